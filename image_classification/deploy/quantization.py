"""int8: ONNX Runtime's static quantization of an exported FP32 graph, calibrated on the user's images.

The FP32 graph is prepared by ``quant_pre_process`` (shapes inferred, BatchNorm folded into the convolutions,
so that each folded weight gets its own scales) and quantized by ``quantize_static`` into QDQ form: int8
weights with one scale per output channel, uint8 activations whose ranges come from the calibration images
(``minmax``: the extremes seen; ``entropy`` and ``percentile``: ranges that clip rare outliers); the logits,
the classifier's output, stay float.  uint8 activations with int8 weights (u8s8) are what ONNX Runtime's x86
kernels fuse whole: every convolution and residual addition of a ResNet-50 becomes one int8 operator, where
int8 activations leave a third of the convolutions in float between (de)quantizations, at half the speed.

``reduce_range`` (7-bit weights) is decided from the CPU's flags: ONNX Runtime computes int8 products with
VNNI (AVX512-VNNI, AVX-VNNI) or AMX-INT8 where the CPU has them; without them it falls back to AVX2's
``vpmaddubsw``, whose 16-bit sums of two products saturate with full 8-bit weights.

The calibration images are chosen without randomness: in a folder of class folders, evenly over the classes
(the same count from each where they hold enough, in each class evenly spaced through its sorted files); in a
flat folder, evenly spaced through its sorted files.  They go through the model's own validation
preprocessing (the caller's ``load``), and an image that cannot be read is named, skipped and counted, as in
training.  What the quantized graph depends on, the calibration tensors' SHA-256, their count and the
method, the reduce_range choice and ONNX Runtime's version, is :meth:`Quantization.description`, which the
ONNX cache puts in its key.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch

from ..arguments.tools import DEFAULT_CALIBRATION_IMAGES
from ..data.files import SplitWalk, is_image_file, walk_class
from ..errors import UserError
from ..records.scratch import temporaries_in
from ..system import machine

# the int8 dot-product instructions ONNX Runtime's int8 kernels use without saturating, named as
# machine.INSTRUCTION_SETS names them
INT8_DOT_PRODUCTS = ("AVX512-VNNI", "AVX-VNNI", "AMX-INT8")
CALIBRATION_BATCH = 8  # images per calibration run: what is held at once is every activation of one batch
EXTRA_OPTIONS = {
    # one batch per collection, its activations reduced before the next (ONNX Runtime otherwise keeps every
    # batch's activations until the end: gigabytes for a ResNet-50 at 224 px)
    "CalibStridedMinMax": 1,
    # the logits stay float: the classifier's int8 product ends in float, without a last rounding to 8 bits
    "OpTypesToExcludeOutputQuantization": ["Gemm"],
}


@dataclass(frozen=True)
class Int8Request:
    """What the flags ask for: ``--calibration-data``, ``--calibration-images``, ``--calibration-method``."""

    folder: str
    images: int = DEFAULT_CALIBRATION_IMAGES
    method: str = "minmax"


def int8_request(args) -> Int8Request | None:
    """The int8 model the parsed flags ask for (checked by ``arguments.tools.check_int8_flags``), or None."""
    if args.quantize is None:
        return None
    return Int8Request(args.calibration_data, args.calibration_images or DEFAULT_CALIBRATION_IMAGES,
                       args.calibration_method or "minmax")


@dataclass(frozen=True, eq=False)
class Quantization:
    """How a graph is quantized: the calibration tensors (N x 3 x S x S, float32, normalised), the method,
    and ``reduce_range``; ``chosen`` and ``skipped`` say how the set was made."""

    images: np.ndarray
    method: str
    reduce_range: bool
    sha256: str
    chosen: int = 0  # images chosen in the folder
    skipped: int = 0  # of those, unreadable ones left out

    def description(self) -> dict:
        """What the quantized graph depends on besides the FP32 one: the cache key and the raport hold it."""
        import onnxruntime

        return {"format": "QDQ", "weights": "int8, per channel", "activations": "uint8", "logits": "float",
                "reduce_range": self.reduce_range, "onnxruntime": onnxruntime.__version__,
                "calibration": {"images": len(self.images), "sha256": self.sha256, "method": self.method}}

    def probe(self) -> torch.Tensor:
        """The input a quantized model is checked on: the first calibration image, an image like those it
        will see (random pixels may lie outside the calibrated ranges, where int8 clips)."""
        return torch.from_numpy(self.images[:1].copy())


def int8_dot_products() -> list[str] | None:
    """The int8 dot-product instructions the CPU lists in /proc/cpuinfo (``AVX512-VNNI``, ``AVX-VNNI``,
    ``AMX-INT8``); None where that file cannot tell."""
    flags = machine._cpu_flags()
    return None if flags is None else [name for name in machine.instruction_sets(flags) if name in INT8_DOT_PRODUCTS]


def cpu_has_int8_dot_product() -> bool | None:
    """Whether the CPU lists VNNI or AMX-INT8; None where /proc/cpuinfo cannot tell."""
    found = int8_dot_products()
    return None if found is None else bool(found)


def reduce_range_here() -> bool:
    """7-bit weights unless the CPU is known to have int8 dot products (where unknown, the safe choice)."""
    return not cpu_has_int8_dot_product()


# ------------------------------------------------------------------------------------------------
# The calibration set
# ------------------------------------------------------------------------------------------------
def calibration_groups(folder: str | os.PathLike) -> list[list[str]]:
    """The image files of ``folder``: one group per class folder (walked as training walks one), and the
    images lying directly in ``folder`` as a group of their own."""
    root = Path(folder)
    if not root.is_dir():
        raise UserError(f"--calibration-data {folder} is not a folder")
    try:
        entries = sorted(os.scandir(root), key=lambda entry: entry.name)
    except OSError as error:
        raise UserError(f"--calibration-data {folder} cannot be listed ({error.strerror or error})") from None
    loose = [entry.path for entry in entries if is_image_file(entry.name) and entry.is_file()]
    groups = [loose] if loose else []
    shared = SplitWalk()
    for entry in entries:
        if entry.is_dir() and not entry.name.startswith("."):
            files = walk_class(Path(entry.path), root, shared).files
            if files:
                groups.append(files)
    return groups


def spread_evenly(groups: Sequence[Sequence[str]], count: int) -> list[str]:
    """``count`` files (all where there are fewer): the same number from every group where each holds enough
    (the rest from the larger ones), each group's share evenly spaced through it."""
    shares = [0] * len(groups)
    left = min(count, sum(len(group) for group in groups))
    while left:
        for index, group in enumerate(groups):
            if left and shares[index] < len(group):
                shares[index] += 1
                left -= 1
    return [group[(2 * k + 1) * len(group) // (2 * share)] for group, share in zip(groups, shares)
            for k in range(share)]


def read_calibration(request: Int8Request, load: Callable[[Path], torch.Tensor], log: Callable[[str], None],
                     reduce_range: bool | None = None) -> Quantization:
    """The calibration set of ``request``: its files chosen (module docstring), each loaded by ``load`` (the
    model's validation preprocessing; a :class:`UserError` for an unreadable image, which is then named
    through ``log``, skipped and counted)."""
    groups = calibration_groups(request.folder)
    chosen = spread_evenly(groups, request.images)
    if not chosen:
        raise UserError(f"--calibration-data {request.folder} holds no images (image files, directly or in class "
                        "folders) to calibrate the int8 model with")
    tensors, problems = [], []
    for path in chosen:
        try:
            tensors.append(load(Path(path)))
        except UserError as error:
            problems.append(str(error))
    if not tensors:
        raise UserError(f"none of the {len(chosen)} calibration images in {request.folder} could be read: "
                        f"{problems[0]}")
    for problem in problems:
        log(f"warning: skipped: {problem}")
    images = np.ascontiguousarray(torch.stack(tensors).float().numpy())
    digest = hashlib.sha256(f"{images.shape}|".encode())
    digest.update(images.tobytes())
    held = sum(len(group) for group in groups)
    fewer = f" (all the folder holds, fewer than --calibration-images {request.images})" if held < request.images else ""
    unread = f", {len(problems)} unreadable skipped" if problems else ""
    log(f"note: int8 calibration on {len(images)} images of {request.folder}{fewer}{unread}, method "
        f"{request.method}")
    return Quantization(images, request.method, reduce_range_here() if reduce_range is None else reduce_range,
                        digest.hexdigest(), chosen=len(chosen), skipped=len(problems))


# ------------------------------------------------------------------------------------------------
# Quantizing
# ------------------------------------------------------------------------------------------------
def quantize(source: str | os.PathLike, target: str | os.PathLike, quantization: Quantization,
             scratch: str | os.PathLike) -> None:
    """Write the int8 QDQ graph of the FP32 graph ``source`` (input ``input``, any batch) to ``target``; the
    graphs on the way, ONNX Runtime's temporary ones included, go into the folder ``scratch`` (see
    :mod:`..records.scratch`)."""
    from onnxruntime.quantization import (CalibrationDataReader, CalibrationMethod, QuantFormat, QuantType,
                                          quantize_static)
    from onnxruntime.quantization.shape_inference import quant_pre_process

    class Batches(CalibrationDataReader):
        """The calibration tensors, ``CALIBRATION_BATCH`` at a time, over the range ONNX Runtime sets."""

        def __init__(self, images: np.ndarray):
            self.starts = range(0, len(images), CALIBRATION_BATCH)
            self.images, self.position, self.end = images, 0, len(self.starts)

        def __len__(self) -> int:
            return len(self.starts)

        def set_range(self, start_index: int, end_index: int) -> None:
            self.position, self.end = start_index, end_index

        def get_next(self) -> dict | None:
            if self.position >= self.end:
                return None
            start = self.starts[self.position]
            self.position += 1
            return {"input": self.images[start:start + CALIBRATION_BATCH]}

    methods = {"minmax": CalibrationMethod.MinMax, "entropy": CalibrationMethod.Entropy,
               "percentile": CalibrationMethod.Percentile}
    # ONNX Runtime prints the histograms' settings: stdout is classify.py's predictions (JSON lines)
    with temporaries_in(Path(scratch)), contextlib.redirect_stdout(io.StringIO()):
        prepared = Path(scratch) / "prepared.onnx"
        quant_pre_process(str(source), str(prepared))
        quantize_static(str(prepared), str(target), Batches(quantization.images), quant_format=QuantFormat.QDQ,
                        per_channel=True, reduce_range=quantization.reduce_range,
                        activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                        calibrate_method=methods[quantization.method], extra_options=EXTRA_OPTIONS)
