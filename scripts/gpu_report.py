"""A GPU machine's report in one command: the GPU tests, training throughput and the inference sweep.

    python scripts/gpu_report.py --out DIR            # on one H100: within 9 minutes
    python scripts/gpu_report.py --out DIR --smoke    # the same steps at tiny sizes, on a CPU too

The steps, in the order they run:

* ``tests``: ``pytest -m gpu`` over tests/ (without CUDA they skip, and the report says why);
* ``train``: ``benchmarks/train_throughput.py`` for resnet50, resnext101-32x4d and se-resnext101-32x4d at
  TF32, AMP (fp16 autocast with a loss scaler) and bf16: the package's training step, eager and
  channels-last, against the plain loop a user writes, at the largest batch up to 256 that fits (halved on
  out-of-memory); resnet50 at AMP also with ``--compile`` (compiling every combination would not fit the
  budget).  resnet50 runs first, then the inference sweep, then the two ResNeXts;
* ``infer``: ``benchmarks/infer_throughput.py`` for resnet50 at batch 1 to 256: torchvision eager (the
  baseline), channels-last TF32, fp16 and bf16, with latency percentiles.

Each step runs in a process of its own, as a user would run it: CUDA memory starts clean, and a crash
or a hang ends that step only; a step that fails or overruns its limit is recorded with its error, and
the report goes on.  The steps share one time budget (``--budget``): each gets at most what is left, and
those for which too little is left are recorded as not run.  After every step DIR/report.json (every
step's command, status, time and the benchmark's own JSON) and DIR/report.md (NVIDIA's table layouts,
the GPU, driver, torch and CUDA versions, each figure's command) are written again, so a run that is
killed leaves what it measured; SIGTERM or Ctrl-C end the step under way and record the rest as not
run.  Each step's output is in DIR/logs/.

``--smoke`` runs the same steps at 32 px with batches of 1 to 4, one timed iteration and one intra-op
thread, with resnet18 in resnet50's place (a cold compilation of its training step took 3 minutes on two
busy cores, resnet50's 7): every code path, compilation included where a compiler exists, in a few
minutes on two CPU cores.  Its figures say nothing about speed.  Without CUDA only ``--smoke`` runs.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from benchmarks.common import compiler_missing, ratio_text, write_json  # noqa: E402
from image_classification import machine  # noqa: E402
from image_classification.cli import UserErrorParser, positive_float, run  # noqa: E402
from image_classification.errors import UserError  # noqa: E402

# train_throughput.py's precision flags; TF32 is its default on CUDA (the CPU has none: FP32 there)
PRECISIONS = {"TF32": (), "AMP": ("--amp", "--amp-dtype", "float16"), "BF16": ("--amp", "--amp-dtype", "bfloat16")}
INFER_PATHS = ("channels_last", "fp16", "bf16")
SECTIONS = ("tests", "train", "infer")
MIN_STEP_S = 10  # a step given less than this would only be killed: it is recorded as not run


@dataclass(frozen=True)
class Scale:
    """The models, sizes, iterations and time limits of a report: the real one, or the smoke run's."""

    archs: tuple[str, ...]  # the first is compiled and swept for inference (torchvision must have it)
    image_size: int
    batch_size: int  # the largest training batch tried
    train_timing: tuple[str, ...]  # train_throughput.py's --iters/--warmup/--repeats
    batch_sizes: tuple[int, ...]  # the inference sweep
    infer_timing: tuple[str, ...]
    budget_s: float
    limits: dict  # seconds per step: tests, train, compile (the training step that compiles), infer
    env: tuple[tuple[str, str], ...] = ()  # set in the steps' environment


