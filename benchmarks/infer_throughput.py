"""Inference latency and throughput: the package's inference paths against plain torchvision eager FP32.

Every path classifies the same images with the same weights, in one process: ``torchvision`` (the
baseline: ``torchvision.models.<arch>()`` in eval mode under ``torch.no_grad``, what a user writes), and
ours: ``eager`` (FP32, NCHW, ``torch.inference_mode``), ``channels_last`` (FP32), ``bf16`` and ``fp16``
(bfloat16 and float16 autocast, channels-last; each runs the dtype it is named after, fp16 on CUDA only),
``compile`` (``torch.compile`` of the channels-last FP32 model, compiled for each batch size's static shape),
``onnxruntime`` (the model exported by ``image_classification.deploy.export.export_onnx`` run with ONNX
Runtime; CPU only) and ``int8`` (that export quantized as ``--quantize int8`` does, calibrated on random
images like the measured ones; CPU only). A path that cannot run here (no compiler for ``torch.compile``,
onnxruntime not installed, no bf16 on the GPU) is recorded as skipped with the reason. On CUDA, cuDNN
autotuning is on.

Every path times the model alone: each batch is uploaded to the device once, before any timing, and the
outputs stay on the device (they are read back only to compare them, untimed). On CUDA the upload of a
batch and the download of its logits, from and into pinned memory, are timed on their own and reported
beside the paths. For each batch size, every path first runs ``--warmup`` untimed batches (their time,
compilation included, is reported); then ``--repeats`` rounds each time ``--iters`` batches of every path in
turn (the order rotates from round to round), each batch timed on its own with the device synchronised
around it. The JSON holds per path and batch size the latency percentiles (p50, p90, p99, in ms), images/s
(batch size over the mean latency), the speed-up over the baseline's images/s, per path its compute dtype,
the largest absolute logit difference and top-1 agreement against the baseline's FP32 outputs on the
measured batches, and the path ``classify.py`` takes by default on this machine.  On the CPU it also holds
the FP32 ceiling: the model's FLOPs per image at the rate of a dense FP32 matrix product on the same
threads, the images/s that no FP32 path can much exceed there. Example::

    python benchmarks/infer_throughput.py -a resnet50 --batch-sizes 1 16 -o infer_resnet50.json \\
        --chart docs/inference.png
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import torch  # noqa: E402
from torch import nn  # noqa: E402

from benchmarks.common import (command_line, compiler_missing, environment, percentile, ratio_spread,  # noqa: E402
                               ratio_text, verdict, write_json)
from image_classification.errors import UserError  # noqa: E402
from image_classification.models import build_model  # noqa: E402
from image_classification.system.cli import run  # noqa: E402
from image_classification.system.cli import UserErrorParser, positive_int  # noqa: E402

BASELINE = "torchvision"
PATHS = ("eager", "channels_last", "bf16", "fp16", "compile", "onnxruntime", "int8")
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


def default_paths(device: torch.device) -> list[str]:
    """Every path that can run on ``device``: fp16 autocast on CUDA only, ONNX Runtime on the CPU only."""
    excluded = ("fp16",) if device.type == "cpu" else CPU_ONLY
    return [name for name in PATHS if name not in excluded]


def build_parser() -> argparse.ArgumentParser:
    parser = UserErrorParser(prog="infer_throughput.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("-a", "--arch", default="resnet50", metavar="ARCH",
                        help="a torchvision ResNet that the package also builds (default: resnet50)")
    parser.add_argument("--image-size", type=positive_int, default=224, metavar="S", help="input size (default: 224)")
    parser.add_argument("--batch-sizes", nargs="+", type=positive_int, default=[1, 16], metavar="N",
                        help="batch sizes (default: 1 16)")
    parser.add_argument("--paths", nargs="+", choices=PATHS, default=None,
                        help="our paths to measure (default: all that run on the device: fp16 on CUDA only, "
                        "onnxruntime and int8 on the CPU only)")
    parser.add_argument("--iters", type=positive_int, default=10, metavar="N",
                        help="timed batches per path, batch size and round (default: 10)")
    parser.add_argument("--warmup", type=int, default=3, metavar="N",
                        help="untimed batches per path and batch size (default: 3; compile always gets one, "
                        "the call that compiles)")
    parser.add_argument("--repeats", type=positive_int, default=3, metavar="N", help="rounds (default: 3)")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                        help="where to run (default: auto, CUDA when present)")
    parser.add_argument("-o", "--output", metavar="FILE", default=None, help="JSON file to write")
    parser.add_argument("--chart", metavar="PNG", default=None,
                        help="also draw images/s of every path and batch size to this PNG file")
    return parser


def select_device(choice: str) -> torch.device:
    """The device to measure on.  On CUDA cuDNN autotuning goes on, as a server running fixed shapes
    would have it: every shape is tuned during its warm-up, before any timing."""
    if choice == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda was asked for, but no CUDA device is available")
    if choice == "cpu" or not torch.cuda.is_available():
        return torch.device("cpu")
    torch.backends.cudnn.benchmark = True
    return torch.device("cuda")


def classify_default(device: torch.device) -> str:
    """The path classify.py takes on ``device`` with its defaults (channels-last, its default precision)."""
    from image_classification.deploy.inference import default_precision

    if default_precision(device.type) == "FP32":
        return "channels_last"
    return "fp16" if device.type == "cuda" else "bf16"


# ------------------------------------------------------------------------------------------------
# Paths
# ------------------------------------------------------------------------------------------------
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


def _onnxruntime(model: nn.Module, image_size: int, workdir: Path, int8: bool = False) -> Forward:
    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        raise Skipped("onnxruntime is not installed") from None
    from image_classification.deploy.export import export_onnx
    from image_classification.deploy.onnx_runtime import OPSET, session as onnx_session

    path = workdir / "model.onnx"
    export_onnx(model.float().eval(), torch.randn(1, 3, image_size, image_size), path, dynamic_batch=True,
                opset=OPSET)
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


# ------------------------------------------------------------------------------------------------
# Measurement
# ------------------------------------------------------------------------------------------------
def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(work: Callable[[], object], device: torch.device) -> float:
    """Seconds ``work`` takes, the device synchronised just before and just after it."""
    _synchronize(device)
    start = time.perf_counter()
    work()
    _synchronize(device)
    return time.perf_counter() - start


def _logits(output: object) -> torch.Tensor:
    """A path's output as float logits on the host, to compare (never inside a timed region)."""
    return torch.as_tensor(output).float().cpu()


