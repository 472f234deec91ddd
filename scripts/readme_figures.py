"""Measure the documentation's figures again and write them into the page that shows them.

    python scripts/readme_figures.py            # every section, on this machine
    python scripts/readme_figures.py demo       # only the named sections
    python scripts/readme_figures.py --check    # every marked block has a generator, and back (no runs)
    python scripts/readme_figures.py demo --print   # print the new block instead of writing the page

A figure that comes from a run lives in one of the pages (README.md or docs/*.md) between
``<!-- figures:NAME -->`` and ``<!-- /figures:NAME -->``; the generator ``NAME`` below makes the run and
returns the block's new text, naming the machine it ran on.  Everything outside the markers is left as it is.

A figure that the pages repeat (the demo's top-1 in three pages, the suite's count in the README's prose and
table) has one value, in docs/figures.json; ``REPEATED`` says where each page shows it, and ``--check`` (run by
the suite) finds every place that says another value.  A generator that measures such a figure writes it there.
"""

from __future__ import annotations

import json
import os
import re
import resource
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

from benchmarks.common import ratio_text  # noqa: E402
from image_classification.system import machine  # noqa: E402
from image_classification.system.cli import UserErrorParser, run  # noqa: E402

DOCS = REPO / "docs"  # the charts lie here, beside the page that shows them (docs/performance.md)
FIGURES = DOCS / "figures.json"  # the one value of each figure that the pages repeat


