"""``main.py`` with a tiny ResNet registered and faults injected on request, for the fault tests.

Run as a script exactly like ``main.py`` (``multiproc.py`` accepts it as its training script), or
called as :func:`main` in a process forked for one run (``harness.train``).  The architecture ``tiny``
(``helpers.tiny_arch_row``: one BasicBlock per stage, 16-32 channels) keeps a checkpoint at a few hundred
kilobytes, so a test can save and kill many times in seconds.  The environment picks the faults:

* ``FAULTS_KILL_AT=K``: the process sends itself SIGKILL right after train iteration K of the run
  (counted over the whole run, as ``Progress.iterations``);
* ``FAULTS_SIGNAL_AT=K:NAME``: it sends itself the signal NAME (SIGTERM, SIGUSR1) after iteration K; with
  ``FAULTS_SIGNAL_GROUP=1`` it leads its own process group and signals the whole group, its loader
  workers included, as SLURM does;
* ``FAULTS_HANG_AT=K``: after iteration K the process hangs (alive, never answering its peers) until a
  SIGTERM or SIGKILL ends it;
* ``FAULTS_KILL_IN_SAVE=N``: the N-th ``torch.save`` of the process writes half of its bytes, syncs
  them and then the process sends itself SIGKILL (a kill in the middle of writing a checkpoint);
* ``FAULTS_FULL_IN_SAVE=N``: the N-th ``torch.save`` writes half of its bytes and then fails as a full
  disk does (``OSError`` ENOSPC);
* ``FAULTS_INTERRUPT_IN_SAVE=N:POINT``: the N-th checkpoint the process saves gets a double Ctrl-C (two
  SIGINTs at once) at POINT: ``before`` (as the save begins, nothing written yet), ``writing`` (from inside
  torch.save's zip writer, at its third write into the file), ``closing`` (as the zip writer closes the
  file: the interrupt that aborted a run with exit 134) or ``renamed`` (just after the rename);
* ``FAULTS_RANK=R``: the faults above apply to global rank R only (all ranks when unset);
* ``FAULTS_ONCE=PATH``: they apply while PATH does not exist, and the first that strikes creates it (a
  run restarted by torchrun, which resumes before the iteration of the fault, goes past it);
* ``FAULTS_RECORD=PATH``: every MixUp draw is appended to PATH as ``rank iteration lambda``.
"""

from __future__ import annotations

import errno
import io
import os
import runpy
import signal
import sys
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(TESTS.parent), str(TESTS)]  # the repository (image_classification) and tests/ (helpers)

import torch  # noqa: E402

from helpers import REPO, tiny_arch_row  # noqa: E402
from image_classification.models.resnet import ARCHS  # noqa: E402
from image_classification.train import batch_augment, engine  # noqa: E402


def _rank() -> int:
    return int(os.environ.get("RANK", "0"))


def _applies() -> bool:
    wanted, once = os.environ.get("FAULTS_RANK"), os.environ.get("FAULTS_ONCE")
    return (wanted is None or int(wanted) == _rank()) and not (once and os.path.exists(once))


def _struck() -> None:
    """Remember that a fault struck, for ``FAULTS_ONCE``."""
    if os.environ.get("FAULTS_ONCE"):
        Path(os.environ["FAULTS_ONCE"]).touch()


def _after_iteration(iterations: int) -> None:
    if not _applies():
        return
    if os.environ.get("FAULTS_KILL_AT") and iterations == int(os.environ["FAULTS_KILL_AT"]):
        _struck()
        os.kill(os.getpid(), signal.SIGKILL)
    if os.environ.get("FAULTS_HANG_AT") and iterations == int(os.environ["FAULTS_HANG_AT"]):
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the launcher's SIGTERM ends the hang at once
        while True:
            time.sleep(60)
    if os.environ.get("FAULTS_SIGNAL_AT"):
        at, name = os.environ["FAULTS_SIGNAL_AT"].split(":")
        if iterations == int(at):
            if os.environ.get("FAULTS_SIGNAL_GROUP"):
                os.killpg(os.getpgid(0), getattr(signal, name))
            else:
                os.kill(os.getpid(), getattr(signal, name))


def _install_iteration_hook() -> None:
    original = engine.Engine.train_step

    def train_step(self, *args, **kwargs):
        original(self, *args, **kwargs)
        _after_iteration(self.progress.iterations)

    engine.Engine.train_step = train_step


