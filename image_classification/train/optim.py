"""Optimizers, weight-decay grouping and learning-rate schedules (pure functions of the epoch)."""

from __future__ import annotations

import inspect
import math

import torch
from torch import nn

from ..arguments import OPTIMIZERS
from ..errors import UserError

STEP_MILESTONES = (30, 60, 80)


TRIANGULAR_START = 1e-4  # FFCV's cyclic schedule starts at this fraction of its peak


def lr_at(epoch: float, *, base_lr: float, schedule: str, warmup: int, epochs: int, end_lr: float = 0.0,
          peak_epoch: int = 2) -> float:
    """The learning rate at 0-based ``epoch``: constant within an epoch, as in the reference, except for the
    triangular schedule, which ``epoch`` places within its epoch (``epoch + batch / batches``)."""
    if schedule == "triangular":
        return triangular_lr(epoch, base_lr=base_lr, peak_epoch=peak_epoch, epochs=epochs)
    epoch = int(epoch)
    if epoch < warmup:
        return base_lr * (epoch + 1) / warmup
    if schedule == "step":
        return base_lr * 0.1 ** sum(epoch >= milestone for milestone in STEP_MILESTONES)
    progress = (epoch - warmup) / max(epochs - warmup, 1)
    if schedule == "linear":
        return base_lr * (1.0 - progress)
    if schedule == "cosine":
        return end_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (base_lr - end_lr)
    raise UserError(f"unknown LR schedule {schedule!r}; choose step, linear, cosine or triangular")


def triangular_lr(epoch: float, *, base_lr: float, peak_epoch: int, epochs: int) -> float:
    """FFCV's cyclic schedule: a line from ``TRIANGULAR_START * base_lr`` at epoch 0 up to ``base_lr`` at
    ``peak_epoch``, then down to 0 at ``epochs`` (``epoch`` may fall within an epoch)."""
    if epoch < peak_epoch:
        start = TRIANGULAR_START * base_lr
        return start + (base_lr - start) * epoch / peak_epoch
    if epoch >= epochs:
        return 0.0
    return base_lr * (epochs - epoch) / (epochs - peak_epoch)


# torchvision's norm_classes in references/classification/utils.set_weight_decay
NORM_LAYERS = (nn.modules.batchnorm._BatchNorm, nn.LayerNorm, nn.GroupNorm, nn.modules.instancenorm._InstanceNorm,
               nn.LocalResponseNorm)


def split_weight_decay(model: nn.Module, *, separate_biases: bool = False
                       ) -> tuple[list[nn.Parameter], list[nn.Parameter], list[nn.Parameter]]:
    """(normalisation-layer parameters, all others, biases): every BatchNorm counts, the downsample BNs
    included.  With ``separate_biases`` every parameter named ``bias`` (a BatchNorm's included) goes to the
    third list, as torchvision's ``bias`` key takes precedence over its norm group; else that list is empty."""
    norm_ids = {
        id(param)
        for module in model.modules()
        if isinstance(module, NORM_LAYERS)
        for param in module.parameters(recurse=False)
    }
    norm, rest, biases = [], [], []
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        if separate_biases and name.rsplit(".", 1)[-1] == "bias":
            biases.append(param)
        else:
            (norm if id(param) in norm_ids else rest).append(param)
    return norm, rest, biases


def weight_decay_groups(model: nn.Module, weight_decay: float, *, norm_weight_decay: float = 0.0,
                        bias_weight_decay: float | None = None) -> list[dict]:
    """The parameter groups, always in this order (a checkpoint's optimizer state follows it): the
    normalisation layers' parameters at ``norm_weight_decay``, the rest at ``weight_decay``, and with
    ``bias_weight_decay`` a third group of every bias at that decay.

    Each group also says whether LARS and LAMB adapt its step (``adapt``): the weights always, a
    normalisation or bias group only when it is decayed, so what is excluded from weight decay is
    excluded from the trust ratio too (timm's ``always_adapt=False``).
    """
    norm, rest, biases = split_weight_decay(model, separate_biases=bias_weight_decay is not None)
    groups = [{"params": norm, "weight_decay": norm_weight_decay, "adapt": norm_weight_decay != 0},
              {"params": rest, "weight_decay": weight_decay, "adapt": True}]
    if bias_weight_decay is not None:
        groups.append({"params": biases, "weight_decay": bias_weight_decay, "adapt": bias_weight_decay != 0})
    return groups


