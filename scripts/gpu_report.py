"""A GPU machine's report in one command: the GPU tests, training throughput, inference and GPU decoding.

    python3 scripts/gpu_report.py --out DIR                    # the first call on a GPU: steps within 520 s
    python3 scripts/gpu_report.py --out DIR2 --sections train  # the rest, in a second call if time is left
    python3 scripts/gpu_report.py --out DIR --smoke            # the same steps tiny, on a CPU too

DIR receives three files and nothing else: ``report.md`` (NVIDIA's table layouts, the GPU, driver, torch
and CUDA versions, each figure's command), ``report.json`` (every step's command, status, time and figures)
and ``logs.tar.gz`` (every step's log, launch.py's raports, the benchmarks' JSON and the tests' outcomes).
The steps work in a scratch folder, removed at the end; the archive holds all of it but the JPEG set.
All three files are written at the start and again after every step, each replaced whole, so a run that
is killed leaves them with what it measured (the steps it had not reached marked pending); SIGTERM or
Ctrl-C end the step under way and record the rest as not run.

The sections, in the order they run, what is worth most first (``--sections``; the default runs the first
four, the fifth fits a second call):

* ``tests``: ``pytest -m gpu`` over the test modules that hold a ``gpu`` test (found by reading them), on
  several workers, each test within a time limit where pytest-timeout is installed; each test's outcome is
  written as it ends (``tests/outcomes.py``), so a step that is killed keeps every outcome it reached;
* ``amp``: the AMP training figure of resnet50, resnext101-32x4d and se-resnext101-32x4d, ``launch.py
  --mode benchmark_training_short --platform DGXH100``, the command users type (its throughput leaves out
  20 warm-up iterations), and resnet50's in NCHW beside its preset's channels-last;
* ``infer``: ``benchmarks/infer_throughput.py`` for resnet50 at batch 1 to 256: torchvision eager (the
  baseline), channels-last TF32, fp16 and bf16, with latency percentiles;
* ``decode``: JPEGs decoded on the GPU.  First the probe that decides whether ``pytorch-gpu`` takes the
  device's decoder (``benchmarks/decoder_probe.py``: each probe JPEG's grey levels against the CPU's), then
  a JPEG set written for the run (``benchmarks/jpeg_set.py``: no download, no scikit-image), the loader alone
  (``benchmarks/benchmark_loader.py --data-backend pytorch-gpu --beside pytorch``, epochs alternating), and
  resnet50's AMP training from those JPEGs with pytorch-gpu against the same command on synthetic data: the
  report gives JPEG over synthetic and the JPEGs decoded on the CPU.  A refused decoder costs only the steps
  that need it, each saying why;
* ``train``: launch.py at TF32 for the three models and at bf16 for resnet50 (40 iterations, 20 of them
  warm-up), ``benchmarks/train_throughput.py`` at AMP (the package's training step, channels-last, against
  the plain loop a user writes, at the largest batch up to 256 that fits), and resnet50's with ``--compile``.

Each step runs in a process of its own, as a user would run it: CUDA memory starts clean, and a crash or a
hang ends that step only; a step that fails or overruns its limit is recorded with its error, and the report
goes on.  Each step carries its time estimated from the first H100 report (:data:`H100_ESTIMATES`); the
steps share one time budget (``--budget``), and a step whose estimate is more than what is left is not
started: it is recorded as left out, with why.  The run starts by printing the forecast.

``--smoke`` runs the same steps at 32 px with batches of 1 to 8, one timed iteration and one intra-op
thread, with resnet18 in resnet50's place for train_throughput.py and the inference sweep, launch.py's CPU
platform (its AMP is bf16 there; fp16, slow on a CPU, runs in resnet18's train_throughput.py step), 64
JPEGs, the pytorch-gpu loader's CPU twin and, for training, the ``pytorch`` backend (main.py refuses
pytorch-gpu off CUDA; the report says so): every code path in a few minutes on two CPU cores, by its own
forecast.  Its figures say nothing about speed.  Without CUDA only ``--smoke`` runs.
"""

from __future__ import annotations

import argparse
import ast
import datetime
import importlib.util
import io
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Sequence

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from benchmarks.common import compiler_missing, write_json  # noqa: E402
from benchmarks.report_markdown import markdown  # noqa: E402
from image_classification.errors import UserError  # noqa: E402
from image_classification.records.raport import read_raport  # noqa: E402
from image_classification.system import machine  # noqa: E402
from image_classification.system.cli import UserErrorParser, positive_float, run  # noqa: E402

LOADER_SCRIPT = "benchmarks/benchmark_loader.py"  # the loader benchmark, relative to the repository
JPEG_SET_SCRIPT = "benchmarks/jpeg_set.py"
PROBE_SCRIPT = "benchmarks/decoder_probe.py"
PROBE_STEP = "decoder probe"  # what the steps that need pytorch-gpu's device decoder wait for
OUTCOMES_ENV = "IC_TEST_OUTCOMES"  # tests/outcomes.py writes each test's outcome to this file as it ends
REPORT_FILES = ("report.md", "report.json", "logs.tar.gz")  # all that --out receives
DATA_FOLDER = "data"  # the JPEG set, in the scratch folder: left out of the archive
ARCHIVE_MEMBER_LIMIT = 4 << 20  # a longer file is archived as its last 4 MiB: the archive must stay small

