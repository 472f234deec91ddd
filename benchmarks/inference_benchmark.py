"""Inference benchmark: sweep batch sizes and precisions through ``main.py --evaluate`` runs.

Every (precision, batch size) point is one evaluation run of main.py (called in this process) on
synthetic data, or on a dataset's val/ split with ``--data``, for ``--iterations`` batches.  A short
run of ``--warmup`` batches with the same shapes goes first and is thrown away, so one-off costs (CUDA
context, cuDNN autotuning, oneDNN kernel creation) stay out of the tables.  The numbers come from each
run's raport summary: throughput ``val.total_ips``; latency ``val.compute_latency`` (mean) and
``val.compute_latency_at{90,95,99}``, the time of one batch with the device synchronised around it.

Writes ``inference_<arch>_<device>.md`` (one table per precision, in the layout of the reference
README), ``.csv`` and ``.png`` (throughput and 99th-percentile latency against batch size) to
``--output-dir``.  Example, the CPU tables of resnet50v1.5/README.md::

    python benchmarks/inference_benchmark.py -a resnet50 --device cpu --batch-sizes 1 2 4 8 16 --iterations 20
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import shlex
import sys
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Sequence

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from image_classification.errors import UserError  # noqa: E402
from image_classification.models import default_image_size, list_models  # noqa: E402
from image_classification.records.raport import read_raport  # noqa: E402
from image_classification.system import machine  # noqa: E402
from image_classification.system.cli import run  # noqa: E402
from image_classification.system.cli import UserErrorParser, positive_int  # noqa: E402

# main.py flags of each precision, as configs.yml's presets: AMP is fp16 autocast on CUDA, bf16 on CPU.
PRECISIONS = {"FP32": ["--no-tf32"], "TF32": ["--tf32"], "AMP": ["--amp"],
              "BF16": ["--amp", "--amp-dtype", "bfloat16"]}
MIXED = ("AMP", "BF16")
DEFAULT_BATCH_SIZES = [2 ** i for i in range(9)]  # 1 .. 256
HEADER = ("Batch Size", "Throughput", "Avg Latency", "Latency 90%", "Latency 95%", "Latency 99%")

Runner = Callable[[list], int]  # main.py's entry point: argv -> exit code


@dataclass
class Point:
    """One measured (precision, batch size): throughput in images/s, latencies in seconds."""

    precision: str
    batch_size: int
    throughput: float
    compute_ips: float
    latency_avg: float
    latency_90: float
    latency_95: float
    latency_99: float
    latency_100: float


def run_summary(raport_path: Path) -> dict:
    """The run summary of a raport: every LOG record with step ``[]``, merged."""
    summary: dict = {}
    for record in read_raport(raport_path):
        if record.get("type") == "LOG" and record.get("step") == []:
            summary.update(record["data"])
    if "val.compute_latency" not in summary:
        raise RuntimeError(f"{raport_path} has no validation summary (val.compute_latency)")
    return summary


def point_from_summary(precision: str, batch_size: int, summary: dict) -> Point:
    return Point(
        precision, batch_size, summary["val.total_ips"], summary["val.compute_ips"],
        summary["val.compute_latency"],
        summary["val.compute_latency_at90"], summary["val.compute_latency_at95"],
        summary["val.compute_latency_at99"], summary["val.compute_latency_at100"],
    )


def main_argv(args: argparse.Namespace, precision: str, batch_size: int, iterations: int, workspace: Path,
              raport_file: str) -> list[str]:
    """main.py's command line for one evaluation run."""
    memory_format = args.memory_format
    if memory_format == "auto":  # the reference's recipes run AMP channels-last
        memory_format = "nhwc" if precision in MIXED else "nchw"
    argv = [
        "--evaluate", "--arch", args.arch, "-b", str(batch_size), "--prof", str(iterations),
        "--device", args.device, "--memory-format", memory_format, "--num-classes", str(args.num_classes),
        "--workspace", str(workspace), "--raport-file", raport_file, "--print-freq", str(max(iterations, 1)),
        "--seed", "0", *PRECISIONS[precision],
    ]
    if args.image_size:
        argv += ["--image-size", str(args.image_size)]
    if args.data:
        argv += ["--data-backend", args.data_backend or "pytorch", args.data]
    else:
        argv += ["--data-backend", "synthetic"]
    return argv + list(args.main_args)


def call_main(runner: Runner, argv: list[str], log_path: Path) -> None:
    """Run main.py's entry point with its output going to ``log_path``; raise if it fails."""
    with open(log_path, "w", encoding="utf-8") as log, contextlib.redirect_stdout(log), \
            contextlib.redirect_stderr(log):
        print("main.py " + shlex.join(argv), flush=True)
        try:
            code = runner(argv)
        except UserError:
            raise
        except Exception:
            traceback.print_exc(file=log)
            raise
    if code:
        raise RuntimeError(f"main.py exited with code {code}; see {log_path}")