def faulty_save(original, when: int, fault):
    """A ``torch.save`` whose ``when``-th call into a file writes half of its bytes, then ``fault()``
    happens (used here, and by the tests that run the training in their own process)."""
    calls = {"n": 0}

    def save(obj, f, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] != when or not hasattr(f, "write") or not _applies():
            return original(obj, f, *args, **kwargs)
        buffer = io.BytesIO()
        original(obj, buffer, *args, **kwargs)
        data = buffer.getvalue()
        f.write(data[: len(data) // 2])
        f.flush()
        os.fsync(f.fileno())
        fault()

    return save


def _kill() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def disk_full() -> None:
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


INTERRUPT_POINTS = ("before", "writing", "closing", "renamed")


def _install_interrupt_in_save(spec: str) -> None:
    """See ``FAULTS_INTERRUPT_IN_SAVE``: each point is a hook on what ``records.checkpoint`` calls as it saves."""
    import torch.serialization as serialization

    from image_classification.records import checkpoint as ckpt

    when, point = spec.split(":")
    assert point in INTERRUPT_POINTS, point
    state = {"saves": 0, "armed": False}

    def interrupt() -> None:
        if state["armed"]:
            state["armed"] = False
            _struck()
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGINT)

    real_save_checkpoint = ckpt.save_checkpoint

    def save_checkpoint(payload, path):
        state["saves"] += 1
        state["armed"] = state["saves"] == int(when) and _applies()
        if point == "before":
            interrupt()
        try:
            return real_save_checkpoint(payload, path)
        finally:
            state["armed"] = False

    ckpt.save_checkpoint = save_checkpoint
    if point == "writing":
        real_save = torch.save

        class Interrupting:
            def __init__(self, handle):
                self.handle, self.writes = handle, 0

            def write(self, data):
                self.writes += 1
                if self.writes == 3:
                    interrupt()
                return self.handle.write(data)

            def __getattr__(self, name):
                return getattr(self.handle, name)

        torch.save = lambda obj, f, *args, **kwargs: real_save(obj, Interrupting(f), *args, **kwargs)
    if point == "closing":
        writer = serialization._open_zipfile_writer_buffer  # what torch.save writes a file object through
        real_exit = writer.__exit__

        def closing(self, *args):
            interrupt()
            return real_exit(self, *args)

        writer.__exit__ = closing
    if point == "renamed":
        real_fsync_folder = ckpt._fsync_folder  # write_atomic's next step after the rename

        def renamed(folder):
            interrupt()
            return real_fsync_folder(folder)

        ckpt._fsync_folder = renamed


def _install_mixup_record(path: str) -> None:
    """Record each MixUp draw where the training step makes it (``batch_augment`` calls ``mixup``)."""
    original = batch_augment.mixup
    state = {"n": 0}

    def mixup(images, targets, num_classes, lam, permutation):
        state["n"] += 1
        with open(path, "a", encoding="utf-8") as record:
            record.write(f"{_rank()} {state['n']} {lam!r}\n")
        return original(images, targets, num_classes, lam, permutation)

    batch_augment.mixup = mixup


def main(argv: list[str]) -> None:
    """Install what the environment asks for, then run ``main.py ARGV`` as ``python main.py`` would (it
    ends with ``SystemExit``).  For a process of its own: the faults stay installed."""
    if os.environ.get("FAULTS_SIGNAL_GROUP"):
        os.setpgrp()  # a group of its own: the signal must not reach the test runner
    ARCHS["tiny"] = tiny_arch_row()
    _install_iteration_hook()
    if os.environ.get("FAULTS_KILL_IN_SAVE"):
        torch.save = faulty_save(torch.save, int(os.environ["FAULTS_KILL_IN_SAVE"]), _kill)
    if os.environ.get("FAULTS_FULL_IN_SAVE"):
        torch.save = faulty_save(torch.save, int(os.environ["FAULTS_FULL_IN_SAVE"]), disk_full)
    if os.environ.get("FAULTS_INTERRUPT_IN_SAVE"):
        _install_interrupt_in_save(os.environ["FAULTS_INTERRUPT_IN_SAVE"])
    if os.environ.get("FAULTS_RECORD"):
        _install_mixup_record(os.environ["FAULTS_RECORD"])
    sys.argv = [str(REPO / "main.py"), *argv]
    runpy.run_path(sys.argv[0], run_name="__main__")  # main.py itself, with the faults installed


if __name__ == "__main__":
    main(sys.argv[1:])
