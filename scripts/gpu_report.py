"""A GPU machine's report in one command: training throughput, the GPU tests and the inference sweep.

    python scripts/gpu_report.py --out DIR            # on one H100: within 8 minutes
    python scripts/gpu_report.py --out DIR --smoke    # the same steps at tiny sizes, on a CPU too

The steps, in the order they run, what users quote first:

* the AMP training figure of resnet50, resnext101-32x4d and se-resnext101-32x4d: ``launch.py --mode
  benchmark_training_short --platform DGXH100``, the command users type (its throughput leaves out 20
  warm-up iterations), then ``benchmarks/train_throughput.py`` at AMP (fp16 autocast with a loss scaler):
  the package's training step, channels-last, against the plain loop a user writes, at the largest batch up
  to 256 that fits (halved on out-of-memory);
* ``pytest -m gpu`` over tests/, on several workers (without CUDA they skip, and the report says why);
* ``benchmarks/infer_throughput.py`` for resnet50 at batch 1 to 256: torchvision eager (the baseline),
  channels-last TF32, fp16 and bf16, with latency percentiles;
* launch.py's benchmark at TF32 for the three models, and at bf16 for resnet50 (NVIDIA publishes no bf16
  figures to compare with; 40 iterations, 20 of them warm-up);
* resnet50 at AMP with ``--compile`` (compiling more would not fit the budget).

Each step carries its time on an H100 estimated from the first H100 report; the start of the run prints
the total and names the steps that, by that estimate, the budget will leave out.

Each step runs in a process of its own, as a user would run it: CUDA memory starts clean, and a crash
or a hang ends that step only; a step that fails or overruns its limit is recorded with its error, and
the report goes on.  The steps share one time budget (``--budget``): each gets at most what is left, and
those for which too little is left are recorded as not run.  After every step DIR/report.json (every
step's command, status, time and the benchmark's own figures) and DIR/report.md (NVIDIA's table layouts,
the GPU, driver, torch and CUDA versions, each figure's command) are written again, so a run that is
killed leaves what it measured; SIGTERM or Ctrl-C end the step under way and record the rest as not
run.  Each step's output is in DIR/logs/, launch.py's raports in DIR/launch/.

``--smoke`` runs the same steps at 32 px with batches of 1 to 4, one timed iteration and one intra-op
thread, with resnet18 in resnet50's place for train_throughput.py and the inference sweep, and launch.py's
CPU platform (its AMP is bf16 there; fp16, slow on a CPU, runs in resnet18's train_throughput.py step):
every code path, compilation included where a compiler exists, in a few minutes on two CPU cores.  Its
figures say nothing about speed.  Without CUDA only ``--smoke`` runs.
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

from benchmarks.common import compiler_missing, write_json  # noqa: E402
from benchmarks.report_markdown import markdown  # noqa: E402
from image_classification import machine  # noqa: E402
from image_classification.cli import UserErrorParser, positive_float, run  # noqa: E402
from image_classification.errors import UserError  # noqa: E402
from image_classification.raport import read_raport  # noqa: E402

# train_throughput.py's precision flags; TF32 is its default on CUDA (the CPU has none: FP32 there)
PRECISIONS = {"TF32": (), "AMP": ("--amp", "--amp-dtype", "float16"), "BF16": ("--amp", "--amp-dtype", "bfloat16")}
INFER_PATHS = ("channels_last", "fp16", "bf16")
SECTIONS = ("tests", "train", "infer")
MIN_STEP_S = 10  # a step given less than this would only be killed: it is recorded as not run
LAUNCH_MODE = "benchmark_training_short"  # synthetic data, 100 iterations, the first 20 left out (configs.yml)


@dataclass(frozen=True)
class Scale:
    """The models, sizes, iterations and time limits of a report: the real one, or the smoke run's."""

    archs: tuple[str, ...]  # train_throughput.py's; the first is compiled and swept for inference
    image_size: int
    batch_size: int  # the largest training batch tried
    train_timing: tuple[str, ...]  # train_throughput.py's --iters/--warmup/--repeats
    batch_sizes: tuple[int, ...]  # the inference sweep
    infer_timing: tuple[str, ...]
    budget_s: float
    limits: dict  # seconds per step: tests, launch, train, compile (the training step that compiles), infer
    platform: str  # launch.py's --platform
    # launch.py's --precision for each of the report's precisions, and flags that follow it
    launch_precisions: dict
    launch_flags: tuple[str, ...] = ()  # for every launch.py step (typed flags win over the preset)
    others_flags: tuple[str, ...] = ()  # for the TF32 and bf16 launch.py steps (they come after the headline)
    test_workers: int = 1
    fp16_archs: int = 3  # how many of the architectures train_throughput.py runs at AMP
    env: tuple[tuple[str, str], ...] = ()  # set in the steps' environment
    estimates: tuple[tuple[str, float], ...] = ()  # (step name, seconds expected): for the plan's forecast