def sweep(args: argparse.Namespace, runner: Runner,
          say: Callable[[str], None] = print) -> tuple[list[Point], list[str]]:
    """Measure every precision at every batch size.  A failed run (out of memory, say) ends that
    precision's sweep, since larger batches would fail too; its message is returned."""
    out = Path(args.output_dir)
    workspace = out / "runs"
    workspace.mkdir(parents=True, exist_ok=True)
    points, failures = [], []
    for precision in args.precisions:
        for batch_size in args.batch_sizes:
            name = f"{args.arch}_{precision}_b{batch_size}"
            for raport in (f"{name}_warmup.json", f"{name}.json"):  # an earlier sweep's: measured again
                (workspace / raport).unlink(missing_ok=True)
            try:
                if args.warmup > 0:
                    call_main(runner, main_argv(args, precision, batch_size, args.warmup, workspace,
                                                f"{name}_warmup.json"), workspace / f"{name}_warmup.log")
                call_main(runner, main_argv(args, precision, batch_size, args.iterations, workspace,
                                            f"{name}.json"), workspace / f"{name}.log")
                point = point_from_summary(precision, batch_size, run_summary(workspace / f"{name}.json"))
            except UserError:
                raise
            except Exception as error:  # noqa: BLE001 - reported; the sweep goes on with the next precision
                reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
                failures.append(f"{precision} batch {batch_size}: {type(error).__name__}: {reason}")
                say(f"{precision:>4} b={batch_size:<4} failed ({reason}); skipping larger batches")
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()
                break
            points.append(point)
            say(f"{precision:>4} b={batch_size:<4} {point.throughput:10.1f} img/s   "
                f"avg {1e3 * point.latency_avg:8.2f} ms   p99 {1e3 * point.latency_99:8.2f} ms")
    return points, failures


# ------------------------------------------------------------------------------------------------
# Reports
# ------------------------------------------------------------------------------------------------
def resolved_device(device: str) -> str:
    return "cuda" if device == "cuda" or (device == "auto" and torch.cuda.is_available()) else "cpu"


def machine_description(device: str) -> str:
    """What the numbers were measured on, in one line: :func:`machine.description`, the threads, and whether
    the CPU's bf16 is native."""
    bf16 = "native bf16" if machine.cpu_bf16_is_native() else "bf16 emulated"
    return f"{machine.description(device)}; {torch.get_num_threads()} torch threads, CPU {bf16}"


def precision_title(precision: str, device: str) -> str:
    if precision == "AMP":
        return f"Mixed Precision ({'float16' if device == 'cuda' else 'bfloat16'} autocast) Inference Latency"
    if precision == "BF16":
        return "Mixed Precision (bfloat16 autocast) Inference Latency"
    return f"{precision} Inference Latency"


def _throughput(value: float) -> str:
    return f"{value:.0f} img/s" if value >= 100 else f"{value:.1f} img/s"


def markdown(points: Sequence[Point], precisions: Sequence[str], arch: str, device: str, machine: str,
             command: str, setup: str) -> str:
    lines = [f"# Inference performance: {arch}", "", f"* Machine: {machine}", f"* Setup: {setup}",
             f"* Command: `{command}`", ""]
    for precision in precisions:
        rows = [p for p in points if p.precision == precision]
        if not rows:
            continue
        lines += [f"#### {precision_title(precision, device)}", "", "| " + " | ".join(HEADER) + " |",
                  "|" + "---:|" * len(HEADER)]
        for p in rows:
            latencies = (p.latency_avg, p.latency_90, p.latency_95, p.latency_99)
            cells = [str(p.batch_size), _throughput(p.throughput)] + [f"{1e3 * v:.2f} ms" for v in latencies]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def write_csv(points: Sequence[Point], path: Path, arch: str, device: str) -> None:
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["arch", "device", "precision", "batch_size", "throughput_img_s", "compute_img_s",
                         "latency_avg_ms", "latency_p90_ms", "latency_p95_ms", "latency_p99_ms",
                         "latency_max_ms"])
        for p in points:
            values = asdict(p)
            writer.writerow([arch, device, p.precision, p.batch_size, f"{p.throughput:.3f}",
                             f"{p.compute_ips:.3f}",
                             *(f"{1e3 * values[k]:.3f}" for k in
                               ("latency_avg", "latency_90", "latency_95", "latency_99", "latency_100"))])


