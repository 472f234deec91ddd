"""Model registry: every architecture by name, built with one call, plus weight loading (:mod:`.weights`;
:mod:`.hub_layouts` maps timm's and Hugging Face's safetensors to ours) and what a model's inputs are: how they
are prepared (:mod:`.preprocessing`, recorded with the weights in every checkpoint) and how large an image may be
(:mod:`.image_size`).

Importing it imports no torch (the names come from :mod:`.archs`): the command lines list the
architectures before torch is loaded.  The builder and the weight loaders import it when first used.

May import: records/ (a weights file is read and its hash checked there), errors.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from image_classification.errors import UserError
from image_classification.models.archs import (FAMILY_OPTIONS, MODEL_CONFIGS, all_archs, designed_image_size,
                                               family)

if TYPE_CHECKING:
    from torch import nn

__all__ = ["MODEL_CONFIGS", "OPTIONS", "arch_options", "build_model", "check_options", "default_image_size",
           "list_models", "load_weights"]

CONV_INIT_MODES = ("fan_in", "fan_out")
OPTIONS = tuple(dict.fromkeys(name for names in FAMILY_OPTIONS.values() for name in names))
FAMILY_NAMES = {"resnet": "a ResNet", "efficientnet": "an EfficientNet"}
RANGES = {  # the EfficientNets' numeric options: (what a value must be, whether it is)
    "dropout": ("from 0 up to (not including) 1", lambda v: 0 <= v < 1),
    "survival_prob": ("above 0 and at most 1", lambda v: 0 < v <= 1),
    "bn_momentum": ("from 0 to 1", lambda v: 0 <= v <= 1),
    "bn_epsilon": ("a positive number", lambda v: v > 0 and math.isfinite(v)),
}


def list_models() -> list[str]:
    """Names accepted by ``build_model`` (and the CLI's ``--arch``), both families'."""
    return all_archs()


def _check_arch(arch: str) -> None:
    if family(arch) is None:
        raise UserError(f"Unknown architecture '{arch}'; choose one of: {', '.join(all_archs())}.")


def default_image_size(arch: str) -> int:
    """Training and validation crop size the architecture was designed for (224; EfficientNet-B1 up: more)."""
    _check_arch(arch)
    return designed_image_size(arch)


def arch_options(arch: str) -> tuple[str, ...]:
    """The options ``build_model`` takes for ``arch`` (beside ``num_classes``)."""
    _check_arch(arch)
    return FAMILY_OPTIONS[family(arch)]


def check_options(arch: str, options: dict) -> None:
    """A :class:`UserError` for an unknown option, a value out of its range, or an option of the other family
    given a value (None is none, and False asks nothing)."""
    _check_arch(arch)
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise UserError(f"Unknown model option(s) {', '.join(unknown)}; the options are: {', '.join(OPTIONS)}.")
    accepted = arch_options(arch)
    foreign = [k for k, v in options.items() if k not in accepted and v is not None and v is not False]
    if foreign:
        verb = "does" if len(foreign) == 1 else "do"
        raise UserError(f"{' and '.join(foreign)} {verb} not apply to {arch} ({FAMILY_NAMES[family(arch)]}), "
                        f"whose options are {', '.join(accepted)}; leave {'it' if verb == 'does' else 'them'} out.")
    if options.get("model_config") not in (None, *MODEL_CONFIGS):
        raise UserError(f"Unknown model config '{options['model_config']}'; "
                        f"choose one of: {', '.join(MODEL_CONFIGS)}.")
    if options.get("conv_init") not in (None, *CONV_INIT_MODES):
        raise UserError(f"Unknown conv_init '{options['conv_init']}'; choose one of: {', '.join(CONV_INIT_MODES)}.")
    for name, (words, fits) in RANGES.items():
        value = options.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or not fits(value)):
            raise UserError(f"{name} must be {words}, got {value!r}.")


def build_model(arch: str, num_classes: int = 1000, model_config: str | None = None, **options) -> nn.Module:
    """A freshly initialised ``arch``; ``options`` are those of its family (:func:`arch_options`), None for
    the architecture's default; :func:`check_options` holds them to their ranges and family.

    ResNets: ``model_config`` (default ``classic``) picks the conv init mode (see ``MODEL_CONFIGS``), an
    explicit ``conv_init`` wins.  EfficientNets: ``conv_init`` (fan_in), ``bn_momentum`` (0.01), ``bn_epsilon``
    (1e-3), ``dropout`` and ``survival_prob`` (the architecture's row).
    """
    given = {k: v for k, v in {"model_config": model_config, **options}.items() if v is not None}
    check_options(arch, given)
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1:
        raise UserError(f"The number of classes must be a positive integer, got {num_classes!r}.")
    settings = {k: v for k, v in given.items() if k in arch_options(arch)}
    if family(arch) == "efficientnet":
        from image_classification.models.efficientnet import efficientnet  # deferred: torch

        return efficientnet(arch, num_classes, **settings)
    conv_init = settings.get("conv_init", MODEL_CONFIGS[settings.get("model_config", "classic")]["conv_init"])
    from image_classification.models.resnet import resnet  # deferred: torch (see the module's docstring)

    return resnet(arch, num_classes, conv_init, bool(settings.get("last_bn_0_init", False)))


def __getattr__(name: str):
    """``load_weights``, from :mod:`.weights` (which imports torch) when first asked for."""
    if name == "load_weights":
        from image_classification.models import weights  # deferred: torch

        return getattr(weights, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