def _python(*argv: str, cwd: Path, env: dict[str, str] | None = None) -> tuple[str, float]:
    """Run ``python argv`` in ``cwd`` with this repository importable (and ``env`` added to the environment);
    its output and wall time."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "MPLBACKEND": "Agg", **(env or {})}
    start = time.perf_counter()
    result = subprocess.run([sys.executable, *argv], cwd=cwd, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if result.returncode != 0:
        sys.exit(f"error: python {' '.join(argv)} failed ({result.returncode}):\n{result.stderr[-2000:]}")
    return result.stdout, seconds


def demo_block(output: str, seconds: float, where: str, cpu_seconds: float | None = None) -> str:
    """The end of the demo's output as it prints it, from its last epoch's line, and one sentence with its time
    (and the CPU time its processes took, which a machine shared with other work changes far less than the wall
    time) and accuracy."""
    lines = output.splitlines()
    last_epoch = max(i for i, line in enumerate(lines) if re.match(r"Epoch \d+/\d+: train ", line))
    tail = lines[last_epoch:]
    best = next(line for line in tail if line.startswith("val top1:"))
    top1 = re.search(r", best ([\d.]+)% \(epoch \d+", best).group(1)  # model_best's: what the docs then use
    cpu = "" if cpu_seconds is None else f" ({cpu_seconds:.0f} s of CPU time)"
    sentence = (f"Measured on {where}: `make demo` took {seconds:.0f} s{cpu} with the environment already installed "
                f"(writing the digits included; the first `make` also installs the requirements, a few "
                f"minutes), {top1}% val top1 (model_best.pth.tar).")
    return "```\n" + "\n".join(tail) + f"\n```\n\n{textwrap.fill(sentence, width=105)}\n"


def demo() -> str:
    with tempfile.TemporaryDirectory() as folder:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        output, seconds = _python("-m", "image_classification.demo", cwd=Path(folder))
        after = resource.getrusage(resource.RUSAGE_CHILDREN)  # the demo and its loader workers, all waited for
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    block = demo_block(output, seconds, f"{machine.description()}, {_load_note()}", cpu)
    record_figure("demo_top1", re.search(r"([\d.]+)% val top1 \(model_best", " ".join(block.split())).group(1))
    return block


def _load_note() -> str:
    """The load the machine was under when a measurement ended (a wall time on a shared machine depends on it)."""
    return "load average at the end {} (1 / 5 / 15 min)".format(" / ".join(f"{v:.1f}" for v in os.getloadavg()))


def _benchmark(script: str, *argv: str, env: dict[str, str] | None = None) -> tuple[dict, str]:
    """Run ``benchmarks/<script>`` with a JSON output; its record and the command as the page shows it."""
    with tempfile.TemporaryDirectory() as folder:
        output = Path(folder) / "result.json"
        _python(str(REPO / "benchmarks" / script), *argv, "-o", str(output), cwd=REPO, env=env)
        record = json.loads(output.read_text())
    return record, f"python benchmarks/{script} {' '.join(argv)} -o FILE.json"


def _environment(record: dict) -> str:
    """The machine a benchmark's record was measured on: its CPU with cores and instruction sets, the GPU
    and driver where one was used, the software."""
    return machine.describe(record["environment"])


TRAIN_STEP_RUNS = (
    ("resnet18", "64", "10", "5"), ("resnet50", "128", "5", "3"),
)
TRAIN_STEP_PATHS = (("eager", "eager NCHW"), ("channels_last", "channels-last"), ("compile", "`--compile`"))


def train_step() -> str:
    rows, record, profiles = [], None, []
    for arch, size, iters, repeats in TRAIN_STEP_RUNS:
        record, command = _benchmark("train_throughput.py", "-a", arch, "--image-size", size, "-b", "16",
                                     "--iters", iters, "--repeats", repeats)
        rows.append(train_step_row(record, command))
        profiles.append(profile_text(record))
    return "\n".join([
        f"Measured on {_environment(record)}{_cpu_note(record['environment'])}. Batch 16, FP32, 1000 classes;",
        "median images/s of the rounds (spread of the rounds, max - min over median, in brackets). A ratio over",
        "the plain loop is bold only where it differs from 1 by more than the spread of the rounds' own ratios;",
        "otherwise the table says so.",
        "",
        "| command | plain loop | " + " | ".join(title for _, title in TRAIN_STEP_PATHS) + " |",
        "|---|---|" + "---|" * len(TRAIN_STEP_PATHS),
        *rows,
        *(["", textwrap.fill("Where the plain loop's time goes (`torch.profiler`, operator self time): "
                             + "; ".join(filter(None, profiles)) + ". The paths above change the layout the "
                             "convolutions run in and fuse the other work; the shares bound what the fusion "
                             "can give.", width=105)] if any(profiles) else []),
    ]) + "\n"


def profile_text(record: dict) -> str:
    """The convolutions' share of one command's plain loop, and the speed-up it leaves to the other work."""
    profile, config = record["plain"].get("profile"), record["config"]
    if not profile:
        return ""
    return (f"{config['arch']} at {config['image_size']} px spends "
            f"{profile['conv_forward'] + profile['conv_backward']:.0%} in convolutions (forward "
            f"{profile['conv_forward']:.0%}, backward {profile['conv_backward']:.0%}), so removing all else would "
            f"gain at most {profile['bound']:.2f}x")


def train_step_row(record: dict, command: str) -> str:
    """One command's row: the plain loop, then each path with its ratio over the plain loop, or no verdict."""
    plain = record["plain"]
    cells = [f"{plain['median']:.1f} ({plain['relative_spread']:.0%})"]
    for key, _ in TRAIN_STEP_PATHS:
        path = record["paths"].get(key)
        if path is None:
            cells.append("-")
            continue
        cells.append(f"{path['median']:.1f} ({path['relative_spread']:.0%}): "
                     f"{ratio_text(path['ratio'], path['ratio_spread'], bold=True)}")
    return f"| `{command}` | " + " | ".join(cells) + " |"


INFERENCE_PATHS = (
    ("torchvision", "torchvision eager FP32 (baseline)"), ("eager", "eager FP32"),
    ("channels_last", "channels-last FP32"), ("bf16", "bf16 autocast, channels-last"),
    ("fp16", "fp16 autocast, channels-last"), ("compile", "`torch.compile`"), ("aoti", "AOTInductor package (`.pt2`)"),
    ("onnxruntime", "ONNX Runtime"), ("int8", "ONNX Runtime int8"),
)