def plot(points: Sequence[Point], precisions: Sequence[str], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    sizes = sorted({p.batch_size for p in points})
    for precision in precisions:
        rows = [p for p in points if p.precision == precision]
        if not rows:
            continue
        measured = [p.batch_size for p in rows]
        left.plot(measured, [p.throughput for p in rows], marker="o", label=precision)
        right.plot(measured, [1e3 * p.latency_99 for p in rows], marker="o", label=precision)
    for axis, label in ((left, "throughput (images/s)"), (right, "99th percentile latency (ms)")):
        axis.set_xscale("log", base=2)
        axis.set_xticks(sizes, [str(b) for b in sizes])
        axis.minorticks_off()
        axis.set_xlabel("batch size")
        axis.set_ylabel(label)
        axis.grid(True, which="both", alpha=0.3)
        axis.legend()
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


# ------------------------------------------------------------------------------------------------
# Command line
# ------------------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    parser = UserErrorParser(prog="inference_benchmark.py",
                     description="Sweep batch sizes and precisions through main.py --evaluate runs and write "
                     "Markdown, CSV and PNG reports. Arguments after -- go to main.py unchanged.")
    parser.add_argument("-a", "--arch", default="resnet50", choices=list_models(), metavar="ARCH",
                        help="model architecture (default: resnet50)")
    parser.add_argument("--precisions", nargs="+", choices=list(PRECISIONS), default=["FP32", "AMP"],
                        help="FP32 (TF32 off), TF32 (TF32 allowed on CUDA), AMP (fp16 autocast on CUDA, "
                        "bf16 on CPU), BF16 (default: FP32 AMP)")
    parser.add_argument("--batch-sizes", nargs="+", type=positive_int, metavar="N", default=None,
                        help="batch sizes to measure (default: 1, 2, 4, ... up to --max-batch-size)")
    parser.add_argument("--max-batch-size", type=positive_int, metavar="N", default=256,
                        help="largest power-of-two batch size of the default sweep (default: 256)")
    parser.add_argument("--iterations", type=positive_int, metavar="N", default=100,
                        help="measured batches per point (default: 100)")
    parser.add_argument("--warmup", type=int, metavar="N", default=5,
                        help="batches of a discarded warm-up run before each point; 0 for none (default: 5)")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                        help="where to run (default: auto, CUDA when present)")
    parser.add_argument("--memory-format", choices=("auto", "nchw", "nhwc"), default="auto",
                        help="auto: nhwc for AMP and BF16, nchw otherwise, as the recipes (default: auto)")
    parser.add_argument("--image-size", type=positive_int, metavar="S", default=None,
                        help="input size (default: the architecture's, 224)")
    parser.add_argument("--num-classes", type=positive_int, metavar="N", default=1000,
                        help="classifier size (default: 1000)")
    parser.add_argument("--data", metavar="DIR", default=None,
                        help="dataset root whose val/ split is read (default: synthetic data)")
    parser.add_argument("--data-backend", metavar="BACKEND", default=None,
                        help="data backend for --data (default: pytorch)")
    parser.add_argument("--output-dir", metavar="DIR", default="benchmark-results",
                        help="where reports, raports and logs go (default: benchmark-results)")
    parser.add_argument("main_args", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    return parser


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    args = build_parser().parse_args(argv)
    if args.main_args and args.main_args[0] == "--":
        args.main_args = args.main_args[1:]
    elif args.main_args:
        raise UserError(f"unrecognised arguments: {' '.join(args.main_args)} (put main.py flags after --)")
    if args.batch_sizes is None:
        args.batch_sizes = [b for b in DEFAULT_BATCH_SIZES if b <= args.max_batch_size]
    args.batch_sizes = sorted(set(args.batch_sizes))
    if args.device == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda was asked for, but no CUDA device is available")
    if args.data and not Path(args.data).is_dir():
        raise UserError(f"--data {args.data} is not a folder")
    return args


def main(argv: Sequence[str] | None = None, runner: Runner | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if runner is None:
        from image_classification.training import main as runner
    device = resolved_device(args.device)
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    command = "python benchmarks/inference_benchmark.py " + shlex.join(argv)
    machine = machine_description(device)
    print(f"{args.arch} on {machine}", flush=True)

    points, failures = sweep(args, runner)
    if not points:
        raise UserError("no batch size could be measured: " + "; ".join(failures))
    size = args.image_size or default_image_size(args.arch)
    data = f"val/ of {args.data}" if args.data else "synthetic data"
    setup = (f"{data}, {size}x{size}, {args.iterations} batches per point after a {args.warmup}-batch "
             "warm-up run; latency is per batch")
    stem = out / f"inference_{args.arch}_{device}"
    report = markdown(points, args.precisions, args.arch, device, machine, command, setup)
    stem.with_suffix(".md").write_text(report + "\n", encoding="utf-8")
    write_csv(points, stem.with_suffix(".csv"), args.arch, device)
    plot(points, args.precisions, stem.with_suffix(".png"), f"{args.arch} inference, {machine}")
    print("\n" + report, flush=True)
    print(f"wrote {stem}.md, .csv and .png", flush=True)
    for failure in failures:
        print(f"failed: {failure}", file=sys.stderr, flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(run(main))