# On one H100, estimated (no GPU was at hand to time them): the tests 1-3 min; a training step at batch
# 256 70-550 ms, so 2 sides x 17 steps plus start-up 25-45 s a run, compilation 1-2 minutes; the sweep
# about a minute: about 8 minutes in all.  The budget, 20 s short of 9 minutes for starting and writing,
# keeps the whole within them whatever the estimates are worth: what does not fit is recorded as not run.
FULL = Scale(
    archs=("resnet50", "resnext101-32x4d", "se-resnext101-32x4d"), image_size=224, batch_size=256,
    train_timing=("--iters", "5", "--warmup", "2", "--repeats", "3"), batch_sizes=tuple(2 ** i for i in range(9)),
    infer_timing=("--iters", "20", "--warmup", "3", "--repeats", "3"), budget_s=520,
    limits={"tests": 180, "train": 90, "compile": 180, "infer": 120},
)
# One thread: on two cores shared with other work, two OpenMP threads spin and run several times slower.
# The limits are the budget's: a cold torch.compile alone takes minutes on a loaded small machine.
SMOKE = Scale(
    archs=("resnet18", "resnext101-32x4d", "se-resnext101-32x4d"), image_size=32, batch_size=4,
    train_timing=("--iters", "1", "--warmup", "1", "--repeats", "2"), batch_sizes=(1, 2),
    infer_timing=("--iters", "2", "--warmup", "1", "--repeats", "2"), budget_s=300,
    limits={"tests": 300, "train": 300, "compile": 300, "infer": 300}, env=(("OMP_NUM_THREADS", "1"),),
)


@dataclass(frozen=True)
class Step:
    """One command of the report: ``argv`` after ``python``, run in the repository with ``env`` added to
    the environment; ``output`` the JSON it writes (None for the tests); ``skipped`` why it cannot run on
    this device."""

    section: str
    name: str
    argv: tuple[str, ...]
    limit_s: float
    output: Path | None = None
    arch: str = ""
    precision: str = ""
    skipped: str | None = None
    env: tuple[tuple[str, str], ...] = ()


def plan(scale: Scale, device: str, out: Path, sections: Sequence[str] = SECTIONS,
         compiler: bool = True) -> list[Step]:
    """Every step of the report, in the order they run: the tests, the first architecture's training, the
    inference sweep, the others' training (the headline figures first, should the budget run out).
    Without a ``compiler`` for torch.compile, no step compiles."""
    steps: list[Step] = []
    if "tests" in sections:
        # a test module that cannot be imported there (a package the machine lacks) costs its own tests only
        argv = ("-m", "pytest", "-m", "gpu", "-v", "-p", "no:cacheprovider", "--continue-on-collection-errors", "tests")
        wide = (("COLUMNS", "400"),)  # pytest -v cuts a skip's reason to the terminal's width
        steps.append(Step("tests", "pytest -m gpu", argv, scale.limits["tests"], env=scale.env + wide))
    first = scale.archs[0]
    compiled = (first, "AMP" if device == "cuda" else "BF16")  # the CPU has no fp16 autocast
    train: dict[str, list[Step]] = {arch: [] for arch in scale.archs}
    for arch in scale.archs if "train" in sections else ():
        for precision, flags in PRECISIONS.items():
            output = out / "train" / f"{arch}_{precision}.json"
            paths = ("channels_last", "compile") if compiler and (arch, precision) == compiled else ("channels_last",)
            argv = ("benchmarks/train_throughput.py", "-a", arch, "--image-size", str(scale.image_size),
                    "-b", str(scale.batch_size), "--largest-batch", "--num-classes", "1000", *scale.train_timing,
                    "--device", device, "--paths", *paths, *flags, "-o", str(output))
            skipped = "fp16 autocast needs CUDA" if precision == "AMP" and device != "cuda" else None
            limit = scale.limits["compile" if "compile" in paths else "train"]
            train[arch].append(Step("train", f"{arch} {precision}", argv, limit, output, arch, precision, skipped,
                                    scale.env))
    steps += train[first]
    if "infer" in sections:
        output = out / "infer" / f"{first}.json"
        argv = ("benchmarks/infer_throughput.py", "-a", first, "--image-size", str(scale.image_size),
                "--batch-sizes", *map(str, scale.batch_sizes), "--paths", *INFER_PATHS, *scale.infer_timing,
                "--device", device, "-o", str(output))
        steps.append(Step("infer", f"{first} inference", argv, scale.limits["infer"], output, first, env=scale.env))
    for arch in scale.archs[1:]:
        steps += train[arch]
    return steps