# train_throughput.py's precision flags; TF32 is its default on CUDA (the CPU has none: FP32 there)
PRECISIONS = {"TF32": (), "AMP": ("--amp", "--amp-dtype", "float16"), "BF16": ("--amp", "--amp-dtype", "bfloat16")}
INFER_PATHS = ("channels_last", "fp16", "bf16")
SECTIONS = ("tests", "amp", "infer", "decode", "train")
DEFAULT_SECTIONS = ("tests", "amp", "infer", "decode")  # by the estimates within one call; "train" is the second
MIN_STEP_S = 10  # a step given less than this would only be killed: it is left out
LAUNCH_MODE = "benchmark_training_short"  # synthetic data, 100 iterations, the first 20 left out (configs.yml)
LAUNCH_MODELS = ("resnet50", "resnext101-32x4d", "se-resnext101-32x4d")  # launch.py's presets
LAUNCH_BF16 = ("resnet50",)  # NVIDIA publishes no bf16 figures: one model shows what bf16 does
LAYOUT_ARCH = "resnet50"  # its AMP preset (channels-last) is also run in NCHW: what --memory-format auto weighs
DECODE_ARCH = "resnet50"  # trained from JPEGs and from synthetic data, at AMP


@dataclass(frozen=True)
class Scale:
    """The models, sizes, iterations, time limits and time estimates of a report: the real one, or the
    smoke run's."""

    archs: tuple[str, ...]  # train_throughput.py's; the first is compiled and swept for inference
    image_size: int
    batch_size: int  # the largest training batch tried
    train_timing: tuple[str, ...]  # train_throughput.py's --iters/--warmup/--repeats
    batch_sizes: tuple[int, ...]  # the inference sweep
    infer_timing: tuple[str, ...]
    budget_s: float
    limits: dict  # seconds per kind of step (see Step.kind), killed past it
    platform: str  # launch.py's --platform
    # launch.py's --precision for each of the report's precisions, and flags that follow it
    launch_precisions: dict
    jpeg_images: int  # the JPEG set: enough for every iteration of the decode section's training runs
    jpeg_classes: int  # as many as the synthetic data's, so that both runs train the same model
    jpeg_workers: int  # benchmarks/jpeg_set.py's -j
    loader_flags: tuple[str, ...]  # benchmark_loader.py's batch, workers, epochs, size, device, layout
    decode_flags: tuple[str, ...]  # the JPEG and synthetic launch.py runs' (the same for both)
    launch_flags: tuple[str, ...] = ()  # for every launch.py step (typed flags win over the preset)
    others_flags: tuple[str, ...] = ()  # for the TF32 and bf16 launch.py steps (they come after the headline)
    test_workers: int = 1
    test_timeout_s: float = 0.0  # pytest-timeout's limit per test, where it is installed (0: none)
    fp16_archs: int = 3  # how many of the architectures train_throughput.py runs at AMP
    env: tuple[tuple[str, str], ...] = ()  # set in the steps' environment
    estimates: dict = field(default_factory=dict)  # step name -> seconds expected, for the budget
    estimated_on: str = ""  # where the estimates come from, in words