# Sized from the first H100 report (one H100 80GB HBM3, torch 2.11): train_throughput.py took 29-40 s a run
# (two cold models, each autotuned by cuDNN), the inference sweep 72 s, the GPU tests 108 s on 4 workers;
# launch.py's first iteration took 13 s for resnet50, 10 s for resnext101-32x4d and 19 s for
# se-resnext101-32x4d (cuDNN's autotuning), then ran at 4,800, 2,180 and 1,400 img/s; starting a process
# takes about 6 s.  The estimates below follow from these; the budget, 8 minutes less 20 s for starting
# and writing, leaves out what does not fit, from the end.
H100_ESTIMATES = (
    ("resnet50 AMP launch.py", 25), ("resnext101-32x4d AMP launch.py", 25),
    ("se-resnext101-32x4d AMP launch.py", 35), ("resnet50 AMP", 30), ("resnext101-32x4d AMP", 40),
    ("se-resnext101-32x4d AMP", 50), ("pytest -m gpu", 100), ("resnet50 inference", 75),
    ("resnet50 TF32 launch.py", 25), ("resnext101-32x4d TF32 launch.py", 25),
    ("se-resnext101-32x4d TF32 launch.py", 35), ("resnet50 BF16 launch.py", 25), ("resnet50 AMP compile", 80),
)
FULL = Scale(
    archs=("resnet50", "resnext101-32x4d", "se-resnext101-32x4d"), image_size=224, batch_size=256,
    train_timing=("--iters", "5", "--warmup", "2", "--repeats", "2"), batch_sizes=tuple(2 ** i for i in range(9)),
    infer_timing=("--iters", "20", "--warmup", "3", "--repeats", "2"), budget_s=460,
    limits={"tests": 150, "launch": 90, "train": 100, "compile": 180, "infer": 120}, platform="DGXH100",
    launch_precisions={"AMP": ("AMP", ()), "TF32": ("TF32", ()), "BF16": ("BF16", ())},
    others_flags=("--prof", "40"), test_workers=6, estimates=H100_ESTIMATES,
)
# One thread: on two cores shared with other work, two OpenMP threads spin and run several times slower.
# The limits are the budget's: a cold torch.compile alone takes minutes on a loaded small machine.  fp16 runs
# on the CPU for resnet18 only: its grouped convolutions take ResNeXt's steps to seconds each.
SMOKE = Scale(
    archs=("resnet18", "resnext101-32x4d", "se-resnext101-32x4d"), image_size=32, batch_size=4,
    train_timing=("--iters", "1", "--warmup", "1", "--repeats", "2"), batch_sizes=(1, 2),
    infer_timing=("--iters", "2", "--warmup", "1", "--repeats", "2"), budget_s=420,
    limits={"tests": 300, "launch": 300, "train": 300, "compile": 300, "infer": 300}, platform="CPU",
    launch_precisions={"AMP": ("AMP", ()), "TF32": ("FP32", ()), "BF16": ("AMP", ("--amp-dtype", "bfloat16"))},
    launch_flags=("--image-size", "32", "-b", "2", "--prof", "3", "--benchmark-warmup", "1"),
    fp16_archs=1, env=(("OMP_NUM_THREADS", "1"),),
)
LAUNCH_MODELS = ("resnet50", "resnext101-32x4d", "se-resnext101-32x4d")  # launch.py's presets
LAUNCH_BF16 = ("resnet50",)  # NVIDIA publishes no bf16 figures: one model shows what bf16 does


