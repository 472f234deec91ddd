"""What every benchmark records: the machine, the software, and robust statistics of repeated timings."""

from __future__ import annotations

import gc
import json
import math
import os
import shutil
import statistics
import sys
from pathlib import Path
from typing import Callable, Sequence, TypeVar

import torch

from image_classification.errors import UserError
from image_classification.records.raport import epoch_records
from image_classification.system import machine
from image_classification.system.machine import compile_unsupported

T = TypeVar("T")


def environment(device: torch.device) -> dict:
    """The machine (:func:`image_classification.system.machine.facts`: CPU model, cores, instruction sets, the GPU
    and its driver where ``device`` is one), the software that produced a figure, and ``machine``, all of
    it in one line."""
    info = {"device": str(device), **machine.facts(device.type)}
    info["device_name"] = info["gpu"]["name"] if info["gpu"] else info["cpu_model"]
    # when the run ends: on a shared machine, other work on the cores slows every path down
    info["load_average"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    info["torch_threads"] = torch.get_num_threads()
    try:
        import onnxruntime

        info["onnxruntime"] = onnxruntime.__version__
    except ImportError:
        pass
    info["machine"] = machine.describe(info)
    return info


def require_scikit_image(what: str) -> None:
    """A :class:`UserError` (one line, exit 2) where scikit-image, whose sample photographs ``what`` cuts its
    images from, is not installed (``make demo`` leaves it out; requirements-dev.txt pins it)."""
    try:
        import skimage.data  # noqa: F401
    except ImportError:
        raise UserError(f"{what} cuts its images from scikit-image's sample photographs, and scikit-image is not "
                        "installed here: pip install scikit-image (requirements-dev.txt pins it)") from None


def summarise(values: Sequence[float]) -> dict:
    """Median, spread (max - min, and relative to the median), and every value."""
    median = statistics.median(values)
    return {"median": median, "min": min(values), "max": max(values), "spread": max(values) - min(values),
            "relative_spread": (max(values) - min(values)) / median if median else 0.0, "values": list(values)}


def ratio_spread(ours: Sequence[float], base: Sequence[float]) -> float | None:
    """How much a ratio moved between rounds measured side by side: the relative spread (max - min over
    median) of the round-by-round ratios ``ours[i] / base[i]``; None with fewer than two rounds."""
    ratios = [a / b for a, b in zip(ours, base)]
    return summarise(ratios)["relative_spread"] if len(ratios) >= 2 else None


def verdict(ratio: float, spread: float | None) -> bool:
    """Whether ``ratio`` may be stated as a difference: only where the difference it claims, |ratio - 1|,
    is larger than ``spread`` (relative, as from :func:`ratio_spread`).  A spread as large as the
    difference, or none known, means the rounds cannot tell the two sides apart."""
    return spread is not None and abs(ratio - 1) > spread


def ratio_text(ratio: float, spread: float | None, bold: bool = False) -> str:
    """``1.65x`` (``**1.65x**`` in Markdown with ``bold``) where the verdict holds; otherwise the ratio and
    the reason no verdict is given."""
    if verdict(ratio, spread):
        return f"**{ratio:.2f}x**" if bold else f"{ratio:.2f}x"
    if spread is None:
        return f"{ratio:.2f}x (one round, spread unknown: no verdict)"
    return f"{ratio:.2f}x (spread {spread:.0%} >= the {abs(ratio - 1):.0%} difference: no verdict)"


def compiler_missing(device: torch.device) -> str | None:
    """Why torch.compile cannot run here, or None: inductor builds its CPU kernels with a C++ compiler, and
    on CUDA Triton builds its kernel launcher with a C compiler, so a GPU host needs one too."""
    if reason := compile_unsupported():
        return reason
    if device.type == "cpu":
        names, what = (os.environ.get("CXX"), "c++", "g++", "clang++"), "a C++ compiler"
    else:
        names, what = (os.environ.get("CC"), "cc", "gcc", "clang"), "a C compiler (Triton builds its launcher)"
    if any(name and shutil.which(name) for name in names):
        return None
    return f"torch.compile on {device.type} needs {what}; none found"


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) with linear interpolation between the closest ranks."""
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def write_json(result: dict, path: str | None) -> None:
    """Write ``result`` to ``path`` (through a temporary file, so a failure leaves no half file)."""
    if not path:
        return
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    temporary = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    temporary.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    os.replace(temporary, target)


def command_line() -> str:
    """This process's command line, as a user would type it."""
    import shlex

    return "python " + shlex.join([os.path.relpath(sys.argv[0])] + sys.argv[1:])


def is_out_of_memory(error: BaseException) -> bool:
    """Whether ``error`` says the device ran out of memory: torch's ``OutOfMemoryError``, or cuDNN and
    cuBLAS failing to allocate a workspace, which reach Python as a plain ``RuntimeError``."""
    if isinstance(error, torch.OutOfMemoryError):
        return True
    return isinstance(error, RuntimeError) and any(
        sign in str(error) for sign in ("out of memory", "ALLOC_FAILED", "NOT_ENOUGH_WORKSPACE"))


def release_device_memory() -> None:
    """Give back what a failed attempt held: its objects (collected), its compiled graphs, CUDA's cache."""
    gc.collect()
    torch._dynamo.reset()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def largest_fitting(attempt: Callable[[int], T], batch_size: int,
                    release: Callable[[], None] = release_device_memory) -> tuple[int, T, list[int]]:
    """Call ``attempt(batch)`` at ``batch_size``, and at half the batch each time it runs out of device
    memory, until one fits.  Returns that batch, what ``attempt`` returned, and the batches that did not
    fit.  Any other error goes up as it is; where not even a batch of one fits, :class:`UserError`."""
    too_large: list[int] = []
    while True:
        try:
            return batch_size, attempt(batch_size), too_large
        except RuntimeError as error:  # torch.OutOfMemoryError is one
            if not is_out_of_memory(error):
                raise
        # out of the except block: the traceback, and the tensors its frames held, are gone
        too_large.append(batch_size)
        release()
        if batch_size == 1:
            raise UserError("not even a batch of 1 fits in the device's memory")
        batch_size //= 2


def last_epoch_top1(raport: Path) -> float:
    """The validation top-1 of the last epoch ``raport`` records; a :class:`UserError` where that epoch has none (its
    outputs were not finite, or it did not validate), never an earlier epoch's figure."""
    epochs = epoch_records(raport)
    if not epochs:
        raise UserError(f"{raport} records no epoch")
    last = max(epochs)
    top1 = epochs[last].get("val.top1")
    if not isinstance(top1, (int, float)) or not math.isfinite(top1):
        raise UserError(f"{raport} holds no validation top-1 for its last epoch ({last + 1})"
                        + (": its outputs were not finite" if "val.not_finite" in epochs[last] else ""))
    return float(top1)