# From the first H100 report (one H100 80GB HBM3, torch 2.11, 16 host cores): starting a process that
# imports torch and initialises CUDA takes about 6 s; launch.py's first iteration took 13 s for resnet50,
# 10 s for resnext101-32x4d and 19 s for se-resnext101-32x4d (cuDNN's autotuning), then they ran at 4,800,
# 2,180 and 1,400 img/s (AMP); train_throughput.py took 29-40 s a run (two cold models, each autotuned); the
# inference sweep 72 s; the GPU tests 108 s on 4 workers; the pytorch loader delivered 2,394 img/s of
# 500x375 JPEGs with 14 workers.  The new steps are estimated from what they do at those rates.
# The JPEG set costs about 30 ms of one core an image (the noise, then the encoding: 5.9 s of CPU time for 200 on
# a 2-core Intel Xeon with AVX512, one BLAS thread; benchmarks/jpeg_set.py), so 15,360 on 14 processes take about
# 33 s, and their start a few.
JPEG_MS_PER_IMAGE = 30
H100_ESTIMATES = {
    # tests: fewer modules collected than then, and more GPU tests since
    "pytest -m gpu": 100,
    # amp (110 s), with resnet50's preset in NCHW beside its channels-last
    "resnet50 AMP launch.py": 25, "resnext101-32x4d AMP launch.py": 25, "se-resnext101-32x4d AMP launch.py": 35,
    "resnet50 AMP launch.py NCHW": 25,
    "resnet50 inference": 75,
    # decode (155 s): the decoder's probe (a process that starts CUDA and decodes four small JPEGs), the set
    "decoder probe": 10, "JPEG set": round(5 + 60 * 256 * JPEG_MS_PER_IMAGE / 1000 / 14),
    # 3 epochs of 15,360 images from each loader: pytorch at 2,400 img/s (19 s), pytorch-gpu at its goal of
    # 5,000 or more (9 s), with starting CUDA and 2x12 loader workers.
    "loader pytorch-gpu beside pytorch": 45,
    # as resnet50's AMP launch.py (6 s start, 13 s autotuning) with 60 iterations of 256 at 4,800 img/s
    # (3 s; 6 s at half the speed) and the loader's workers starting, and without them
    "resnet50 AMP launch.py JPEG": 35, "resnet50 AMP launch.py synthetic": 25,
    # train (340 s): the TF32 and bf16 launch.py runs have 40 iterations, cuDNN's autotuning most of them
    "resnet50 TF32 launch.py": 25, "resnext101-32x4d TF32 launch.py": 25, "se-resnext101-32x4d TF32 launch.py": 35,
    "resnet50 BF16 launch.py": 25,
    "resnet50 AMP": 30, "resnext101-32x4d AMP": 40, "se-resnext101-32x4d AMP": 50,
    # the plain loop's warm-up, then a cold torch.compile of resnet50's forward and backward (60-90 s)
    "resnet50 AMP compile": 110,
}
FULL = Scale(
    archs=("resnet50", "resnext101-32x4d", "se-resnext101-32x4d"), image_size=224, batch_size=256,
    train_timing=("--iters", "5", "--warmup", "2", "--repeats", "2"), batch_sizes=tuple(2 ** i for i in range(9)),
    infer_timing=("--iters", "20", "--warmup", "3", "--repeats", "2"), budget_s=520,
    limits={"tests": 150, "launch": 90, "throughput": 100, "compile": 180, "infer": 120,
            "data": 2 * H100_ESTIMATES["JPEG set"], "loader": 120, "probe": 40},
    platform="DGXH100",
    launch_precisions={"AMP": ("AMP", ()), "TF32": ("TF32", ()), "BF16": ("BF16", ())},
    jpeg_images=60 * 256, jpeg_classes=1000, jpeg_workers=14,
    loader_flags=("-b", "256", "-j", "12", "--epochs", "3", "--device", "cuda", "--memory-format", "nhwc"),
    decode_flags=("--prof", "60"),  # 40 iterations after the 20 of warm-up: 60 x 256 images, one epoch
    others_flags=("--prof", "40"), test_workers=6, test_timeout_s=90, estimates=H100_ESTIMATES,
    estimated_on="the first H100 report",
)
# Measured on the 2-core machine of docs/performance.md while other work held a load average of 6 to 13: each
# step of a --smoke run took 7 to 25 s (launch.py), 32 to 46 s (the tests), 16 to 23 s (inference), 7 to 15 s
# (the JPEG set), 11 to 16 s (the loader), 27 to 30 s (resnet18's fp16 step) and 210 to 212 s (compiling); the
# estimates round the longest up by about a quarter.  One thread: on two cores shared with other work, two
# OpenMP threads spin and run several times slower.  fp16 runs on the CPU for resnet18 only: its grouped
# convolutions take ResNeXt's steps to seconds each.
SMOKE_ESTIMATES = {
    "resnet50 AMP launch.py": 30, "resnext101-32x4d AMP launch.py": 30, "se-resnext101-32x4d AMP launch.py": 30,
    "resnet50 AMP launch.py NCHW": 30, "pytest -m gpu": 60, "resnet18 inference": 30, "decoder probe": 15,
    "JPEG set": 20, "loader pytorch-gpu beside pytorch": 20, "resnet50 AMP launch.py JPEG": 30,
    "resnet50 AMP launch.py synthetic": 30,
    "resnet50 TF32 launch.py": 30, "resnext101-32x4d TF32 launch.py": 30, "se-resnext101-32x4d TF32 launch.py": 30,
    "resnet50 BF16 launch.py": 30,
    "resnet18 AMP": 40, "resnet18 BF16 compile": 280,
}
SMOKE = Scale(
    archs=("resnet18", "resnext101-32x4d", "se-resnext101-32x4d"), image_size=32, batch_size=4,
    train_timing=("--iters", "1", "--warmup", "1", "--repeats", "2"), batch_sizes=(1, 2),
    infer_timing=("--iters", "2", "--warmup", "1", "--repeats", "2"), budget_s=520,
    limits={"tests": 300, "launch": 300, "throughput": 300, "compile": 300, "infer": 300, "data": 300,
            "loader": 300, "probe": 120},
    platform="CPU",
    launch_precisions={"AMP": ("AMP", ()), "TF32": ("FP32", ()), "BF16": ("AMP", ("--amp-dtype", "bfloat16"))},
    jpeg_images=64, jpeg_classes=4, jpeg_workers=2,
    loader_flags=("-b", "8", "-j", "1", "--epochs", "2", "--image-size", "32", "--device", "cpu"),
    decode_flags=(),  # launch_flags' 3 iterations, 1 of them warm-up
    launch_flags=("--image-size", "32", "-b", "2", "--prof", "3", "--benchmark-warmup", "1"),
    test_workers=2, test_timeout_s=240, fp16_archs=1, env=(("OMP_NUM_THREADS", "1"),), estimates=SMOKE_ESTIMATES,
    estimated_on="smoke runs on 2 CPU cores",
)


@dataclass(frozen=True)
class Step:
    """One command of the report: ``argv`` after ``python``, run in the repository with ``env`` added to
    the environment; ``output`` the file it writes (a raport for ``launch``, the outcomes' JSON lines for ``tests``,
    None for the loader, whose figures are in its log); ``skipped`` why it cannot run on this device;
    ``needs`` the steps that must have succeeded first.  ``kind``: ``launch`` (launch.py's benchmark, the figure
    users type), ``throughput`` (train_throughput.py, against the plain loop), ``compile``, ``tests``,
    ``infer``, ``probe`` (the device's JPEG decoder), ``data`` (the JPEG set) or ``loader``; ``data``: what a decode
    section's training run reads."""

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
    estimate_s: float = 0.0
    needs: tuple[str, ...] = ()
    data: str = ""
    memory_format: str = ""  # a launch.py step's --memory-format where the report sets one (else the preset's)
    echo: bool = False  # its output is printed on the console once it ends (the decoder probe's figures)
    note: str = ""  # how the step differs from what it stands for on this device, said in the report


