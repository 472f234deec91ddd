"""The ``model`` group: the architecture, its initialisation, the weights it starts from and how it is run."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from ..errors import UserError
from ..models import MODEL_CONFIGS, list_models
from ..system.cli import positive_int
from ..system.machine import compile_unsupported
from .values import add_group, flag, str2bool


@dataclass(frozen=True)
class ModelConfig:
    """The ``model`` group: the architecture, its initialisation, the weights it starts from and how it is run;
    ``num_classes`` as the run settles it (the flag's, else the checkpoint's or the dataset's)."""

    arch: str = flag("--arch", "-a", default="resnet50", metavar="ARCH", choices=list_models,
                     help=lambda: "model architecture: " + " | ".join(list_models()) + " (default: resnet50)")
    model_config: str = flag("--model-config", "-c", default="classic", metavar="CONF", choices=list(MODEL_CONFIGS),
                             help="model configs: " + " | ".join(MODEL_CONFIGS) + " (default: classic)")
    num_classes: int | None = flag("--num-classes", "--num_classes", metavar="N", type=positive_int,
                                   help="number of classes (default: the checkpoint's, else the dataset's class "
                                   "folders, else 1000)")
    conv_init: str | None = flag("--conv_init", choices=("fan_in", "fan_out"),
                                 help="kaiming init mode of the convolutions (default: the model config's)")
    last_bn_0_init: bool = flag("--last_bn_0_init", default=True, metavar="BOOL", type=str2bool, nargs="?",
                                const=True,
                                help="zero-initialise the last BatchNorm of every residual block, so that each residual "
                                "branch starts at zero (default: true; false in launch.py's presets, as in the "
                                "reference)")
    pretrained_weights: str | None = flag("--pretrained-weights", "--pretrained-from-file", metavar="PATH",
                                          help="load model weights from here (NGC, torchvision or our files); "
                                          "a head of another size is replaced to fit --num-classes (default: none)")
    jit: str = flag("--jit", default="no", choices=("no", "script"),
                    help="script the model with TorchScript (default: no)")
    compile: bool = flag("--compile", default=False, action="store_true",
                         help="compile the model with torch.compile (default: false)")

    def options(self) -> dict:
        """``build_model``'s keyword arguments beyond the architecture and the class count."""
        chosen = {"model_config": self.model_config, "last_bn_0_init": bool(self.last_bn_0_init)}
        return {**chosen, **({"conv_init": self.conv_init} if self.conv_init is not None else {})}


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``model`` group."""
    add_group(parser, "model", ModelConfig)


def check_compile_supported(args: argparse.Namespace) -> None:
    """--compile on a torch and Python that can compile. Imports torch: the last check of all."""
    if args.compile:
        if reason := compile_unsupported():
            raise UserError(f"--compile: {reason} (or leave --compile out)")
