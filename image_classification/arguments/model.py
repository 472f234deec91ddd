"""The ``model`` group: the architecture, its initialisation, the weights it starts from and how it is run."""

from __future__ import annotations

import argparse

from ..errors import UserError
from ..models import MODEL_CONFIGS, list_models
from ..system.cli import positive_int
from ..system.machine import compile_unsupported
from .values import str2bool


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``model`` group."""
    model = parser.add_argument_group("model")
    model.add_argument("--arch", "-a", metavar="ARCH", default="resnet50", choices=list_models(),
                       help="model architecture: " + " | ".join(list_models()) + " (default: resnet50)")
    model.add_argument("--model-config", "-c", metavar="CONF", default="classic", choices=list(MODEL_CONFIGS),
                       help="model configs: " + " | ".join(MODEL_CONFIGS) + " (default: classic)")
    model.add_argument("--num-classes", "--num_classes", metavar="N", dest="num_classes",
                       type=positive_int, default=None,
                       help="number of classes (default: the checkpoint's, else the dataset's class folders, "
                       "else 1000)")
    model.add_argument("--conv_init", choices=("fan_in", "fan_out"), default=None,
                       help="kaiming init mode of the convolutions (default: the model config's)")
    model.add_argument("--last_bn_0_init", metavar="BOOL", type=str2bool, nargs="?", const=True, default=True,
                       help="zero-initialise the last BatchNorm of every residual block, so that each residual "
                       "branch starts at zero (default: true; false in launch.py's presets, as in the reference)")
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


def check_compile_supported(args: argparse.Namespace) -> None:
    """--compile on a torch and Python that can compile. Imports torch: the last check of all."""
    if args.compile:
        if reason := compile_unsupported():
            raise UserError(f"--compile: {reason} (or leave --compile out)")
