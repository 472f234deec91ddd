"""``--runtime onnxruntime``: the model exported to ONNX once (FP32, or int8 with ``--quantize int8``), cached
by a hash of its weights, and run by ONNX Runtime (on the CPU; on CUDA through its CUDA execution provider).

The cache key covers everything the exported graph depends on: every tensor of the state dict (names,
dtypes, shapes and bytes) and :func:`export_description` (the model's class, the crop size, the kind of
model, the opset, the exporter tried first, the versions of torch and onnx; for int8 also the calibration set's
SHA-256, its size and method, ``reduce_range`` and ONNX Runtime's version, see :mod:`.quantization`). A changed
weights file or calibration set therefore exports again; an unchanged one is read back.

The exporter tried first is torch.export's (:mod:`.torch_export`) wherever it can run; a model it fails for is
exported by the TorchScript-based one, said in one line, and that file serves later runs as any other (its
record names the exporter that wrote it), until another torch, whose version the key holds, tries again.  Files
of the TorchScript-based exporter written before torch.export's was the default (opset 17, a record of format 1)
are stale: their key differs, so they are never read, and the export through torch.export gets a file of its own.

A cached model proves it is the export of these weights before it is used. Beside ``<key>.onnx`` lies
``<key>.json``, its record: the description, the SHA-256 and size of the file, and the logits ONNX Runtime
gave for a fixed probe image when it was written (an int8 model's probe: its first calibration image). A
run reads the file's bytes once and runs those bytes only when their hash is the recorded one and their
logits for the probe agree with PyTorch's and with the recorded ones, within the tolerances of the model's
kind (:class:`ModelKind`). Anything else (another model copied over it, a link, a flipped bit, a record of
another export, no record) is said in one line and exported again. The bytes checked are the bytes run, so
a file another process replaces meanwhile cannot slip in, and a link is never followed into somebody else's
file: it is replaced. The proof runs on the CPU whatever device the model then runs on, so that it means
the same everywhere.

Files are written under temporary names that name their writer (pid, process start, machine) and renamed
into place, the model before its record, so that two processes exporting at once both end with a complete
pair, and a model caught between the two renames fails its check and is exported again. What an export
writes on the way (the FP32 graph of an int8 model, ONNX Runtime's own temporaries) goes into a scratch
folder in the cache named the same way (:mod:`..records.scratch`). A SIGTERM or SIGUSR1 during an export stops the
script (exit 75) with its temporaries removed; those of a writer killed outright are removed by the next run
that finds their writer dead. A cache that cannot be written (read-only) and holds a file that fails its
check: this run exports to a temporary folder instead. The cache holds ONNX graphs, which ONNX Runtime
interprets as data: nothing in them is executed as Python.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import os
import re
import secrets
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from torch import nn

from ..errors import UserError
from ..models.quantized import deployable, is_quantized
from ..records.datafile import DataFileError, parse_json, read_regular
from ..records.scratch import STAMP, remove_dead_writers, scratch_folder
from ..records.workspace import writer_stamp
from ..system import machine
from ..system.signals import stop_raises
from .quantization import Quantization, quantize
from .torch_export import (MIN_TRACED_BATCH, OPSET, TORCH_EXPORT, TORCHSCRIPT, export_onnx, probe_image,
                           torch_export_unavailable)

CACHE_ENV = "IMAGE_CLASSIFICATION_CACHE"
RECORD_FORMAT = 2  # 2: the record names the exporter that wrote the file (1: always the TorchScript-based one)
MAX_RECORD_BYTES = 16 << 20  # a record holds the probe's logits: about 25 KB for 1,000 classes

# Largest FP32 logit difference between onnxruntime and PyTorch we accept, relative to the largest logit
# when that exceeds 1: a model whose logits reach 1e5 (a briefly trained or diverging one) cannot agree
# to 1e-3 in absolute terms in float32, and is no less correctly exported for it.
ONNX_TOLERANCE = 1e-3
# Largest int8 logit difference from PyTorch's FP32 on the probe (a calibration image), relative to the
# largest logit whatever its size (int8's error scales with the activations). Measured: the demo's ResNet-18
# differs by at most 0.2 on its 360 val images and 0.03 on its calibration images with minmax and percentile,
# by up to 0.5 with entropy (it clips the largest activations); random tiny and ResNet-18 models on random
# images by up to 0.17; another model of the same architecture by 0.8 or more. Against its own recorded
# logits an int8 model is held to ONNX_TOLERANCE, as an FP32 one: the same bytes compute the same numbers.
INT8_TOLERANCE = 0.6
INT8_FLOOR = 1e-2  # logits all smaller than this: the tolerance is of this size
# A quantization-aware model's int8 graph against its fake-quantized PyTorch twin (:func:`..models.quantized.deployable`,
# its biases on the int32 grid ONNX Runtime's int8 kernels add them on): the same integers, except where float
# rounding puts a value on the other side of a rounding boundary and one activation moves a step.  Measured on
# the probe: 3e-7 and 0.002 of the largest logit on the digits' trained ResNet-18s, 3e-7 on one fine-tuned 2 steps
# from a 2-step checkpoint; on more images such steps add up in a barely trained model (0.09 on 16 random images).
QAT_TOLERANCE = 0.05

# a model or record being written (``.onnx.tmp``, ``.json.tmp``), or the scratch folder of an export (``.tmp``)
_TEMPORARY = re.compile(rf"^\.[0-9a-f]{{32}}\.{STAMP}\.[0-9a-f]{{8}}\.(?:onnx\.|json\.)?tmp$")


@dataclass(frozen=True)
class ModelKind:
    """What a cached model is, and how closely its logits on the probe (``probe`` names it) must follow
    PyTorch's FP32 ones (``tolerance``) and those recorded when it was written (``recorded_tolerance``), both
    relative to the largest logit where that exceeds ``floor`` (1 for the recorded ones): an FP32 export agrees
    with both to rounding; an int8 model follows PyTorch only roughly, and its own record to rounding."""

    name: str
    tolerance: float
    floor: float = 1.0
    recorded_tolerance: float = ONNX_TOLERANCE
    probe: str = "probe image"


FP32 = ModelKind("fp32", ONNX_TOLERANCE)
INT8 = ModelKind("int8", INT8_TOLERANCE, INT8_FLOOR, probe="first calibration image")
QAT = ModelKind("qat-int8", QAT_TOLERANCE, INT8_FLOOR)


def kind_of(quantization: Quantization | None, model: nn.Module | None = None) -> ModelKind:
    """The kind of ``model``'s export: int8 with a ``quantization``, int8 as trained for a quantization-aware
    model, else FP32."""
    if quantization is not None:
        return INT8
    return QAT if model is not None and is_quantized(model) else FP32


def export_ready(model: nn.Module, image_size: int, int8: bool = False) -> nn.Module:
    """The FP32 eval-mode model to export, on the CPU: a quantization-aware model as an int8 engine runs it
    (its BatchNorms folded, :func:`..models.quantized.deployable`), which ``--quantize int8`` would quantize twice."""
    if any(tensor.device.type != "cpu" for tensor in model.state_dict().values()):
        model = copy.deepcopy(model).cpu()  # the probe runs on the CPU; the caller's model stays where it is
    model = model.float().eval()
    if not is_quantized(model):
        return model
    if int8:
        raise UserError("the model was trained quantization-aware: its ONNX export is int8 already; leave out "
                        "--quantize int8")
    return deployable(model, probe_image(image_size))


class _Mismatch(Exception):
    """Why a cached model is not the export of these weights, in the words the notice puts in parentheses."""


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


def logit_limit(tolerance: float, scale: float, floor: float = 1.0) -> float:
    """The largest logit difference accepted: ``tolerance``, times the largest logit ``scale`` above ``floor``."""
    return tolerance * max(floor, scale)


def export_description(model: nn.Module, image_size: int, quantization: Quantization | None = None) -> dict:
    """What an exported graph depends on besides the weights; the cache key and the record hold it."""
    import onnx

    exporter = TORCH_EXPORT if torch_export_unavailable(OPSET) is None else TORCHSCRIPT
    description = {"model": f"{type(model).__module__}.{type(model).__qualname__}", "image_size": image_size,
                   "kind": kind_of(quantization, model).name, "opset": OPSET, "exporter": exporter,
                   "torch": torch.__version__, "onnx": onnx.__version__}
    if quantization is not None:
        description["int8"] = quantization.description()
    return description


def weights_key(model: nn.Module, image_size: int, quantization: Quantization | None = None) -> str:
    """A hex digest of what the exported graph depends on (see the module docstring)."""
    description = export_description(model, image_size, quantization)
    digest = hashlib.sha256(json.dumps(description, sort_keys=True).encode())
    for name, tensor in model.state_dict().items():
        tensor = tensor.detach().cpu().contiguous().reshape(-1)
        digest.update(f"|{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        digest.update(tensor.view(torch.uint8).numpy().tobytes() if tensor.numel() else b"")
    return digest.hexdigest()[:32]


def providers(device: str = "cpu") -> list:
    """ONNX Runtime's execution providers for ``device`` (from :func:`onnx_device`): the CPU's; on cuda
    TensorRT's where present, then CUDA's (FP32 kept FP32: no TF32), then the CPU's for what they leave."""
    if device == "cpu":
        return ["CPUExecutionProvider"]
    import onnxruntime

    chosen: list = []
    if "TensorrtExecutionProvider" in onnxruntime.get_available_providers():
        chosen.append(("TensorrtExecutionProvider", {"trt_engine_cache_enable": "True",
                                                     "trt_engine_cache_path": str(cache_dir() / "tensorrt")}))
    return chosen + [("CUDAExecutionProvider", {"use_tf32": "0"}), "CPUExecutionProvider"]