def launch_step(scale: Scale, arch: str, precision: str, section: str, workspace: Path, extra: Sequence[str] = (),
                name: str = "", **fields) -> Step:
    """launch.py's benchmark of ``arch`` at ``precision``, as a user types it, then ``extra`` flags; its raport
    in ``workspace``."""
    launch_precision, flags = scale.launch_precisions[precision]
    argv = ("launch.py", "--model", arch, "--precision", launch_precision, "--mode", LAUNCH_MODE, "--platform",
            scale.platform, *scale.launch_flags, *flags, "--workspace", str(workspace), "--raport-file", "raport.json",
            *extra)
    return Step(section, name or f"{arch} {precision} launch.py", argv, scale.limits["launch"],
                workspace / "raport.json", arch, precision, env=scale.env, kind="launch", **fields)


def throughput_step(scale: Scale, arch: str, precision: str, device: str, work: Path, compiled: bool = False) -> Step:
    """train_throughput.py's run of ``arch`` at ``precision``: ours channels-last (or compiled) against the
    plain loop, at the largest batch up to the scale's that fits."""
    suffix = "_compile" if compiled else ""
    output = work / "train" / f"{arch}_{precision}{suffix}.json"
    argv = ("benchmarks/train_throughput.py", "-a", arch, "--image-size", str(scale.image_size), "-b",
            str(scale.batch_size), "--largest-batch", "--num-classes", "1000", *scale.train_timing, "--device",
            device, "--paths", "compile" if compiled else "channels_last", *PRECISIONS[precision], "-o", str(output))
    skipped = None
    if precision == "AMP" and device != "cuda" and scale.archs.index(arch) >= scale.fp16_archs:
        skipped = "fp16 on the CPU is run for the first architecture only (its grouped convolutions are slow there)"
    kind = "compile" if compiled else "throughput"
    return Step("train", f"{arch} {precision}{' compile' if compiled else ''}", argv, scale.limits[kind], output,
                arch, precision, skipped, scale.env, kind)


def is_gpu_mark(node: ast.AST) -> bool:
    """Whether ``node`` is ``pytest.mark.gpu`` (a decorator, a ``pytestmark`` entry, a parameter's mark)."""
    return (isinstance(node, ast.Attribute) and node.attr == "gpu" and isinstance(node.value, ast.Attribute)
            and node.value.attr == "mark" and isinstance(node.value.value, ast.Name)
            and node.value.value.id == "pytest")


def gpu_test_modules(tests: Path = REPO / "tests") -> list[str]:
    """The test modules under ``tests`` that hold a test marked ``gpu``, found by reading them, relative to the
    repository: ``pytest -m gpu`` collects only these, so a module that imports what the machine lacks and
    holds no GPU test costs nothing."""
    found = []
    for path in sorted(tests.rglob("test_*.py")):
        if any(is_gpu_mark(node) for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))):
            found.append(str(path.relative_to(tests.parent)))
    return found


def timeout_flags(scale: Scale) -> tuple[str, ...]:
    """pytest-timeout's limit per test where the plugin is installed (a hanging test then fails alone, and the
    others still run), else none: the suite runs without it."""
    if not scale.test_timeout_s or importlib.util.find_spec("pytest_timeout") is None:
        return ()
    return ("--timeout", f"{scale.test_timeout_s:g}")


def tests_step(scale: Scale, work: Path, modules: Sequence[str]) -> Step:
    """``pytest -m gpu`` over ``modules`` on the scale's workers, each test's outcome written as it ends
    (``tests/outcomes.py``, one JSON line each: a step that is killed keeps what it reached), each test within
    the scale's limit where pytest-timeout is installed."""
    outcomes = work / "tests" / "outcomes.jsonl"
    argv = ("-m", "pytest", "-m", "gpu", "-v", "-p", "no:cacheprovider", "-p", "outcomes",
            "--continue-on-collection-errors", *(("-n", str(scale.test_workers)) if scale.test_workers > 1 else ()),
            *timeout_flags(scale), *modules)
    skipped = None if modules else "no test module holds a test marked gpu"
    return Step("tests", "pytest -m gpu", argv, scale.limits["tests"], outcomes, skipped=skipped,
                env=(*scale.env, (OUTCOMES_ENV, str(outcomes))), kind="tests")


def probe_step(scale: Scale, device: str, work: Path) -> Step:
    """What the device's JPEG decoder makes of pytorch-gpu's probe JPEGs (their grey levels against the CPU's),
    and whether the backend takes it: the steps that need the backend wait for it."""
    output = work / "decode" / "probe.json"
    return Step("decode", PROBE_STEP, (PROBE_SCRIPT, "--device", device, "-o", str(output)), scale.limits["probe"],
                output, env=scale.env, kind="probe", echo=True)


