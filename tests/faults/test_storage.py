"""Storage faults: torn checkpoints, a full disk, a read-only or unusable workspace, bad file names.

Each is one line on stderr, before any training step where it can be known then, and never a lost or
overwritten file: exit 2 for what the user can fix, 4 for a save that failed.

The runs are ``main.py`` in the test's process (``train_here``), but for the run that holds a workspace
against a second one, which must be another process.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import torch

from helpers import one_error_line
from image_classification.errors import StorageError

from . import runner
from .harness import TALLY, explain, load, never_trained, start, train, train_here

INTERVAL_RUN = ["--epochs", "1", "-j", "0", "--checkpoint-interval", "2"]


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 3])


def flip(path: Path) -> None:
    """Invert one byte in the middle of ``path`` (a tensor's bytes: the file still unpickles)."""
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("damage", [truncate, flip], ids=["truncated", "bit-flipped"])
def test_a_torn_checkpoint_is_refused_with_one_line(data, straight, tmp_path, damage, capsys):
    torn = tmp_path / "torn.pth.tar"
    shutil.copy(straight / "checkpoint.pth.tar", torn)
    damage(torn)
    result = train_here(data, tmp_path / "ws", "--epochs", "3", "-j", "0", "--resume", torn, capsys=capsys)
    line = one_error_line(result)
    assert str(torn) in line and never_trained(result)
    TALLY["bad_inputs"] += 1


def test_resume_auto_falls_back_from_damaged_files_to_the_newest_valid_one(data, straight, tmp_path, capsys):
    """The straight run's workspace: checkpoint.pth.tar and checkpoint_0001 (epoch 2), checkpoint_0000
    (epoch 1) and the best; every epoch-2 file is damaged, so the run goes back to epoch 1."""
    workspace = tmp_path / "ws"
    shutil.copytree(straight, workspace)
    damaged = [workspace / "checkpoint.pth.tar", workspace / "checkpoint_0001.pth.tar"]
    if load(workspace / "model_best.pth.tar")["epoch"] == 2:
        damaged.append(workspace / "model_best.pth.tar")
    for index, path in enumerate(damaged):
        (flip if index % 2 else truncate)(path)
    result = train_here(data, workspace, "--epochs", "2", "-j", "0", "--resume", "auto", capsys=capsys)
    assert result.returncode == 0, explain(result)
    for path in damaged:
        assert f"cannot resume from {path}" in result.stdout
    assert "--resume auto: loading checkpoint" in result.stdout
    assert "RUNNING EPOCHS FROM 2 TO 2" in result.stdout  # the epoch-1 file (checkpoint_0000 or the best)
    assert load(workspace / "checkpoint.pth.tar")["epoch"] == 2
    TALLY["bad_inputs"] += len(damaged)


def test_resume_auto_takes_the_checkpoint_furthest_along_whatever_the_files_times(data, straight, tmp_path,
                                                                                  capsys):
    """A workspace copied file by file (cp, a download) gets the times of the copy: here the epoch-1 file is
    the newest.  The resume goes by the progress each checkpoint records (epoch 2), so nothing is trained again
    and nothing is overwritten."""
    workspace = tmp_path / "ws"
    shutil.copytree(straight, workspace)
    copied = ["checkpoint.pth.tar", "checkpoint_0001.pth.tar", "model_best.pth.tar", "checkpoint_0000.pth.tar"]
    for when, name in enumerate(copied):
        os.utime(workspace / name, (1_000_000 + when, 1_000_000 + when))
    before = {name: (workspace / name).read_bytes() for name in copied}
    result = train_here(data, workspace, "--epochs", "2", "-j", "0", "--resume", "auto", capsys=capsys)
    assert result.returncode == 0, explain(result)
    assert f"{workspace / 'checkpoint.pth.tar'} already finished all 2 epochs: nothing to do" in result.stdout
    assert {name: (workspace / name).read_bytes() for name in copied} == before
    result = train_here(data, workspace, "--epochs", "3", "-j", "0", "--resume", "auto", "--prof", "1",
                        capsys=capsys)
    assert result.returncode == 0 and "RUNNING EPOCHS FROM 3 TO 3" in result.stdout, explain(result)


def test_resume_auto_in_an_empty_workspace_starts_afresh(data, tmp_path, capsys):
    result = train_here(data, tmp_path / "ws", "--epochs", "1", "--prof", "1", "-j", "0", "--resume", "auto",
                        capsys=capsys)
    assert result.returncode == 0, explain(result)
    assert "no checkpoint in" in result.stdout and "starting from scratch" in result.stdout
    assert "RUNNING EPOCHS FROM 1 TO 1" in result.stdout


# -- a full disk ------------------------------------------------------------------------------------------
def _assert_failed_save_left_the_previous(result, workspace: Path) -> None:
    line = one_error_line(result, code=StorageError.exit_code)
    assert "could not write" in line and "No space left on device" in line and "intact" in line
    assert load(workspace / "checkpoint.pth.tar")["iterations"] == 2  # the interval checkpoint before
    assert not list(workspace.glob(".*.tmp"))
    TALLY["storage_faults"] += 1


@pytest.fixture
def tmpfs(tmp_path):
    """A 1 MiB tmpfs: room for one tiny checkpoint and its raport, not for a second one beside it."""
    mount = tmp_path / "tmpfs"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip() or done.returncode}")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_full_disk_fails_the_save_with_one_line_and_keeps_the_previous_checkpoint(data, tmpfs, capsys):
    result = train_here(data, tmpfs, *INTERVAL_RUN, capsys=capsys)
    _assert_failed_save_left_the_previous(result, tmpfs)