def onnx_device(choice: str) -> str:
    """Where ONNX Runtime runs for ``--device`` ``choice``: cuda when asked (through ONNX Runtime's CUDA
    execution provider, which onnxruntime-gpu has), and under auto where torch sees a GPU and that provider
    is there; else the CPU."""
    if choice == "cpu":
        return "cpu"
    if not machine.cuda_available():
        if choice == "cuda":
            raise UserError("--device cuda was asked for, but no CUDA device is available")
        return "cpu"
    import onnxruntime

    available = onnxruntime.get_available_providers()
    if "CUDAExecutionProvider" in available:
        return "cuda"
    if choice == "auto":
        return "cpu"
    raise UserError(f"--runtime onnxruntime on CUDA needs ONNX Runtime's CUDA execution provider, which "
                    f"onnxruntime {onnxruntime.__version__} here lacks (it has {', '.join(available)}); pip install "
                    "onnxruntime-gpu in place of onnxruntime, or run on the CPU (--device cpu)")


def session(model: str | os.PathLike | bytes, threads: int | None = None, device: str = "cpu"):
    """An ONNX Runtime session of a file or of its bytes on ``device`` (:func:`providers`), with every graph
    optimisation, on ``threads`` (default: this machine's cores) intra-op threads."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = threads or machine.cores()
    source = model if isinstance(model, bytes) else str(model)
    return onnxruntime.InferenceSession(source, options, providers=providers(device))


def _run(runner, probe: torch.Tensor) -> np.ndarray:
    return runner.run(["output"], {"input": probe.numpy()})[0]


def require_finite(logits: np.ndarray, inputs: str) -> None:
    """A :class:`UserError` where PyTorch's ``logits`` on ``inputs`` hold NaN or inf: nothing could be compared
    with them, and the model's predictions would mean nothing."""
    if not np.isfinite(logits).all():
        raise UserError(f"the model's outputs are NaN or inf on {inputs}; its predictions would mean nothing")


