"""Inference latency and throughput: the package's inference paths against plain torchvision eager FP32.

Every path classifies the same images with the same weights, in one process: ``torchvision`` (the
baseline: ``torchvision.models.<arch>()`` in eval mode under ``torch.no_grad``, what a user writes), and
ours: ``eager`` (FP32, NCHW, ``torch.inference_mode``), ``channels_last`` (FP32), ``bf16`` and ``fp16``
(bfloat16 and float16 autocast, channels-last; each runs the dtype it is named after, fp16 on CUDA only),
``compile`` (``torch.compile`` of the channels-last FP32 model, compiled for each batch size's static shape),
``aoti`` (the model compiled ahead of time into an AOTInductor package, its batch free, as ``model2onnx.py
--output M.pt2`` writes it), ``onnxruntime`` (the model exported by
``image_classification.deploy.torch_export.export_onnx`` run with ONNX Runtime; CPU only) and ``int8`` (that export quantized as ``--quantize int8`` does, calibrated on random
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
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Sequence

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from benchmarks.common import command_line, environment, ratio_text, write_json  # noqa: E402
from benchmarks.infer_paths import BASELINE, PATHS, build_baseline, build_path, default_paths  # noqa: E402
from benchmarks.infer_timing import best_paths, fp32_ceiling, measure_paths, summary, transfer_times  # noqa: E402
from image_classification.errors import UserError  # noqa: E402
from image_classification.models import build_model  # noqa: E402
from image_classification.system.cli import run  # noqa: E402
from image_classification.system.cli import UserErrorParser, positive_int  # noqa: E402


def build_parser() -> argparse.ArgumentParser:
    parser = UserErrorParser(prog="infer_throughput.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("-a", "--arch", default="resnet50", metavar="ARCH",
                        help="a torchvision ResNet that the package also builds (default: resnet50)")
    parser.add_argument("--image-size", type=positive_int, default=224, metavar="S", help="input size (default: 224)")
    parser.add_argument("--batch-sizes", nargs="+", type=positive_int, default=[1, 16], metavar="N",
                        help="batch sizes (default: 1 16)")
    parser.add_argument("--paths", nargs="+", choices=PATHS, default=None,
                        help="our paths to measure (default: all that run on the device, fp16 on CUDA only, "
                        "onnxruntime and int8 on the CPU only, but aoti, whose compilation takes minutes)")
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
