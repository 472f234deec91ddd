"""AOTInductor packages (``.pt2``): a model compiled ahead of time for the CPU or CUDA, carrying what its use needs.

:func:`write_package` traces the model with torch.export, its batch free (:func:`.torch_export.export_program`),
and compiles it with ``torch._inductor.aoti_compile_and_package``.  Through AOTInductor's own metadata the package
carries a record under :data:`RECORD_KEY`: the architecture, the class names and the preprocessing (as ONNX files
carry them in their metadata_props, :func:`.torch_export.deployed_record`), the crop size, and PyTorch's logits
for the fixed probe image.

:func:`load_package` reads that record out of the zip before anything in it is loaded, and refuses in one line a
file that is no zip or whose members fail their CRC, one without the record (a package this toolkit did not
write), and one compiled for another device, machine or CPU instruction set than this one offers (its code
would not run here, or would stop the process); then loads it with ``torch._inductor.aoti_load_package`` and
passes the probe through it: logits other than the recorded ones (a package whose record belongs to another
model, a flipped bit the CRC missed) are refused too, as the ONNX cache refuses a file that is not its export.

A package holds compiled native code, which runs when it is loaded: as with a script, run only packages you
wrote or trust.  The checks above catch accidents, not an adversary, who can write any record.
"""

from __future__ import annotations

import copy
import json
import os
import platform
import re
import shutil
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from torch import nn

from ..errors import UserError
from ..records.datafile import DataFileError, parse_json
from ..system.machine import cuda_available
from .torch_export import MIN_TRACED_BATCH, RECORD_KEY, export_program, probe_image, quiet_torch

PACKAGE_SUFFIX = ".pt2"
RECORD_FORMAT = 1
MAX_METADATA_BYTES = 16 << 20  # the record holds the probe's logits: about 25 KB for 1,000 classes
# Largest logit difference from PyTorch's FP32 accepted of a package, relative to the largest logit above 1: on
# the CPU the ONNX export's bound (Inductor fuses and reorders float sums as ONNX Runtime does); on CUDA cuDNN's
# convolutions may compute in TF32 (torch's default), ten bits of mantissa
PACKAGE_TOLERANCE = {"cpu": 1e-3, "cuda": 1e-2}
_METADATA_MEMBER = re.compile(r"^[^/]+/data/aotinductor/model/[^/]+_metadata\.json$")


def is_package(path: str | os.PathLike) -> bool:
    """Whether ``path`` names a .pt2 package: by its suffix, or a zip holding a PT2 archive's ``archive_format``
    (a torch.save file is a zip too, without it)."""
    if str(path).lower().endswith(PACKAGE_SUFFIX):
        return True
    try:
        with zipfile.ZipFile(path) as archive:
            return any(name.count("/") == 1 and name.endswith("/archive_format") for name in archive.namelist())
    except (OSError, zipfile.BadZipFile, ValueError):
        return False


def compile_problem(device: torch.device) -> str | None:
    """Why AOTInductor cannot compile for ``device`` here, in words that follow "cannot compile a .pt2
    package: "; None where it can."""
    import torch._inductor  # deferred: Inductor, seconds to import

    if not hasattr(torch._inductor, "aoti_compile_and_package"):
        return f"torch {torch.__version__} has no torch._inductor.aoti_compile_and_package (torch 2.6 has)"
    if device.type == "cuda" and not cuda_available():
        return "no CUDA device is available"
    if not any(name and shutil.which(name) for name in (os.environ.get("CXX"), "c++", "g++", "clang++")):
        return "AOTInductor builds the package with a C++ compiler, and none was found (c++, g++, clang++ or $CXX)"
    return None