def _disagreement(got: np.ndarray, expected: np.ndarray, whose: str, tolerance: float, floor: float = 1.0,
                  probe: str = "probe image") -> str | None:
    """How logits ``got`` for the ``probe`` differ from ``expected`` (``whose``) beyond ``tolerance`` (see
    :func:`logit_limit`); None where they agree."""
    if got.shape != expected.shape:
        return f"its logits on the {probe} have the shape {tuple(got.shape)}, {whose} {tuple(expected.shape)}"
    difference = float(np.abs(got.astype(np.float64) - expected).max())
    limit = logit_limit(tolerance, float(np.abs(expected).max()), floor)
    if difference <= limit:
        return None
    return f"its logits on the {probe} differ from {whose} by {difference:.3g} (limit {limit:.3g})"


# ------------------------------------------------------------------------------------------------
# The cache
# ------------------------------------------------------------------------------------------------
def _read_file(path: Path, what: str, max_bytes: int | None = None) -> bytes:
    """The bytes of ``path`` where it is a plain file itself: a link is not followed (it may lead into
    somebody else's file) and a pipe is not waited on."""
    try:
        return read_regular(path, max_bytes)
    except DataFileError as error:
        raise _Mismatch(f"{what} {error}") from None


def _read_record(path: Path) -> dict:
    """The record at ``path``, as :func:`_record_of` writes it; _Mismatch for anything else (a file that is no
    JSON within :mod:`..records.datafile`'s bounds: too large, nested too deep, numbers out of range)."""
    try:
        record = parse_json(_read_file(path, "its record", MAX_RECORD_BYTES), MAX_RECORD_BYTES)
    except DataFileError as error:
        raise _Mismatch(f"its record is damaged: it {error}") from None
    if not isinstance(record, dict):
        raise _Mismatch("its record is damaged: it holds no mapping")
    return record