def command(step: Step) -> str:
    """The step's command as a user types it in the repository."""
    return "python " + shlex.join(step.argv)


# ------------------------------------------------------------------------------------------------
# Running
# ------------------------------------------------------------------------------------------------
class Stopped(Exception):
    """SIGTERM reached the report: the step under way is ended and the report written as it stands."""


def _stop(signum: int, frame: object) -> None:
    raise Stopped(f"stopped by signal {signum}")


TEST_LINE = re.compile(r"^(?P<test>\S+::.+?) (?P<outcome>PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS)"
                       r"(?: \((?P<reason>.*)\))?(?:\s+\[\s*\d+%\])?$", re.M)


def parse_tests(output: str) -> dict:
    """``pytest -v``'s outcome of every test, with a skip's reason, and the count of each outcome; from
    as much of the output as there is (a run that was stopped counts the tests it finished)."""
    tests = [{"test": m["test"], "outcome": m["outcome"].lower(), **({"reason": m["reason"]} if m["reason"] else {})}
             for m in TEST_LINE.finditer(output)]
    return {"counts": dict(Counter(test["outcome"] for test in tests)), "tests": tests}


def _last_line(text: str) -> str:
    """The last line of a failed command's output: its one-line error, or a traceback's exception."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else "no output"


def _kill(process: subprocess.Popen) -> None:
    """End the step's process and whatever it started (its own process group), and reap it."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()