def decode_steps(scale: Scale, device: str, work: Path) -> list[Step]:
    """The decoder's probe, the JPEG set, the loader alone (pytorch-gpu beside pytorch, epochs alternating) and
    resnet50's AMP training from the JPEGs and from synthetic data with the same command."""
    data_dir = work / DATA_FOLDER / "jpegs"
    summary = work / "decode" / "jpeg_set.json"
    write = (JPEG_SET_SCRIPT, "--images", str(scale.jpeg_images), "--classes", str(scale.jpeg_classes), "-j",
             str(scale.jpeg_workers), "-o", str(summary), str(data_dir))
    data = Step("decode", "JPEG set", write, scale.limits["data"], summary, env=scale.env, kind="data")
    loader_note = "" if device == "cuda" else ("without CUDA, pytorch-gpu is its CPU twin (torchvision's CPU "
                                               "decoder in the training process): its plumbing, not its speed")
    loader = Step("decode", "loader pytorch-gpu beside pytorch",
                  (LOADER_SCRIPT, "--data-backend", "pytorch-gpu", "--beside", "pytorch", *scale.loader_flags,
                   str(data_dir)), scale.limits["loader"], env=scale.env, kind="loader",
                  needs=(PROBE_STEP, data.name), note=loader_note)
    backend = "pytorch-gpu" if device == "cuda" else "pytorch"
    train_note = "" if device == "cuda" else "main.py refuses pytorch-gpu off CUDA: the pytorch backend stands in"

    def training(what: str, flags: Sequence[str] = (), **fields) -> Step:
        return launch_step(scale, DECODE_ARCH, "AMP", "decode", work / "decode" / f"{DECODE_ARCH}_AMP_{what}",
                           (*scale.decode_flags, *flags), f"{DECODE_ARCH} AMP launch.py {what}", data=what, **fields)

    needs = (PROBE_STEP, data.name) if device == "cuda" else (data.name,)  # the pytorch backend needs no probe
    jpeg = training("JPEG", ("--data-backend", backend, str(data_dir)), needs=needs, note=train_note)
    return [data, loader, jpeg, training("synthetic")]


def plan(scale: Scale, device: str, work: Path, sections: Sequence[str] = DEFAULT_SECTIONS,
         compiler: bool = True) -> list[Step]:
    """Every step of ``sections``, in the order of :data:`SECTIONS`, each with its estimate: the GPU tests (over
    the modules that hold one), the AMP training figures of the three models (resnet50's in NCHW too), the
    inference sweep, GPU decoding, and the other training figures (TF32, bf16, train_throughput.py's AMP runs, and last
    ``--compile``, left out without a compiler)."""
    # the decoder's probe first of all (seconds): what the device's decoder makes of the probe JPEGs is the first
    # thing the report says, and whether the decode section's steps can run is known from the start
    steps: list[Step] = [probe_step(scale, device, work)] if "decode" in sections else []
    if "tests" in sections:
        steps.append(tests_step(scale, work, gpu_test_modules()))
    if "amp" in sections:
        steps += [launch_step(scale, arch, "AMP", "amp", work / "launch" / f"{arch}_AMP") for arch in LAUNCH_MODELS]
        steps.append(launch_step(scale, LAYOUT_ARCH, "AMP", "amp", work / "launch" / f"{LAYOUT_ARCH}_AMP_NCHW",
                                 ("--memory-format", "nchw"), f"{LAYOUT_ARCH} AMP launch.py NCHW",
                                 memory_format="nchw"))
    first = scale.archs[0]
    if "infer" in sections:
        output = work / "infer" / f"{first}.json"
        argv = ("benchmarks/infer_throughput.py", "-a", first, "--image-size", str(scale.image_size),
                "--batch-sizes", *map(str, scale.batch_sizes), "--paths", *INFER_PATHS, *scale.infer_timing,
                "--device", device, "-o", str(output))
        steps.append(Step("infer", f"{first} inference", argv, scale.limits["infer"], output, first, env=scale.env,
                          kind="infer"))
    if "decode" in sections:
        steps += decode_steps(scale, device, work)
    if "train" in sections:
        steps += [launch_step(scale, arch, precision, "train", work / "launch" / f"{arch}_{precision}",
                              scale.others_flags)
                  for precision, archs in (("TF32", LAUNCH_MODELS), ("BF16", LAUNCH_BF16)) for arch in archs]
        steps += [throughput_step(scale, arch, "AMP", device, work) for arch in scale.archs]
        if compiler:  # the CPU has no fp16 autocast worth compiling: bf16 there
            steps.append(throughput_step(scale, first, "AMP" if device == "cuda" else "BF16", device, work, True))
    return [replace(step, estimate_s=scale.estimates.get(step.name, 0.0)) for step in steps]


def forecast(steps: Sequence[Step], budget_s: float) -> tuple[float, list[str]]:
    """The seconds ``steps`` are expected to take by their estimates (a step the device cannot run takes
    none), and the names of those that, if every step before takes its estimate, would be left out."""
    total, cut = 0.0, []
    for step in steps:
        if step.skipped:
            continue
        if step.estimate_s > budget_s - total:
            cut.append(step.name)
            continue
        total += step.estimate_s
    return total, cut


def command(step: Step) -> str:
    """The step's command as a user types it in the repository (``python3``: a machine may have no ``python``)."""
    return "python3 " + shlex.join(step.argv)


