"""Inference latency and throughput: the package's inference paths against plain torchvision eager FP32.

Every path classifies the same images with the same weights, in one process: ``torchvision`` (the
baseline: ``torchvision.models.<arch>()`` in eval mode under ``torch.no_grad``, what a user writes), and
ours: ``eager`` (FP32, NCHW, ``torch.inference_mode``), ``channels_last`` (FP32), ``bf16`` (bfloat16
autocast, channels-last; fp16 on CUDA), ``compile`` (``torch.compile`` of the channels-last FP32 model)
and ``onnxruntime`` (the model exported by ``image_classification.export.export_onnx`` run with ONNX
Runtime; CPU only). A path that cannot run here (no C compiler for ``torch.compile``, onnxruntime not
installed) is recorded as skipped with the reason.

For each batch size, every path first runs ``--warmup`` untimed batches (their time, compilation
included, is reported); then ``--repeats`` rounds each time ``--iters`` batches of every path in turn
(the order rotates from round to round), each batch timed on its own with the device synchronised. The
JSON holds per path and batch size the latency percentiles (p50, p90, p99, in ms), images/s (batch size
over the mean latency), the speed-up over the baseline's images/s, and the largest absolute logit
difference and top-1 agreement against the baseline's FP32 outputs. Example::

    python benchmarks/infer_throughput.py -a resnet50 --batch-sizes 1 16 -o infer_resnet50.json \\
        --chart docs/inference.png
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import torch  # noqa: E402
from torch import nn  # noqa: E402

from benchmarks.common import command_line, environment, percentile, write_json  # noqa: E402
from image_classification.arguments import UserErrorParser, positive_int  # noqa: E402
from image_classification.cli import run  # noqa: E402
from image_classification.errors import UserError  # noqa: E402
from image_classification.models import build_model  # noqa: E402

BASELINE = "torchvision"
PATHS = ("eager", "channels_last", "bf16", "compile", "onnxruntime")
Forward = Callable[[torch.Tensor], torch.Tensor]


class Skipped(Exception):
    """A path that cannot run on this machine; the message says why."""


@dataclass
class Path_:
    """One way of running the model: its forward function (logits as a float CPU tensor) once built."""

    name: str
    forward: Forward | None = None
    skipped: str | None = None
    min_warmup: int = 0  # untimed calls it needs whatever --warmup says (compile's first call compiles)
    warmup_seconds: dict[int, float] = field(default_factory=dict)
    latencies: dict[int, list[float]] = field(default_factory=dict)


def build_parser() -> argparse.ArgumentParser:
    parser = UserErrorParser(prog="infer_throughput.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("-a", "--arch", default="resnet50", metavar="ARCH",
                        help="a torchvision ResNet that the package also builds (default: resnet50)")
    parser.add_argument("--image-size", type=positive_int, default=224, metavar="S", help="input size (default: 224)")
    parser.add_argument("--batch-sizes", nargs="+", type=positive_int, default=[1, 16], metavar="N",
                        help="batch sizes (default: 1 16)")
    parser.add_argument("--paths", nargs="+", choices=PATHS, default=list(PATHS),
                        help="our paths to measure (default: all)")
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


# ------------------------------------------------------------------------------------------------
# Paths
# ------------------------------------------------------------------------------------------------
def _eager(model: nn.Module, device: torch.device, memory_format: torch.memory_format,
           dtype: torch.dtype | None) -> Forward:
    def forward(images: torch.Tensor) -> torch.Tensor:
        with torch.inference_mode():
            batch = images.to(device).contiguous(memory_format=memory_format)
            with torch.autocast(device.type, dtype=dtype) if dtype else contextlib.nullcontext():
                return model(batch).float().cpu()

    return forward


def _compiled(model: nn.Module, device: torch.device) -> Forward:
    if device.type == "cpu" and not (shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")):
        raise Skipped("torch.compile on the CPU needs a C++ compiler; none found")
    compiled = torch.compile(model.to(memory_format=torch.channels_last))

    def forward(images: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return compiled(images.to(device).contiguous(memory_format=torch.channels_last)).float().cpu()

    return forward


def _onnxruntime(model: nn.Module, device: torch.device, image_size: int, workdir: Path) -> Forward:
    if device.type != "cpu":
        raise Skipped("the ONNX Runtime path is measured on the CPU only")
    try:
        import onnxruntime
    except ImportError:
        raise Skipped("onnxruntime is not installed") from None
    from image_classification.export import export_onnx

    path = workdir / "model.onnx"
    export_onnx(model.float().eval(), torch.randn(1, 3, image_size, image_size), path, dynamic_batch=True, opset=17)
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = torch.get_num_threads()
    session = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])

    def forward(images: torch.Tensor) -> torch.Tensor:
        (logits,) = session.run(["output"], {"input": images.numpy()})
        return torch.from_numpy(logits)

    return forward


def build_path(name: str, state: dict, arch: str, num_classes: int, device: torch.device, image_size: int,
               workdir: Path) -> Path_:
    """Our path ``name`` over a fresh copy of the package's model holding ``state``."""
    model = build_model(arch, num_classes=num_classes)
    model.load_state_dict(state)
    model = model.eval().to(device)
    mixed = torch.float16 if device.type == "cuda" else torch.bfloat16
    try:
        if name == "eager":
            return Path_(name, _eager(model, device, torch.contiguous_format, None))
        if name == "channels_last":
            model = model.to(memory_format=torch.channels_last)
            return Path_(name, _eager(model, device, torch.channels_last, None))
        if name == "bf16":
            model = model.to(memory_format=torch.channels_last)
            return Path_(name, _eager(model, device, torch.channels_last, mixed))
        if name == "compile":
            return Path_(name, _compiled(model, device), min_warmup=1)
        return Path_(name, _onnxruntime(model, device, image_size, workdir))
    except Skipped as reason:
        return Path_(name, skipped=str(reason))


