"""Quantization-aware training (QAT): a model's convolutions and linear layers with fake int8 quantization.

:func:`quantize_model` swaps every ``nn.Conv2d`` and ``nn.Linear`` for a subclass that rounds its weights to
int8 (symmetric, one scale per output channel, from the weights' largest magnitude at every forward) and its
input to uint8 (one scale and zero point per tensor, calibrated on a few batches by :func:`calibrate` and then
fixed), through torch's ``fake_quantize_per_tensor_affine`` for the inputs and, for the weights, the rounding of
``fake_quantize_per_channel_affine`` on plain tensor ops (bit for bit the same, faster on the CPU): the forward
computes what an int8 engine computes, the backward passes gradients straight through (zero where an input
was clipped).  Parameter names stay those of the float model, so FP32 weights load into it; the activation
ranges are buffers (``<layer>.input_quantizer.scale`` / ``zero_point`` / ``calibrated``), in the state dict and
so in every checkpoint, and a resume continues with the very ranges it stopped with.

uint8 activations with int8 weights are what ONNX Runtime's x86 kernels run fused (as :mod:`..deploy.quantization`
says), and weights held to [-127, 127] keep their integers when a BatchNorm is folded in:
:func:`deployable` multiplies each channel's fake-quantized weight by the BatchNorm's factor, which scales that
channel's step by the factor's size and leaves its integers (negated for a negative factor), so the folded
convolution computes exactly what the trained one and its BatchNorm computed (:func:`fold_batchnorms`).  An
int8 engine adds a bias in int32, in steps of the input's scale times the channel's weight scale, so
:func:`deployable` then rounds each bias to that grid, as ONNX Runtime does where it fuses a convolution into
int8 (at most half a step, far below one step of the output; training does not model it): a bias already on the
grid stays itself, so ONNX Runtime's fused and float paths and PyTorch add the same one.  Its ONNX export is a
QDQ graph: QuantizeLinear/DequantizeLinear pairs at every quantized input and weight.

May import: errors.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterable, Mapping

import torch
from torch import nn

from ..errors import UserError

ACTIVATION_RANGE = (0, 255)  # uint8 activations (ONNX Runtime's x86 int8 kernels: u8 activations, s8 weights)
WEIGHT_RANGE = (-128, 127)  # int8 weights; the scale maps the largest magnitude to 127, so -128 is never used
WEIGHT_LEVELS = 127
CALIBRATION_BATCHES = 10  # the reference's calib_iter
SCHEME = "qdq-u8s8-v1"  # what a checkpoint records of how its model was quantized
QUANTIZER_KEY = ".input_quantizer.scale"  # a state dict key only a quantization-aware model has


class ActivationQuantizer(nn.Module):
    """Fake uint8 quantization of a tensor with one scale and zero point, from the range seen in calibration.

    Before calibration it passes its input through unchanged; while ``observing`` it widens ``low``/``high``
    to the input's range (always holding 0, so that 0 is exact: zero padding and ReLU's zeros).  Whether it is
    calibrated is the buffer ``calibrated``, mirrored in a Python flag when set or loaded, so that the forward
    has no branch on a tensor (torch.export traces it)."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("low", torch.zeros(()))
        self.register_buffer("high", torch.zeros(()))
        self.register_buffer("scale", torch.ones(()))
        self.register_buffer("zero_point", torch.zeros((), dtype=torch.int32))
        self.register_buffer("calibrated", torch.zeros((), dtype=torch.bool))
        self.observing = False
        self.active = False  # bool(self.calibrated)
        self.constants: tuple[float, int] | None = None  # the scale and zero point as numbers: deployable()'s

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs) -> None:
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
        self.active = bool(self.calibrated)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.observing:
            with torch.no_grad():
                self.low.copy_(torch.minimum(self.low, x.min().float()))
                self.high.copy_(torch.maximum(self.high, x.max().float()))
            return x
        if not self.active:
            return x
        if self.constants is not None:  # deployable()'s: ops that torch.export traces with a free batch
            decomposed = torch.ops.quantized_decomposed
            scale, zero = self.constants
            rounded = decomposed.quantize_per_tensor(x.float(), scale, zero, *ACTIVATION_RANGE, torch.uint8)
            return decomposed.dequantize_per_tensor(rounded, scale, zero, *ACTIVATION_RANGE, torch.uint8).to(x.dtype)
        quantized = torch.fake_quantize_per_tensor_affine(x.float(), self.scale, self.zero_point, *ACTIVATION_RANGE)
        return quantized.to(x.dtype)

    def finish_calibration(self) -> None:
        """Fix the scale and zero point from the range observed (a range of zero width: scale 1)."""
        low, high = float(self.low), float(self.high)
        levels = ACTIVATION_RANGE[1] - ACTIVATION_RANGE[0]
        scale = (high - low) / levels if high > low else 1.0
        self.scale.fill_(scale)
        self.zero_point.fill_(int(min(max(round(-low / scale), ACTIVATION_RANGE[0]), ACTIVATION_RANGE[1])))
        self.calibrated.fill_(True)
        self.observing, self.active = False, True


