"""The paths infer_throughput.py measures, each a forward function over its own copy of the same weights.

``torchvision`` (the baseline: torchvision's model under ``torch.no_grad``, as a user calls it) and ours:
``eager``, ``channels_last``, ``bf16`` and ``fp16`` (autocast in the dtype each is named after),
``compile`` (a static graph per batch size), ``aoti`` (the AOTInductor package model2onnx.py --output M.pt2
writes, compiled once for any batch, as classify.py --weights M.pt2 runs it), ``onnxruntime`` and ``int8`` (the
export classify.py's ``--runtime onnxruntime`` runs, FP32 or quantized).  A path that cannot run here is built
as skipped, with the reason.  Every forward takes a batch already on the device and leaves its output there.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch
from torch import nn

from benchmarks.common import compiler_missing
from image_classification.models import build_model

BASELINE = "torchvision"
PATHS = ("eager", "channels_last", "bf16", "fp16", "compile", "aoti", "onnxruntime", "int8")
CPU_ONLY = ("onnxruntime", "int8")
AUTOCAST = {"bf16": torch.bfloat16, "fp16": torch.float16}  # a mixed path runs the dtype it is named after
Forward = Callable[[torch.Tensor], object]  # a batch on the device -> the output, left where it was computed


class Skipped(Exception):
    """A path that cannot run on this machine; the message says why."""


@dataclass
class Path_:
    """One way of running the model: its forward function (device-resident batch in, output left on the
    device) once built, or for compile a fresh forward per batch size."""

    name: str
    forward: Forward | None = None
    skipped: str | None = None
    min_warmup: int = 0  # untimed calls it needs whatever --warmup says (compile's first call compiles)
    dtype: str = "float32"  # what its convolutions compute in
    for_batch_size: Callable[[int], Forward] | None = None  # called before each batch size's warm-up
    warmup_seconds: dict[int, float] = field(default_factory=dict)
    latencies: dict[int, list[float]] = field(default_factory=dict)
    max_abs_diff: float = 0.0  # against the first path's (the baseline's) logits, over the measured batches
    agreeing: int = 0
    compared: int = 0


ON_REQUEST = ("aoti",)  # measured when named: its compilation takes minutes for a ResNet-50 on two cores


def default_paths(device: torch.device) -> list[str]:
    """Every path that can run on ``device`` but those measured on request: fp16 autocast on CUDA only, ONNX
    Runtime on the CPU only."""
    excluded = (("fp16",) if device.type == "cpu" else CPU_ONLY) + ON_REQUEST
    return [name for name in PATHS if name not in excluded]


def _fp32_label(device: torch.device) -> str:
    """FP32 paths' dtype; cuDNN computes FP32 convolutions in TF32 when it is allowed (the default)."""
    if device.type == "cuda" and torch.backends.cudnn.allow_tf32:
        return "float32 (TF32 convolutions)"
    return "float32"


def _check_runs(name: str, device: torch.device) -> None:
    """Raise :class:`Skipped` when path ``name`` cannot run on ``device``; before any model is moved there."""
    reason = None
    if name == "compile":
        reason = compiler_missing(device)
    elif name == "aoti":
        from image_classification.deploy.aoti import compile_problem

        reason = compile_problem(device)
    elif name == "fp16" and device.type == "cpu":
        reason = "fp16 autocast is measured on CUDA only; the CPU's mixed precision is bf16"
    elif name == "bf16" and device.type == "cuda" and torch.cuda.get_device_capability(device) < (8, 0):
        reason = "this GPU computes no bf16 (that came with Ampere)"
    elif name in CPU_ONLY and device.type != "cpu":
        reason = "the ONNX Runtime paths are measured on the CPU only"
    if reason:
        raise Skipped(reason)


def _eager(model: nn.Module, device: torch.device, memory_format: torch.memory_format,
           dtype: torch.dtype | None) -> Forward:
    def forward(images: torch.Tensor) -> torch.Tensor:
        with torch.inference_mode():
            batch = images.contiguous(memory_format=memory_format)  # on the device: part of the path's cost
            with torch.autocast(device.type, dtype=dtype) if dtype else contextlib.nullcontext():
                return model(batch)

    return forward