def _compare(paths: list[Path_], images: torch.Tensor) -> None:
    """Every path's logits on ``images`` against the first path's: largest difference, top-1 agreement."""
    reference = _logits(paths[0].forward(images))
    for path in paths[1:]:
        logits = _logits(path.forward(images))
        path.max_abs_diff = max(path.max_abs_diff, float((logits - reference).abs().max()))
        path.agreeing += int((logits.argmax(1) == reference.argmax(1)).sum())
        path.compared += len(reference)


def measure_paths(paths: list[Path_], batch_sizes: Sequence[int], image_size: int, device: torch.device,
                  iters: int, warmup: int, repeats: int) -> None:
    """Time every runnable path at every batch size; then compare each path's outputs with the first's."""
    live = [p for p in paths if p.skipped is None]
    generator = torch.Generator().manual_seed(0)
    for batch_size in batch_sizes:
        # Uploaded once: the timed calls get a batch already on the device, as a pipelined server's model does.
        images = torch.randn(batch_size, 3, image_size, image_size, generator=generator).to(device)
        for path in live:
            start = time.perf_counter()
            if path.for_batch_size is not None:
                path.forward = path.for_batch_size(batch_size)
            for _ in range(max(warmup, path.min_warmup)):
                path.forward(images)
            _synchronize(device)
            path.warmup_seconds[batch_size] = time.perf_counter() - start
            path.latencies[batch_size] = []
        for round_index in range(repeats):
            shift = round_index % len(live)
            for path in live[shift:] + live[:shift]:
                path.latencies[batch_size] += [_timed(lambda: path.forward(images), device) for _ in range(iters)]
        if len(live) > 1:
            _compare(live, images)


def transfer_times(batch_size: int, image_size: int, num_classes: int, device: torch.device,
                   iters: int) -> dict[str, float]:
    """Median ms to upload a batch from pinned memory and to download its logits into pinned memory, both
    non-blocking (CUDA): what a server pays besides the model, kept out of the paths' figures."""
    host = torch.randn(batch_size, 3, image_size, image_size).pin_memory()
    logits = torch.empty(batch_size, num_classes, device=device)
    back = torch.empty(logits.shape, pin_memory=True)
    upload, download = [], []
    for _ in range(iters + 1):  # the first of each is a warm-up
        upload.append(_timed(lambda: host.to(device, non_blocking=True), device))
        download.append(_timed(lambda: back.copy_(logits, non_blocking=True), device))
    return {"upload_ms": 1e3 * percentile(upload[1:], 50), "download_ms": 1e3 * percentile(download[1:], 50)}