def weight_scale(weight: torch.Tensor) -> torch.Tensor:
    """One int8 step per output channel: the channel's largest magnitude over 127 (a channel of zeros: 1)."""
    amax = weight.detach().abs().flatten(1).amax(1).float()
    return torch.where(amax > 0, amax / WEIGHT_LEVELS, torch.ones_like(amax))


class _RoundedWeight(torch.autograd.Function):
    """int8 rounding per output channel on plain tensor ops, the gradient straight through: bit for bit what
    ``fake_quantize_per_channel_affine`` computes with a zero point of 0, forward and backward (with the scales
    of :func:`weight_scale` no weight is clipped, so none has its gradient zeroed), in under half its time on the
    CPU."""

    @staticmethod
    def forward(ctx, weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        step = scale.view(-1, *([1] * (weight.dim() - 1)))
        return torch.round(weight * (1.0 / step)).clamp_(*WEIGHT_RANGE).mul_(step)  # torch's op: x * (1 / scale)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad, None


def fake_quantize_weight(weight: torch.Tensor, scale: torch.Tensor | None = None) -> torch.Tensor:
    """``weight`` rounded to int8 per output channel (the scale of :func:`weight_scale` unless given)."""
    if scale is None:  # training and evaluation
        return _RoundedWeight.apply(weight.float(), weight_scale(weight)).to(weight.dtype)
    # a fixed scale is deployable()'s: torch's op, which torch.export writes as QuantizeLinear/DequantizeLinear
    zero = torch.zeros(scale.shape, dtype=torch.int32, device=weight.device)
    return torch.fake_quantize_per_channel_affine(weight.float(), scale, zero, 0, *WEIGHT_RANGE).to(weight.dtype)


class _Quantized:
    """What the quantized conv and linear layers share: the input quantizer, and a weight scale that
    :func:`deployable` fixes (``frozen_scale``) so that an export holds it as a constant."""

    input_quantizer: ActivationQuantizer
    frozen_scale: torch.Tensor | None

    def _setup(self) -> None:
        self.input_quantizer = ActivationQuantizer()
        self.register_buffer("frozen_scale", None, persistent=False)

    def quantized_weight(self) -> torch.Tensor:
        return fake_quantize_weight(self.weight, self.frozen_scale)


class QuantConv2d(nn.Conv2d, _Quantized):
    """``nn.Conv2d`` on a fake-uint8 input with fake-int8 weights."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._conv_forward(self.input_quantizer(x), self.quantized_weight(), self.bias)


class QuantLinear(nn.Linear, _Quantized):
    """``nn.Linear`` on a fake-uint8 input with fake-int8 weights; its output stays float (the logits)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(self.input_quantizer(x), self.quantized_weight(), self.bias)


def _swapped(module: nn.Module) -> nn.Module | None:
    """The quantized twin of a conv or linear layer, sharing its parameters; None for any other module."""
    kinds = {nn.Conv2d: QuantConv2d, nn.Linear: QuantLinear}
    kind = kinds.get(type(module))
    if kind is None:
        return None
    twin = copy.copy(module)  # the same parameters and settings, another class
    twin.__class__ = kind
    twin._modules = dict(module._modules)
    twin._setup()
    return twin


def quantize_model(model: nn.Module) -> nn.Module:
    """``model`` with every ``nn.Conv2d`` and ``nn.Linear`` replaced, in place, by its fake-quantized twin (module
    docstring); returned for chaining.  A model already quantized is refused."""
    if is_quantized(model):
        raise UserError("the model is already quantized")
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            twin = _swapped(child)
            if twin is not None:
                setattr(parent, name, twin)
    return model


def holds_quantizers(state: Mapping[str, torch.Tensor]) -> bool:
    """Whether a state dict is that of a quantization-aware model: it holds activation ranges."""
    return any(key.endswith(QUANTIZER_KEY) for key in state)


def check_quantizers(model: nn.Module, where: str) -> None:
    """A :class:`UserError` where a loaded QAT model's activation ranges are not ones calibration makes (a
    damaged file): uncalibrated, a scale not finite and positive, a zero point outside uint8."""
    for name, module in model.named_modules():
        if isinstance(module, ActivationQuantizer):
            scale, zero = float(module.scale), int(module.zero_point)
            if not (bool(module.calibrated) and math.isfinite(scale) and scale > 0
                    and ACTIVATION_RANGE[0] <= zero <= ACTIVATION_RANGE[1]):
                raise UserError(f"{where} is damaged: the activation range of {name} (scale {scale:g}, zero point "
                                f"{zero}) is not one that calibration makes")


def quantizers(model: nn.Module) -> list[ActivationQuantizer]:
    return [module for module in model.modules() if isinstance(module, ActivationQuantizer)]


def is_quantized(model: nn.Module) -> bool:
    return bool(quantizers(model))


def is_calibrated(model: nn.Module) -> bool:
    """Whether every activation quantizer of ``model`` has its range (a resumed QAT model has)."""
    found = quantizers(model)
    return bool(found) and all(bool(quantizer.calibrated) for quantizer in found)


def calibrate(model: nn.Module, batches: Iterable[torch.Tensor]) -> int:
    """Set every activation quantizer's range from ``model``'s inputs in eval mode over ``batches`` (the
    reference's calibration, with min/max ranges); the model's mode is restored.  Returns the batches used."""
    found, training = quantizers(model), model.training
    for quantizer in found:
        quantizer.observing = True
        quantizer.low.zero_()
        quantizer.high.zero_()
    model.eval()
    count = 0
    try:
        with torch.no_grad():
            for images in batches:
                model(images)
                count += 1
    finally:
        model.train(training)
        for quantizer in found:
            quantizer.observing = False
    if not count:
        raise UserError("no batch to calibrate the quantized model on")
    for quantizer in found:
        quantizer.finish_calibration()
    return count


def _fold_pairs(model: nn.Module, probe: torch.Tensor) -> list[tuple[nn.Module, nn.BatchNorm2d]]:
    """(conv, BatchNorm) pairs where the BatchNorm's input is the conv's output, seen on one forward of ``probe``."""
    outputs: dict[int, nn.Module] = {}
    pairs = []

    def conv_hook(module, _inputs, output):
        outputs[id(output)] = module

    def bn_hook(module, inputs, _output):
        conv = outputs.get(id(inputs[0]))
        if conv is not None:
            pairs.append((conv, module))

    hooks = [module.register_forward_hook(conv_hook) for module in model.modules() if isinstance(module, QuantConv2d)]
    hooks += [module.register_forward_hook(bn_hook) for module in model.modules()
              if isinstance(module, nn.BatchNorm2d)]
    try:
        with torch.no_grad():
            model(probe)
    finally:
        for hook in hooks:
            hook.remove()
    return pairs


def fold_batchnorms(model: nn.Module, probe: torch.Tensor) -> nn.Module:
    """An eval-mode copy of the calibrated QAT ``model`` that computes what it computes: each BatchNorm that
    follows a quantized conv folded into it (exactly: module docstring), every weight scale fixed as a constant."""
    if not is_calibrated(model):
        raise UserError("the quantized model has not been calibrated: its activation ranges are unknown")
    import torch.ao.quantization.fx._decomposed  # noqa: F401  (deferred: registers the quantized_decomposed ops)

    folded = copy.deepcopy(model).float().eval()
    with torch.no_grad():
        for conv, bn in _fold_pairs(folded, probe.float()):
            factor = bn.weight / torch.sqrt(bn.running_var + bn.eps)
            weight = fake_quantize_weight(conv.weight) * factor.view(-1, 1, 1, 1)
            bias = conv.bias if conv.bias is not None else torch.zeros_like(bn.running_mean)
            conv.weight = nn.Parameter(weight)
            conv.bias = nn.Parameter(bn.bias + (bias - bn.running_mean) * factor)
            _replace(folded, bn, nn.Identity())
        for module in folded.modules():
            if isinstance(module, _Quantized):
                module.frozen_scale = weight_scale(module.weight)
            elif isinstance(module, ActivationQuantizer):
                module.constants = (float(module.scale), int(module.zero_point))
    return folded


def deployable(model: nn.Module, probe: torch.Tensor) -> nn.Module:
    """The calibrated QAT ``model`` as an int8 engine runs it, what its ONNX export is made from:
    :func:`fold_batchnorms`, and every bias then on its int32 grid (:func:`bias_on_grid`)."""
    folded = fold_batchnorms(model, probe)
    with torch.no_grad():
        for module in folded.modules():
            if isinstance(module, _Quantized) and module.bias is not None:
                module.bias = nn.Parameter(bias_on_grid(module.bias, module.input_quantizer.scale,
                                                        module.frozen_scale))
    return folded


def bias_on_grid(bias: torch.Tensor, input_scale: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``bias`` rounded to a whole number of steps of the layer's int32 accumulator, ``input_scale * scale`` per
    output channel, in float32 as ONNX Runtime computes that step: the bias its int8 kernels add."""
    # ONNX Runtime rounds a float bias to this grid where it fuses a convolution into QLinearConv (its
    # WeightBiasQuantization pass); a bias already on it comes back the same, so both paths add the same value.
    step = input_scale.float() * scale.float()
    return torch.round(bias.float() / step) * step


def _replace(model: nn.Module, old: nn.Module, new: nn.Module) -> None:
    for parent in model.modules():
        for name, child in parent.named_children():
            if child is old:
                setattr(parent, name, new)