def test_a_disk_that_fills_while_logging_ends_the_run_with_one_line(data, tmpfs, capsys):
    (tmpfs / "filler").write_bytes(bytes(1024 * 1024 - 8192))  # room for the lock, not for the raport
    result = train_here(data, tmpfs, *INTERVAL_RUN, capsys=capsys)
    line = one_error_line(result, code=StorageError.exit_code)
    assert "raport" in line and "No space left on device" in line
    TALLY["storage_faults"] += 1


def test_a_disk_that_fills_under_tensorboard_ends_the_run_with_one_line(data, tmpfs, tmp_path, capsys):
    """TensorBoard writes from a thread of its own: its failure was two tracebacks and exit 1."""
    (tmpfs / "filler").write_bytes(bytes(1024 * 1024 - 8192))
    result = train_here(data, tmp_path / "ws", *INTERVAL_RUN, "--tensorboard", tmpfs / "tb", capsys=capsys)
    line = one_error_line(result, code=StorageError.exit_code)
    assert f"--tensorboard {tmpfs / 'tb'}" in line and "No space left on device" in line, line
    TALLY["storage_faults"] += 1


def test_a_writer_failing_midway_keeps_the_previous_checkpoint(data, tmp_path, capsys, monkeypatch):
    """The same fault where no tmpfs can be mounted: the second save writes half and gets ENOSPC."""
    monkeypatch.setattr(torch, "save", runner.faulty_save(torch.save, 2, runner.disk_full))
    result = train_here(data, tmp_path, *INTERVAL_RUN, capsys=capsys)
    _assert_failed_save_left_the_previous(result, tmp_path)


