"""Model registry: every architecture by name, built with one call, plus weight loading and what a model's
inputs are: how they are prepared (:mod:`.preprocessing`, recorded with the weights in every checkpoint)
and how large an image may be (:mod:`.image_size`).

Importing it imports no torch (the names come from :mod:`.archs`): the command lines list the
architectures before torch is loaded.  The builder and the weight loaders import it when first used.

May import: records/ (a weights file is read and its hash checked there), errors.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from image_classification.errors import UserError
from image_classification.models.archs import ARCHS, MODEL_CONFIGS

if TYPE_CHECKING:
    from torch import nn

__all__ = ["MODEL_CONFIGS", "build_model", "default_image_size", "list_models", "load_weights"]

CONV_INIT_MODES = ("fan_in", "fan_out")
OPTIONS = ("last_bn_0_init", "conv_init")


def list_models() -> list[str]:
    """Names accepted by ``build_model`` (and the CLI's ``--arch``)."""
    return list(ARCHS)


def _check_arch(arch: str) -> None:
    if arch not in ARCHS:
        raise UserError(f"Unknown architecture '{arch}'; choose one of: {', '.join(ARCHS)}.")


def default_image_size(arch: str) -> int:
    """Training and validation crop size the architecture was designed for."""
    _check_arch(arch)
    return 224


def build_model(arch: str, num_classes: int = 1000, model_config: str = "classic", **options) -> nn.Module:
    """A freshly initialised ``arch``; ``options`` are ``last_bn_0_init`` and ``conv_init``.

    ``model_config`` picks the conv init mode (see ``MODEL_CONFIGS``); an explicit ``conv_init`` wins.
    """
    _check_arch(arch)
    if model_config not in MODEL_CONFIGS:
        raise UserError(f"Unknown model config '{model_config}'; choose one of: {', '.join(MODEL_CONFIGS)}.")
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise UserError(f"Unknown model option(s) {', '.join(unknown)}; "
                        f"the options are: {', '.join(OPTIONS)}.")
    settings = {**MODEL_CONFIGS[model_config], **{k: v for k, v in options.items() if v is not None}}
    if settings["conv_init"] not in CONV_INIT_MODES:
        raise UserError(f"Unknown conv_init '{settings['conv_init']}'; "
                        f"choose one of: {', '.join(CONV_INIT_MODES)}.")
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1:
        raise UserError(f"The number of classes must be a positive integer, got {num_classes!r}.")
    from image_classification.models.resnet import resnet  # deferred: torch (see the module's docstring)

    return resnet(arch, num_classes, settings["conv_init"], bool(settings.get("last_bn_0_init", False)))


def __getattr__(name: str):
    """``load_weights``, from :mod:`.weights` (which imports torch) when first asked for."""
    if name == "load_weights":
        from image_classification.models import weights  # deferred: torch

        return getattr(weights, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