# ------------------------------------------------------------------------------------------------
# What a step's files say
# ------------------------------------------------------------------------------------------------
OUTCOME_RANK = {"error": 0, "failed": 1, "xpassed": 2, "passed": 3, "xfailed": 4, "skipped": 5}  # worst first


def parse_outcomes(path: Path) -> dict:
    """The outcome of every test that ``tests/outcomes.py`` recorded, as the lines reached (a killed run's last
    line may be cut: it is left out): passed, failed, error (collection errors included, named by their
    module), skipped, xfailed or xpassed, with a skip's reason and a failure's message and the last lines of
    its traceback; a test whose teardown failed after it passed counts as an error.  And the count of each."""
    tests: dict[str, dict] = {}
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            record = json.loads(line)
            name, outcome = record["test"], record["outcome"]
        except (ValueError, KeyError, TypeError):
            continue
        kept = {key: record[key] for key in ("reason", "message", "traceback") if key in record}
        earlier = tests.get(name)
        if earlier is None or OUTCOME_RANK.get(outcome, 0) < OUTCOME_RANK.get(earlier["outcome"], 0):
            tests[name] = {"test": name, "outcome": outcome, **kept}
    listed = list(tests.values())
    return {"counts": dict(Counter(test["outcome"] for test in listed)), "tests": listed}


LOADER_AGAINST = re.compile(
    r"^(?P<base>[\w-]+): (?P<base_rate>[\d.]+) images/s, (?P<base_cpu_ms>[\d.]+) CPU ms/image; (?P<backend>[\w-]+): "
    r"(?P<rate>[\d.]+) images/s, (?P<cpu_ms>[\d.]+) CPU ms/image; speed-up (?P<speedup>[\d.]+)x \((?P<spread>[^)]*)\)",
    re.M)
LOADER_VERDICT = re.compile(r"^verdict against (?P<base>[\w-]+): (?P<verdict>.+)$", re.M)
LOADER_LAST = re.compile(r"^images/s: (?P<rate>[\d.]+)\s*\Z", re.M)
LOADER_CPU_DECODED = re.compile(r"^decoded on the CPU: (?P<count>\d+) JPEGs", re.M)


def loader_figures(output: str) -> dict:
    """What benchmark_loader.py printed: the measured backend's images/s (its last line), the JPEGs it decoded
    on the CPU (pytorch-gpu: those the device's decoder refused) and, against each ``--beside`` backend, both
    speeds, CPU ms per image, the speed-up with its spread, and the verdict; ValueError where it printed no
    figure."""
    last = LOADER_LAST.search(output)
    if last is None:
        raise ValueError(f"its output does not end in 'images/s: N' ({LOADER_SCRIPT}'s last line)")
    verdicts = {m["base"]: m["verdict"] for m in LOADER_VERDICT.finditer(output)}
    beside = {}
    for m in LOADER_AGAINST.finditer(output):
        beside[m["base"]] = {"images_per_s": float(m["base_rate"]), "cpu_ms": float(m["base_cpu_ms"]),
                             "speedup": float(m["speedup"]), "spread": m["spread"],
                             "verdict": verdicts.get(m["base"], "")}
        backend = {"backend": m["backend"], "cpu_ms": float(m["cpu_ms"])}
    decoded = LOADER_CPU_DECODED.search(output)
    return {**(backend if beside else {}), "images_per_s": float(last["rate"]), "beside": beside,
            "cpu_decoded": int(decoded["count"]) if decoded else None}


def launch_figures(raport: Path) -> dict:
    """What a launch.py benchmark's raport says: the summary's throughput (warm-up left out) and wall-clock
    throughput, the batch, the warm-up, the iterations, the data backend, the memory format and the JPEGs
    decoded on the CPU (pytorch-gpu's refusals, None for the other backends); ValueError where it has no
    throughput figure."""
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
            else None, "loss": summary.get("train.loss"), "data_backend": parameters.get("data_backend"),
            "memory_format": parameters.get("memory_format"), "cpu_decoded": summary.get("train.cpu_decoded")}


def step_result(step: Step, log_text: str) -> dict:
    """The figures of a step that exited 0, from its output file or (the loader) its log."""
    if step.kind == "loader":
        return loader_figures(log_text)
    if step.kind == "launch":
        return launch_figures(step.output)
    if step.kind == "tests":
        return parse_outcomes(step.output)
    return json.loads(step.output.read_text(encoding="utf-8"))


# ------------------------------------------------------------------------------------------------
# Running
# ------------------------------------------------------------------------------------------------
class Stopped(Exception):
    """SIGTERM reached the report: the step under way is ended and the report written as it stands."""


def _stop(signum: int, frame: object) -> None:
    raise Stopped(f"stopped by signal {signum}")


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


def record_of(step: Step, status: str, error: str | None = None) -> dict:
    """A step's record before it has run, or of one that does not run."""
    record = {"section": step.section, "name": step.name, "arch": step.arch, "precision": step.precision,
              "kind": step.kind, "data": step.data, "memory_format": step.memory_format, "command": command(step),
              "status": status, "seconds": 0.0, "estimate_s": step.estimate_s}
    if step.note:
        record["note"] = step.note
    return {**record, "error": error} if error else record