# ------------------------------------------------------------------------------------------------
# Writing
# ------------------------------------------------------------------------------------------------
def write_package(model: nn.Module, image_size: int, target: Path, device: torch.device, record: dict,
                  batch_size: int = MIN_TRACED_BATCH) -> None:
    """Compile ``model`` (any layout, on any device; left as it is) for ``device`` into the package ``target``
    (named .pt2), traced on ``batch_size`` images (at least :data:`MIN_TRACED_BATCH`) with the batch free, the
    ``record`` (architecture, classes, preprocessing) and the probe's logits in its metadata."""
    problem = compile_problem(device)
    if problem:
        raise UserError(f"cannot compile a .pt2 package: {problem}")
    model = copy.deepcopy(model).float().eval().cpu()
    with torch.no_grad():
        logits = model(probe_image(image_size)).double().numpy()
    if not np.isfinite(logits).all():
        raise UserError("the model's outputs are NaN or inf on a probe image; its predictions would mean nothing")
    full = {**record, "format": RECORD_FORMAT, "image_size": image_size, "device": device.type,
            "torch": torch.__version__, "probe_logits": logits.tolist()}
    example = torch.randn(max(batch_size, MIN_TRACED_BATCH), 3, image_size, image_size, device=device)
    program = export_program(model.to(device), example)
    with quiet_torch():
        torch._inductor.aoti_compile_and_package(
            program, package_path=str(target),
            inductor_configs={"aot_inductor.metadata": {RECORD_KEY: json.dumps(full)}})


# ------------------------------------------------------------------------------------------------
# Reading
# ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PackageRecord:
    """What a package records: this toolkit's record (:func:`write_package`), and AOTInductor's own facts of
    where its code runs (``AOTI_DEVICE_KEY``, ``AOTI_MACHINE``, ``AOTI_CPU_ISA``)."""

    record: dict
    device: str
    machine: str
    cpu_isa: str


def read_record(path: str | os.PathLike) -> PackageRecord:
    """The record of the package at ``path``, read without loading anything of it (module docstring); a
    :class:`UserError` for a file that is not a sound package of this toolkit."""
    name = f"'{path}'"
    try:
        with zipfile.ZipFile(path) as archive:
            damaged = archive.testzip()
            if damaged is not None:
                raise UserError(f"{name} is damaged: its member {damaged[:80]} fails its CRC check; write the "
                                "package again (model2onnx.py --output M.pt2)")
            metadata = [_member_json(archive, member, name) for member in archive.namelist()
                        if _METADATA_MEMBER.match(member)]
    except FileNotFoundError:
        raise UserError(f"{name} does not exist") from None
    except (OSError, zipfile.BadZipFile, ValueError, EOFError) as error:
        raise UserError(f"{name} is not a readable .pt2 package ({str(error)[:100] or type(error).__name__})") from None
    found = [entry for entry in metadata if isinstance(entry, dict) and RECORD_KEY in entry]
    if not found:
        raise UserError(f"{name} is a .pt2 file without this toolkit's record (no AOTInductor model, or one "
                        "compiled elsewhere): write packages with model2onnx.py --output M.pt2")
    try:
        record = parse_json(found[0][RECORD_KEY], MAX_METADATA_BYTES)
        valid = _valid_record(record)
    except (DataFileError, TypeError):
        valid = False
    if not valid:
        raise UserError(f"{name} holds a damaged record of this toolkit (format {RECORD_FORMAT} expected)")
    return PackageRecord(record, str(found[0].get("AOTI_DEVICE_KEY", "")), str(found[0].get("AOTI_MACHINE", "")),
                         str(found[0].get("AOTI_CPU_ISA", "")))


def _member_json(archive: zipfile.ZipFile, member: str, name: str):
    if archive.getinfo(member).file_size > MAX_METADATA_BYTES:
        raise UserError(f"{name} holds a metadata file of over {MAX_METADATA_BYTES:,} bytes")
    try:
        return parse_json(archive.read(member), MAX_METADATA_BYTES)
    except DataFileError:
        return None


def _valid_record(record) -> bool:
    def integer(value) -> bool:
        return isinstance(value, int) and not isinstance(value, bool) and value > 0

    if not isinstance(record, dict) or record.get("format") != RECORD_FORMAT or not integer(record.get("image_size")):
        return False
    logits = record.get("probe_logits")
    return (isinstance(logits, list) and len(logits) == 1 and isinstance(logits[0], list) and bool(logits[0])
            and all(isinstance(value, (int, float)) for value in logits[0]))


