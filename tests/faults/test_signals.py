"""SIGTERM and SIGUSR1 (what SLURM sends before a preemption) and SIGINT (Ctrl-C): a checkpoint of that very
point, exit 75, and ``--resume auto`` finishes the run as if it had never stopped.

The signalled runs are real processes; the runs that resume them run in the test's process."""

from __future__ import annotations

import shutil

import pytest

from image_classification.errors import EXIT_PREEMPTED

from .harness import (INTERVAL, ITERATIONS_PER_EPOCH, RUN, TALLY, assert_same_state, count_lost_records, explain,
                      load, train, train_here)


@pytest.mark.parametrize("name,at", [("SIGTERM", 3), ("SIGUSR1", 8)])
def test_a_stop_signal_saves_exits_75_and_resumes_exactly(data, tmp_path, straight, name, at, capsys):
    stopped = train(data, tmp_path / "ws", *RUN, "-j", "0", signal_at=f"{at}:{name}")
    assert stopped.returncode == EXIT_PREEMPTED, explain(stopped)
    assert f"Stopped by {name}" in stopped.stdout and "exit code 75" in stopped.stdout
    saved = load(tmp_path / "ws" / "checkpoint.pth.tar")
    assert saved["iterations"] == at  # exactly where it stopped: nothing to redo
    assert (saved["epoch"], saved["batch"]) == divmod(at, ITERATIONS_PER_EPOCH)

    resumed = train_here(data, tmp_path / "ws", *RUN, "-j", "0", capsys=capsys)
    assert resumed.returncode == 0, explain(resumed)
    TALLY["stops"] += 1
    assert_same_state(load(straight / "checkpoint.pth.tar"), load(tmp_path / "ws" / "checkpoint.pth.tar"))
    assert count_lost_records(tmp_path / "ws" / "experiment_raport.json", epochs=2) == 0


@pytest.mark.parametrize("name", ["SIGTERM", "SIGINT"])
def test_a_stop_signal_to_the_process_group_with_loader_workers_saves_and_exits_75(data, tmp_path, name):
    """SLURM signals every process of the job step, and a terminal's Ctrl-C every process of the foreground
    job: the workers must leave the stop to the main process."""
    stopped = train(data, tmp_path / "ws", *RUN, "-j", "2", signal_at=f"3:{name}", signal_group=1)
    assert stopped.returncode == EXIT_PREEMPTED, explain(stopped)
    assert f"Stopped by {name}" in stopped.stdout and "Traceback" not in stopped.stderr, explain(stopped)
    assert load(tmp_path / "ws" / "checkpoint.pth.tar")["iterations"] == 3
    TALLY["stops"] += 1


@pytest.mark.parametrize("save,point", [(2, "before"), (2, "writing"), (2, "closing"), (2, "renamed"),
                                        (3, "renamed")],
                         ids=["before", "writing", "closing", "renamed", "renamed-at-an-epoch-s-end"])
def test_a_double_ctrl_c_at_any_point_of_a_save_exits_130_with_a_checkpoint_that_loads(data, tmp_path, straight,
                                                                                       save, point, capsys):
    """Two SIGINTs at once (a double Ctrl-C) during the interval save of iteration 4 (the second save), or the
    epoch's save of iteration 6 (the third): exit 130, never 134 (an interrupt inside torch.save's zip writer,
    which aborted the process), no temporary file left, the last checkpoint complete; a save under way when
    they come is finished first.  The same command with --resume auto then ends with the weights of a run never
    interrupted, the per-epoch file that the interrupted epoch save left unwritten included."""
    workspace = tmp_path / "ws"
    stopped = train(data, workspace, *RUN, "-j", "0", interrupt_in_save=f"{save}:{point}")
    assert stopped.returncode == 130, explain(stopped)
    assert "Received SIGINT again: stopping at once" in stopped.stderr and "Traceback" not in stopped.stderr
    assert not list(workspace.glob(".*.tmp")), sorted(path.name for path in workspace.iterdir())
    assert load(workspace / "checkpoint.pth.tar")["iterations"] == INTERVAL * (save - (point == "before"))
    assert not (workspace / "checkpoint_0000.pth.tar").exists()  # the epoch's copy: not reached

    resumed = train_here(data, workspace, *RUN, "-j", "0", capsys=capsys)
    assert resumed.returncode == 0, explain(resumed)
    TALLY["interrupts"] += 1
    for name in ("checkpoint.pth.tar", "checkpoint_0000.pth.tar", "checkpoint_0001.pth.tar"):
        assert_same_state(load(straight / name), load(workspace / name))
    assert count_lost_records(workspace / "experiment_raport.json", epochs=2) == 0


def test_resume_auto_of_a_finished_run_exits_0_without_training(data, tmp_path, straight, capsys):
    """A blindly re-queued job whose run already finished does nothing and succeeds."""
    shutil.copytree(straight, tmp_path / "ws")
    before = (tmp_path / "ws" / "checkpoint.pth.tar").read_bytes()
    again = train_here(data, tmp_path / "ws", *RUN, "-j", "0", capsys=capsys)
    assert again.returncode == 0, explain(again)
    assert "nothing to do" in again.stdout and "RUNNING EPOCHS" not in again.stdout
    assert (tmp_path / "ws" / "checkpoint.pth.tar").read_bytes() == before