def run_step(step: Step, work: Path, left_s: float) -> dict:
    """Run one step within ``min(its limit, left_s)`` seconds; its record: the command, status (ok, failed,
    timed out, skipped, left out), seconds, error, log and result (the figures)."""
    if step.skipped:
        return record_of(step, "skipped", step.skipped)
    if step.estimate_s > left_s:
        return record_of(step, "left out", f"its estimate, {step.estimate_s:.0f} s, is more than the "
                                           f"{left_s:.0f} s left of the budget")
    limit = min(step.limit_s, left_s)
    if limit < MIN_STEP_S:
        return record_of(step, "left out", f"{left_s:.0f} s of the budget were left")
    record = record_of(step, "ok")
    log = work / "logs" / (re.sub(r"[^\w.-]+", "_", step.name) + ".log")
    log.parent.mkdir(parents=True, exist_ok=True)
    record["log"] = str(log.relative_to(work))
    start, started_at = time.monotonic(), time.time()
    code = _run(step, log, limit)
    record["seconds"] = round(time.monotonic() - start, 1)
    output = log.read_text(encoding="utf-8", errors="replace")
    fresh = step.output is not None and step.output.exists() and step.output.stat().st_mtime >= started_at
    if step.kind == "tests":  # the outcomes reached, whatever pytest's exit code, also where it was stopped
        record["result"] = parse_outcomes(step.output) if fresh else None
    if step.kind == "probe" and code == 1 and fresh:  # the decoder refused: its figures say why
        record["result"] = step_result(step, output)
    if code is None:
        reached = f"; {len(record['result']['tests'])} tests had ended" if record.get("result") else ""
        return {**record, "status": "timed out", "error": f"stopped after {limit:.0f} s (its limit "
                f"{step.limit_s:.0f} s, {left_s:.0f} s of the budget left){reached}"}
    if step.kind == "tests":
        return _tests_record(record, code, output)
    if code != 0:
        return {**record, "status": "failed", "error": f"exit code {code}: {_last_line(output)}"}
    if step.output is None and step.kind != "loader":  # a step with no figures
        return record
    what = {"launch": "raport", "loader": "output"}.get(step.kind, "JSON")
    try:
        if step.output is not None and not fresh:  # a file of an earlier run: not this step's figures
            raise OSError(f"{step.output} was not written by this step")
        record["result"] = step_result(step, output)
    except (OSError, ValueError, KeyError) as error:
        return {**record, "status": "failed", "error": f"its {what} could not be read: {error}"}
    return record


def _run(step: Step, log: Path, limit: float) -> int | None:
    """Run the step's command with its output in ``log``; its exit code, None where it was stopped at ``limit``
    seconds (or this process was stopped while it ran)."""
    # the tests step loads tests/outcomes.py as a plugin (-p outcomes): the tests folder is on its path
    paths = [str(REPO), str(REPO / "tests") if step.kind == "tests" else None, os.environ.get("PYTHONPATH")]
    python_path = os.pathsep.join(filter(None, paths))
    env = {**os.environ, "PYTHONPATH": python_path, "PYTHONUNBUFFERED": "1", "MPLBACKEND": "Agg", **dict(step.env)}
    with open(log, "w", encoding="utf-8") as handle:
        # a process group of its own: what it starts (torch.compile's workers, pytest's) is ended with it
        process = subprocess.Popen([sys.executable, *step.argv], cwd=REPO, env=env, stdout=handle,
                                   stderr=subprocess.STDOUT, process_group=0)
        try:
            return process.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            return None
        finally:
            if process.returncode is None:  # timed out, or this process was stopped while waiting
                _kill(process)


def _tests_record(record: dict, code: int, output: str) -> dict:
    """The tests step's record once pytest exited ``code``: failed where any test failed or erred (named) or
    pytest wrote no outcomes."""
    if record["result"] is None:
        return {**record, "status": "failed", "error": f"pytest exited {code} before any test ended: "
                f"{_last_line(output)}"}
    failed, errors = (sorted(t["test"] for t in record["result"]["tests"] if t["outcome"] == outcome)
                      for outcome in ("failed", "error"))
    if failed or errors:
        return {**record, "status": "failed",
                "error": f"{len(failed)} failed and {len(errors)} errors: {', '.join(failed + errors)}"}
    if code != 0:
        return {**record, "status": "failed", "error": f"pytest exited {code}: {_last_line(output)}"}
    return record


def unmet_need(step: Step, done: Sequence[dict]) -> str | None:
    """Why ``step`` cannot run for a step it needs (the first that did not succeed, with that step's own
    error), or None where every one did."""
    for name in step.needs:
        needed = next((record for record in done if record["name"] == name), None)
        if needed is None:
            return f"it needs the step '{name}', which is not in this run"
        if needed["status"] != "ok":
            why = f": {needed['error']}" if needed.get("error") else ""
            return f"it needs the step '{name}', which ended {needed['status']}{why}"
    return None