# -- an unusable workspace or file name: exit 2 before any training ----------------------------------------
def test_a_read_only_workspace_is_refused_before_training(data, tmpfs, capsys):
    done = subprocess.run(["mount", "-o", "remount,ro", str(tmpfs)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot remount the tmpfs read-only: {done.stderr.decode().strip()}")
    result = train_here(data, tmpfs, "--epochs", "1", "-j", "0", capsys=capsys)
    assert "read-only" in one_error_line(result) and never_trained(result)
    TALLY["bad_inputs"] += 1


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root writes into a 0555 folder")
def test_a_folder_without_write_permission_is_refused_before_training(data, tmp_path, capsys):
    workspace = tmp_path / "ws"
    workspace.mkdir(mode=0o555)
    try:
        result = train_here(data, workspace, "--epochs", "1", "-j", "0", capsys=capsys)
    finally:
        workspace.chmod(0o755)
    assert "cannot be written" in one_error_line(result) and never_trained(result)
    TALLY["bad_inputs"] += 1


def test_a_workspace_that_is_a_file_is_refused_before_training(data, tmp_path, capsys):
    (tmp_path / "ws").write_text("a file")
    result = train_here(data, tmp_path / "ws", "--epochs", "1", "-j", "0", capsys=capsys)
    assert "is a file" in one_error_line(result) and never_trained(result)
    assert (tmp_path / "ws").read_text() == "a file"
    TALLY["bad_inputs"] += 1


@pytest.mark.parametrize("flags", [
    ["--checkpoint-filename", ""], ["--raport-file", ""], ["--raport-file", " "],
    ["--checkpoint-filename", "model_best.pth.tar"], ["--checkpoint-filename", "checkpoint_0003.pth.tar"],
    ["--checkpoint-filename", "run.json", "--raport-file", "run.json"],
    ["--checkpoint-filename", "/tmp/elsewhere.pth.tar"],
], ids=["empty checkpoint", "empty raport", "blank raport", "best", "per-epoch", "same file", "absolute"])
def test_unusable_file_names_are_refused_before_training(data, tmp_path, capsys, flags):
    workspace = tmp_path / "ws"
    result = train_here(data, workspace, "--epochs", "1", "-j", "0", *flags, capsys=capsys)
    err = one_error_line(result)
    assert flags[-2] in err or "same file" in err, err  # refused for its name, not for anything else
    assert "RUNNING EPOCHS" not in result.stdout
    assert not workspace.exists() or not [p for p in workspace.iterdir() if p.name != ".workspace.lock"]
    TALLY["bad_inputs"] += 1


# -- two runs, one workspace --------------------------------------------------------------------------------
def test_a_second_run_on_a_workspace_in_use_stops_and_a_dead_run_s_lock_does_not_block(
        data, tmp_path, capsys):
    """The first run is a process of its own (the lock is held by another process); the others run here."""
    workspace = tmp_path / "ws"
    first = start(data, workspace, "--epochs", "50", "-j", "0", "--checkpoint-interval", "2", "--resume", "auto",
                  log=tmp_path / "first.txt")
    try:
        while "SAVING" not in (tmp_path / "first.txt").read_text():
            assert first.poll() is None, (tmp_path / "first.txt").read_text()
            time.sleep(0.1)
        second = train_here(data, workspace, "--epochs", "50", "-j", "0", "--resume", "auto", capsys=capsys)
        line = one_error_line(second)
        assert "in use by another run" in line and f"pid {first.pid}" in line and never_trained(second)
        first.kill()  # SIGKILL: the lock file stays, the kernel's lock goes with the process
        assert first.wait() == -9
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    TALLY["bad_inputs"] += 1
    TALLY["kills"] += 1
    assert (workspace / ".workspace.lock").is_file()
    third = train_here(data, workspace, "--epochs", "1", "-j", "0", "--resume", "auto", capsys=capsys)
    assert third.returncode == 0, explain(third)
    assert "in use" not in third.stderr and load(workspace / "checkpoint.pth.tar")["epoch"] >= 1


# -- a link or a pipe in place of a file the run writes -------------------------------------------------------
@pytest.mark.parametrize("name", [".workspace.lock", "experiment_raport.json"], ids=["lock", "raport"])
@pytest.mark.parametrize("kind", ["link", "fifo"])
def test_a_link_or_a_fifo_named_like_a_workspace_file_is_refused_before_training(data, tmp_path, name, kind):
    """A link planted as the lock or the raport would have the run write through it, outside the workspace; a
    FIFO would hang the open, a SIGTERM unanswered, the lock held.  Either is one line and exit 2, in a moment,
    with the link's target as it was."""
    workspace, victim = tmp_path / "ws", tmp_path / "victim.txt"
    workspace.mkdir()
    victim.write_text("not the toolkit's\n")
    if kind == "link":
        (workspace / name).symlink_to("../victim.txt")
    else:
        os.mkfifo(workspace / name)
    result = train(data, workspace, "--epochs", "1", "-j", "0", timeout=60)
    line = one_error_line(result)
    assert name in line and ("symbolic link" in line if kind == "link" else "not a regular file" in line), line
    assert never_trained(result) and victim.read_text() == "not the toolkit's\n"
    assert sorted(path.name for path in workspace.iterdir()) == [name]
    TALLY["bad_inputs"] += 1
