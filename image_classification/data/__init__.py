"""Data backends.  ``get_loaders`` is the one entry point; each backend returns :class:`Loader` objects."""

from __future__ import annotations

import argparse

from ..errors import UserError
from ..runtime import Runtime
from .common import DeviceLoader, Loader, val_resize_size

__all__ = ["get_loaders", "resolve_backend", "Loader", "DeviceLoader", "val_resize_size", "dali_available"]


def dali_available() -> bool:
    try:
        import nvidia.dali  # noqa: F401
    except ImportError:
        return False
    return True


def resolve_backend(requested: str | None, log=print) -> str:
    """The backend to use: the requested one, or dali-cpu when DALI is installed, else pytorch."""
    if requested is not None:
        return requested
    return "dali-cpu" if dali_available() else "pytorch"


def get_loaders(
    args: argparse.Namespace, runtime: Runtime, image_size: int, *, want_train: bool, want_val: bool
) -> tuple[Loader | None, Loader | None, list[str]]:
    """The train and val loaders that ``args`` asks for (None for the ones not wanted), and the class
    folder names in label order (empty for synthetic data)."""
    backend = args.data_backend
    if backend == "synthetic":
        from .synthetic import synthetic_loaders

        return (*synthetic_loaders(args, runtime, image_size, want_train=want_train, want_val=want_val), [])
    from .folder import check_dataset

    classes = check_dataset(args.data, args.num_classes, want_train=want_train, want_val=want_val)
    if backend == "pytorch":
        from .folder import folder_loaders as build
    elif backend in ("dali-cpu", "dali-gpu"):
        from .dali import dali_loaders as build
    else:
        raise UserError(f"unknown data backend {backend!r}")
    return (*build(args, runtime, image_size, classes, want_train=want_train, want_val=want_val), classes)