def _compiled(model: nn.Module) -> Callable[[int], Forward]:
    """A fresh ``torch.compile(dynamic=False)`` per batch size: each shape gets its own static graph, where
    reusing one compiled module would recompile the second shape with dynamic shapes (slower kernels)."""
    model = model.to(memory_format=torch.channels_last)

    def for_batch_size(batch_size: int) -> Forward:
        torch._dynamo.reset()  # the previous batch size's graphs and its record of shapes seen
        compiled = torch.compile(model, dynamic=False)

        def forward(images: torch.Tensor) -> torch.Tensor:
            with torch.no_grad():
                return compiled(images.contiguous(memory_format=torch.channels_last))

        return forward

    return for_batch_size


def _aoti(model: nn.Module, image_size: int, device: torch.device, workdir: Path) -> Forward:
    """The model compiled into a package for ``device``, its batch free, loaded as classify.py loads one."""
    from image_classification.deploy.aoti import AotiModel, write_package

    path = workdir / "model.pt2"
    write_package(model, image_size, path, device, {})
    return AotiModel(path)


def _onnxruntime(model: nn.Module, image_size: int, workdir: Path, int8: bool = False) -> Forward:
    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        raise Skipped("onnxruntime is not installed") from None
    from image_classification.deploy.onnx_runtime import session as onnx_session
    from image_classification.deploy.torch_export import MIN_TRACED_BATCH, OPSET, export_onnx

    path = workdir / "model.onnx"
    export_onnx(model.float().eval(), torch.randn(MIN_TRACED_BATCH, 3, image_size, image_size), path,
                dynamic_batch=True, opset=OPSET, log=print)
    if int8:
        path = _quantized(path, image_size)
    session = onnx_session(path, threads=torch.get_num_threads())  # classify.py --runtime onnxruntime's session

    def forward(images: torch.Tensor) -> object:
        return session.run(["output"], {"input": images.numpy()})[0]  # numpy() of a CPU tensor copies nothing

    return forward


INT8_CALIBRATION_IMAGES = 16


def _quantized(path: Path, image_size: int) -> Path:
    """The int8 graph of the FP32 one at ``path``, quantized as ``--quantize int8`` does on this CPU, calibrated
    on random images like those measured (random weights leave nothing else to calibrate on)."""
    from image_classification.deploy.quantization import Quantization, quantize, reduce_range_here

    images = torch.randn(INT8_CALIBRATION_IMAGES, 3, image_size, image_size,
                         generator=torch.Generator().manual_seed(1)).numpy()
    target = path.with_name("model_int8.onnx")
    quantize(path, target, Quantization(images, "minmax", reduce_range_here(), sha256="random"), path.parent)
    return target


def _dtype(name: str, device: torch.device) -> str:
    if name in AUTOCAST:
        return str(AUTOCAST[name]).removeprefix("torch.")
    if name == "int8":
        from image_classification.deploy.quantization import reduce_range_here

        return "int8 (7-bit weights: reduce_range)" if reduce_range_here() else "int8"
    return _fp32_label(device)


def build_path(name: str, state: dict, arch: str, num_classes: int, device: torch.device, image_size: int,
               workdir: Path) -> Path_:
    """Our path ``name`` over a fresh copy of the package's model holding ``state``."""
    dtype = _dtype(name, device)
    try:
        _check_runs(name, device)
        model = build_model(arch, num_classes=num_classes)
        model.load_state_dict(state)
        model = model.eval().to(device)
        if name == "compile":
            return Path_(name, min_warmup=1, dtype=dtype, for_batch_size=_compiled(model))
        if name == "eager":
            forward = _eager(model, device, torch.contiguous_format, None)
        elif name == "channels_last" or name in AUTOCAST:
            model = model.to(memory_format=torch.channels_last)
            forward = _eager(model, device, torch.channels_last, AUTOCAST.get(name))
        elif name == "aoti":
            forward = _aoti(model, image_size, device, workdir)
        else:
            forward = _onnxruntime(model, image_size, workdir, int8=name == "int8")
        return Path_(name, forward, dtype=dtype)
    except Skipped as reason:
        return Path_(name, skipped=str(reason), dtype=dtype)


def build_baseline(arch: str, state: dict, device: torch.device) -> Path_:
    """torchvision's model with the same weights, called as a user does."""
    import torchvision

    model = getattr(torchvision.models, arch)(num_classes=state["fc.weight"].shape[0])
    model.load_state_dict(state)
    model = model.eval().to(device)

    def forward(images: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return model(images)

    return Path_(BASELINE, forward, dtype=_fp32_label(device))
