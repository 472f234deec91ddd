"""The ``model`` group: the architecture, its initialisation, the weights it starts from and how it is run.

The options of one family of architectures (``--model-config`` and ``--last_bn_0_init`` the ResNets',
``--bn_momentum``, ``--bn_epsilon``, ``--dropout`` and ``--survival_prob`` the EfficientNets') default to None,
so that one typed (or set by a preset) can be told from none: given for the other family, it is refused.
"""

from __future__ import annotations

import argparse

from ..errors import UserError
from ..models import MODEL_CONFIGS, OPTIONS, arch_options, check_options, list_models
from ..system.cli import positive_float, positive_int
from ..system.machine import compile_unsupported
from .values import probability, str2bool

PLAIN_LAST_BN_0_INIT = True  # a plain run's --last_bn_0_init where the arch has one (REFERENCE_DEFAULTS: false)


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``model`` group."""
    model = parser.add_argument_group("model")
    model.add_argument("--arch", "-a", metavar="ARCH", default="resnet50", choices=list_models(),
                       help="model architecture: " + " | ".join(list_models()) + " (default: resnet50)")
    model.add_argument("--model-config", "-c", metavar="CONF", default=None, choices=list(MODEL_CONFIGS),
                       help="model configs of the ResNets: " + " | ".join(MODEL_CONFIGS) + " (default: classic)")
    model.add_argument("--num-classes", "--num_classes", metavar="N", dest="num_classes",
                       type=positive_int, default=None,
                       help="number of classes (default: the checkpoint's, else the dataset's class folders, "
                       "else 1000)")
    model.add_argument("--conv_init", choices=("fan_in", "fan_out"), default=None,
                       help="kaiming init mode of the convolutions (default: the model config's; fan_in for the "
                       "EfficientNets)")
    model.add_argument("--last_bn_0_init", metavar="BOOL", type=str2bool, nargs="?", const=True, default=None,
                       help="the ResNets: zero-initialise the last BatchNorm of every residual block, so that each "
                       "residual branch starts at zero (default: true; false in launch.py's presets, as in the "
                       "reference)")
    model.add_argument("--bn_momentum", metavar="M", type=probability, default=None,
                       help="the EfficientNets: BatchNorm momentum, the weight of each batch in the running "
                       "statistics (default: 0.01)")
    model.add_argument("--bn_epsilon", metavar="EPS", type=positive_float, default=None,
                       help="the EfficientNets: BatchNorm epsilon (default: 0.001)")
    model.add_argument("--dropout", metavar="P", type=probability, default=None,
                       help="the EfficientNets: dropout before the classifier (default: the architecture's, 0.2 "
                       "for b0 and b1, 0.3 for b2 and b3, 0.4 for b4 and b5, 0.5 for b6 and b7)")
    model.add_argument("--survival_prob", metavar="P", type=probability, default=None,
                       help="the EfficientNets: stochastic depth, the probability that the last residual block is "
                       "kept in training, from 1 at the first (default: the architecture's, 0.8 for b4, else 1)")
    model.add_argument("--pretrained-weights", "--pretrained-from-file", metavar="PATH",
                       dest="pretrained_weights", default=None,
                       help="load model weights from here (NGC, torchvision or our files); "
                       "a head of another size is replaced to fit --num-classes (default: none)")
    model.add_argument("--jit", choices=("no", "script"), default="no",
                       help="script: train and validate the model scripted with TorchScript (torch.jit.script), as "
                       "the reference does; torch deprecates TorchScript, which the run says in one => line: "
                       "--compile makes a faster model, model2onnx.py (ONNX through torch.export, or a .pt2 "
                       "package) deploys one (default: no)")
    model.add_argument("--compile", action="store_true",
                       help="compile the model with torch.compile (default: false)")


def model_options(args: argparse.Namespace) -> dict:
    """``build_model``'s options from the flags: those given (a preset's included), and a plain run's zeroed last
    BatchNorm (:data:`PLAIN_LAST_BN_0_INIT`) where the architecture has one."""
    options = {name: getattr(args, name) for name in OPTIONS if getattr(args, name) is not None}
    if args.last_bn_0_init is None and "last_bn_0_init" in arch_options(args.arch):
        options["last_bn_0_init"] = PLAIN_LAST_BN_0_INIT
    return options


def check_model_combinations(args: argparse.Namespace) -> None:
    """The model options given fit ``--arch``: none of the other family (False asks nothing and passes), each in
    its range; before torch is imported."""
    check_options(args.arch, model_options(args))


def check_compile_supported(args: argparse.Namespace) -> None:
    """--compile on a torch and Python that can compile. Imports torch: the last check of all."""
    if args.compile:
        if reason := compile_unsupported():
            raise UserError(f"--compile: {reason} (or leave --compile out)")
