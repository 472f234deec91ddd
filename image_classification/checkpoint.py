"""Training checkpoints: what they hold, how they are written (atomically) and read (as data only).

A checkpoint is a dict of tensors and plain Python values, loadable with ``weights_only=True``:

* ``epoch``: number of finished epochs (resume starts there); ``arch``; ``model_options``
  (``num_classes``, ``model_config``, ...); ``best_prec1``;
* ``state_dict``: the model in the native layout, no ``module.`` prefix; ``state_dict_ema`` with EMA;
* ``optimizer``, ``scaler`` (loss-scaler state, or None), ``optimizer_steps`` (for the EMA warm-up);
* ``rng``: every random generator (python, numpy, torch CPU, torch CUDA) and ``seed``.
"""

from __future__ import annotations

import os
import random
import re
import shutil
import tempfile
from pathlib import Path

import numpy as np
import torch

from .errors import UserError
from .models.weights import load_checkpoint_file

__all__ = [
    "save_atomic",
    "copy_atomic",
    "load_checkpoint",
    "rng_state",
    "restore_rng_state",
    "unwrap",
    "prune_epoch_checkpoints",
    "epoch_checkpoint_name",
]


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The plain model under DDP, torch.compile and similar wrappers."""
    while True:
        if hasattr(model, "module") and isinstance(model.module, torch.nn.Module):
            model = model.module
        elif hasattr(model, "_orig_mod"):
            model = model._orig_mod
        else:
            return model


def _umask_mode() -> int:
    current = os.umask(0)
    os.umask(current)
    return 0o666 & ~current


def save_atomic(state: dict, path: str | os.PathLike) -> None:
    """Write ``state`` to ``path`` through a temporary file and a rename: never a half-written file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            torch.save(state, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, _umask_mode())  # mkstemp makes 0600 files; give the usual permissions
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def copy_atomic(source: str | os.PathLike, target: str | os.PathLike) -> None:
    """Copy a finished checkpoint under another name, atomically."""
    target = Path(target)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    try:
        shutil.copyfile(source, tmp)
        os.chmod(tmp, _umask_mode())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load_checkpoint(path: str | os.PathLike) -> dict:
    """Read a training checkpoint (data only); a file that is not one is a :class:`UserError`."""
    state = load_checkpoint_file(path)
    if not isinstance(state, dict) or "state_dict" not in state or "epoch" not in state:
        raise UserError(f"{path} is not a training checkpoint (no 'state_dict' and 'epoch'); "
                        "use --pretrained-weights for a weights-only file")
    return state


def rng_state() -> dict:
    """Every RNG the training touches, as tensors and plain values."""
    np_state = np.random.get_state()
    state = {
        "python": random.getstate(),
        "numpy": {
            "name": np_state[0],
            "keys": torch.from_numpy(np_state[1].astype(np.int64)),
            "pos": int(np_state[2]),
            "has_gauss": int(np_state[3]),
            "cached_gaussian": float(np_state[4]),
        },
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }
    return state


def restore_rng_state(state: dict) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    np_state = state["numpy"]
    np.random.set_state(
        (np_state["name"], np_state["keys"].numpy().astype(np.uint32), np_state["pos"],
         np_state["has_gauss"], np_state["cached_gaussian"])
    )
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available() and len(state["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(state["cuda"])


def epoch_checkpoint_name(epoch_index: int) -> str:
    """The per-epoch file kept by --gather-checkpoints; ``epoch_index`` is the 0-based finished epoch."""
    return f"checkpoint_{epoch_index:04}.pth.tar"


_EPOCH_FILE = re.compile(r"checkpoint_(\d{4,})\.pth\.tar$")


def prune_epoch_checkpoints(workspace: str | os.PathLike, keep: int) -> None:
    """Keep the newest ``keep`` per-epoch files (all of them when ``keep`` < 0, none when 0)."""
    if keep < 0:
        return
    files = sorted(
        (p for p in Path(workspace).iterdir() if _EPOCH_FILE.match(p.name)),
        key=lambda p: int(_EPOCH_FILE.match(p.name).group(1)),
    )
    for stale in files[: max(len(files) - keep, 0)]:
        stale.unlink(missing_ok=True)