def _norms(tensors: list[torch.Tensor]) -> torch.Tensor:
    return torch.stack(torch._foreach_norm(tensors))


def trust_ratios(ratios: torch.Tensor, weight_norms: torch.Tensor, other_norms: torch.Tensor) -> list[torch.Tensor]:
    """``ratios`` per tensor, 1 where the weight's or the other norm is 0 (a zero-initialised layer, no
    gradient): one vectorised operation on the device, no host synchronisation."""
    keep = (weight_norms > 0) & (other_norms > 0)
    return list(torch.where(keep, ratios, torch.ones_like(ratios)).unbind())


class _GroupwiseOptimizer(torch.optim.Optimizer):
    """An optimizer whose update is :meth:`_step_group` over each group's tensors that have a gradient."""

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if params:
                self._step_group(group, params)
        return loss

    def _step_group(self, group: dict, params: list[torch.Tensor]) -> None:
        raise NotImplementedError

    def _buffers(self, params: list[torch.Tensor], *names: str) -> list[list[torch.Tensor]]:
        """The state tensors ``names`` of ``params`` (zeros until the first step), one list per name."""
        for param in params:
            state = self.state[param]
            for name in names:
                if name not in state:
                    state[name] = torch.zeros_like(param)
        return [[self.state[p][name] for p in params] for name in names]


class Lamb(_GroupwiseOptimizer):
    """LAMB, You et al. 2019 ("Large Batch Optimization for Deep Learning", Algorithm 2).

    Adam's bias-corrected step ``r = m_hat / (sqrt(v_hat) + eps)`` plus the weight decay,
    ``u = r + weight_decay * w``, scaled per tensor by the trust ratio ``||w|| / ||u||`` (1 when either norm
    is 0): ``w -= lr * ratio * u``.  No gradient clipping (the paper has none).  A group with ``adapt``
    False takes the unscaled step ``w -= lr * u``.
    """

    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-6,
                 weight_decay: float = 0.0, adapt: bool = True):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, adapt=adapt))

    def _step_group(self, group: dict, params: list[torch.Tensor]) -> None:
        grads = [p.grad for p in params]
        exp_avg, exp_avg_sq = self._buffers(params, "exp_avg", "exp_avg_sq")
        group["step"] = step = group.get("step", 0) + 1  # every tensor of a group steps together
        beta1, beta2 = group["betas"]
        torch._foreach_lerp_(exp_avg, grads, 1 - beta1)  # m = beta1 m + (1 - beta1) g
        torch._foreach_mul_(exp_avg_sq, beta2)
        torch._foreach_addcmul_(exp_avg_sq, grads, grads, value=1 - beta2)  # v = beta2 v + (1 - beta2) g^2
        denominator = torch._foreach_sqrt(exp_avg_sq)
        torch._foreach_div_(denominator, math.sqrt(1 - beta2**step))
        torch._foreach_add_(denominator, group["eps"])  # sqrt(v_hat) + eps
        update = torch._foreach_div(exp_avg, denominator)
        torch._foreach_div_(update, 1 - beta1**step)  # r = m_hat / (sqrt(v_hat) + eps)
        if group["weight_decay"]:
            torch._foreach_add_(update, params, alpha=group["weight_decay"])
        if group["adapt"]:
            weight_norms, update_norms = _norms(params), _norms(update)
            torch._foreach_mul_(update, trust_ratios(weight_norms / update_norms, weight_norms, update_norms))
        torch._foreach_add_(params, update, alpha=-group["lr"])


class Lars(_GroupwiseOptimizer):
    """LARS, You et al. 2017 ("Large Batch Training of Convolutional Networks", Algorithm 1).

    The decayed gradient ``g + weight_decay * w`` is scaled per tensor by the trust ratio
    ``eta * ||w|| / (||g|| + weight_decay * ||w||)`` (1 when either norm is 0), then goes through momentum:
    ``v = momentum * v + ratio * (g + weight_decay * w)``, ``w -= lr * v``.  The global ``lr`` multiplies the
    velocity, as torch's SGD and timm's ``Lars`` do (the paper puts it inside ``v``; the two agree while
    the LR is constant, and ours changes only between epochs).  A group with ``adapt`` False is plain SGD.
    """

    def __init__(self, params, lr: float = 1.0, momentum: float = 0.9, weight_decay: float = 0.0,
                 eta: float = 1e-3, adapt: bool = True):
        super().__init__(params, dict(lr=lr, momentum=momentum, weight_decay=weight_decay, eta=eta, adapt=adapt))

    def _step_group(self, group: dict, params: list[torch.Tensor]) -> None:
        grads = [p.grad for p in params]
        decay = group["weight_decay"]
        update = torch._foreach_add(grads, params, alpha=decay)  # a new list: p.grad stays as it was
        if group["adapt"]:
            weight_norms, grad_norms = _norms(params), _norms(grads)
            ratios = group["eta"] * weight_norms / (grad_norms + decay * weight_norms)
            ratios = trust_ratios(ratios, weight_norms, grad_norms)
            torch._foreach_mul_(update, ratios)
        if group["momentum"]:
            (velocity,) = self._buffers(params, "momentum_buffer")
            torch._foreach_mul_(velocity, group["momentum"])
            torch._foreach_add_(velocity, update)
            update = velocity
        torch._foreach_add_(params, update, alpha=-group["lr"])


