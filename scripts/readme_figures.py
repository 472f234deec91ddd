"""Measure the README's figures again and write them into README.md.

    python scripts/readme_figures.py            # every section, on this machine
    python scripts/readme_figures.py demo       # only the named sections
    python scripts/readme_figures.py --check    # every marked block has a generator, and back (no runs)
    python scripts/readme_figures.py demo --print   # print the new block instead of writing README.md

A figure that comes from a run lives in README.md between ``<!-- figures:NAME -->`` and
``<!-- /figures:NAME -->``; the generator ``NAME`` below makes the run and returns the block's new text,
naming the machine it ran on.  Everything outside the markers is left as it is.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from image_classification import machine  # noqa: E402

README = REPO / "README.md"
SUMMARY_FIELDS = ("train.loss", "train.total_ips", "val.top1", "val.top5")


def _python(*argv: str, cwd: Path) -> tuple[str, float]:
    """Run ``python argv`` in ``cwd`` with this repository importable; its output and wall time."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "MPLBACKEND": "Agg"}
    start = time.perf_counter()
    result = subprocess.run([sys.executable, *argv], cwd=cwd, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if result.returncode != 0:
        sys.exit(f"error: python {' '.join(argv)} failed ({result.returncode}):\n{result.stderr[-2000:]}")
    return result.stdout, seconds


def demo_block(output: str, seconds: float, where: str) -> str:
    """The end of the demo's output, shortened, and one sentence with its time and accuracy."""
    lines = output.splitlines()
    summary = next(line for line in lines if " - Summary: " in line and "val.top1" in line)
    head, fields = summary.split(" - Summary: ", 1)
    kept = [match.group(0) for name in SUMMARY_FIELDS
            for match in [re.search(rf"{re.escape(name)} : \S+(?: (?:%|images/s))?", fields)] if match]
    tail = lines[next(i for i, line in enumerate(lines) if line.startswith("val top1:")):]
    top1 = re.search(r"val top1: ([\d.]+)%", tail[0]).group(1)
    sample = "\n".join([f"{head} - Summary: {' ... '.join(kept)} ...", *tail])
    sentence = (f"Measured on {where}: `make demo` took {seconds:.0f} s with the environment already installed "
                f"(writing the digits included; the first `make` also installs the requirements, a few "
                f"minutes), {top1}% val top1.")
    return f"```\n{sample}\n```\n\n{textwrap.fill(sentence, width=105)}\n"


def demo() -> str:
    with tempfile.TemporaryDirectory() as folder:
        output, seconds = _python("-m", "image_classification.demo", cwd=Path(folder))
    return demo_block(output, seconds, machine.description())


def _benchmark(script: str, *argv: str) -> tuple[dict, str]:
    """Run ``benchmarks/<script>`` with a JSON output; its record and the command as the README shows it."""
    with tempfile.TemporaryDirectory() as folder:
        output = Path(folder) / "result.json"
        _python(str(REPO / "benchmarks" / script), *argv, "-o", str(output), cwd=REPO)
        record = json.loads(output.read_text())
    return record, f"python benchmarks/{script} {' '.join(argv)} -o FILE.json"


def _environment(record: dict) -> str:
    env = record["environment"]
    where = env["device_name"] if env["device"] == "cuda" else f"{env['cpu_model']} ({env['cpu_cores']} cores), no GPU"
    software = f"Python {env['python']}, torch {env['torch']}, torchvision {env['torchvision']}"
    if env.get("onnxruntime"):
        software += f", onnxruntime {env['onnxruntime']}"
    return f"{where}; {software}"


TRAIN_STEP_RUNS = (
    ("resnet18", "64", "10", "5"), ("resnet18", "128", "10", "5"),
    ("resnet50", "64", "10", "5"), ("resnet50", "128", "5", "3"),
)


def train_step() -> str:
    rows, record = [], None
    for arch, size, iters, repeats in TRAIN_STEP_RUNS:
        record, command = _benchmark("train_throughput.py", "-a", arch, "--image-size", size, "-b", "16",
                                     "--iters", iters, "--repeats", repeats)
        ours, plain = record["ours"], record["plain"]
        rows.append(f"| `{command}` | {ours['median']:.1f} ({ours['relative_spread']:.0%}) | "
                    f"{plain['median']:.1f} ({plain['relative_spread']:.0%}) | **{record['ratio']:.2f}x** |")
    return "\n".join([
        f"Measured on {_environment(record)}. Batch 16, FP32, NCHW, 1000 classes; median images/s of the rounds",
        "(spread of the rounds, max - min over median, in brackets).",
        "",
        "| command | ours | plain loop | ours / plain |",
        "|---|---|---|---|",
        *rows,
    ]) + "\n"


INFERENCE_PATHS = (
    ("torchvision", "torchvision eager FP32 (baseline)"), ("eager", "eager FP32"),
    ("channels_last", "channels-last FP32"), ("bf16", "bf16 autocast, channels-last"),
    ("fp16", "fp16 autocast, channels-last"), ("compile", "`torch.compile`"), ("onnxruntime", "ONNX Runtime"),
)


def inference() -> str:
    record, command = _benchmark("infer_throughput.py", "-a", "resnet50", "--batch-sizes", "1", "16", "--iters", "5",
                                 "--repeats", "3", "--warmup", "2", "--chart", str(REPO / "docs" / "inference.png"))
    return inference_block(record, command.replace(str(REPO / "docs"), "docs"))


def inference_block(record: dict, command: str) -> str:
    """The command, the machine with its CPU capability, and one row per path measured or skipped; the
    row of classify.py's default path on that machine is marked."""
    sizes = [str(size) for size in record["config"]["batch_sizes"]]
    header = "| path | " + " | ".join(f"batch {b} img/s | p50 / p90 / p99 ms | vs torchvision" for b in sizes) + \
        " | max abs logit diff | top-1 agreement |"
    rows = []
    for key, title in INFERENCE_PATHS:
        path = record["paths"].get(key)
        if path is None:  # not measured on this device (fp16 on the CPU, ONNX Runtime on CUDA)
            continue
        if key == record["classify_default"]:
            title += " (**`classify.py`'s default here**)"
        if "skipped" in path:
            rows.append(f"| {title} | skipped: {path['skipped']} |" + " |" * (3 * len(sizes) + 1))
            continue
        cells = []
        for b in sizes:
            point = path[b]
            cells.append(f"{point['images_per_s']:.2f} | {point['p50_ms']:.0f} / {point['p90_ms']:.0f} / "
                         f"{point['p99_ms']:.0f} | {point['speedup']:.2f}x")
        agreement = " - | - " if key == "torchvision" else \
            f" {path['max_abs_diff']:.1e} | {path['top1_agreement']:.0%} "
        rows.append(f"| {title} | " + " | ".join(cells) + f" |{agreement}|")
    env = record["environment"]
    if env["device"] == "cuda":
        cpu = f"host CPU capability {env['cpu_capability']}"
    else:
        bf16 = "computes bf16 natively" if env["cpu_bf16_native"] else "has no native bf16: it emulates bf16"
        cpu = f"CPU capability {env['cpu_capability']}, {bf16}"
    load = env.get("load_average")
    if load:
        cpu += f"; load average at the end of the run {' / '.join(f'{v:.1f}' for v in load)} (1 / 5 / 15 min)"
    return "\n".join([
        "```bash", command, "```", "",
        f"Measured on {_environment(record)}; {cpu}; {record['config']['image_size']} px, random weights.", "",
        header, "|---|" + "---|" * (3 * len(sizes) + 2), *rows,
    ]) + "\n"


LOADER_SUMMARY = re.compile(r"torchvision: ([\d.]+) images/s, ([\d.]+) CPU ms/image; (\S+): ([\d.]+) images/s, "
                            r"([\d.]+) CPU ms/image; speed-up ([\d.]+)x")


def loader() -> str:
    """benchmark_loader.py for each backend against plain torchvision, on 2 classes x 1,000 JPEGs of 500x375,
    and DALI once more on short epochs (2 x 192), where anything paid per pass would weigh most."""
    rows, commands, bars = [], [], []
    with tempfile.TemporaryDirectory() as folder:
        made = set()
        for backend, count in (("dali-cpu", 1000), ("pytorch", 1000), ("dali-cpu", 192)):
            data = Path(folder) / f"bench{count}"
            make = [] if count in made else ["--make-dataset", str(count)]
            made.add(count)
            argv = [*make, "--data-backend", backend, "-b", "64", "-j", "2", "--epochs", "4", "--baseline", str(data)]
            output, _ = _python(str(REPO / "scripts" / "benchmark_loader.py"), *argv, cwd=REPO)
            match = LOADER_SUMMARY.search(output)
            if match is None:
                sys.exit(f"error: no summary line in benchmark_loader.py's output:\n{output[-2000:]}")
            base_ips, base_ms, name, ips, ms, ratio = match.groups()
            commands.append("python scripts/benchmark_loader.py " + " ".join(argv).replace(folder, "/tmp"))
            rows.append(f"| `--data-backend {name}` | {2 * count:,} | {float(ips):,.0f} | {ms} | {float(base_ips):,.0f} "
                        f"| **{ratio}x** |")
            bars.append((f"{name}\n{2 * count:,} JPEGs", float(ips), float(base_ips), ratio))
    draw_loader_chart(bars, REPO / "docs" / "loader.png")
    return "\n".join([
        "```bash", *commands, "```", "",
        f"Measured on {machine.description()}; DALI {_dali_version()}.", "",
        "| loader | training JPEGs | images/s | CPU ms per image | plain torchvision in the same run, images/s "
        "| vs torchvision |",
        "|---|---|---|---|---|---|", *rows, "",
        "![data loaders against plain torchvision](docs/loader.png)",
    ]) + "\n"


def draw_loader_chart(bars: list[tuple[str, float, float, str]], path: Path) -> None:
    """Pairs of bars, ours beside plain torchvision's from the same run, the ratio written above."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(6.5, 4))
    places = range(len(bars))
    ours = axis.bar([x - 0.2 for x in places], [b[1] for b in bars], 0.4, color="tab:blue", label="ours")
    axis.bar([x + 0.2 for x in places], [b[2] for b in bars], 0.4, color="0.55", label="plain torchvision")
    for bar, (_, _, _, ratio) in zip(ours, bars):
        axis.annotate(f"{ratio}x", (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center",
                      va="bottom", fontsize=8)
    axis.set_xticks(list(places), [b[0] for b in bars], fontsize=8)
    axis.set_ylabel("training images/s")
    axis.grid(True, axis="y", alpha=0.3)
    axis.legend(fontsize=8)
    axis.set_title(f"Training data loaders (224 px crops, batch 64, 2 workers)\n{machine.cpu_model()}, "
                   f"{machine.cores()} cores", fontsize=9)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    plt.close(figure)


def reliability() -> str:
    """The fault suite's own count of what it did and what was lost."""
    start = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/faults"],
                            cwd=REPO, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    counts = next((line for line in result.stdout.splitlines() if line.startswith("faults: ")), None)
    outcome = re.search(r"(\d+) passed(?:, (\d+) skipped)?", result.stdout)
    if result.returncode != 0 or counts is None or outcome is None:
        sys.exit(f"error: the fault suite failed:\n{result.stdout[-3000:]}")
    skipped = f", {outcome.group(2)} skipped" if outcome.group(2) else ""
    return (f"```\n{counts}\n```\n\n" + textwrap.fill(
        f"{outcome.group(1)} tests passed{skipped} in {seconds:.0f} s on {machine.description()}.", width=105) + "\n")


def _dali_version() -> str:
    try:
        from nvidia import dali
    except ImportError:
        return "not installed"
    return dali.__version__


GENERATORS: dict[str, Callable[[], str]] = {"demo": demo, "loader": loader, "train-step": train_step, "inference": inference,
                                             "reliability": reliability}


def marked_blocks(text: str) -> list[str]:
    """The names of the figure blocks marked in ``text``, in order."""
    return re.findall(r"^<!-- figures:([\w-]+) -->$", text, flags=re.M)


def replace_block(text: str, name: str, block: str) -> str:
    """``text`` with the block ``name`` replaced by ``block`` (markers kept)."""
    pattern = re.compile(rf"^(<!-- figures:{name} -->\n).*?^(<!-- /figures:{name} -->)$", re.S | re.M)
    if not pattern.search(text):
        raise KeyError(name)
    return pattern.sub(lambda match: match.group(1) + block.rstrip("\n") + "\n" + match.group(2), text, count=1)


def check(text: str) -> list[str]:
    """Problems with the markers: blocks without a generator, generators without a block, unclosed blocks."""
    names = marked_blocks(text)
    problems = [f"README block {name!r} has no generator" for name in names if name not in GENERATORS]
    problems += [f"generator {name!r} has no block in README.md" for name in GENERATORS if name not in names]
    problems += [f"README block {name!r} is not closed" for name in names
                 if not re.search(rf"^<!-- /figures:{name} -->$", text, flags=re.M)]
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sections", nargs="*", help=f"sections to measure (default: all of {', '.join(GENERATORS)})")
    parser.add_argument("--check", action="store_true", help="only check the markers against the generators")
    parser.add_argument("--print", action="store_true", help="print the new blocks instead of writing README.md")
    args = parser.parse_args(argv)
    text = README.read_text()
    problems = check(text)
    if args.check or problems:
        print("\n".join(problems) or "README figure blocks: all have generators", file=sys.stderr if problems else sys.stdout)
        return 1 if problems else 0
    unknown = [name for name in args.sections if name not in GENERATORS]
    if unknown:
        parser.error(f"unknown section {unknown[0]!r}; choose from {', '.join(GENERATORS)}")
    for name in args.sections or list(GENERATORS):
        print(f"=> measuring {name}", file=sys.stderr, flush=True)
        block = GENERATORS[name]()
        if args.print:
            print(block)
        else:
            text = replace_block(text, name, block)
            README.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
