"""torch.export of a classifier with a free batch dimension: what the ONNX file and the AOTInductor package are
made from.

torch.export specialises a dimension whose example has size 0 or 1 to that constant, so a batch it keeps free
is traced on at least :data:`MIN_TRACED_BATCH` images, whatever batch the caller names; the graph then runs any
batch, 1 included.

:func:`export_onnx` writes one self-contained ONNX file through torch.onnx's exporter built on torch.export
(``dynamo=True``, torch.onnx's default since torch 2.9; it needs onnxscript and writes opset 18 and later).
The TorchScript-based exporter, which torch deprecates, writes the file only where that one cannot: where it
fails for a model, on a torch before 2.6 (whose torch.export-based exporter lacks the options used here), without
onnxscript, or for an opset below 18; the caller is told why in one line.

What an exported model needs to be used travels with it (:func:`deployed_record`): its architecture, class
names and preprocessing, in an ONNX file's metadata_props and in a .pt2 package's metadata (:mod:`.aoti`).
"""

from __future__ import annotations

import contextlib
import inspect
import io
import logging
import os
import warnings
from typing import Callable, Iterator, Sequence

import torch
from torch import nn

from ..arguments.tools import ONNX_OPSET as OPSET  # the lowest opset torch.export's exporter writes
from ..errors import UserError
from ..models.preprocessing import Preprocessing

MIN_TRACED_BATCH = 2
TORCH_EXPORT = "torch.export"
TORCHSCRIPT = "TorchScript"
# torch.onnx.export's options this module passes to the torch.export-based exporter (all there since torch 2.6)
_DYNAMO_OPTIONS = {"dynamo", "dynamic_shapes", "external_data", "optimize"}


def traced_batch(batch_size: int, dynamic_batch: bool) -> int:
    """How many images the example that is traced holds: ``batch_size``, at least :data:`MIN_TRACED_BATCH`
    where the batch stays free."""
    return max(batch_size, MIN_TRACED_BATCH) if dynamic_batch else batch_size


def _batch_dimension() -> dict:
    return {0: torch.export.Dim("batch")}


@contextlib.contextmanager
def quiet_torch() -> Iterator[None]:
    """torch's exporters and compilers narrate on stdout and through its loggers (onnxscript's passes, a CUDA
    toolkit that is not there): stdout is classify.py's predictions, stderr its notices, so both stay ours."""
    loggers = [logging.getLogger(name) for name in ("torch", "onnxscript", "onnx_ir")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore", DeprecationWarning)  # torch >= 2.9 calls the TorchScript exporter legacy
            warnings.simplefilter("ignore", FutureWarning)
            yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def probe_image(image_size: int) -> torch.Tensor:
    """The fixed input an exported model is checked on: standard normal pixels, as normalised images have."""
    return torch.randn(1, 3, image_size, image_size, generator=torch.Generator().manual_seed(0))


def export_program(model: nn.Module, example: torch.Tensor) -> torch.export.ExportedProgram:
    """``model`` traced by ``torch.export.export`` on ``example`` (at least :data:`MIN_TRACED_BATCH` images), its
    batch dimension free."""
    with quiet_torch():
        return torch.export.export(model, (example,), dynamic_shapes=(_batch_dimension(),))


def torch_export_unavailable(opset: int) -> str | None:
    """Why torch.export's ONNX exporter cannot write ``opset`` here, in words that follow "ONNX through the
    TorchScript-based exporter: "; None where it can."""
    if not _DYNAMO_OPTIONS <= set(inspect.signature(torch.onnx.export).parameters):
        return f"torch {torch.__version__} has no torch.export-based exporter with a free batch dimension (2.6 has)"
    try:
        import onnxscript  # noqa: F401  (what the torch.export-based exporter translates with)
    except ImportError:
        return "onnxscript is not installed (pip install onnxscript)"
    if opset < OPSET:
        return f"opset {opset} was asked for, and torch.export's exporter writes opset {OPSET} and later"
    return None


def export_onnx(model: nn.Module, example: torch.Tensor, path: str | os.PathLike, *, dynamic_batch: bool,
                opset: int = OPSET, log: Callable[[str], None] | None = None) -> str:
    """Write ``model`` as one ONNX file (input ``input``, output ``output``, with ``dynamic_batch`` a free batch
    dimension named ``batch``) through torch.export, else the TorchScript-based exporter (module docstring), the
    reason said through ``log``; returns the exporter's name."""
    reason = torch_export_unavailable(opset)
    if reason is None:
        try:
            _export_through_torch_export(model, example, path, dynamic_batch, opset)
            return TORCH_EXPORT
        except (OSError, MemoryError):  # a full disk is not the exporter's failure
            raise
        except Exception as error:  # noqa: BLE001 (torch.export's and onnxscript's many error types)
            reason = f"torch.export's exporter failed for this model ({_first_line(error)})"
    if log is not None:
        log(f"note: ONNX through the TorchScript-based exporter: {reason}")
    _export_through_torchscript(model, example, path, dynamic_batch, opset)
    return TORCHSCRIPT


def _first_line(error: Exception) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return f"{type(error).__name__}: {lines[0][:160] if lines else ''}".rstrip(": ")


def _export_through_torch_export(model: nn.Module, example: torch.Tensor, path: str | os.PathLike,
                                 dynamic_batch: bool, opset: int) -> None:
    shapes = (_batch_dimension(),) if dynamic_batch else None
    with quiet_torch():
        torch.onnx.export(model, (example,), str(path), dynamo=True, input_names=["input"], output_names=["output"],
                          opset_version=opset, dynamic_shapes=shapes, external_data=False, optimize=True,
                          verbose=False, report=False)


def _export_through_torchscript(model: nn.Module, example: torch.Tensor, path: str | os.PathLike,
                                dynamic_batch: bool, opset: int) -> None:
    kwargs = {"input_names": ["input"], "output_names": ["output"], "opset_version": opset,
              "do_constant_folding": True}
    if dynamic_batch:
        kwargs["dynamic_axes"] = {"input": {0: "batch"}, "output": {0: "batch"}}
    if "dynamo" in inspect.signature(torch.onnx.export).parameters:
        kwargs["dynamo"] = False
    with quiet_torch():
        torch.onnx.export(model, (example,), str(path), **kwargs)


# ------------------------------------------------------------------------------------------------
# What an exported model carries
# ------------------------------------------------------------------------------------------------
RECORD_KEY = "image_classification"  # the metadata entry of an ONNX file or .pt2 package that holds the record


def deployed_record(arch: str, class_names: Sequence[str], preprocessing: Preprocessing) -> dict:
    """What an exported model carries for its use: the architecture, the class names (as many as it has
    classes) and the preprocessing its input images need."""
    return {"arch": arch, "num_classes": len(class_names), "classes": list(class_names),
            "preprocessing": preprocessing.to_dict()}


def read_deployed(record: dict, source: str) -> tuple[str, list[str], Preprocessing]:
    """The architecture, class names and preprocessing of a :func:`deployed_record` read back; a
    :class:`UserError` naming ``source`` where one is missing or malformed."""
    arch, names = record.get("arch"), record.get("classes")
    if not isinstance(arch, str) or not isinstance(names, list) or not names \
            or not all(isinstance(name, str) for name in names) or record.get("num_classes") != len(names):
        raise UserError(f"{source} records no architecture and class names this version can read; write it again "
                        "with model2onnx.py")
    preprocessing = record.get("preprocessing")
    if not isinstance(preprocessing, dict):
        raise UserError(f"{source} records no preprocessing; write it again with model2onnx.py")
    return arch, names, Preprocessing.from_dict(preprocessing, source)