def make_optimizer(optimizer_class: type[torch.optim.Optimizer], groups: list[dict], *, fused: bool = True,
                   **options) -> torch.optim.Optimizer:
    """``optimizer_class`` with its fused kernel where ``fused`` allows it and this torch has one for the
    parameters' device and dtype (SGD on CUDA and, from torch 2.4, on the CPU), else with its foreach
    (multi-tensor) kernels.

    The fused update is one kernel per parameter group, and on the CPU it is faster than the for-loop
    update. The optimizer's constructor decides what it supports; one with neither option (our LAMB and
    LARS, foreach throughout) is built as it is.

    Under a loss scaler pass ``fused=False``: torch's fused SGD (2.11 to at least 2.14) takes the scaler's
    inf flag into its kernel, and a first step skipped for inf gradients leaves the momentum buffers it
    allocated with ``torch.empty_like`` unwritten, which the next taken step then reads as momentum
    (garbage, NaN on the CPU; the weights left stock SGD's on an H100 too). tests/test_fp16.py holds a test
    that tells when torch has fixed it.
    """
    accepted = inspect.signature(optimizer_class).parameters
    if fused and "fused" in accepted and _fused_kernel_steps(optimizer_class, groups, options):
        return optimizer_class(groups, fused=True, **options)
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in accepted.values())
    if "foreach" in accepted or takes_any:
        return optimizer_class(groups, foreach=True, **options)
    return optimizer_class(groups, **options)


def _fused_kernel_steps(optimizer_class: type[torch.optim.Optimizer], groups: list[dict],
                        options: dict) -> bool:
    """Whether ``optimizer_class(fused=True)`` takes a step on one element of each device and dtype in
    ``groups``.  Its constructor is not enough: torch 2.3's SGD accepts ``fused=True`` for CPU tensors and
    only fails at the first step, where it has no CPU kernel."""
    for device, dtype in {(p.device, p.dtype) for group in groups for p in group["params"]}:
        probe = torch.zeros(1, device=device, dtype=dtype, requires_grad=True)
        probe.grad = torch.zeros_like(probe)
        try:
            optimizer_class([probe], fused=True, **options).step()
        except RuntimeError:  # NotImplementedError included: no fused kernel for this device or dtype
            return False
    return True


ADAM_BETAS = (0.9, 0.999)  # AdamW's and LAMB's (torch's default, the LAMB paper's)
ADAMW_EPS, LAMB_EPS = 1e-8, 1e-6  # torch's AdamW default; the LAMB paper's (and timm's)