def run_step(step: Step, out: Path, left_s: float) -> dict:
    """Run one step within ``min(its limit, left_s)`` seconds; its record: the command, status (ok,
    failed, timed out, skipped, not run), seconds, error, log and result (the benchmark's JSON, or the
    tests' outcomes)."""
    record = {"section": step.section, "name": step.name, "arch": step.arch, "precision": step.precision,
              "command": command(step), "status": "ok", "seconds": 0.0}
    if step.skipped:
        return {**record, "status": "skipped", "error": step.skipped}
    limit = min(step.limit_s, left_s)
    if limit < MIN_STEP_S:
        return {**record, "status": "not run", "error": f"{left_s:.0f} s of the budget were left"}
    log = out / "logs" / (re.sub(r"[^\w.-]+", "_", step.name) + ".log")
    log.parent.mkdir(parents=True, exist_ok=True)
    record["log"] = str(log)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "MPLBACKEND": "Agg", **dict(step.env)}
    start, started_at = time.monotonic(), time.time()
    with open(log, "w", encoding="utf-8") as handle:
        # a process group of its own: what it starts (torch.compile's workers) is ended with it
        process = subprocess.Popen([sys.executable, *step.argv], cwd=REPO, env=env, stdout=handle,
                                   stderr=subprocess.STDOUT, process_group=0)
        try:
            code = process.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            code = None
        finally:
            if process.returncode is None:  # timed out, or this process was stopped while waiting
                _kill(process)
    record["seconds"] = round(time.monotonic() - start, 1)
    output = log.read_text(encoding="utf-8", errors="replace")
    if step.section == "tests":
        record["result"] = parse_tests(output)
    if code is None:
        return {**record, "status": "timed out", "error": f"stopped after {limit:.0f} s (its limit "
                f"{step.limit_s:.0f} s, {left_s:.0f} s of the budget left)"}
    if step.section == "tests":
        failed = [t["test"] for t in record["result"]["tests"] if t["outcome"] in ("failed", "error")]
        if code != 0:
            error = f"{len(failed)} failed: {', '.join(failed)}" if failed else f"pytest exited {code}: " \
                f"{_last_line(output)}"
            return {**record, "status": "failed", "error": error}
        return record
    if code != 0:
        return {**record, "status": "failed", "error": f"exit code {code}: {_last_line(output)}"}
    if step.output is None:
        return record
    try:
        if step.output.stat().st_mtime < started_at:  # a file of an earlier run: not this step's figures
            raise OSError("it was not written by this step")
        record["result"] = json.loads(step.output.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        return {**record, "status": "failed", "error": f"its JSON {step.output} could not be read: {error}"}
    return record


def _not_run(steps: Sequence[Step], reason: str) -> list[dict]:
    return [{"section": s.section, "name": s.name, "arch": s.arch, "precision": s.precision, "command": command(s),
             "status": "not run", "seconds": 0.0, "error": reason} for s in steps]


def run_report(steps: Sequence[Step], out: Path, header: dict, budget_s: float,
               write: Callable[[dict], None], say: Callable[[str], None] = print) -> dict:
    """Run ``steps`` in turn within ``budget_s`` seconds in all, writing the report with ``write`` after
    each; SIGTERM (or Ctrl-C) ends the step under way and records it and the rest as not run."""
    report = {**header, "budget_s": budget_s, "seconds": 0.0, "steps": []}
    start = time.monotonic()
    previous = signal.signal(signal.SIGTERM, _stop)
    try:
        for index, step in enumerate(steps):
            try:
                record = run_step(step, out, budget_s - (time.monotonic() - start))
            except (Stopped, KeyboardInterrupt) as reason:
                report["steps"] += _not_run(steps[index:], f"the report was {reason or 'interrupted'}")
                break
            report["steps"].append(record)
            report["seconds"] = round(time.monotonic() - start, 1)
            write(report)
            say(f"  {step.section:>5} {step.name:<28} {record['status']:<9} {record['seconds']:6.0f} s"
                + (f"  {record['error']}" if record.get("error") else ""))
    finally:
        signal.signal(signal.SIGTERM, previous)
    report["seconds"] = round(time.monotonic() - start, 1)
    write(report)
    return report


# ------------------------------------------------------------------------------------------------
# The report
# ------------------------------------------------------------------------------------------------
def _rate(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:.1f}"


def _md(text: str) -> str:
    """``text`` fit for a Markdown table cell."""
    return text.replace("|", "\\|").replace("\n", " ")


def _precision_title(precision: str, device: str) -> str:
    """TF32 / AMP (fp16) / bf16, as NVIDIA's columns name them; FP32 on the CPU, which has no TF32."""
    return {"TF32": "TF32" if device == "cuda" else "FP32", "AMP": "AMP (fp16)", "BF16": "bf16"}[precision]


def _ours(step: dict | None) -> float | None:
    """Ours' images/s (eager, channels-last) of a training step that ran, else None."""
    return step["result"]["paths"]["channels_last"]["median"] if step and step["status"] == "ok" else None


def _cell(step: dict | None) -> str:
    """A throughput cell: ours with its batch (and the batches that ran out of memory), or why none."""
    if step is None:
        return "-"
    if step["status"] != "ok":
        return _md(f"{step['status']}: {step.get('error', '')}")
    config = step["result"]["config"]
    too_large = config.get("largest_batch", {}).get("out_of_memory_at")
    note = f"; {', '.join(map(str, too_large))} out of memory" if too_large else ""
    return f"{_rate(_ours(step))} img/s (batch {config['batch_size']}{note})"


def _speedup(step: dict | None, base: dict | None) -> str:
    ours, theirs = _ours(step), _ours(base)
    return f"{ours / theirs:.2f}x" if ours and theirs else "-"


def training_markdown(report: dict) -> list[str]:
    """NVIDIA's training table (Arch | GPUs | Throughput TF32 | Throughput AMP | speed-up, bf16 beside),
    then each run against the plain loop and ``--compile``, and the command of every figure."""
    records = {(s["arch"], s["precision"]): s for s in report["steps"] if s["section"] == "train"}
    if not records:
        return []
    device = report["device"]
    base = _precision_title("TF32", device)
    lines = ["## Training throughput", "",
             "The package's training step (`Engine.train_step`, as main.py runs it with `--memory-format nhwc`: "
             "eager, channels-last) on a synthetic batch held on the device, 1000 classes; median images/s of "
             "the rounds. The batch is the largest tried that fits (halved on out-of-memory). Speed-up: over "
             f"the {base} column.", "",
             f"| Arch | GPUs | Throughput {base} | Throughput AMP (fp16) | speed-up ({base} to AMP) | "
             f"Throughput bf16 | speed-up ({base} to bf16) |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for arch in dict.fromkeys(arch for arch, _ in records):
        full, amp, bf16 = (records.get((arch, precision)) for precision in PRECISIONS)
        lines.append(f"| {arch} | 1 | {_cell(full)} | {_cell(amp)} | {_speedup(amp, full)} | {_cell(bf16)} | "
                     f"{_speedup(bf16, full)} |")
    lines += ["", "Against the loop a user writes (`torch.optim.SGD`, `nn.CrossEntropyLoss`, autocast and a "
              "`GradScaler` where the precision asks for them, NCHW), in the same process, in alternating "
              "rounds; a ratio inside the rounds' spread gets no verdict:", "",
              "| Arch | precision | batch | plain loop img/s | ours eager channels-last | `--compile` | "
              "compile warm-up s |", "|---|---|---:|---:|---:|---:|---:|"]
    for (arch, precision), step in records.items():
        if step["status"] != "ok":
            continue
        result = step["result"]
        cells = []
        for path in ("channels_last", "compile"):
            stats = result["paths"].get(path)
            cells.append("-" if stats is None else
                         f"{_rate(stats['median'])} ({ratio_text(stats['ratio'], stats['ratio_spread'])})")
        warmup = result["warmup_seconds"].get("compile")
        lines.append(f"| {arch} | {_precision_title(precision, device)} | {result['config']['batch_size']} | "
                     f"{_rate(result['plain']['median'])} | {cells[0]} | {cells[1]} | "
                     f"{'-' if warmup is None else f'{warmup:.0f}'} |")
    if report.get("compile_missing"):
        lines += ["", f"`--compile` was not measured: {report['compile_missing']}."]
    lines += ["", "Commands (in the repository):", ""]
    lines += [f"* {arch} {_precision_title(precision, device)}: `{step['command']}`"
              for (arch, precision), step in records.items()]
    return lines + [""]


def _infer_title(name: str, device: str) -> str:
    fp32 = "TF32" if device == "cuda" else "FP32"
    return {"torchvision": f"torchvision eager {fp32}, NCHW (the baseline)", "channels_last": f"{fp32}, channels-last",
            "fp16": "AMP (fp16 autocast), channels-last", "bf16": "bf16 autocast, channels-last"}.get(name, name)


def inference_markdown(report: dict) -> list[str]:
    """NVIDIA's inference tables (Batch | Throughput | Latency p50 | p90 | p99), one per path."""
    lines = []
    for step in (s for s in report["steps"] if s["section"] == "infer"):
        lines += [f"## Inference: {step['arch']}", "", f"`{step['command']}`", ""]
        if step["status"] != "ok":
            lines += [f"{step['status']}: {step.get('error', '')}", ""]
            continue
        result = step["result"]
        lines.append(f"{result['config']['image_size']} px, random weights; each batch is on the device before it "
                     "is timed, on its own; throughput is the batch size over the mean latency; vs torchvision: "
                     "over the baseline's throughput at the same batch.")
        for name, entry in result["paths"].items():
            lines += ["", f"#### {result['config']['arch']}, {_infer_title(name, report['device'])}", ""]
            if "skipped" in entry:
                lines.append(f"skipped: {entry['skipped']}")
                continue
            lines += ["| Batch | Throughput img/s | Latency p50 | Latency p90 | Latency p99 | vs torchvision |",
                      "|---:|---:|---:|---:|---:|---:|"]
            for batch in result["config"]["batch_sizes"]:
                point = entry[str(batch)]
                lines.append(f"| {batch} | {_rate(point['images_per_s'])} | {point['p50_ms']:.2f} ms | "
                             f"{point['p90_ms']:.2f} ms | {point['p99_ms']:.2f} ms | {point['speedup']:.2f}x |")
        lines.append("")
    return lines


def tests_markdown(report: dict) -> list[str]:
    """The tests' status and count of outcomes, why tests were skipped, and which failed."""
    lines = []
    for step in (s for s in report["steps"] if s["section"] == "tests"):
        error = f" ({step['error']})" if step.get("error") else ""
        lines += ["## GPU tests", "", f"`{step['command']}`: **{step['status']}**{error}, {step['seconds']:.0f} s", ""]
        result = step.get("result")
        if result:
            counts = ", ".join(f"{n} {outcome}" for outcome, n in sorted(result["counts"].items()))
            lines.append(f"Outcomes: {counts or 'no test ran'}.")
            reasons = Counter(t.get("reason", "no reason given") for t in result["tests"] if t["outcome"] == "skipped")
            lines += [f"* skipped ({n}): {reason}" for reason, n in reasons.items()]
            lines += [f"* {test['outcome']}: `{test['test']}`" for test in result["tests"]
                      if test["outcome"] in ("failed", "error")]
        lines.append("")
    return lines


def markdown(report: dict) -> str:
    """report.md: the machine and the command, then the tests, training and inference tables, and every
    step's status."""
    smoke = " (smoke run: tiny sizes, the figures say nothing about speed)" if report["smoke"] else ""
    lines = [f"# GPU report{smoke}", "",
             f"* Machine: {report['machine']['description']}",
             f"* Command: `{report['command']}`",
             f"* Started {report['started']}; {report['seconds']:.0f} s of the {report['budget_s']:.0f} s budget.", ""]
    lines += tests_markdown(report) + training_markdown(report) + inference_markdown(report)
    lines += ["## Steps", "", "| section | step | status | seconds | error |", "|---|---|---|---:|---|"]
    for step in report["steps"]:
        error = _md(step.get("error") or "")
        lines.append(f"| {step['section']} | {step['name']} | {step['status']} | {step['seconds']:.0f} | {error} |")
    return "\n".join(lines) + "\n"


def write_report(report: dict, out: Path) -> None:
    """DIR/report.json and DIR/report.md, each replaced whole (a reader never sees half a file)."""
    write_json(report, str(out / "report.json"))
    temporary = out / f".report.md.{os.getpid()}.tmp"
    temporary.write_text(markdown(report), encoding="utf-8")
    os.replace(temporary, out / "report.md")


# ------------------------------------------------------------------------------------------------
# Command line
# ------------------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    parser = UserErrorParser(prog="gpu_report.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, metavar="DIR",
                        help="folder for report.md, report.json, the benchmarks' JSON and the logs (a new one, "
                        "or one without a report)")
    parser.add_argument("--smoke", action="store_true",
                        help="the same steps at tiny sizes (32 px, batches of 1 to 4), on whatever device there is")
    parser.add_argument("--budget", type=positive_float, default=None, metavar="SECONDS",
                        help=f"time for all the steps (default: {FULL.budget_s:.0f}, with --smoke "
                        f"{SMOKE.budget_s:.0f})")
    parser.add_argument("--sections", nargs="+", choices=SECTIONS, default=list(SECTIONS),
                        help="which parts to run (default: all of them)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    out = Path(args.out)
    if (out / "report.json").exists():
        raise UserError(f"--out {out} already holds a report (report.json): give a new folder")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu" and not args.smoke:  # batch 256 of ResNeXt-101 at 224 px: hours on a CPU, to no purpose
        raise UserError("the report measures a CUDA device and none is available here; --smoke runs the same "
                        "steps at tiny sizes on the CPU")
    out.mkdir(parents=True, exist_ok=True)
    scale = SMOKE if args.smoke else FULL
    budget = args.budget or scale.budget_s
    facts = machine.facts(device)
    no_compiler = compiler_missing(torch.device(device))
    header = {"report": "gpu_report", "command": "python " + shlex.join(["scripts/gpu_report.py", *argv]),
              "smoke": args.smoke, "device": device, "compile_missing": no_compiler,
              "started": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
              "machine": {**facts, "description": machine.describe(facts)}}
    steps = plan(scale, device, out.resolve(), args.sections, compiler=not no_compiler)
    print(f"{len(steps)} steps within {budget:.0f} s on {header['machine']['description']}", flush=True)
    report = run_report(steps, out, header, budget, lambda report: write_report(report, out),
                        say=lambda line: print(line, flush=True))
    print(f"wrote {out / 'report.md'} and report.json in {report['seconds']:.0f} s", flush=True)
    return 0 if all(step["status"] in ("ok", "skipped") for step in report["steps"]) else 1


if __name__ == "__main__":
    sys.exit(run(main))