def _cpu_note(env: dict) -> str:
    """``; `` and what the machine's line leaves out: whether the CPU computes bf16 natively (for a CPU
    figure) and the load the figure was measured under; empty where there is neither."""
    notes = []
    if env["device"] != "cuda":
        notes.append("the CPU computes bf16 natively" if env["cpu_bf16_native"]
                     else "the CPU has no native bf16: it emulates bf16")
    load = env.get("load_average")
    if load:
        notes.append(f"load average at the end of the run {' / '.join(f'{v:.1f}' for v in load)} (1 / 5 / 15 min)")
    return "".join(f"; {note}" for note in notes)


def inference() -> str:
    record, command = _benchmark("infer_throughput.py", "-a", "resnet50", "--batch-sizes", "1", "16", "--iters", "5",
                                 "--repeats", "3", "--warmup", "2", "--chart", str(DOCS / "inference.png"))
    # only this script writes the tracked chart: the command a reader copies writes to a scratch path
    return inference_block(record, command.replace(str(DOCS), "/tmp"))


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
            versus = f"{point['speedup']:.2f}x" if key == "torchvision" else \
                ratio_text(point["speedup"], point.get("speedup_spread"))
            cells.append(f"{point['images_per_s']:.2f} | {point['p50_ms']:.0f} / {point['p90_ms']:.0f} / "
                         f"{point['p99_ms']:.0f} | {versus}")
        agreement = " - | - " if key == "torchvision" else \
            f" {path['max_abs_diff']:.1e} | {path['top1_agreement']:.0%} "
        rows.append(f"| {title} | " + " | ".join(cells) + f" |{agreement}|")
    cpu = _cpu_note(record["environment"])
    return "\n".join([
        "```bash", command, "```", "",
        f"Measured on {_environment(record)}{cpu}; {record['config']['image_size']} px, random weights.", "",
        header, "|---|" + "---|" * (3 * len(sizes) + 2), *rows, *_ceiling_note(record, sizes),
    ]) + "\n"


def _ceiling_note(record: dict, sizes: list[str]) -> list[str]:
    """On the CPU: the FP32 ceiling, and how near the fastest FP32 row comes to it."""
    ceiling = record.get("fp32_ceiling")
    if not ceiling:
        return []
    best = {b: max((path[b]["images_per_s"], key) for key, path in record["paths"].items()
                   if "skipped" not in path and path.get("dtype") == "float32") for b in sizes}
    reached = "; ".join(f"at batch {b} the fastest FP32 row ({dict(INFERENCE_PATHS)[key].split(' (')[0]}) "
                        f"reaches {rate / ceiling['images_per_s']:.0%} of it" for b, (rate, key) in best.items())
    return ["", textwrap.fill(
        f"The FP32 ceiling of this CPU: {record['config']['arch']} needs {ceiling['gflop_per_image']:.2f} GFLOP "
        f"per image (convolutions and fc, counted by `torch.utils.flop_counter`) and an FP32 matrix product "
        f"runs at {ceiling['gemm_gflops']:.0f} GFLOP/s on the same threads, so no FP32 path can much exceed "
        f"{ceiling['images_per_s']:.1f} images/s; {reached}. Beyond it lie fewer bits per operation (bf16 "
        f"where the CPU computes it faster than FP32, with AMX or AMD's AVX512-BF16; int8), not a faster FP32 "
        f"path.", width=105)]


LOADER_SUMMARY = re.compile(r"torchvision: ([\d.]+) images/s, ([\d.]+) CPU ms/image; (\S+): ([\d.]+) images/s, "
                            r"([\d.]+) CPU ms/image; speed-up ([\d.]+)x \((spread [\d.]+%|spread unknown)")
