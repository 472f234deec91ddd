"""Data backends.  ``get_loaders`` is the one entry point; each backend returns :class:`Loader` objects.

The package imports torch only when a name that needs it is first asked for (PEP 562), so that the modules
that need none, ``python -m image_classification.data.pack -h`` among them, answer without it.  Beside the
backends: the torchvision transforms (:mod:`.transforms`), the image files (:mod:`.files`), the JPEG decoders
(:mod:`.decoders`, and :mod:`.reduced`: a JPEG decoded at a reduced scale), and the dataset's check and pack
commands.

May import: arguments/ (the pack command's parser), models/ (the preprocessing, the size rule of images),
system/, records/, errors, seeding.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import TYPE_CHECKING

from ..errors import UserError
from ..system import machine

if TYPE_CHECKING:
    import torch

    from ..system.runtime import Runtime
    from .common import DataConfig, Loader

__all__ = ["get_loaders", "resolve_backend", "default_backend_notice", "augmentation_notice",
           "decoder_notice", "gpu_decoding_problem", "DataConfig", "Loader", "DeviceLoader", "ShardSampler",
           "val_resize_size", "dali_available"]
_LAZY = {"DataConfig": ".common", "DeviceLoader": ".common", "Loader": ".common", "ShardSampler": ".common",
         "val_resize_size": "..models.preprocessing"}  # name: the module that defines it


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def dali_available() -> bool:
    try:
        import nvidia.dali  # noqa: F401
    except ImportError:
        return False
    return True


def gpu_decoding_problem() -> str | None:
    """Why no JPEG decoder (torchvision's, TorchCodec's) decodes on this process's CUDA device (None when one does)."""
    from .device_decode import gpu_decoding_problem as problem  # deferred: torch

    return problem()


def resolve_backend(requested: str | None, is_cuda: bool = False) -> str:
    """The backend to use: the requested one; else dali-cpu where DALI is installed (as in the reference); else, on
    CUDA, pytorch-gpu where a JPEG decoder works on the GPU (the fastest installed); else pytorch."""
    if requested is not None:
        return requested
    if dali_available():
        return "dali-cpu"
    if is_cuda and gpu_decoding_problem() is None:
        return "pytorch-gpu"
    return "pytorch"


def default_backend_notice(backend: str, is_cuda: bool) -> str:
    """The start-up line of a run that gave no --data-backend: which one it takes, and why."""
    if backend.startswith("dali"):
        why = "where NVIDIA DALI is installed"
    elif backend == "pytorch-gpu":
        why = "on CUDA without NVIDIA DALI: JPEGs decoded and augmented on the GPU by torchvision"
    elif is_cuda:
        why = f"on CUDA without NVIDIA DALI, where no JPEG decoder works on the GPU ({gpu_decoding_problem()})"
    else:
        why = "without NVIDIA DALI"
    return f"=> data backend: {backend}, the default {why} (--data-backend picks another)"


# --augmentation's implementation on each backend, and where it runs.
_POLICY_OWNER = {"dali-cpu": "DALI's auto_aug", "dali-gpu": "DALI's auto_aug", "pytorch": "torchvision's",
                 "pytorch-gpu": "torchvision's"}
_POLICY_PLACE = {"dali-cpu": "on the CPU in DALI's threads", "dali-gpu": "on the GPU",
                 "pytorch": "on the CPU in the loader workers",
                 "pytorch-gpu": "on the GPU, each image's operations drawn in the loader workers"}
# The two AutoAugment ImageNet policies differ: DALI's is the reference's, sub-policy for sub-policy
# (TensorFlow's EfficientNet policy, with SolarizeAdd and TranslateY); torchvision's, the AutoAugment paper's.
_AUTOAUGMENT_POLICY = {
    "DALI's auto_aug": ", with the reference's ImageNet policy",
    "torchvision's": ", with the AutoAugment paper's ImageNet policy; the reference's policy is DALI's "
                     "(--data-backend dali-cpu or dali-gpu)"}


def augmentation_notice(backend: str, augmentation: str | None) -> str | None:
    """The start-up line of a training run with ``--augmentation``: whose implementation runs it on
    ``backend`` and where (for AutoAugment, which ImageNet policy); None without one."""
    if augmentation is None:
        return None
    if backend == "synthetic":
        return f"=> --augmentation {augmentation}: not applied, the synthetic batches are not augmented"
    owner = _POLICY_OWNER[backend]
    policy = _AUTOAUGMENT_POLICY[owner] if augmentation == "autoaugment" else ""
    return f"=> --augmentation {augmentation}: {owner}, {_POLICY_PLACE[backend]}{policy}"


def decoder_notice(backend: str, device: torch.device, decode_scale: str = "auto") -> str | None:
    """The start-up line naming the JPEG decoder ``backend`` uses on ``device`` (None for synthetic data)."""
    if backend == "synthetic":
        return None
    from .decoders import decoder_notice as notice  # deferred: torch

    return notice(backend, device, decode_scale)


def get_loaders(
    config: DataConfig, runtime: Runtime, classes: list[str] | None = None, *, want_train: bool, want_val: bool
) -> tuple[Loader | None, Loader | None]:
    """The train and val loaders ``config`` describes (None for the ones not wanted).

    ``classes``: the class folder names in label order, as the run's set-up checked them; None scans
    the dataset here (a script that has not).
    """
    config = dataclasses.replace(config, workers=min(config.workers, machine.cores()))  # torch warns beyond
    if config.backend == "synthetic":
        from .synthetic import synthetic_loaders  # deferred: torch, as every backend below

        return synthetic_loaders(config, runtime, want_train=want_train, want_val=want_val)
    from .layout import check_dataset, reading_dataset  # deferred: numpy and PIL

    if classes is None:
        classes = check_dataset(config.data, config.num_classes, want_train=want_train, want_val=want_val)
    if config.backend == "pytorch":
        from .folder import folder_loaders as build  # deferred: torch
    elif config.backend == "pytorch-gpu":
        from .device_decode import device_decode_loaders as build  # deferred: torch
    elif config.backend in ("dali-cpu", "dali-gpu"):
        from .dali import dali_loaders as build  # deferred: torch, DALI when it runs
    else:
        raise UserError(f"unknown data backend {config.backend!r}")
    with reading_dataset():  # the scan of a folder, the shards' opening: a stop signal ends the wait
        return build(config, runtime, classes, want_train=want_train, want_val=want_val)