def _round_rates(latencies: list[float], batch_size: int, repeats: int) -> list[float]:
    """images/s of each round (the latencies are in round order, the same count per round)."""
    per_round = len(latencies) // max(repeats, 1)
    return [batch_size * per_round / sum(latencies[i:i + per_round]) for i in range(0, per_round * repeats, per_round)]


def summary(paths: list[Path_], batch_sizes: Sequence[int], repeats: int = 1) -> dict:
    baseline_rate, baseline_rounds = {}, {}
    table: dict[str, dict] = {}
    for path in paths:
        if path.skipped:
            table[path.name] = {"dtype": path.dtype, "skipped": path.skipped}
            continue
        entry: dict = {"dtype": path.dtype}
        for batch_size in batch_sizes:
            latencies = path.latencies[batch_size]
            rate = batch_size * len(latencies) / sum(latencies)
            rounds = _round_rates(latencies, batch_size, repeats)
            if path.name == BASELINE:
                baseline_rate[batch_size], baseline_rounds[batch_size] = rate, rounds
            spread = ratio_spread(rounds, baseline_rounds[batch_size])  # the paths alternate within a round
            entry[str(batch_size)] = {
                "p50_ms": 1e3 * percentile(latencies, 50), "p90_ms": 1e3 * percentile(latencies, 90),
                "p99_ms": 1e3 * percentile(latencies, 99), "images_per_s": rate,
                "speedup": rate / baseline_rate[batch_size], "warmup_seconds": path.warmup_seconds[batch_size],
                "batches": len(latencies), "speedup_spread": spread,
                "verdict": verdict(rate / baseline_rate[batch_size], spread),
            }
        if path.compared:
            entry.update(max_abs_diff=path.max_abs_diff, top1_agreement=path.agreeing / path.compared,
                         compared_images=path.compared)
        table[path.name] = entry
    return table


def best_paths(table: dict, batch_sizes: Sequence[int]) -> dict[str, str]:
    """The path with the most images/s at each batch size (the baseline excluded)."""
    best = {}
    for batch_size in batch_sizes:
        rates = {name: entry[str(batch_size)]["images_per_s"] for name, entry in table.items()
                 if name != BASELINE and str(batch_size) in entry}
        if rates:
            best[str(batch_size)] = max(rates, key=rates.get)
    return best