LOADER_VERDICT = re.compile(r"^verdict: (.*)$", re.M)
# (data set, JPEGs per class for a generated set or 0 for the photo set, backend, batch size)
LOADER_RUNS = (
    ("generated", 1000, "dali-cpu", 64), ("generated", 1000, "pytorch", 64),
    ("photos", 0, "pytorch", 32), ("photos", 0, "pytorch", 64),
    ("photos", 0, "dali-cpu", 32), ("photos", 0, "dali-cpu", 64),
    ("generated", 192, "dali-cpu", 64),
)


def loader() -> str:
    """benchmark_loader.py for each backend against plain torchvision: on the generated set (2 classes x 1,000
    JPEGs of 500x375 cut from six sample images), on the photo set (4 photographs x 300 cuts) at batch 32
    and 64, and DALI once more on short epochs (2 x 192), where anything paid per pass would weigh most."""
    rows, commands, bars = [], [], []
    with tempfile.TemporaryDirectory() as folder:
        made = set()
        for data_set, count, backend, batch in LOADER_RUNS:
            data = Path(folder) / ("photos" if data_set == "photos" else f"bench{count}")
            make = [] if data in made else (["--photos"] if data_set == "photos" else ["--make-dataset", str(count)])
            made.add(data)
            argv = [*make, "--data-backend", backend, "-b", str(batch), "-j", "2", "--epochs", "5", "--baseline",
                    str(data)]
            output, _ = _python(str(REPO / "benchmarks" / "benchmark_loader.py"), *argv, cwd=REPO)
            match, verdict = LOADER_SUMMARY.search(output), LOADER_VERDICT.search(output)
            if match is None or verdict is None:
                sys.exit(f"error: no summary line in benchmark_loader.py's output:\n{output[-2000:]}")
            base_ips, base_ms, name, ips, ms, ratio, spread = match.groups()
            claim = verdict.group(1)
            stated = re.fullmatch(r"[\d.]+x", claim) is not None  # else the ratio is within its spread
            claim = f"**{claim}** ({spread})" if stated else claim
            commands.append("python benchmarks/benchmark_loader.py " + " ".join(argv).replace(folder, "/tmp"))
            images = f"{len(list(data.glob('train/*/*.jpg'))):,} {data_set}"
            rows.append(f"| `--data-backend {name}` | {images} | {batch} | {float(ips):,.0f} | {ms} ({base_ms}) | "
                        f"{float(base_ips):,.0f} | {claim} |")
            bars.append((f"{name}\n{images}\nbatch {batch}", float(ips), float(base_ips),
                         f"{ratio}x" if stated else f"{ratio}x\n(in spread)"))
        load = " / ".join(f"{value:.1f}" for value in os.getloadavg())
    draw_loader_chart(bars, DOCS / "loader.png")
    return "\n".join([
        "```bash", *commands, "```", "",
        f"Measured on {machine.description()}; DALI {_dali_version()}; load average at the end {load} "
        "(1 / 5 / 15 min).", "",
        "| loader | training JPEGs | batch | images/s | CPU ms per image (torchvision's) | plain torchvision in the same run, "
        "images/s | vs torchvision: median of the epochs' ratios (their spread) |",
        "|---|---|---|---|---|---|---|", *rows, "",
        "![data loaders against plain torchvision](loader.png)",
    ]) + "\n"


