"""Checkpoint files: written atomically and sealed with a content hash, read as data only.

A training checkpoint is a dict of tensors and plain values (``weights_only=True`` loads it); what it
holds is :meth:`image_classification.train.engine.Engine.state_dict`'s business, defined there once. Here:

* :func:`save_checkpoint` seals the dict with its SHA-256 (:mod:`image_classification.records.integrity`) and
  writes it through a temporary file, fsync and rename, so a kill never leaves a torn file and a full
  disk leaves the previous file intact (:class:`StorageError`, the temporary file removed); a signal whose
  handler raises (a second Ctrl-C) is acted on once the file is in place, never inside torch.save;
* :func:`load_checkpoint_file` reads any PyTorch checkpoint or weights file as data only, and refuses with one
  line a file that would build objects, an ONNX model, a safetensors file (:mod:`.safetensors_file` reads
  those), a torn file or one whose hash does not match (a damaged copy); :func:`load_checkpoint` also wants a
  training checkpoint's entries;
* :func:`save_weights` writes a ``.pth``, or a safetensors file for a ``.safetensors`` path;
* the per-epoch files kept by ``--gather-checkpoints`` and the RNG snapshot of a process.

torch is imported by the functions that read, write or seal tensors, not with the module: the workspace's
checks use the names defined here before main.py imports torch (seconds), so that a refusal is said at once.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import random
import re
import shutil
import signal
import tempfile
import warnings
from pathlib import Path
from typing import BinaryIO, Callable, Iterator

import numpy as np

from ..errors import StorageError, UserError
from .safetensors_file import SUFFIX as SAFETENSORS_SUFFIX
from .safetensors_file import is_safetensors, safetensors_bytes

FORMAT = 2  # 1: no hash, one RNG snapshot; 2: sealed, one RNG snapshot per rank
BEST_NAME = "model_best.pth.tar"
TEMP_SUFFIX = ".tmp"
_EPOCH_FILE = re.compile(r"checkpoint_(\d{4,})\.pth\.tar$")


# ------------------------------------------------------------------------------------------------
# Writing
# ------------------------------------------------------------------------------------------------
def _umask_mode() -> int:
    current = os.umask(0)
    os.umask(current)
    return 0o666 & ~current


def _storage_error(path: Path, error: OSError | None, fallback: str = "") -> StorageError:
    reason = (error.strerror or str(error) or type(error).__name__) if error is not None else fallback
    return StorageError(f"could not write {path}: {reason}; the previous {path.name} (if any) is intact")


# torch.save's zip writer (caffe2's inline_container.cc, class PytorchStreamWriter) reports a write that
# failed under it, a full disk among them, as a RuntimeError: "[enforce fail at inline_container.cc:672]
# . unexpected pos 64 vs 0" or "PytorchStreamWriter failed writing file data/0: file write failed".
_ZIP_WRITER_FAILURE = re.compile(r"inline_container\.cc|PytorchStreamWriter")


# The signals whose handlers may raise (image_classification.system.signals: a second Ctrl-C's KeyboardInterrupt,
# stop_raises' Stopped), held while a file is written.
_HELD_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGUSR1") if hasattr(signal, name))


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """Within the block the signals handled in Python are only noted; once it ends, their handlers get them, in
    the order they came, so one that raises does so after the block, never inside it.

    Raised inside torch.save, an exception that cuts its zip writer's closing short leaves the writer unfinished,
    and its destructor, writing to the closed file, aborts the process (std::terminate, exit 134).  A signal
    with the default action (a kill) is not held; outside the main thread, where no handler runs, none is.
    """
    held: list[int] = []
    previous = {}
    try:
        try:
            for number in _HELD_SIGNALS:
                if callable(signal.getsignal(number)):
                    previous[number] = signal.signal(number, lambda signum, frame: held.append(signum))
        except ValueError:  # not the main thread
            pass
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
        for number in held:
            signal.raise_signal(number)  # the handler runs before this returns


def _zip_writer_failure(error: RuntimeError) -> tuple[OSError | None, str] | None:
    """(the OSError behind it, if Python saw one; torch's words) when ``error`` is the zip writer failing,
    None for any other RuntimeError, which stays a bug to show."""
    text = str(error)
    if not _ZIP_WRITER_FAILURE.search(text):
        return None
    cause = error.__cause__ or error.__context__
    while cause is not None and not isinstance(cause, OSError):
        cause = cause.__cause__ or cause.__context__
    words = text.splitlines()[0].split("] ", 1)[-1].strip(" .")[:100]
    return cause, f"the checkpoint writer failed ({words}): is the disk full?"


def longest_name(folder: str | os.PathLike) -> int:
    """The longest file name, in bytes, that the file system of ``folder`` takes (255 where it won't say);
    asked of the nearest folder that exists, so that names can be checked before anything is created."""
    for existing in (Path(folder).absolute(), *Path(folder).absolute().parents):
        if existing.is_dir():
            try:
                return os.pathconf(existing, "PC_NAME_MAX")
            except (OSError, ValueError):
                break
    return 255


def temporary_name(path: Path) -> str:
    """The prefix of ``path``'s temporary files: hidden, beside it, recognisable by the workspace.

    A long name is cut so that the temporary (prefix, 8 random characters, ``.tmp``) still fits the file
    system: any name the file system takes can be saved.
    """
    room = longest_name(path.parent) - len("..") - 8 - len(TEMP_SUFFIX)
    return f".{os.fsdecode(os.fsencode(path.name)[:room])}."


def write_atomic(path: str | os.PathLike, write: Callable[[BinaryIO], None]) -> None:
    """Write ``path`` through a temporary file beside it, fsync and rename: never a half-written file.

    Any OSError (a full disk, a read-only folder), and torch.save's zip writer failing on one, removes
    the temporary file, leaves ``path`` as it was and becomes a :class:`StorageError`.  Stop signals are held
    meanwhile (:func:`signals_held`): a second Ctrl-C during the write stops the process once ``path`` is in place.
    """
    path = Path(path)
    tmp = None
    with signals_held():
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=temporary_name(path), suffix=TEMP_SUFFIX, dir=path.parent)
            with os.fdopen(fd, "wb") as handle:
                write(handle)
                handle.flush()
                os.fsync(handle.fileno())
            os.chmod(tmp, _umask_mode())  # mkstemp makes 0600 files; give the usual permissions
            os.replace(tmp, path)
            tmp = None
            _fsync_folder(path.parent)
        except (OSError, RuntimeError) as error:
            if isinstance(error, OSError):
                raise _storage_error(path, error) from None
            failure = _zip_writer_failure(error)
            if failure is None:
                raise
            raise _storage_error(path, *failure) from None
        finally:
            if tmp is not None:
                Path(tmp).unlink(missing_ok=True)


def _fsync_folder(folder: Path) -> None:
    """Make the rename itself durable (best effort: not every file system can open a folder)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def to_host(obj):
    """``obj`` (dicts, lists, tuples, tensors, plain values) with every device tensor copied to the host.

    One pass: each GPU tensor goes into pinned memory without blocking, then one synchronisation waits
    for all of them. Hashing and ``torch.save`` then both read these copies, where they would otherwise
    each copy every tensor again, synchronously (about 800 copies per save with EMA). Host tensors are
    kept as they are; a state dict's ``_metadata`` goes along.
    """
    import torch  # deferred: see the module docstring

    devices: set[torch.device] = set()

    def copy(value):
        if isinstance(value, torch.Tensor):
            if value.device.type == "cpu":
                return value
            devices.add(value.device)
            host = torch.empty_like(value, device="cpu", pin_memory=value.is_cuda)
            return host.copy_(value.detach(), non_blocking=value.is_cuda)
        if isinstance(value, dict):
            result = type(value)((key, copy(item)) for key, item in value.items())
            metadata = getattr(value, "_metadata", None)
            if metadata is not None:
                result._metadata = metadata
            return result
        if isinstance(value, (list, tuple)):
            return type(value)(copy(item) for item in value)
        return value

    result = copy(obj)
    for device in devices:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    return result


def save_checkpoint(payload: dict, path: str | os.PathLike) -> None:
    """Copy ``payload`` to the host once, seal it with its content hash and write it atomically."""
    import torch  # deferred, as integrity's (torch) import: see the module docstring

    from .integrity import seal_checkpoint  # deferred: torch (integrity imports it)

    sealed = seal_checkpoint({"format": FORMAT, **to_host(payload)})
    write_atomic(path, lambda handle: torch.save(sealed, handle))


def save_weights(state_dict: dict, description: dict, path: str | os.PathLike) -> None:
    """Write a plain state dict that records ``description`` (arch, classes, preprocessing) and its hash: a
    ``.pth`` (torch.save), or a safetensors file where ``path`` ends in ``.safetensors``."""
    if Path(path).suffix.lower() == SAFETENSORS_SUFFIX:
        data = safetensors_bytes(state_dict, description)
        write_atomic(path, lambda handle: handle.write(data))
        return
    import torch  # deferred, as integrity's (torch) import: see the module docstring

    from .integrity import seal_state_dict  # deferred: torch (integrity imports it)

    sealed = seal_state_dict(state_dict, description)
    write_atomic(path, lambda handle: torch.save(sealed, handle))


def copy_atomic(source: str | os.PathLike, target: str | os.PathLike) -> None:
    """Copy a finished checkpoint under another name, atomically."""
    def copy(handle: BinaryIO) -> None:
        with open(source, "rb") as original:
            shutil.copyfileobj(original, handle, length=16 << 20)

    write_atomic(target, copy)


# ------------------------------------------------------------------------------------------------
# Reading
# ------------------------------------------------------------------------------------------------
def load_checkpoint_file(path: str | os.PathLike) -> dict:
    """``torch.load`` a checkpoint safely (tensors and plain containers only) onto the CPU."""
    import torch  # deferred, as integrity's (torch) import: see the module docstring

    from .integrity import verify  # deferred: torch (integrity imports it)

    path = Path(path)
    if not path.is_file():
        raise UserError(f"Checkpoint file '{path}' does not exist or is not a file; NVIDIA's published "
                        "weights come from the NVIDIA NGC catalog, https://catalog.ngc.nvidia.com "
                        "(classify.py --pretrained downloads them).")
    if is_safetensors(path):
        raise UserError(f"'{path}' is a safetensors file: it holds weights, not a training checkpoint; pass it "
                        "as --pretrained-weights (main.py) or --weights (classify.py, model2onnx.py)")
    try:
        with warnings.catch_warnings():  # a protocol-4 pickle warns before it is refused: one line only
            warnings.filterwarnings("ignore", message="Detected pickle protocol")
            obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises many types for foreign, truncated or malicious files
        refused = _refused_global(e)
        if refused is not None:
            raise UserError(f"'{path}' was refused: it would build {refused}, which is neither a tensor nor "
                            "a plain container; checkpoints are loaded as data only, never as code (a file "
                            "from a source you trust can be saved again as a plain state dict).") from None
        if _is_onnx(path):
            raise UserError(f"'{path}' is an ONNX model, not PyTorch weights: pass the weights it was exported "
                            "from and --runtime onnxruntime, which runs them in ONNX Runtime (exported once and "
                            "cached), e.g. classify.py --weights model.pth --runtime onnxruntime --image IMAGE; "
                            "the ONNX file itself runs in onnxruntime.InferenceSession or Triton Inference "
                            "Server.") from None
        raise UserError(f"'{path}' could not be read as a PyTorch checkpoint of tensors ({_reason(e)}); "
                        "checkpoints are loaded as data only, never as code.") from e
    if not isinstance(obj, dict):
        raise UserError(f"'{path}' holds a {type(obj).__name__}, not a state dict or checkpoint dict.")
    if verify(obj) is False:
        raise UserError(f"'{path}' is damaged: its content does not match the hash recorded when it was "
                        "written; use another copy or an older checkpoint.")
    return obj


# The tags an ONNX ModelProto's second field may have: producer_name .. opset_import, metadata_props, training_info,
# functions (protobuf writes fields in number order, ir_version first)
_ONNX_SECOND_TAGS = {0x12, 0x1A, 0x22, 0x28, 0x32, 0x3A, 0x42, 0x72, 0xA2, 0xCA}


def _is_onnx(path: Path) -> bool:
    """Whether ``path`` is named as an ONNX model or opens as one: ir_version (field 1, a small varint), then
    another field of ModelProto."""
    if path.suffix.lower() == ".onnx":
        return True
    try:
        with open(path, "rb") as handle:
            head = handle.read(3)
    except OSError:
        return False
    return len(head) == 3 and head[0] == 0x08 and 0 < head[1] < 0x80 and head[2] in _ONNX_SECOND_TAGS


def _refused_global(error: Exception) -> str | None:
    """The function or class that a file asked torch's data-only unpickler to build (``posix.system`` in
    a malicious file), when that is what it refused: "GLOBAL posix.system" in the words of newer torch,
    "Unsupported class posix.system" in torch 2.3's."""
    text = str(error) if isinstance(error, pickle.UnpicklingError) else ""
    found = re.search(r"(?:GLOBAL|Unsupported class) ([\w.]+\w)", text)
    return found.group(1)[:80] if found else None


def _reason(error: Exception) -> str:
    """What went wrong, in one short line.  torch's data-only refusals open with paragraphs of advice
    (among them to pass weights_only=False, exactly what must not be done with such a file): the
    unpickler's own words are in the exception they replaced, or after "WeightsUnpickler error:"."""
    if isinstance(error, pickle.UnpicklingError) and isinstance(error.__context__, pickle.UnpicklingError):
        error = error.__context__
    text = str(error)
    found = re.search(r"WeightsUnpickler error:\s*(.+)", text)
    line = found.group(1) if found else (text.strip().splitlines() or [type(error).__name__])[0]
    return line.strip()[:160]


def load_checkpoint(path: str | os.PathLike) -> dict:
    """Read a training checkpoint (data only, hash verified); a file that is not one is a :class:`UserError`."""
    state = load_checkpoint_file(path)
    if not isinstance(state, dict) or "state_dict" not in state or "epoch" not in state:
        raise UserError(f"{path} is not a training checkpoint (no 'state_dict' and 'epoch'); "
                        "use --pretrained-weights for a weights-only file")
    return state


# ------------------------------------------------------------------------------------------------
# Random generators of one process
# ------------------------------------------------------------------------------------------------
def rng_state() -> dict:
    """Every RNG the training touches in this process, as tensors and plain values."""
    import torch  # deferred: see the module docstring

    np_state = np.random.get_state()
    return {
        "python": random.getstate(),
        "numpy": {
            "name": np_state[0],
            "keys": torch.from_numpy(np_state[1].astype(np.int64)),
            "pos": int(np_state[2]),
            "has_gauss": int(np_state[3]),
            "cached_gaussian": float(np_state[4]),
        },
        "torch": torch.get_rng_state(),
        # the generators of a process that uses CUDA (initialising it only to read them would take a GPU's memory)
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else [],
    }


def restore_rng_state(state: dict) -> None:
    import torch  # deferred: see the module docstring

    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    np_state = state["numpy"]
    np.random.set_state(
        (np_state["name"], np_state["keys"].numpy().astype(np.uint32), np_state["pos"],
         np_state["has_gauss"], np_state["cached_gaussian"])
    )
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_initialized() and len(state["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(state["cuda"])


# ------------------------------------------------------------------------------------------------
# Per-epoch files
# ------------------------------------------------------------------------------------------------
def position_text(epoch: int, batch: int = 0) -> str:
    """Where a checkpoint stands, its epochs counted from 1 as people count them (a checkpoint's ``epoch`` is the
    count of epochs finished): ``end of epoch 5``, or ``epoch 5, batch 1200`` (four finished, 1,200 batches of
    the fifth)."""
    if batch:
        return f"epoch {epoch + 1}, batch {batch}"
    return f"end of epoch {epoch}" if epoch else "before the first epoch"


def epoch_checkpoint_name(epoch_index: int) -> str:
    """The per-epoch file kept by --gather-checkpoints; ``epoch_index`` is the 0-based finished epoch."""
    return f"checkpoint_{epoch_index:04}.pth.tar"


def is_epoch_checkpoint_name(name: str) -> bool:
    return _EPOCH_FILE.match(name) is not None


def epoch_checkpoint_index(name: str) -> int | None:
    """The 0-based finished epoch a per-epoch file's name gives (None for another name)."""
    match = _EPOCH_FILE.match(name)
    return int(match.group(1)) if match else None


def epoch_checkpoints(workspace: str | os.PathLike) -> list[Path]:
    """The per-epoch files in ``workspace``, oldest epoch first."""
    return sorted(
        (p for p in Path(workspace).iterdir() if _EPOCH_FILE.match(p.name)),
        key=lambda p: epoch_checkpoint_index(p.name),
    )


def prune_epoch_checkpoints(workspace: str | os.PathLike, keep: int) -> None:
    """Keep the newest ``keep`` per-epoch files (all of them when ``keep`` < 0, none when 0)."""
    if keep < 0:
        return
    files = epoch_checkpoints(workspace)
    for stale in files[: max(len(files) - keep, 0)]:
        stale.unlink(missing_ok=True)
