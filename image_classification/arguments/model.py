"""The ``model`` group: the architecture, its initialisation, the weights it starts from and how it is run.

The options of one family of architectures (``--model-config`` and ``--last_bn_0_init`` the ResNets',
``--bn_momentum``, ``--bn_epsilon``, ``--dropout`` and ``--survival_prob`` the EfficientNets') default to None,
so that one typed (or set by a preset) can be told from none: given for the other family, it is refused.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from ..errors import UserError
from ..models import MODEL_CONFIGS, OPTIONS, arch_options, check_options, list_models
from ..models.archs import plain_arch, quant_spellings
from ..system.cli import positive_float, positive_int
from ..system.machine import compile_unsupported
from .values import add_group, flag, probability, str2bool

PLAIN_LAST_BN_0_INIT = True  # a plain run's --last_bn_0_init where the arch has one (REFERENCE_DEFAULTS: false)


@dataclass(frozen=True)
class ModelConfig:
    """The ``model`` group: the architecture, its initialisation, the weights it starts from and how it is run;
    ``num_classes`` as the run settles it (the flag's, else the checkpoint's or the dataset's)."""

    arch: str = flag("--arch", "-a", default="resnet50", metavar="ARCH",
                     choices=lambda: list_models() + quant_spellings(),
                     help=lambda: "model architecture: " + " | ".join(list_models()) + " (default: resnet50); "
                     "efficientnet-quant-bN, the reference's name, is efficientnet-bN with --quantize-aware")
    model_config: str | None = flag("--model-config", "-c", metavar="CONF", choices=list(MODEL_CONFIGS),
                                    help="model configs of the ResNets: " + " | ".join(MODEL_CONFIGS)
                                    + " (default: classic)")
    num_classes: int | None = flag("--num-classes", "--num_classes", metavar="N", type=positive_int,
                                   help="number of classes (default: the checkpoint's, else the dataset's class "
                                   "folders, else 1000)")
    conv_init: str | None = flag("--conv_init", choices=("fan_in", "fan_out"),
                                 help="kaiming init mode of the convolutions (default: the model config's; fan_in for "
                                 "the EfficientNets)")
    last_bn_0_init: bool | None = flag("--last_bn_0_init", metavar="BOOL", type=str2bool, nargs="?", const=True,
                                       help="the ResNets: zero-initialise the last BatchNorm of every residual block, "
                                       "so that each residual branch starts at zero (default: true; false in "
                                       "launch.py's presets, as in the reference)")
    bn_momentum: float | None = flag("--bn_momentum", metavar="M", type=probability,
                                     help="the EfficientNets: BatchNorm momentum, the weight of each batch in the "
                                     "running statistics (default: 0.01)")
    bn_epsilon: float | None = flag("--bn_epsilon", metavar="EPS", type=positive_float,
                                    help="the EfficientNets: BatchNorm epsilon (default: 0.001)")
    dropout: float | None = flag("--dropout", metavar="P", type=probability,
                                 help="the EfficientNets: dropout before the classifier (default: the "
                                 "architecture's, 0.2 for b0 and b1, 0.3 for b2 and b3, 0.4 for b4 and b5, 0.5 for "
                                 "b6 and b7)")
    survival_prob: float | None = flag("--survival_prob", metavar="P", type=probability,
                                       help="the EfficientNets: stochastic depth, the probability that the last "
                                       "residual block is kept in training, from 1 at the first (default: the "
                                       "architecture's, 0.8 for b4, else 1)")
    pretrained_weights: str | None = flag("--pretrained-weights", "--pretrained-from-file", metavar="PATH",
                                          help="load model weights from here (NGC, torchvision or our files, "
                                          ".pth or .safetensors; timm's safetensors; a Hugging Face folder holding "
                                          "model.safetensors); a head of another size is replaced to fit "
                                          "--num-classes (default: none)")
    jit: str = flag("--jit", default="no", choices=("no", "script"),
                    help="script: train and validate the model scripted with TorchScript (torch.jit.script), as "
                    "the reference does; torch deprecates TorchScript, which the run says in one => line: "
                    "--compile makes a faster model, model2onnx.py (ONNX through torch.export, or a .pt2 "
                    "package) deploys one (default: no)")
    compile: bool = flag("--compile", action="store_true",
                         help="compile the model with torch.compile (default: false)")
    quantize_aware: bool = flag("--quantize-aware", action="store_true",
                                help="quantization-aware training: fake int8 weights and uint8 activations in every "
                                "convolution and linear layer, the activation ranges calibrated on the first batches "
                                "(quant_main.py sets it; a resumed quantized checkpoint continues so; default: false)")

    def options(self) -> dict:
        """``build_model``'s options: those given (a preset's included), and a plain run's zeroed last BatchNorm
        (:data:`PLAIN_LAST_BN_0_INIT`) where the architecture has one."""
        return model_options(self)


def model_options(model) -> dict:
    """``build_model``'s options of ``model`` (the parsed flags, or a :class:`ModelConfig`): see
    :meth:`ModelConfig.options`."""
    options = {name: getattr(model, name) for name in OPTIONS if getattr(model, name) is not None}
    if model.last_bn_0_init is None and "last_bn_0_init" in arch_options(model.arch):
        options["last_bn_0_init"] = PLAIN_LAST_BN_0_INIT
    return options


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``model`` group."""
    add_group(parser, "model", ModelConfig)


def settle_quant_spelling(args: argparse.Namespace) -> None:
    """``--arch efficientnet-quant-bN`` (the reference's name) as ``--arch efficientnet-bN --quantize-aware``: the
    one place the parsed arguments are rewritten, before they are checked."""
    args.arch, asked = plain_arch(args.arch)
    args.quantize_aware = args.quantize_aware or asked


def check_model_combinations(args: argparse.Namespace) -> None:
    """The model options given fit ``--arch``: none of the other family (False asks nothing and passes), each in
    its range; before torch is imported.  Quantization-aware training is not scripted: TorchScript would not
    keep its calibration."""
    check_options(args.arch, model_options(args))
    if args.quantize_aware and args.jit == "script":
        raise UserError("--jit script does not take a quantization-aware model; leave out --jit script")


def check_compile_supported(args: argparse.Namespace) -> None:
    """--compile on a torch and Python that can compile. Imports torch: the last check of all."""
    if args.compile:
        if reason := compile_unsupported():
            raise UserError(f"--compile: {reason} (or leave --compile out)")
