"""SIGKILLs at any iteration, or in the middle of a save: the checkpoint on disk always loads, and
``--resume auto`` continues to the very weights of a run that was never interrupted.

The killed runs are real processes; the resumed runs after them run in the test's process."""

from __future__ import annotations

import random

import pytest

from .harness import (INTERVAL, ITERATIONS_PER_EPOCH, RUN, TALLY, assert_same_state, count_lost_records,
                      explain, load, train, train_here, wait_unlocked)

KILLED = -9


def _kill_and_resume(data, workspace, kill_at: int, *args) -> int:
    """Kill the run after iteration ``kill_at``; check what is on disk; return the iterations lost."""
    killed = train(data, workspace, *RUN, *args, kill_at=kill_at)
    assert killed.returncode == KILLED, explain(killed)
    wait_unlocked(workspace)  # its loader workers (-j N) go a moment after it
    saved = load(workspace / "checkpoint.pth.tar")
    assert saved["iterations"] < kill_at
    lost = kill_at - saved["iterations"]
    assert lost <= INTERVAL, (kill_at, saved["iterations"])
    TALLY["kills"] += 1
    TALLY["redone"] += lost
    return lost


@pytest.mark.parametrize("workers", ["0", pytest.param("2", marks=pytest.mark.slow)])
def test_a_sigkill_after_an_interval_checkpoint_resumes_bitwise(data, tmp_path, straight, workers, capsys):
    reference = load(straight / "checkpoint.pth.tar")
    if workers != "0":  # the loader's workers must not change the result either
        result = train_here(data, tmp_path / "straight", *RUN, "-j", workers, capsys=capsys)
        assert result.returncode == 0, explain(result)
        reference = load(tmp_path / "straight" / "checkpoint.pth.tar")
    kill_at = ITERATIONS_PER_EPOCH + 3  # mid-epoch 1, one iteration after the interval checkpoint at 8
    assert _kill_and_resume(data, tmp_path / "ws", kill_at, "-j", workers) == 1
    resumed = train_here(data, tmp_path / "ws", *RUN, "-j", workers, capsys=capsys)
    assert resumed.returncode == 0, explain(resumed)
    assert "--resume auto: loading checkpoint" in resumed.stdout
    assert_same_state(reference, load(tmp_path / "ws" / "checkpoint.pth.tar"))
    assert count_lost_records(tmp_path / "ws" / "experiment_raport.json", epochs=2) == 0


def test_random_sigkills_lose_at_most_one_interval(data, tmp_path, straight, capsys):
    """Five kills, each at an iteration drawn from its own seed, in one run that is resumed after each."""
    workspace, done = tmp_path / "ws", 0
    total = 2 * ITERATIONS_PER_EPOCH
    for seed in range(5):
        kill_at = random.Random(seed).randint(done + 1, min(done + 4, total - 1))
        _kill_and_resume(data, workspace, kill_at, "-j", "0")
        done = load(workspace / "checkpoint.pth.tar")["iterations"]
    finished = train_here(data, workspace, *RUN, "-j", "0", capsys=capsys)
    assert finished.returncode == 0, explain(finished)
    assert_same_state(load(straight / "checkpoint.pth.tar"), load(workspace / "checkpoint.pth.tar"))
    assert count_lost_records(workspace / "experiment_raport.json", epochs=2) == 0


def test_a_sigkill_in_the_middle_of_a_save_leaves_the_previous_checkpoint(data, tmp_path, straight, capsys):
    workspace = tmp_path / "ws"
    killed = train(data, workspace, *RUN, "-j", "0", kill_in_save=2)  # the second interval checkpoint
    assert killed.returncode == KILLED, explain(killed)
    left = sorted(p.name for p in workspace.glob(".checkpoint.pth.tar.*.tmp"))
    assert len(left) == 1  # the torn temporary file, never the checkpoint itself
    assert load(workspace / "checkpoint.pth.tar")["iterations"] == INTERVAL
    TALLY["kills"] += 1
    TALLY["save_kills"] += 1
    TALLY["redone"] += INTERVAL

    resumed = train_here(data, workspace, *RUN, "-j", "0", capsys=capsys)
    assert resumed.returncode == 0, explain(resumed)
    assert f"removed {left[0]}, left by an interrupted save" in resumed.stdout
    assert not list(workspace.glob(".*.tmp"))
    assert_same_state(load(straight / "checkpoint.pth.tar"), load(workspace / "checkpoint.pth.tar"))