def run_report(steps: Sequence[Step], work: Path, header: dict, budget_s: float,
               write: Callable[[dict], None], say: Callable[[str], None] = print) -> dict:
    """Run ``steps`` in turn within ``budget_s`` seconds in all, writing the report with ``write`` at the
    start and after each (the steps not yet run marked pending); SIGTERM (or Ctrl-C) ends the step under way
    and records it and the rest as not run."""
    done: list[dict] = []
    start = time.monotonic()

    def snapshot(finished: bool, rest: Sequence[Step] = ()) -> dict:
        pending = [record_of(step, "pending") for step in rest]
        return {**header, "budget_s": budget_s, "seconds": round(time.monotonic() - start, 1),
                "finished": finished, "steps": done + pending}

    write(snapshot(False, steps))
    previous = signal.signal(signal.SIGTERM, _stop)
    try:
        for index, step in enumerate(steps):
            try:
                unmet = unmet_need(step, done)
                if unmet:
                    record = record_of(step, "skipped", unmet)
                else:
                    record = run_step(step, work, budget_s - (time.monotonic() - start))
            except (Stopped, KeyboardInterrupt) as reason:
                done += [record_of(s, "not run", f"the report was {reason or 'interrupted'}") for s in steps[index:]]
                break
            done.append(record)
            write(snapshot(False, steps[index + 1:]))
            say(f"  {step.section:>6} {step.name:<36} {record['status']:<9} {record['seconds']:6.0f} s"
                + (f"  {record['error']}" if record.get("error") else ""))
            if step.echo and record.get("log"):
                for line in (work / record["log"]).read_text(encoding="utf-8", errors="replace").splitlines():
                    say(f"         {line}")
    finally:
        signal.signal(signal.SIGTERM, previous)
    final = snapshot(True)
    write(final)
    return final


# ------------------------------------------------------------------------------------------------
# The three files
# ------------------------------------------------------------------------------------------------
def write_report(report: dict, out: Path, work: Path) -> None:
    """OUT/report.json, OUT/report.md and OUT/logs.tar.gz (the scratch folder ``work`` but its data set),
    each replaced whole: a reader, or a run killed now, never leaves half a file."""
    write_json(report, str(out / "report.json"))
    temporary = out / f".report.md.{os.getpid()}.tmp"
    temporary.write_text(markdown(report), encoding="utf-8")
    os.replace(temporary, out / "report.md")
    archive(work, out / "logs.tar.gz")


def archive(work: Path, target: Path) -> None:
    """Every file under ``work`` but the JPEG set (and hidden files: workspace locks), as ``gpu_report/<path>`` in
    a gzip tar written through a
    temporary file; a file longer than :data:`ARCHIVE_MEMBER_LIMIT` goes in as its last part, after a line
    that says so."""
    temporary = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    with tarfile.open(temporary, "w:gz") as tar:
        for path in sorted(work.rglob("*")):
            relative = path.relative_to(work)
            if relative.parts[0] == DATA_FOLDER or path.name.startswith(".") or not path.is_file():
                continue
            size = path.stat().st_size
            info = tarfile.TarInfo(f"gpu_report/{relative}")
            info.mtime = int(path.stat().st_mtime)
            with open(path, "rb") as handle:
                if size <= ARCHIVE_MEMBER_LIMIT:
                    data = handle.read()
                else:
                    handle.seek(size - ARCHIVE_MEMBER_LIMIT)
                    data = f"[the first {size - ARCHIVE_MEMBER_LIMIT} bytes left out]\n".encode() + handle.read()
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    os.replace(temporary, target)


# ------------------------------------------------------------------------------------------------
# Command line
# ------------------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    parser = UserErrorParser(prog="gpu_report.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, metavar="DIR",
                        help="folder for report.md, report.json and logs.tar.gz, and nothing else (a new one, or "
                        "one without a report)")
    parser.add_argument("--smoke", action="store_true",
                        help="the same steps at tiny sizes (32 px, batches of 1 to 8), on whatever device there is")
    parser.add_argument("--budget", type=positive_float, default=None, metavar="SECONDS",
                        help=f"time for all the steps (default: {FULL.budget_s:.0f}, with --smoke "
                        f"{SMOKE.budget_s:.0f}); a step whose estimate is more than what is left is left out")
    parser.add_argument("--sections", nargs="+", choices=SECTIONS, default=list(DEFAULT_SECTIONS),
                        help=f"which parts to run, in the order of {', '.join(SECTIONS)} (default: "
                        f"{' '.join(DEFAULT_SECTIONS)}; train fits a second call)")
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
    work = Path(tempfile.mkdtemp(prefix="gpu_report."))
    try:
        steps = plan(scale, device, work, args.sections, compiler=not no_compiler)
        expected, cut = forecast(steps, budget)
        header = {"report": "gpu_report", "command": "python3 " + shlex.join(["scripts/gpu_report.py", *argv]),
                  "smoke": args.smoke, "device": device, "sections": list(args.sections),
                  "compile_missing": no_compiler, "work": str(work), "expected_s": expected,
                  "estimated_on": scale.estimated_on,
                  "started": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
                  "machine": {**facts, "description": machine.describe(facts)}}
        print(f"{len(steps)} steps within {budget:.0f} s on {header['machine']['description']}", flush=True)
        print(f"by the estimates ({scale.estimated_on}) they take about {expected:.0f} s"
              + (f"; expected to be left out: {', '.join(cut)}" if cut else ""), flush=True)
        report = run_report(steps, work, header, budget, lambda report: write_report(report, out, work),
                            say=lambda line: print(line, flush=True))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"wrote {', '.join(str(out / name) for name in REPORT_FILES)} in {report['seconds']:.0f} s", flush=True)
    return 0 if all(step["status"] in ("ok", "skipped") for step in report["steps"]) else 1


if __name__ == "__main__":
    sys.exit(run(main))