def build_optimizer(model: nn.Module, *, name: str, lr: float, momentum: float, weight_decay: float,
                    nesterov: bool = False, bn_weight_decay: bool = False, norm_weight_decay: float | None = None,
                    bias_weight_decay: float | None = None, rmsprop_alpha: float = 0.9, rmsprop_eps: float = 1e-3,
                    loss_scaling: bool = False, log=print) -> torch.optim.Optimizer:
    """``name`` (one of :data:`OPTIMIZERS`) over :func:`weight_decay_groups`.

    The normalisation layers' decay is ``norm_weight_decay`` when given, else ``weight_decay`` with
    ``bn_weight_decay``, else 0 (the reference's exclusion, downsample BNs included).  AdamW and LAMB use
    betas :data:`ADAM_BETAS`; ``momentum`` is SGD's, RMSprop's and LARS's.  Build it after the model is on
    its device: :func:`make_optimizer` picks the kernels for it, never a fused one when ``loss_scaling``
    (fp16) will skip steps.
    """
    if name not in OPTIMIZERS:
        raise UserError(f"unknown optimizer {name!r}; choose {', '.join(OPTIMIZERS[:-1])} or {OPTIMIZERS[-1]}")
    if norm_weight_decay is None:
        norm_weight_decay = weight_decay if bn_weight_decay else 0.0
    groups = weight_decay_groups(model, weight_decay, norm_weight_decay=norm_weight_decay,
                                 bias_weight_decay=bias_weight_decay)
    log(describe_weight_decay(groups, weight_decay))
    if name not in ("lamb", "lars"):
        for group in groups:
            del group["adapt"]  # LARS's and LAMB's only; the other optimizers' checkpoints stay as they were
    fused = not loss_scaling
    if name == "sgd":
        return make_optimizer(torch.optim.SGD, groups, fused=fused, lr=lr, momentum=momentum, nesterov=nesterov)
    if name == "rmsprop":
        return make_optimizer(torch.optim.RMSprop, groups, fused=fused, lr=lr, alpha=rmsprop_alpha, eps=rmsprop_eps,
                              momentum=momentum)
    if name == "adamw":
        return make_optimizer(torch.optim.AdamW, groups, fused=fused, lr=lr, betas=ADAM_BETAS, eps=ADAMW_EPS)
    if name == "lamb":
        return make_optimizer(Lamb, groups, lr=lr, betas=ADAM_BETAS, eps=LAMB_EPS)
    return make_optimizer(Lars, groups, lr=lr, momentum=momentum)


def describe_weight_decay(groups: list[dict], weight_decay: float) -> str:
    """One line on which parameter tensors are decayed, and by how much."""
    norm, rest = groups[0], groups[1]
    if len(groups) == 2 and norm["weight_decay"] == weight_decay:
        return (f"=> weight decay {weight_decay:g} on all {len(norm['params']) + len(rest['params'])} parameter "
                "tensors, BatchNorm included")
    if len(groups) == 2 and norm["weight_decay"] == 0:
        return (f"=> weight decay {weight_decay:g} on {len(rest['params'])} parameter tensors; none on the "
                f"{len(norm['params'])} BatchNorm ones (--bn-weight-decay includes them)")
    parts = [f"{weight_decay:g} on {len(rest['params'])} weight tensors",
             f"{norm['weight_decay']:g} on {len(norm['params'])} normalisation ones"]
    if len(groups) > 2:
        parts.append(f"{groups[2]['weight_decay']:g} on {len(groups[2]['params'])} biases")
    return "=> weight decay " + ", ".join(parts)


IMPLEMENTATION_FLAGS = ("fused", "foreach")


def load_optimizer_state(optimizer: torch.optim.Optimizer, state: dict) -> None:
    """Load ``state`` but keep the kernels :func:`make_optimizer` chose here (a checkpoint's parameter
    groups carry the flags of the machine and torch version that wrote it), each state tensor shaped like
    its parameter laid out as the parameter (:func:`in_layout_of`).

    torch's ``load_state_dict`` keeps the checkpoint's strides, and its fused SGD and AdamW pair a parameter's
    elements with its state's by memory position: on the CPU a checkpoint written in NCHW and resumed in
    channels-last (or the reverse) takes wrong steps without a word; CUDA's fused kernels stop instead.
    """
    chosen = [{flag: group[flag] for flag in IMPLEMENTATION_FLAGS if flag in group} for group in optimizer.param_groups]
    optimizer.load_state_dict(state)
    for group, flags in zip(optimizer.param_groups, chosen):
        for flag in IMPLEMENTATION_FLAGS:
            group.pop(flag, None)
        group.update(flags)
    for param, param_state in optimizer.state.items():
        for key, value in param_state.items():
            if isinstance(value, torch.Tensor):
                param_state[key] = in_layout_of(value, param)


def in_layout_of(tensor: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``tensor``'s values (by index; its dtype and device kept) in a tensor of ``like``'s strides where the
    two have the same shape and other strides; else ``tensor`` itself (a scalar ``step``, another shape)."""
    if tensor.shape != like.shape or tensor.stride() == like.stride():
        return tensor
    # exact strides, not just the same order in memory: CUDA's fused kernels compare the stride tuples, which
    # differ between layouts even for a 1x1 kernel's weight that both layouts store alike
    return torch.empty_like(like, dtype=tensor.dtype, device=tensor.device).copy_(tensor)


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """Give every parameter group the learning rate ``lr``."""
    for group in optimizer.param_groups:
        group["lr"] = lr