def _record_of(content: bytes, key: str, description: dict, logits: np.ndarray, written_by: str) -> dict:
    """The record of a cached model; ``written_by``: the exporter that wrote it (the description names the one
    tried first, torch.export's where it can run)."""
    return {"format": RECORD_FORMAT, "key": key, "exported": description, "written_by": written_by,
            "sha256": hashlib.sha256(content).hexdigest(), "bytes": len(content),
            "probe_logits": logits.astype(np.float64).tolist()}


def _proven_session(path: Path, record_path: Path, key: str, description: dict, kind: ModelKind,
                    probe: torch.Tensor, expected: np.ndarray) -> tuple[bytes, object]:
    """The cached file's bytes and a CPU session of them, when it proves to be this export (module
    docstring); else _Mismatch."""
    record = _read_record(record_path)
    try:
        recorded = np.asarray(record["probe_logits"], dtype=np.float64)
        identity = (record["format"], record["key"], record["exported"], record["sha256"], record["bytes"])
    except (ValueError, TypeError, KeyError):
        raise _Mismatch("its record is damaged") from None
    if identity[:3] != (RECORD_FORMAT, key, description):
        raise _Mismatch("its record is of another export")
    content = _read_file(path, "it")
    if (hashlib.sha256(content).hexdigest(), len(content)) != identity[3:]:
        raise _Mismatch("its content is not what was written: the SHA-256 differs from its record's")
    try:
        runner = session(content)
        got = _run(runner, probe)
    except Exception as error:  # noqa: BLE001 (onnxruntime's own error types)
        raise _Mismatch(f"it does not run: {str(error)[:80]}") from None
    checks = ((expected, "PyTorch's", kind.tolerance, kind.floor),
              (recorded, "those recorded at its export", kind.recorded_tolerance, 1.0))
    for reference, whose, tolerance, floor in checks:
        wrong = _disagreement(got, reference, whose, tolerance, floor, kind.probe)
        if wrong:
            raise _Mismatch(wrong)
    return content, runner


def _create(folder: Path, key: str, suffix: str) -> Path:
    """A new empty temporary file beside the cached ones, named after this process (module docstring)."""
    path = folder / f".{key}.{writer_stamp()}.{secrets.token_hex(4)}{suffix}"
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
    return path


def remove_stale_temporaries(folder: Path) -> list[Path]:
    """Delete the temporaries and scratch folders of exports whose writer is proven dead (a SIGKILL, a crash);
    those of live writers, and of other machines sharing the folder, stay.  Nothing is said where it cannot
    be done."""
    return remove_dead_writers(folder, _TEMPORARY)


def _exported(model: nn.Module, probe: torch.Tensor, target: Path, quantization: Quantization | None,
              expected: np.ndarray, scratch: Path, log: Callable[[str], None]):
    """Export ``model`` to ``target`` (quantized, with ``quantization``, by way of the folder ``scratch``): its
    bytes, a CPU session of them, its logits for the probe, checked against PyTorch's, and the exporter's name."""
    example = torch.zeros((MIN_TRACED_BATCH, *probe.shape[1:]))
    fp32 = target if quantization is None else scratch / "fp32.onnx"
    written_by = export_onnx(model, example, fp32, dynamic_batch=True, opset=OPSET, log=log)
    if quantization is not None:
        quantize(fp32, target, quantization, scratch)
    content = target.read_bytes()
    runner = session(content)
    got = _run(runner, probe)
    kind = kind_of(quantization, model)
    wrong = _disagreement(got, expected, "PyTorch's", kind.tolerance, kind.floor, kind.probe)
    if not wrong:  # the batch is free: the probe three times over gives its logits three times
        wrong = _disagreement(_run(runner, probe.repeat(3, 1, 1, 1)), np.repeat(got, 3, axis=0),
                              "those of the probe alone", ONNX_TOLERANCE, probe=f"{kind.probe}, three times over,")
    if wrong and quantization is not None:
        raise UserError(f"the int8 model loses too much: {wrong}; nothing was cached; try another "
                        "--calibration-method or other calibration images, or leave out --quantize int8")
    if wrong:
        raise UserError(f"the ONNX export of this model does not compute what PyTorch does ({wrong}); nothing "
                        "was cached; use --runtime torch")
    return content, runner, got, written_by


def _cache_error(folder: Path, error: OSError) -> UserError:
    return UserError(f"cannot write the ONNX cache in {folder} ({error.strerror or error}); set {CACHE_ENV} to "
                     "a writable folder")


