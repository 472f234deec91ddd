"""The workspace: names checked before anything is written, and a lock that dies with its run."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from conftest import REPO
from helpers import patient
from image_classification.errors import UserError
from image_classification.records import checkpoint as ckpt
from image_classification.records import workspace as workspace_module
from image_classification.records.workspace import LOCK_NAME, Workspace, holder_is_dead

CHECKPOINT, RAPORT = "checkpoint.pth.tar", "experiment_raport.json"


def refused(workspace: Workspace, saving: bool = True) -> str:
    """The one line that ``prepare`` refuses ``workspace`` with, after checking it wrote nothing."""
    with pytest.raises(UserError) as error:
        workspace.prepare(saving)
    assert error.value.exit_code == 2 and "\n" not in str(error.value)
    assert not workspace.path.exists()
    return str(error.value)


# -- names ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("raport,what", [
    ("model_best.pth.tar", "the best model"),
    ("sub/../checkpoint.pth.tar", "--checkpoint-filename"),
    ("./checkpoint.pth.tar", "--checkpoint-filename"),
    ("checkpoint_0000.pth.tar", "a per-epoch checkpoint"),
    (LOCK_NAME, "the workspace's lock"),
])
@pytest.mark.parametrize("saving", [True, False], ids=["training", "evaluating"])
def test_a_raport_that_is_a_checkpoint_or_the_lock_is_refused(tmp_path, raport, what, saving):
    line = refused(Workspace(tmp_path / "ws", CHECKPOINT, raport), saving)
    assert line.startswith(f"--raport-file {raport} is the same file as {what}"), line


def test_a_raport_linked_to_the_checkpoint_is_refused(tmp_path):
    (tmp_path / "ws").mkdir()
    (tmp_path / "ws" / "raport.json").symlink_to(CHECKPOINT)
    with pytest.raises(UserError, match="--raport-file raport.json is the same file as --checkpoint-filename"):
        Workspace(tmp_path / "ws", CHECKPOINT, "raport.json").prepare(True)


@pytest.mark.parametrize("flag,name", [
    ("--checkpoint-filename", "../x"), ("--raport-file", "../../x"), ("--raport-file", "sub/../../x"),
])
def test_a_name_that_leads_out_of_the_workspace_is_refused(tmp_path, flag, name):
    names = {"--checkpoint-filename": CHECKPOINT, "--raport-file": RAPORT, flag: name}
    line = refused(Workspace(tmp_path / "a" / "ws", names["--checkpoint-filename"], names["--raport-file"]))
    assert line == f"{flag} {name} leads out of --workspace; give a name inside it"
    assert list(tmp_path.iterdir()) == []


def test_a_long_legal_name_is_accepted_and_its_checkpoint_saved(tmp_path):
    """250 characters fit the file system; the temporary beside the checkpoint is cut to fit too."""
    name = "c" * 242 + ".pth.tar"
    workspace = Workspace(tmp_path / "ws", name, "r" * 245 + ".json")
    workspace.prepare(True)
    ckpt.save_checkpoint({"epoch": 1, "state_dict": {"w": torch.ones(2)}}, workspace.latest)
    assert ckpt.load_checkpoint(workspace.latest)["epoch"] == 1
    left = workspace.path / (ckpt.temporary_name(workspace.latest) + "k2x9_abc.tmp")  # a killed save's
    left.write_bytes(b"partial")
    assert workspace.remove_stale_temporaries() == [left] and not left.exists()


@pytest.mark.parametrize("flag", ["--checkpoint-filename", "--raport-file"])
def test_a_name_too_long_for_the_file_system_is_named_as_such(tmp_path, flag):
    names = {"--checkpoint-filename": CHECKPOINT, "--raport-file": RAPORT, flag: "n" * 300}
    line = refused(Workspace(tmp_path / "ws", names["--checkpoint-filename"], names["--raport-file"]))
    assert line.startswith(f"{flag} is too long for the file system: nnnn") and "300 bytes" in line, line


# -- the lock ---------------------------------------------------------------------------------------------
@pytest.fixture
def workspace(tmp_path) -> Workspace:
    workspace = Workspace(tmp_path / "ws", CHECKPOINT, RAPORT)
    workspace.prepare(True)
    yield workspace
    workspace.unlock()


def test_a_live_run_keeps_its_workspace(workspace):
    workspace.lock()
    with pytest.raises(UserError, match=rf"in use by another run \(pid {os.getpid()} on "):
        Workspace(workspace.path, CHECKPOINT, RAPORT).lock()


def test_a_forked_child_does_not_keep_the_lock(workspace):
    """A DataLoader worker is fork()ed with the lock's descriptor: it must not hold the lock once the
    run is gone (here: has let go), for the seconds a worker outlives a killed run."""
    workspace.lock()
    ready, started = os.pipe()
    child = os.fork()
    if child == 0:  # the worker
        os.write(started, b"1")
        time.sleep(60)
        os._exit(0)
    try:
        assert os.read(ready, 1) == b"1"  # past fork(), in the worker's own code
        workspace.unlock()
        with Workspace(workspace.path, CHECKPOINT, RAPORT):  # the next run, while the worker lives
            pass
    finally:
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)
        os.close(ready)
        os.close(started)


def test_a_lock_kept_by_a_child_of_a_killed_run_is_taken_over(workspace):
    """A real run locks the workspace, starts a child that inherits the locked descriptor (not through
    fork, so it keeps it), and is SIGKILLed: the child lives on, the next run starts all the same."""
    run = textwrap.dedent(f"""
        import os, signal, subprocess, sys
        sys.path.insert(0, {str(REPO)!r})
        from image_classification.records.workspace import Workspace, _HELD
        Workspace({str(workspace.path)!r}, "checkpoint.pth.tar", "raport.json").lock()
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                                 pass_fds=[_HELD[0].fileno()], stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL)
        print(child.pid, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    killed = subprocess.run([sys.executable, "-c", run], capture_output=True, text=True, timeout=patient(120))
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    child = int(killed.stdout)
    try:
        os.kill(child, 0)  # still alive, still holding the old lock file
        workspace.lock()
        assert (workspace.path / LOCK_NAME).read_text().startswith(f"pid {os.getpid()} on ")
        with pytest.raises(UserError, match=f"pid {os.getpid()} "):
            Workspace(workspace.path, CHECKPOINT, RAPORT).lock()  # and the new lock holds
    finally:
        os.kill(child, signal.SIGKILL)


def test_a_holder_is_dead_only_when_proven(workspace):
    workspace.lock()
    record = workspace_module._holder_record()
    assert record["pid"] == os.getpid() and not holder_is_dead(record)
    assert holder_is_dead({**record, "start": record["start"] + 1})  # the pid was reused by another process
    assert not holder_is_dead({**record, "start": record["start"] + 1, "host": socket.gethostname() + "x"})
    assert not holder_is_dead({**record, "start": record["start"] + 1, "pidns": "pid:[1]"})
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout
    assert holder_is_dead({**record, "pid": int(dead)})
    assert Path(workspace.path / LOCK_NAME).read_text().count("\n") == 2


def test_a_writer_stamp_is_dead_only_when_proven():
    """The name of a temporary file tells a dead writer's leftovers from a live writer's file."""
    stamp = workspace_module.writer_stamp()
    pid, start, machine = stamp.split("-")
    assert int(pid) == os.getpid() and not workspace_module.stamp_is_dead(stamp)
    assert workspace_module.stamp_is_dead(f"{pid}-{int(start) + 1}-{machine}")  # the pid reused since
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()
    assert workspace_module.stamp_is_dead(f"{dead}-{start}-{machine}")
    other = "0" * 12 if machine != "0" * 12 else "1" * 12
    assert not workspace_module.stamp_is_dead(f"{dead}-{start}-{other}")  # another machine: cannot tell
    for garbage in ("", "12", f"{dead}--{machine}", f"-1-{start}-{machine}", f"{dead}-{start}-{machine}-x"):
        assert not workspace_module.stamp_is_dead(garbage)


# -- checked before anything is written ------------------------------------------------------------------
def test_check_refuses_a_workspace_in_use_without_writing(workspace):
    """A run checks its workspace (and every other part of its set-up) before it creates or locks it: the
    check names the run that holds the lock as lock() would, and writes nothing."""
    workspace.lock()
    before = sorted(workspace.path.iterdir())
    with pytest.raises(UserError, match=rf"in use by another run \(pid {os.getpid()} on "):
        Workspace(workspace.path, CHECKPOINT, RAPORT).check(True)
    assert sorted(workspace.path.iterdir()) == before
    workspace.unlock()
    Workspace(workspace.path, CHECKPOINT, RAPORT).check(True)  # free again


def test_check_refuses_what_prepare_would_and_creates_nothing(tmp_path):
    (tmp_path / "file").write_text("x")
    cases = {
        "under a file": (Workspace(tmp_path / "file" / "ws", CHECKPOINT, RAPORT), "is a file"),
        "a file": (Workspace(tmp_path / "file", CHECKPOINT, RAPORT), "is a file, not a folder"),
        "raport in a file": (Workspace(tmp_path / "ws", CHECKPOINT, "file/raport.json"), "is a file, so"),
    }
    (tmp_path / "ws").mkdir()
    (tmp_path / "ws" / "file").write_text("x")
    for name, (workspace, words) in cases.items():
        with pytest.raises(UserError, match=words):
            workspace.check(True)
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["file", "file", "ws"]


def test_a_workspace_not_made_yet_has_nothing_to_resume(tmp_path):
    workspace = Workspace(tmp_path / "new", CHECKPOINT, RAPORT)
    workspace.check(True)
    assert workspace.resume_candidates() == [] and not workspace.path.exists()


def test_each_evaluation_raport_is_a_file_of_its_own(tmp_path):
    workspace = Workspace(tmp_path / "ws", CHECKPOINT, "sub/raport.json")
    workspace.prepare(False)
    first = workspace.claim_evaluation_raport()
    assert first == tmp_path / "ws" / "sub" / "raport.json" and first.read_bytes() == b""
    first.write_text("an earlier evaluation's records\n")
    claimed = [Workspace(tmp_path / "ws", CHECKPOINT, "sub/raport.json").claim_evaluation_raport() for _ in range(2)]
    assert len({first, *claimed}) == 3 and all(p.parent == first.parent for p in claimed)
    assert all(p.name.startswith("raport.evaluate-") and p.suffix == ".json" for p in claimed)
    assert first.read_text() == "an earlier evaluation's records\n"
