"""What the fault tests share: running the training with faults injected, reading what it left, counting.

A run that is killed, signalled, hung or that must hold a lock against another run is a process of its
own running :mod:`tests.faults.runner` (``main.py`` plus a tiny ResNet and the faults the environment asks
for), so a SIGKILL kills a real training process: :func:`train` and :func:`start` fork it from the test's
process (torch and the package already imported: a fraction of a second instead of a fresh interpreter's
seconds), ``multiproc.py`` starts it as a script (:func:`command`).  Every other run (the runs that resume
after a fault, refused inputs, failing storage) is ``main.py`` run in the test's process
(:func:`train_here`).  All of them run the same tiny ResNet on one thread, so they compute the same weights
bit for bit.  :data:`TALLY` counts what the suite did and what was lost; ``tests/conftest.py`` prints it at
the end of the session.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import torch

from helpers import (REPO, Forked, Result, explain, forkable, patient, run_script,  # noqa: F401
                     tiny_registered, wait_or_kill)
from image_classification.records import checkpoint as ckpt
from image_classification.records.raport import read_raport

from . import runner
from .tally import TALLY  # noqa: F401  (the tests import it from here)

RUNNER = Path(__file__).with_name("runner.py")
ITERATIONS_PER_EPOCH = 6  # 24 training images, -b 4
COMMON = ["-a", "tiny", "--num-classes", "3", "--device", "cpu", "--data-backend", "pytorch",
          "--image-size", "32", "-b", "4", "-p", "1", "--lr", "0.05", "--seed", "3"]

INTERVAL = 2
# The run most tests interrupt: 2 epochs (12 iterations), a checkpoint every 2 iterations and per epoch, and
# every random stream a resume must restore (MixUp's draws, the loader's shuffling), an EMA and a cosine
# schedule.
RUN = ["--epochs", "2", "--checkpoint-interval", str(INTERVAL), "--gather-checkpoints", "--mixup", "0.2",
       "--use-ema", "0.9", "--lr-schedule", "cosine", "--resume", "auto"]


def command(data: Path, workspace: Path, *args) -> list[str]:
    return [sys.executable, "-u", str(RUNNER), *COMMON, "--workspace", str(workspace), *map(str, args),
            str(data)]


def environment(**faults) -> dict:
    """The process environment with the faults named (``FAULTS_<NAME>``) and one thread per process."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("FAULTS_")}
    env["OMP_NUM_THREADS"] = "1"
    env.update({f"FAULTS_{name.upper()}": str(value) for name, value in faults.items()})
    return env


def _runner(argv: list[str]):
    return lambda: runner.main(argv)


def start(data: Path, workspace: Path, *args, log: Path, **faults):
    """Start the training in a process of its own, stdout and stderr together in ``log``."""
    argv = command(data, workspace, *args)
    if forkable():
        return Forked(_runner(argv[3:]), argv, log, env=environment(**faults), cwd=REPO)
    with log.open("w") as out:
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, text=True, cwd=REPO,
                                env=environment(**faults))


def train(data: Path, workspace: Path, *args, timeout: float = 600, **faults):
    """Run the training to its end in a process of its own (``faults``: see :mod:`tests.faults.runner`);
    its exit code and output, as ``subprocess.run`` gives them.  A run still going after ``timeout`` seconds
    is killed (exit -9)."""
    argv = command(data, workspace, *args)
    if not forkable():
        try:
            return subprocess.run(argv, capture_output=True, text=True, cwd=REPO, env=environment(**faults),
                                  timeout=timeout)
        except subprocess.TimeoutExpired as expired:
            return Result(argv, -9, str(expired.stdout or ""), str(expired.stderr or ""))
    with tempfile.TemporaryDirectory() as folder:
        out, err = Path(folder, "stdout"), Path(folder, "stderr")
        run = Forked(_runner(argv[3:]), argv, out, err, env=environment(**faults), cwd=REPO)
        try:
            wait_or_kill(run, timeout)
        except subprocess.TimeoutExpired:
            pass
        return Result(argv, run.returncode, out.read_text(), err.read_text())


def wait_unlocked(workspace: Path, timeout: float = 60) -> None:
    """Wait until no process holds the workspace's lock.  A killed run's DataLoader workers were forked
    with its lock and hold it until they notice their parent is gone (a few seconds); a fresh interpreter
    took longer than that to start, a run in this process does not."""
    import fcntl

    lock = workspace / ".workspace.lock"
    if not lock.exists():
        return
    deadline = time.monotonic() + patient(timeout)
    with lock.open("a") as handle:
        while True:
            try:
                fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                assert time.monotonic() < deadline, f"{lock} still locked after {timeout} s"
                time.sleep(0.1)
                continue
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
            return


def train_here(data: Path, workspace: Path, *args, capsys=None):
    """Run the training to its end in this process, as :func:`train` would without faults: ``main.py``
    with the tiny ResNet, on one thread.  ``capsys``: pytest's, when the caller has it."""
    with tiny_registered():
        return run_script([REPO / "main.py", *COMMON, "--workspace", workspace, *args, data], capsys,
                          cwd=REPO, threads=1)


def never_trained(result) -> bool:
    return "RUNNING EPOCHS" not in result.stdout and not re.search(r"^Epoch \d+/\d+ \[", result.stdout, re.M)


def load(path: Path) -> dict:
    """A checkpoint, its hash verified (``load_checkpoint`` refuses a damaged one); counts a failure."""
    try:
        return ckpt.load_checkpoint(path)
    except Exception:
        TALLY["damaged"] += 1
        raise


def assert_same_state(a: dict, b: dict) -> None:
    """The weights (and EMA weights) of two checkpoints are bitwise equal."""
    for key in ("state_dict", "state_dict_ema"):
        assert (key in a) == (key in b), key
        if key not in a:
            continue
        assert a[key].keys() == b[key].keys()
        for name in a[key]:
            assert torch.equal(a[key][name], b[key][name]), f"{key}.{name}"
    assert a["iterations"] == b["iterations"] and a["optimizer_steps"] == b["optimizer_steps"]


def train_records(raport: Path) -> list[tuple[int, int]]:
    """(epoch, iteration) of every train record in a raport, in file order."""
    return [tuple(record["step"]) for record in read_raport(raport)
            if record.get("type") == "LOG" and isinstance(record.get("step"), list)
            and len(record["step"]) == 2 and "train.loss" in record.get("data", {})]


def count_lost_records(raport: Path, epochs: int) -> int:
    """Train records missing from or repeated in a raport that should hold every iteration once."""
    expected = [(epoch, it) for epoch in range(epochs) for it in range(1, ITERATIONS_PER_EPOCH + 1)]
    found = Counter(train_records(raport))
    lost = sum(abs(found[step] - 1) for step in expected) + sum(n for step, n in found.items()
                                                                if step not in expected)
    TALLY["records_lost"] += lost
    return lost