def cached_session(model: nn.Module, image_size: int, log: Callable[[str], None],
                   quantization: Quantization | None = None, device: str = "cpu"):
    """An ONNX Runtime session on ``device`` of ``model`` (NCHW, any batch size; FP32, or int8 with
    ``quantization``) from the cache, where the cached file proves to be its export; else exported first
    (and cached where the cache can be written)."""
    content, runner = cached_model(model, image_size, log, quantization)
    return runner if device == "cpu" else session(content, device=device)


def cached_model(model: nn.Module, image_size: int, log: Callable[[str], None],
                 quantization: Quantization | None = None) -> tuple[bytes, object]:
    """The bytes of ``model``'s export (see :func:`cached_session`) and a CPU session of them."""
    model = export_ready(model, image_size, quantization is not None)
    folder = cache_dir()
    kind = kind_of(quantization, model)
    key = weights_key(model, image_size, quantization)
    description = export_description(model, image_size, quantization)
    path, record_path = folder / f"{key}.onnx", folder / f"{key}.json"
    probe = probe_image(image_size) if quantization is None else quantization.probe()
    with torch.no_grad():
        expected = model(probe).double().numpy()
    require_finite(expected, "a probe image")
    remove_stale_temporaries(folder)

    reason = None
    if os.path.lexists(path):
        try:
            return _proven_session(path, record_path, key, description, kind, probe, expected)
        except _Mismatch as mismatch:
            reason = str(mismatch)
    what = "the model to ONNX" if quantization is None else "the model to ONNX and quantizing it to int8"
    notice = (f"cached ONNX model {path} does not match these weights ({reason}); exporting again" if reason
              else f"exporting {what} once, cached as {path}")
    with stop_raises(f"exporting {what}", "nothing was cached"):  # exit 75, temporaries removed
        try:
            folder.mkdir(parents=True, exist_ok=True)
            temporary = _create(folder, key, ".onnx.tmp")
        except OSError as error:
            if reason is None:
                raise _cache_error(folder, error) from None
            log(f"note: {notice}, to a temporary folder for this run: the cache cannot be written "
                f"({error.strerror or error})")
            return _export_for_this_run(model, probe, quantization, expected, log)
        log(f"note: {notice}")
        record_temporary = None
        try:
            try:
                with scratch_folder(folder, key) as scratch:
                    content, runner, got, written_by = _exported(model, probe, temporary, quantization, expected,
                                                                 scratch, log)
            except OSError as error:  # a full disk
                raise _cache_error(folder, error) from None
            try:
                record_temporary = _create(folder, key, ".json.tmp")
                record = _record_of(content, key, description, got, written_by)
                record_temporary.write_text(json.dumps(record), encoding="utf-8")
                os.replace(temporary, path)  # the model first: a model without its record is exported again
                os.replace(record_temporary, record_path)
            except OSError as error:
                log(f"note: the export could not be stored in the cache ({error.strerror or error}); it serves "
                    "this run only")
        finally:
            for leftover in (temporary, record_temporary):
                if leftover is not None:
                    with contextlib.suppress(OSError):
                        leftover.unlink()
    return content, runner


def _export_for_this_run(model: nn.Module, probe: torch.Tensor, quantization: Quantization | None,
                         expected: np.ndarray, log: Callable[[str], None]) -> tuple[bytes, object]:
    """``model`` exported to a temporary folder, removed again: for a cache that cannot be written."""
    try:
        with tempfile.TemporaryDirectory(prefix="image_classification-onnx-") as scratch:
            return _exported(model, probe, Path(scratch) / "model.onnx", quantization, expected, Path(scratch),
                             log)[:2]
    except OSError as error:
        raise UserError(f"cannot export the ONNX model to a temporary folder ({error.strerror or error}); set "
                        "TMPDIR to a writable folder") from None


class OnnxModel:
    """Called like the eval-mode model: float32 NCHW images in, logits out, on the images' device.

    ``quantization``: the int8 model calibrated so (else FP32); ``device``: where ONNX Runtime runs it
    (cuda: its CUDA execution provider, see :func:`providers`).  ``description`` says which model it is, for
    a raport."""

    def __init__(self, model: nn.Module, image_size: int, log: Callable[[str], None],
                 quantization: Quantization | None = None, device: str = "cpu"):
        require_onnxruntime("--runtime onnxruntime")
        self._session = cached_session(model, image_size, log, quantization, device)
        self.description = {**export_description(model, image_size, quantization), "device": device}

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        batch = images.detach().cpu().float().contiguous().numpy()
        return torch.from_numpy(self._session.run(["output"], {"input": batch})[0]).to(images.device)