def build_baseline(arch: str, state: dict, device: torch.device) -> Path_:
    """torchvision's model with the same weights, called as a user does."""
    import torchvision

    model = getattr(torchvision.models, arch)(num_classes=state["fc.weight"].shape[0])
    model.load_state_dict(state)
    model = model.eval().to(device)

    def forward(images: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return model(images.to(device)).float().cpu()

    return Path_(BASELINE, forward)


# ------------------------------------------------------------------------------------------------
# Measurement
# ------------------------------------------------------------------------------------------------
def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _time_batch(path: Path_, images: torch.Tensor, device: torch.device) -> float:
    _synchronize(device)
    start = time.perf_counter()
    path.forward(images)  # the logits come back to the host: the result is complete
    _synchronize(device)
    return time.perf_counter() - start


def measure_paths(paths: list[Path_], batch_sizes: Sequence[int], image_size: int, device: torch.device,
                  iters: int, warmup: int, repeats: int) -> None:
    live = [p for p in paths if p.forward is not None]
    generator = torch.Generator().manual_seed(0)
    for batch_size in batch_sizes:
        images = torch.randn(batch_size, 3, image_size, image_size, generator=generator)
        for path in live:
            start = time.perf_counter()
            for _ in range(max(warmup, path.min_warmup)):
                path.forward(images)
            path.warmup_seconds[batch_size] = time.perf_counter() - start
            path.latencies[batch_size] = []
        for round_index in range(repeats):
            shift = round_index % len(live)
            for path in live[shift:] + live[:shift]:
                path.latencies[batch_size] += [_time_batch(path, images, device) for _ in range(iters)]


def agreement(paths: list[Path_], image_size: int, samples: int = 16) -> dict[str, dict]:
    """Largest absolute logit difference and top-1 agreement of every path with the baseline's."""
    images = torch.randn(samples, 3, image_size, image_size, generator=torch.Generator().manual_seed(7))
    reference = paths[0].forward(images)
    result = {}
    for path in paths[1:]:
        if path.forward is None:
            continue
        logits = path.forward(images)
        result[path.name] = {"max_abs_diff": float((logits - reference).abs().max()),
                             "top1_agreement": float((logits.argmax(1) == reference.argmax(1)).float().mean())}
    return result


def summary(paths: list[Path_], batch_sizes: Sequence[int], checks: dict[str, dict]) -> dict:
    baseline_rate = {}
    table: dict[str, dict] = {}
    for path in paths:
        if path.skipped:
            table[path.name] = {"skipped": path.skipped}
            continue
        entry: dict = {}
        for batch_size in batch_sizes:
            latencies = path.latencies[batch_size]
            rate = batch_size * len(latencies) / sum(latencies)
            if path.name == BASELINE:
                baseline_rate[batch_size] = rate
            entry[str(batch_size)] = {
                "p50_ms": 1e3 * percentile(latencies, 50), "p90_ms": 1e3 * percentile(latencies, 90),
                "p99_ms": 1e3 * percentile(latencies, 99), "images_per_s": rate,
                "speedup": rate / baseline_rate[batch_size], "warmup_seconds": path.warmup_seconds[batch_size],
                "batches": len(latencies),
            }
        entry.update(checks.get(path.name, {}))
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
            axis.annotate(f"{table[name][str(batch_size)]['speedup']:.2f}x",
                          (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center", va="bottom",
                          fontsize=8)
        axis.set_title(f"batch {batch_size}")
        axis.set_ylabel("images/s")
        axis.tick_params(axis="x", labelrotation=30)
        axis.grid(True, axis="y", alpha=0.3)
    env = result["environment"]
    figure.suptitle(f"{result['config']['arch']} {result['config']['image_size']} px inference, "
                    f"{env['device_name']} ({env['cpu_cores']} cores), torch {env['torch']}", fontsize=10)
    figure.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    plt.close(figure)


def measure(args: argparse.Namespace) -> dict:
    if args.device == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda was asked for, but no CUDA device is available")
    use_cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    device = torch.device("cuda" if use_cuda else "cpu")
    torch.manual_seed(0)
    state = build_model(args.arch, num_classes=1000).state_dict()
    with tempfile.TemporaryDirectory() as workdir:
        paths = [build_baseline(args.arch, state, device)]
        paths += [build_path(name, state, args.arch, 1000, device, args.image_size, Path(workdir))
                  for name in args.paths]
        measure_paths(paths, args.batch_sizes, args.image_size, device, args.iters, args.warmup, args.repeats)
        checks = agreement(paths, args.image_size)
    table = summary(paths, args.batch_sizes, checks)
    return {
        "benchmark": "infer_throughput",
        "command": command_line(),
        "config": {"arch": args.arch, "image_size": args.image_size, "batch_sizes": list(args.batch_sizes),
                   "iters": args.iters, "warmup": args.warmup, "repeats": args.repeats, "baseline": BASELINE},
        "environment": environment(device),
        "paths": table,
        "best": best_paths(table, args.batch_sizes),
    }


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    import torchvision

    if not callable(getattr(torchvision.models, args.arch, None)):
        raise UserError(f"torchvision has no model {args.arch!r} to compare with")
    result = measure(args)
    env = result["environment"]
    print(f"{args.arch} {args.image_size} px on {env['device_name']} ({env['cpu_cores']} cores), torch {env['torch']}")
    for name, entry in result["paths"].items():
        if "skipped" in entry:
            print(f"  {name:>14}: skipped ({entry['skipped']})")
            continue
        cells = [f"b{b}: {entry[str(b)]['images_per_s']:7.1f} img/s p50 {entry[str(b)]['p50_ms']:7.1f} ms "
                 f"({entry[str(b)]['speedup']:.2f}x)" for b in args.batch_sizes]
        check = f"  max|diff| {entry['max_abs_diff']:.2g} top1 {entry['top1_agreement']:.2f}" if name != BASELINE else ""
        print(f"  {name:>14}: " + "   ".join(cells) + check)
    print("  fastest: " + ", ".join(f"batch {b}: {name}" for b, name in result["best"].items()))
    write_json(result, args.output)
    if args.chart:
        draw_chart(result, args.chart)
    return 0


if __name__ == "__main__":
    sys.exit(run(main))