def runs_here_problem(found: PackageRecord) -> str | None:
    """Why the package's code cannot run on this machine, in words that follow "it was compiled ..."; None where
    it can: the same machine type, a CUDA device for a CUDA package, and for the CPU an instruction set this CPU
    has (code for AVX-512 stops an AVX2 CPU at its first instruction)."""
    if found.machine and found.machine != platform.machine():
        return f"for {found.machine}, and this machine is {platform.machine()}"
    if found.device == "cuda":
        return None if cuda_available() else "for CUDA, and no CUDA device is available"
    if found.device != "cpu":
        return f"for the device {found.device[:40]!r}, which this toolkit does not run"
    if found.cpu_isa:
        from torch._inductor import cpu_vec_isa  # deferred: Inductor

        with quiet_torch():
            offered = {str(isa).upper() for isa in cpu_vec_isa.valid_vec_isa_list()}
        if found.cpu_isa.upper() not in offered | {"INVALID_VEC_ISA"}:  # the latter: no vector code
            return (f"for CPUs with {found.cpu_isa[:60]}, which this CPU lacks (it offers "
                    f"{', '.join(sorted(offered)) or 'no vector instructions Inductor uses'})")
    return None


class AotiModel:
    """Called like the eval-mode model: float32 images in (any layout, any device), logits out on the images'
    device.  ``record``: what the package records; ``description``: which model it is, for a raport."""

    def __init__(self, path: str | os.PathLike):
        import torch._inductor  # deferred: Inductor, seconds to import (``torch`` is then this function's name)

        if not hasattr(torch._inductor, "aoti_load_package"):
            raise UserError(f"'{path}' is a .pt2 package, and running one needs torch 2.6 or later (this is "
                            f"{torch.__version__})")
        found = read_record(path)
        problem = runs_here_problem(found)
        if problem:
            raise UserError(f"'{path}' cannot run here: it was compiled {problem}; compile it on this machine "
                            "(model2onnx.py --output M.pt2)")
        self.record = found.record
        self.device = torch.device(found.device)
        try:
            with quiet_torch():
                self._runner = torch._inductor.aoti_load_package(str(path))
        except Exception as error:  # noqa: BLE001 (the loader's C++ errors)
            raise UserError(f"'{path}' could not be loaded as an AOTInductor package ({str(error)[:120]})") from None
        self._check_probe(path)
        self.description = {"format": "AOTInductor package", "device": found.device, "cpu_isa": found.cpu_isa,
                            "compiled_with_torch": self.record.get("torch"), "torch": torch.__version__}

    def _check_probe(self, path) -> None:
        probe = probe_image(self.record["image_size"])
        expected = np.asarray(self.record["probe_logits"], dtype=np.float64)
        try:
            got = self(probe).double().cpu().numpy()
        except Exception as error:  # noqa: BLE001 (the compiled model's own errors)
            raise UserError(f"'{path}' does not run on a probe image ({str(error)[:120]})") from None
        limit = PACKAGE_TOLERANCE[self.device.type] * max(1.0, float(np.abs(expected).max()))
        if got.shape != expected.shape or not np.abs(got - expected).max() <= limit:
            difference = "another shape" if got.shape != expected.shape else f"{np.abs(got - expected).max():.3g}"
            raise UserError(f"'{path}' does not compute what its record says: its logits on the probe image differ "
                            f"from PyTorch's, recorded at its compilation, by {difference} (limit {limit:.3g}); "
                            "write the package again")

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        # the compiled code indexes its input as the contiguous NCHW example it was traced on: another layout
        # (channels-last) would be read with the wrong strides
        batch = images.detach().to(self.device, torch.float32).contiguous()
        with torch.inference_mode():
            return self._runner(batch).to(images.device)


def compiled_for_this_run(model: nn.Module, image_size: int, device: torch.device,
                          log: Callable[[str], None]) -> AotiModel:
    """``model`` compiled into a package in a temporary folder, loaded (and proven on the probe) and the folder
    removed again: ``--runtime aoti`` of weights that are no package."""
    log(f"note: compiling the model into an AOTInductor package for {device.type} (tens of seconds to minutes)")
    with tempfile.TemporaryDirectory(prefix="image_classification-aoti-") as scratch:
        path = Path(scratch) / f"model{PACKAGE_SUFFIX}"
        write_package(model, image_size, path, device, {})
        return AotiModel(path)