def draw_loader_chart(bars: list[tuple[str, float, float, str]], path: Path) -> None:
    """Pairs of bars, ours beside plain torchvision's from the same run, the ratio's label written above."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(9, 4.5))
    places = range(len(bars))
    ours = axis.bar([x - 0.2 for x in places], [b[1] for b in bars], 0.4, color="tab:blue", label="ours")
    axis.bar([x + 0.2 for x in places], [b[2] for b in bars], 0.4, color="0.55", label="plain torchvision")
    for bar, (_, _, _, ratio) in zip(ours, bars):
        axis.annotate(ratio, (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center",
                      va="bottom", fontsize=8)
    axis.set_xticks(list(places), [b[0] for b in bars], fontsize=7)
    axis.set_ylabel("training images/s")
    axis.grid(True, axis="y", alpha=0.3)
    axis.set_ylim(0, 1.25 * max(max(b[1], b[2]) for b in bars))  # room for the labels and the legend
    axis.legend(fontsize=8, loc="upper left", ncol=2)
    axis.set_title(f"Training data loaders (224 px crops, 2 workers)\n{machine.cpu_model()}, "
                   f"{machine.cores()} cores; {', '.join(machine.instruction_sets())}", fontsize=9)
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


INT8_EVALUATIONS = (
    ("PyTorch FP32", []),
    ("ONNX Runtime FP32", ["--runtime", "onnxruntime"]),
    *((f"ONNX Runtime int8, {method}", ["--runtime", "onnxruntime", "--quantize", "int8", "--calibration-data",
                                        "data/digits/train", "--calibration-method", method])
      for method in ("minmax", "percentile", "entropy")),
)
DEMO_MODEL = "workspace/digits/model_best.pth.tar"
EVALUATE = ["main.py", "-a", "resnet18", "--evaluate", "--resume", DEMO_MODEL, "-b", "64", "-j", "2",
            "--data-backend", "pytorch"]
CLASSIFY = ["classify.py", "--weights", DEMO_MODEL, "--image", *(f"data/digits/val/{digit}" for digit in range(10)),
            "--json", "--topk", "1", "--cpu"]
CLASSIFY_SHOWN = [*CLASSIFY[:4], "data/digits/val/*", *CLASSIFY[14:]]  # the folders, as a shell expands them
CLASSIFY_INT8 = ["--runtime", "onnxruntime", "--quantize", "int8", "--calibration-data", "data/digits/train"]


def int8_accuracy() -> str:
    """The demo's model validated by main.py --evaluate in PyTorch, through ONNX Runtime in FP32 and in int8
    by each calibration method, and classify.py's int8 top-1 against PyTorch FP32's on the same images."""
    from image_classification.deploy.onnx_runtime import CACHE_ENV
    from image_classification.records.raport import read_raport

    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        env = {CACHE_ENV: str(root / "cache")}  # exports of its own, not the user's cache
        _python("-m", "image_classification.demo", cwd=root, env=env)
        rows = []
        for index, (label, extra) in enumerate(INT8_EVALUATIONS):
            workspace = root / f"evaluation-{index}"
            _python(*[str(REPO / EVALUATE[0]), *EVALUATE[1:]], "--workspace", str(workspace), *extra,
                    "data/digits", cwd=root, env=env)
            summary = next(r["data"] for r in read_raport(workspace / "experiment_raport.json")
                           if r.get("type") == "LOG" and r["step"] == [] and "val.top1" in r["data"])
            rows.append((label, " ".join(extra), summary["val.top1"], summary["val.loss"]))
        top1 = [[json.loads(line)["predictions"][0]["index"] for line in _python(
            str(REPO / CLASSIFY[0]), *CLASSIFY[1:], *extra, cwd=root, env=env)[0].splitlines()]
            for extra in (["--precision", "FP32", "--memory-format", "nchw"], CLASSIFY_INT8)]
    agreeing = sum(a == b for a, b in zip(*top1))
    return int8_accuracy_block(rows, agreeing, len(top1[0]), _int8_machine())


def _int8_note() -> str:
    """Whether the CPU computes int8 dot products, which decides reduce_range."""
    from image_classification.deploy.quantization import int8_dot_products

    found = int8_dot_products()
    return (f"int8 dot products: {', '.join(found)}, so no reduce_range" if found
            else "no int8 dot-product instructions: 7-bit weights (reduce_range)")


def _int8_machine() -> str:
    """The machine, and whether its CPU computes int8 dot products."""
    import onnxruntime

    return f"{machine.description()}, onnxruntime {onnxruntime.__version__}; {_int8_note()}"


def int8_accuracy_block(rows: list[tuple[str, str, float, float]], agreeing: int, images: int, where: str) -> str:
    """The evaluation commands, one row per runtime (val top-1 and loss, top-1 against PyTorch FP32's), and
    classify.py's agreement."""
    reference = rows[0][2]
    table = [f"| {label} | `{flags or '(none)'}` | {top1:.2f}% | {loss:.4f} | "
             f"{'-' if index == 0 else f'{top1 - reference:+.2f}'} |" for index, (label, flags, top1, loss) in enumerate(rows)]
    return "\n".join([
        "```",  # not a bash block: the docs' commands run in the tests, and this one trains the demo first
        "python -m image_classification.demo",
        f"python {' '.join(EVALUATE)} FLAGS data/digits",
        f"python {' '.join(CLASSIFY_SHOWN)} [{' '.join(CLASSIFY_INT8)}]",
        "```", "",
        textwrap.fill(f"Measured on {where}. The demo's ResNet-18 on its 360 val digits, each runtime through "
                      "main.py's own validation loop; int8 calibrated on 100 of the training digits (10 a class).",
                      width=105), "",
        "| model | FLAGS | val top-1 | val loss | top-1 points vs PyTorch FP32 |", "|---|---|---|---|---|", *table, "",
        textwrap.fill(f"`classify.py` with int8 names the class PyTorch FP32 names for {agreeing} of the {images} val "
                      f"digits ({100 * agreeing / images:.1f}%).", width=105),
    ]) + "\n"


def int8_speed() -> str:
    """ONNX Runtime FP32 and int8 against torchvision eager FP32 for ResNet-50 at batch 1 and 16, each path on
    one thread: on a shared machine a second thread that waits for a busy core stalls torch's eager batch 1
    tenfold (ONNX Runtime's far less), which would inflate every ratio over the baseline."""
    record, command = _benchmark("infer_throughput.py", "-a", "resnet50", "--batch-sizes", "1", "16", "--iters", "5",
                                 "--repeats", "3", "--warmup", "2", "--paths", "onnxruntime", "int8",
                                 env={"OMP_NUM_THREADS": "1"})
    int8 = record["paths"]["int8"]
    goal = ", ".join(f"{ratio_text(int8[b]['speedup'], int8[b].get('speedup_spread'))} at batch {b}"
                     for b in ("1", "16"))
    record.pop("fp32_ceiling", None)  # the inference block's subject; here int8 against the baseline
    return inference_block(record, f"OMP_NUM_THREADS=1 {command}") + "\n" + textwrap.fill(
        f"Each path on {record['environment']['torch_threads']} thread (torch's and ONNX Runtime's), as the "
        f"machine is shared. int8 runs at {goal} of torchvision eager FP32 here "
        f"({_int8_note()}); its logit difference and top-1 agreement are those of random "
        "weights on random images.", width=105) + "\n"


def deployment_speed() -> str:
    """ResNet-50's deployment formats against torchvision eager FP32 at batch 1 and 16: eager, torch.compile, the
    AOTInductor package, ONNX Runtime FP32 and int8, each path on one thread (as :func:`int8_speed`)."""
    record, command = _benchmark("infer_throughput.py", "-a", "resnet50", "--batch-sizes", "1", "16", "--iters", "5",
                                 "--repeats", "3", "--warmup", "2", "--paths", "eager", "compile", "aoti",
                                 "onnxruntime", "int8", env={"OMP_NUM_THREADS": "1"})
    return deployment_speed_block(record, f"OMP_NUM_THREADS=1 {command}")


def deployment_speed_block(record: dict, command: str) -> str:
    """:func:`inference_block` of the deployment formats, and what the threads and the warm-up were."""
    record = {key: value for key, value in record.items() if key != "fp32_ceiling"}  # the inference block's
    threads = record["environment"]["torch_threads"]
    return inference_block(record, command) + "\n" + textwrap.fill(
        f"Each path on {threads} thread (torch's, Inductor's and ONNX Runtime's), as the machine is shared; every "
        "batch is timed on its own after the untimed warm-up (compilation and export excluded). int8: "
        f"{_int8_note()}.", width=105) + "\n"


def export_time() -> str:
    """ResNet-50 exported to ONNX by either exporter, and compiled into a .pt2 package, in one process."""
    from benchmarks.export_time import markdown_block  # deferred: torch

    record, command = _benchmark("export_time.py", "-a", "resnet50", "--repeats", "2", "--pt2")
    return markdown_block(record, command, machine.describe(record["environment"]) + _cpu_note(record["environment"]))


def _dali_version() -> str:
    try:
        from nvidia import dali
    except ImportError:
        return "not installed"
    return dali.__version__


GENERATORS: dict[str, Callable[[], str]] = {"demo": demo, "loader": loader, "train-step": train_step, "inference": inference,
                                             "reliability": reliability, "int8-accuracy": int8_accuracy,
                                             "int8-speed": int8_speed, "deployment-speed": deployment_speed,
                                             "export-time": export_time}


# Where the pages repeat each figure of FIGURES: (page, pattern), the pattern's group being the figure, matched
# against the page's text with its white space (line breaks included) made single spaces.
REPEATED: dict[str, tuple[tuple[str, str], ...]] = {
    "demo_top1": (
        ("README.md", r"val top1: last [\d.]+% \(epoch \d+\), best ([\d.]+)%"),
        ("README.md", r"([\d.]+)% val top1 \(model_best\.pth\.tar\)"),
        ("docs/data.md", r"printed `pytorch top-1 ([\d.]+)%"),
        ("docs/inference.md", r"\| PyTorch FP32 \| `\(none\)` \| ([\d.]+)% \|"),
    ),
    "suite_tests": (
        ("README.md", r"the longest modules first: ([\d,]+) tests"),
        ("README.md", r"\| `make test` \|[^|]*\|[^|]*\|[^|]*\| ([\d,]+) tests: "),
    ),
    "suite_time": (
        ("README.md", r"[\d,]+ tests, (\d+ min \d+ s) of pytest"),
        ("README.md", r"\| `make test` \|[^\n]*? (\d+ min \d+ s) \| \| `make test-pins"),
    ),
    "h100_resnet50_ips": (
        ("docs/performance.md", r"\| resnet50 \| 256 \| about ([\d,]+) \|"),
        ("docs/performance.md", r"resnet50 at AMP trains at about ([\d,]+) img/s"),
        ("docs/training.md", r"where the iterations ran at ([\d,]+)\."),
    ),
    "h100_resnet50_summary_ips": (
        ("docs/performance.md", r"\| resnet50 \| 256 \| about [\d,]+ \| ([\d,]+) \|"),
        ("docs/training.md", r"of 100 iterations with it said ([\d,]+) img/s"),
    ),
    "h100_resnet50_first_iteration_s": (
        ("docs/performance.md", r"the first iteration alone took (\d+) s for resnet50"),
        ("docs/training.md", r"first iteration take (\d+) s on an H100"),
    ),
    "pytorch_gpu_goal_ips": (
        ("docs/data.md", r"at least ([\d,]+) images/s\. Without a GPU"),
        ("docs/performance.md", r"at least ([\d,]+) images/s of 500x375 JPEGs"),
    ),
}


def load_figures(path: Path = FIGURES) -> dict[str, dict]:
    """docs/figures.json: each repeated figure's ``value`` (as the pages write it) and ``what`` it is."""
    return json.loads(path.read_text())


def record_figure(name: str, value: str, path: Path = FIGURES) -> None:
    """Write a figure a generator measured into docs/figures.json (its ``what`` kept)."""
    figures = load_figures(path)
    figures[name] = {**figures.get(name, {}), "value": value}
    path.write_text(json.dumps(figures, indent=2) + "\n")


def check_repeated(texts: dict[Path, str], figures: dict[str, dict], root: Path = REPO) -> list[str]:
    """Every place that ``REPEATED`` names must show the figure's one value: a problem for each that shows
    another, for a place where the pattern finds nothing (the page changed: fix the pattern), and for a figure
    that has no value or no place."""
    problems = [f"{name}: {FIGURES.name} holds no value" for name in REPEATED if name not in figures]
    problems += [f"{name}: {FIGURES.name} holds it, but no page is said to repeat it" for name in figures
                 if name not in REPEATED]
    for name, places in REPEATED.items():
        value = figures.get(name, {}).get("value")
        for page, pattern in places:
            text = " ".join(texts.get(root / page, "").split())
            found = re.findall(pattern, text)
            if not found:
                problems.append(f"{name}: {page} no longer shows it where /{pattern}/ looks")
            problems += [f"{name}: {page} says {shown}; {FIGURES.name} holds {value}" for shown in found
                         if value is not None and shown != value]
    return problems


def pages(root: Path = REPO) -> dict[Path, str]:
    """The pages that may hold figure blocks, README.md and docs/*.md, with their text."""
    return {page: page.read_text() for page in [root / "README.md", *sorted((root / "docs").glob("*.md"))]}


def marked_blocks(text: str) -> list[str]:
    """The names of the figure blocks marked in ``text``, in order."""
    return re.findall(r"^<!-- figures:([\w-]+) -->$", text, flags=re.M)


def page_holding(name: str, texts: dict[Path, str]) -> Path:
    """The page whose text marks the block ``name``."""
    return next(page for page, text in texts.items() if name in marked_blocks(text))


def replace_block(text: str, name: str, block: str) -> str:
    """``text`` with the block ``name`` replaced by ``block`` (markers kept)."""
    pattern = re.compile(rf"^(<!-- figures:{name} -->\n).*?^(<!-- /figures:{name} -->)$", re.S | re.M)
    if not pattern.search(text):
        raise KeyError(name)
    return pattern.sub(lambda match: match.group(1) + block.rstrip("\n") + "\n" + match.group(2), text, count=1)


def check(texts: dict[Path, str]) -> list[str]:
    """Problems with the markers: blocks without a generator, generators without a block, a block marked
    twice, unclosed blocks."""
    names = [name for text in texts.values() for name in marked_blocks(text)]
    problems = [f"figure block {name!r} has no generator" for name in names if name not in GENERATORS]
    problems += [f"generator {name!r} has no block in README.md or docs/" for name in GENERATORS
                 if name not in names]
    problems += [f"figure block {name!r} is marked {names.count(name)} times" for name in dict.fromkeys(names)
                 if names.count(name) > 1]
    problems += [f"figure block {name!r} is not closed in {page.name}" for page, text in texts.items()
                 for name in marked_blocks(text)
                 if not re.search(rf"^<!-- /figures:{name} -->$", text, flags=re.M)]
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = UserErrorParser(prog="readme_figures.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("sections", nargs="*", help=f"sections to measure (default: all of {', '.join(GENERATORS)})")
    parser.add_argument("--check", action="store_true", help="only check the markers against the generators")
    parser.add_argument("--print", action="store_true", help="print the new blocks, writing no page")
    args = parser.parse_args(argv)
    texts = pages()
    problems = check(texts)
    if args.check:
        problems += check_repeated(texts, load_figures())
    if args.check or problems:
        print("\n".join(problems) or "figure blocks: all have generators; every repeated figure has one value",
              file=sys.stderr if problems else sys.stdout)
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
            page = page_holding(name, texts)
            texts[page] = replace_block(texts[page], name, block)
            page.write_text(texts[page])
    stale = [] if args.print else check_repeated(texts, load_figures())
    if stale:  # a figure measured here that another page repeats, measured elsewhere or by hand
        print("figures the pages now repeat with another value (measure them on this machine too, or edit):\n"
              + "\n".join(stale), file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(run(main))