@dataclass(frozen=True)
class Step:
    """One command of the report: ``argv`` after ``python``, run in the repository with ``env`` added to
    the environment; ``output`` the JSON it writes (a raport for ``launch``; None for the tests); ``skipped``
    why it cannot run on this device.  ``kind``: ``launch`` (launch.py's benchmark, the figure users type),
    ``throughput`` (train_throughput.py, against the plain loop), ``compile`` or empty (tests, inference)."""

    section: str
    name: str
    argv: tuple[str, ...]
    limit_s: float
    output: Path | None = None
    arch: str = ""
    precision: str = ""
    skipped: str | None = None
    env: tuple[tuple[str, str], ...] = ()
    kind: str = ""


def launch_step(scale: Scale, arch: str, precision: str, out: Path) -> Step:
    """launch.py's benchmark of ``arch`` at ``precision``, as a user types it, its raport in its own workspace."""
    workspace = out / "launch" / f"{arch}_{precision}"
    launch_precision, flags = scale.launch_precisions[precision]
    extra = scale.others_flags if precision != "AMP" else ()
    argv = ("launch.py", "--model", arch, "--precision", launch_precision, "--mode", LAUNCH_MODE, "--platform",
            scale.platform, *scale.launch_flags, *flags, *extra, "--workspace", str(workspace),
            "--raport-file", "raport.json")
    return Step("train", f"{arch} {precision} launch.py", argv, scale.limits["launch"], workspace / "raport.json",
                arch, precision, env=scale.env, kind="launch")


def throughput_step(scale: Scale, arch: str, precision: str, device: str, out: Path, compiled: bool = False) -> Step:
    """train_throughput.py's run of ``arch`` at ``precision``: ours channels-last (or compiled) against the
    plain loop, at the largest batch up to the scale's that fits."""
    suffix = "_compile" if compiled else ""
    output = out / "train" / f"{arch}_{precision}{suffix}.json"
    argv = ("benchmarks/train_throughput.py", "-a", arch, "--image-size", str(scale.image_size), "-b",
            str(scale.batch_size), "--largest-batch", "--num-classes", "1000", *scale.train_timing, "--device",
            device, "--paths", "compile" if compiled else "channels_last", *PRECISIONS[precision], "-o", str(output))
    skipped = None
    if precision == "AMP" and device != "cuda" and scale.archs.index(arch) >= scale.fp16_archs:
        skipped = "fp16 on the CPU is run for the first architecture only (its grouped convolutions are slow there)"
    limit = scale.limits["compile" if compiled else "train"]
    return Step("train", f"{arch} {precision}{' compile' if compiled else ''}", argv, limit, output, arch, precision,
                skipped, scale.env, "compile" if compiled else "throughput")


def plan(scale: Scale, device: str, out: Path, sections: Sequence[str] = SECTIONS,
         compiler: bool = True) -> list[Step]:
    """Every step of the report, in the order they run, what users quote first: the AMP training figures of
    the three models (launch.py's benchmark, then train_throughput.py's against the plain loop), the GPU
    tests, the inference sweep, TF32 (and bf16 for resnet50), and last ``--compile`` (left out without a
    compiler)."""
    train = "train" in sections
    steps: list[Step] = []
    if train:
        steps += [launch_step(scale, arch, "AMP", out) for arch in LAUNCH_MODELS]
        steps += [throughput_step(scale, arch, "AMP", device, out) for arch in scale.archs]
    if "tests" in sections:
        # a test module that cannot be imported there (a package the machine lacks) costs its own tests only
        argv = ("-m", "pytest", "-m", "gpu", "-v", "-p", "no:cacheprovider", "--continue-on-collection-errors",
                *(("-n", str(scale.test_workers)) if scale.test_workers > 1 else ()), "tests")
        wide = (("COLUMNS", "400"),)  # pytest -v cuts a skip's reason to the terminal's width
        steps.append(Step("tests", "pytest -m gpu", argv, scale.limits["tests"], env=scale.env + wide))
    first = scale.archs[0]
    if "infer" in sections:
        output = out / "infer" / f"{first}.json"
        argv = ("benchmarks/infer_throughput.py", "-a", first, "--image-size", str(scale.image_size),
                "--batch-sizes", *map(str, scale.batch_sizes), "--paths", *INFER_PATHS, *scale.infer_timing,
                "--device", device, "-o", str(output))
        steps.append(Step("infer", f"{first} inference", argv, scale.limits["infer"], output, first, env=scale.env))
    if train:
        steps += [launch_step(scale, arch, "TF32", out) for arch in LAUNCH_MODELS]
        steps += [launch_step(scale, arch, "BF16", out) for arch in LAUNCH_BF16]
        if compiler:  # the CPU has no fp16 autocast worth compiling: bf16 there
            steps.append(throughput_step(scale, first, "AMP" if device == "cuda" else "BF16", device, out, True))
    return steps


