"""classify.py ``--runtime onnxruntime``: the model exported to ONNX once, cached by a hash of its weights,
and run by ONNX Runtime on the CPU.

The cache key covers everything the exported graph depends on: every tensor of the state dict (names,
dtypes, shapes and bytes), the model's class and the crop size, the exporter's opset and the versions of
torch and onnx. A changed weights file therefore exports again; an unchanged one is read back. A file is
written under a temporary name and renamed into place, so two processes exporting the same weights at
once both end with a complete file, and an interrupted export leaves no half file behind; a cached file
damaged later (a disk error, another program) fails to load and is exported again. The cache holds
ONNX graphs, which ONNX Runtime interprets as data: nothing in them is executed as Python.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path
from typing import Callable

import torch
from torch import nn

from . import machine
from .errors import UserError

OPSET = 17
CACHE_ENV = "IMAGE_CLASSIFICATION_CACHE"


def require_onnxruntime(what: str) -> None:
    """One line, before any work, where the onnx extra is missing."""
    for module in ("onnx", "onnxruntime"):
        try:
            __import__(module)
        except ImportError as error:
            raise UserError(f"{what} needs the onnx extra ({error}); pip install .[onnx] in the repository, or "
                            "pip install onnx onnxscript onnxruntime") from None


def cache_dir() -> Path:
    """``$IMAGE_CLASSIFICATION_CACHE/onnx``, else ``$XDG_CACHE_HOME/image_classification/onnx``, else
    ``~/.cache/image_classification/onnx``."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]) / "onnx"
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "image_classification" / "onnx"


def weights_key(model: nn.Module, image_size: int) -> str:
    """A hex digest of what the exported graph depends on (see the module docstring)."""
    import onnx

    digest = hashlib.sha256()
    digest.update(f"{type(model).__module__}.{type(model).__qualname__}|{image_size}|opset {OPSET}|"
                  f"torch {torch.__version__}|onnx {onnx.__version__}".encode())
    for name, tensor in model.state_dict().items():
        tensor = tensor.detach().cpu().contiguous().reshape(-1)
        digest.update(f"|{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        digest.update(tensor.view(torch.uint8).numpy().tobytes() if tensor.numel() else b"")
    return digest.hexdigest()[:32]


def cached_export(model: nn.Module, image_size: int, log: Callable[[str], None]) -> Path:
    """The ONNX file of ``model`` (FP32, NCHW, any batch size) from the cache, exported first if missing."""
    from .export import export_onnx

    folder = cache_dir()
    path = folder / f"{weights_key(model, image_size)}.onnx"
    if path.is_file():
        return path
    try:
        folder.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(prefix=f".{path.stem}.", suffix=".onnx.tmp", dir=folder)
        os.close(handle)
    except OSError as error:
        raise UserError(f"cannot write the ONNX cache in {folder} ({error.strerror or error}); set "
                        f"{CACHE_ENV} to a writable folder") from None
    log(f"note: exporting the model to ONNX once, cached as {path}")
    try:
        example = torch.zeros(1, 3, image_size, image_size)
        export_onnx(model.float().eval(), example, temporary, dynamic_batch=True, opset=OPSET)
        os.replace(temporary, path)
    except OSError as error:
        raise UserError(f"cannot write the ONNX cache in {folder} ({error.strerror or error}); set "
                        f"{CACHE_ENV} to a writable folder") from None
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)
    return path


def session(path: str | os.PathLike, threads: int | None = None):
    """An ONNX Runtime CPU session with every graph optimisation, on ``threads`` (default: this machine's
    cores) intra-op threads."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = threads or machine.cores()
    return onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


class OnnxModel:
    """Called like the eval-mode model: float32 NCHW images in, logits out (a CPU tensor)."""

    def __init__(self, model: nn.Module, image_size: int, log: Callable[[str], None]):
        require_onnxruntime("--runtime onnxruntime")
        path = cached_export(model, image_size, log)
        try:
            self._session = session(path)
        except Exception as error:  # onnxruntime's own error types: a cached file damaged since it was written
            log(f"note: the cached {path} does not load ({str(error)[:80]}); exporting it again")
            path.unlink(missing_ok=True)
            self._session = session(cached_export(model, image_size, log))

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        batch = images.detach().cpu().float().contiguous().numpy()
        return torch.from_numpy(self._session.run(["output"], {"input": batch})[0])