def draw_chart(result: dict, path: str) -> None:
    """Grouped bars: images/s of every measured path at every batch size, the speed-up written above."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    table, batch_sizes = result["paths"], result["config"]["batch_sizes"]
    names = [name for name, entry in table.items() if "skipped" not in entry]
    figure, axes = plt.subplots(1, len(batch_sizes), figsize=(5 * len(batch_sizes), 4.2), squeeze=False)
    for axis, batch_size in zip(axes[0], batch_sizes):
        rates = [table[name][str(batch_size)]["images_per_s"] for name in names]
        colours = ["0.55" if name == BASELINE else "tab:blue" for name in names]
        bars = axis.bar(names, rates, color=colours)
        for bar, name in zip(bars, names):
            point = table[name][str(batch_size)]
            # a speed-up within the spread of its rounds is marked as such, not claimed
            axis.annotate(f"{point['speedup']:.2f}x" + ("" if point.get("verdict", True) else "\n(in spread)"),
                          (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center", va="bottom",
                          fontsize=8)
        axis.set_title(f"batch {batch_size}")
        axis.set_ylabel("images/s")
        axis.tick_params(axis="x", labelrotation=30)
        axis.grid(True, axis="y", alpha=0.3)
    config = result["config"]
    title = f"{config['arch']} {config['image_size']} px inference on {result['environment']['machine']}"
    figure.suptitle(textwrap.fill(title, width=60 * len(batch_sizes)), fontsize=9)
    figure.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    plt.close(figure)


def model_gflop(arch: str, image_size: int) -> float:
    """Floating-point operations of one image's forward pass, in GFLOP: the convolutions and the fc layer,
    two per multiply-add, counted by ``torch.utils.flop_counter`` on the meta device (no weights, no data)."""
    from torch.utils.flop_counter import FlopCounterMode

    with torch.device("meta"):
        model = build_model(arch, num_classes=1000).eval()
        images = torch.empty(1, 3, image_size, image_size)
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(images)
    return counter.get_total_flops() / 1e9


def gemm_gflops(size: int = 2048, trials: int = 5) -> float:
    """The FP32 rate of this process's threads on the CPU, in GFLOP/s: the best of ``trials`` timings of a
    ``size`` x ``size`` matrix product, the densest work a CPU does and close to its peak."""
    a, b = torch.randn(size, size), torch.randn(size, size)
    a @ b  # the first call pays for the library's set-up
    best = min(_timed(lambda: a @ b, torch.device("cpu")) for _ in range(trials))
    return 2 * size ** 3 / best / 1e9


def fp32_ceiling(arch: str, image_size: int) -> dict:
    """The images/s no FP32 path can much exceed on this CPU: the model's GFLOP per image at the rate of a
    dense FP32 matrix product.  A path near it is limited by the arithmetic, not by its implementation."""
    gflop, rate = model_gflop(arch, image_size), gemm_gflops()
    return {"gflop_per_image": gflop, "gemm_gflops": rate, "images_per_s": rate / gflop}


def measure(args: argparse.Namespace) -> dict:
    device = select_device(args.device)
    torch.manual_seed(0)
    state = build_model(args.arch, num_classes=1000).state_dict()
    with tempfile.TemporaryDirectory() as workdir:
        paths = [build_baseline(args.arch, state, device)]
        paths += [build_path(name, state, args.arch, 1000, device, args.image_size, Path(workdir))
                  for name in args.paths or default_paths(device)]
        measure_paths(paths, args.batch_sizes, args.image_size, device, args.iters, args.warmup, args.repeats)
    table = summary(paths, args.batch_sizes, args.repeats)
    result = {
        "benchmark": "infer_throughput",
        "command": command_line(),
        "config": {"arch": args.arch, "image_size": args.image_size, "batch_sizes": list(args.batch_sizes),
                   "iters": args.iters, "warmup": args.warmup, "repeats": args.repeats, "baseline": BASELINE},
        "environment": environment(device),
        "paths": table,
        "best": best_paths(table, args.batch_sizes),
        "classify_default": classify_default(device),
    }
    if device.type == "cpu":
        result["fp32_ceiling"] = fp32_ceiling(args.arch, args.image_size)
    if device.type == "cuda":
        result["transfer"] = {str(b): transfer_times(b, args.image_size, 1000, device, args.iters)
                              for b in args.batch_sizes}
    return result


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    import torchvision

    if not callable(getattr(torchvision.models, args.arch, None)):
        raise UserError(f"torchvision has no model {args.arch!r} to compare with")
    result = measure(args)
    print(f"{args.arch} {args.image_size} px on {result['environment']['machine']}")
    default = result["classify_default"]
    for name, entry in result["paths"].items():
        label = f"{name}{'*' if name == default else ''}"
        if "skipped" in entry:
            print(f"  {label:>15}: skipped ({entry['skipped']})")
            continue
        cells = []
        for b in args.batch_sizes:
            point = entry[str(b)]
            versus = "baseline" if name == BASELINE else ratio_text(point["speedup"], point["speedup_spread"])
            cells.append(f"b{b}: {point['images_per_s']:7.1f} img/s p50 {point['p50_ms']:7.1f} ms ({versus})")
        check = ""
        if "max_abs_diff" in entry:
            check = f"  max|diff| {entry['max_abs_diff']:.2g} top1 {entry['top1_agreement']:.2f}"
        print(f"  {label:>15}: " + "   ".join(cells) + f"  [{entry['dtype']}]" + check)
    print(f"  * classify.py's default path here: {default}")
    ceiling = result.get("fp32_ceiling")
    if ceiling:
        print(f"  FP32 ceiling here: {ceiling['gflop_per_image']:.2f} GFLOP per image at the "
              f"{ceiling['gemm_gflops']:.0f} GFLOP/s of an FP32 matrix product: about "
              f"{ceiling['images_per_s']:.1f} images/s")
    for batch_size, times in result.get("transfer", {}).items():
        print(f"  transfer, not in the figures above: b{batch_size} upload {times['upload_ms']:.2f} ms, "
              f"logits back {times['download_ms']:.2f} ms (pinned, non-blocking)")
    print("  fastest: " + ", ".join(f"batch {b}: {name}" for b, name in result["best"].items()))
    write_json(result, args.output)
    if args.chart:
        draw_chart(result, args.chart)
    return 0


if __name__ == "__main__":
    sys.exit(run(main))