def forecast(scale: Scale, steps: Sequence[Step], budget_s: float) -> tuple[float, list[str]]:
    """The seconds ``steps`` are expected to take at ``scale`` (0 where it has no estimates), and the names
    of the runnable steps that, by those estimates, start with less than :data:`MIN_STEP_S` of the budget
    left or would need more than is left (the runner gives such a step what is left and stops it there)."""
    expected = dict(scale.estimates)
    total, cut = 0.0, []
    for step in steps:
        seconds = 0.0 if step.skipped else expected.get(step.name, 0.0)
        if seconds and total + seconds > budget_s:
            cut.append(step.name)
        total += seconds
    return total, cut


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
              "kind": step.kind, "command": command(step), "status": "ok", "seconds": 0.0}
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
    what = "raport" if step.kind == "launch" else "JSON"
    try:
        if step.output.stat().st_mtime < started_at:  # a file of an earlier run: not this step's figures
            raise OSError("it was not written by this step")
        if step.kind == "launch":
            record["result"] = launch_figures(step.output)
        else:
            record["result"] = json.loads(step.output.read_text(encoding="utf-8"))
    except (OSError, ValueError, KeyError) as error:
        return {**record, "status": "failed", "error": f"its {what} {step.output} could not be read: {error}"}
    return record


def launch_figures(raport: Path) -> dict:
    """What a launch.py benchmark's raport says: the summary's throughput (warm-up left out) and wall-clock
    throughput, the batch, the warm-up and the iterations; ValueError where it has no throughput figure."""
    parameters, summary = {}, {}
    for record in read_raport(raport):
        if record.get("step") == "PARAMETER":
            parameters.update(record["data"])
        elif record.get("step") == []:
            summary.update(record["data"])
    if "train.total_ips" not in summary:
        raise ValueError("its summary has no train.total_ips: no iteration after the warm-up")
    return {"total_ips": summary["train.total_ips"], "wall_ips": summary.get("train.wall_ips"),
            "batch_size": parameters["batch_size"], "warmup": parameters.get("benchmark_warmup", 0),
            "iterations": parameters.get("prof"), "amp_dtype": parameters.get("amp_dtype") if parameters.get("amp")
            else None, "loss": summary.get("train.loss")}


def _not_run(steps: Sequence[Step], reason: str) -> list[dict]:
    return [{"section": s.section, "name": s.name, "arch": s.arch, "precision": s.precision, "kind": s.kind,
             "command": command(s), "status": "not run", "seconds": 0.0, "error": reason} for s in steps]


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
    expected, cut = forecast(scale, steps, budget)
    if expected:
        header["expected_s"] = expected
        print(f"by the first H100 report's times they take about {expected:.0f} s"
              + (f"; expected not to fit: {', '.join(cut)}" if cut else ""), flush=True)
    report = run_report(steps, out, header, budget, lambda report: write_report(report, out),
                        say=lambda line: print(line, flush=True))
    print(f"wrote {out / 'report.md'} and report.json in {report['seconds']:.0f} s", flush=True)
    return 0 if all(step["status"] in ("ok", "skipped") for step in report["steps"]) else 1


if __name__ == "__main__":
    sys.exit(run(main))
