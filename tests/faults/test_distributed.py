"""Two gloo processes started by multiproc.py: a stop signal, a killed worker, a resume mid-epoch."""

from __future__ import annotations

import re
import signal
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from helpers import free_port, patient, run_process, start_process
from image_classification.errors import EXIT_PREEMPTED
from image_classification.multiproc import _interrupted, _stopped_early
from image_classification.system.distributed import lost_peer_reason as _lost_peer_reason

from .harness import COMMON, REPO, RUNNER, TALLY, assert_same_state, environment, explain, load

needs_linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="gloo on Linux")
RUN = ["--epochs", "2", "--mixup", "0.4", "-j", "0", "--resume", "auto"]  # 3 iterations per epoch and rank


def two_processes(data: Path, workspace: Path, *args, max_restarts: int = 0, **faults):
    """The training on 2 gloo processes through multiproc.py (rank 1's output in workspace/../GPU_1.log);
    multiproc.py is a process forked from this one, its workers fresh interpreters (helpers.run_process)."""
    command = [sys.executable, str(REPO / "multiproc.py"), "--nproc_per_node", "2", "--master_port",
               str(free_port()), "--max-restarts", str(max_restarts), "--log_dir", str(workspace.parent), str(RUNNER), *COMMON,
               "--workspace", str(workspace), *map(str, args), str(data)]
    return run_process(command, cwd=REPO, env=environment(**faults))


@pytest.fixture(scope="module")
def straight_two(data, tmp_path_factory) -> Path:
    """The folder of an uninterrupted 2-process run of ``RUN`` (workspace ``straight/``, its MixUp draws in
    ``straight.txt``) that interrupted 2-process runs must equal.  Read-only for the tests."""
    folder = tmp_path_factory.mktemp("two_straight")
    result = two_processes(data, folder / "straight", *RUN, record=folder / "straight.txt")
    assert result.returncode == 0, explain(result)
    return folder


def mixup_draws(record: Path) -> dict[int, list[float]]:
    draws: dict[int, list[float]] = {0: [], 1: []}
    for line in record.read_text().splitlines():
        rank, _, lam = line.split()
        draws[int(rank)].append(float(lam))
    return draws


@pytest.mark.slow
@needs_linux
def test_ranks_stopped_by_a_signal_make_multiproc_exit_75(data, tmp_path):
    result = two_processes(data, tmp_path / "ws", *RUN, signal_at="2:SIGUSR1", rank=1)
    assert result.returncode == EXIT_PREEMPTED, explain(result)
    assert "stopped early after saving a checkpoint (exit code 75)" in result.stderr
    assert "Stopped by another process after 2 batches of epoch 1" in result.stdout  # rank 0 got no signal
    saved = load(tmp_path / "ws" / "checkpoint.pth.tar")
    assert (saved["epoch"], saved["batch"], saved["world_size"]) == (0, 2, 2)
    TALLY["stops"] += 1


# multiproc.py as on a torch whose torchrun has no --signals-to-handle (before 2.9): torchrun takes SIGTERM
OLD_TORCHRUN = f"""import sys
sys.path.insert(0, {str(REPO)!r})
from image_classification import multiproc
from image_classification.system import cli
multiproc._has_signals_option = lambda torchrun: False
sys.exit(cli.run(multiproc.main))
"""


@needs_linux
@pytest.mark.parametrize("name, launcher", [pytest.param("SIGUSR1", "multiproc.py", marks=pytest.mark.slow),
                                            ("SIGTERM", "multiproc.py"),
                                            pytest.param("SIGTERM", "torchrun before 2.9", marks=pytest.mark.slow),
                                            pytest.param("SIGINT", "multiproc.py", marks=pytest.mark.slow)])
def test_a_stop_signal_to_multiproc_reaches_the_workers_which_save_and_exit_75(data, tmp_path, name, launcher):
    """SLURM's --signal warns the launched task, multiproc.py, not its workers; scancel sends it SIGTERM; a
    terminal's Ctrl-C reaches multiproc.py alone too (torchrun starts the workers in sessions of their own)."""
    script = REPO / "multiproc.py"
    if launcher != "multiproc.py":
        script = tmp_path / "multiproc_old_torchrun.py"
        script.write_text(OLD_TORCHRUN)
    command = [sys.executable, str(script), "--nproc_per_node", "2", "--master_port",
               str(free_port()), "--log_dir", str(tmp_path), str(RUNNER), *COMMON, "--workspace",
               str(tmp_path / "ws"), "--epochs", "100", "-j", "0", str(data)]
    job = start_process(command, tmp_path / "out.txt", cwd=REPO, env=environment())
    try:
        while not re.search(r"^Epoch 1/100 \[ *2/", (tmp_path / "out.txt").read_text(), re.M):  # a window's line
            assert job.poll() is None, (tmp_path / "out.txt").read_text()
            time.sleep(0.1)
        job.send_signal(getattr(signal, name))
        code = job.wait(timeout=patient(120))
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
    output = (tmp_path / "out.txt").read_text()
    assert code == EXIT_PREEMPTED, output[-3000:]
    assert f"Stopped by {name}" in output and "Traceback" not in output
    saved = load(tmp_path / "ws" / "checkpoint.pth.tar")
    assert saved["world_size"] == 2 and saved["iterations"] >= 2
    TALLY["stops"] += 1


@pytest.mark.parametrize("codes,early", [
    ((75, 75), True), ((75, -signal.SIGTERM), True),  # torchrun stops the later ranks with SIGTERM
    ((-signal.SIGTERM,), False), ((75, 1), False), ((75, -signal.SIGKILL), False),
])
def test_only_ranks_that_all_stopped_after_saving_make_a_75(codes, early):
    assert _stopped_early([SimpleNamespace(exitcode=code) for code in codes]) is early


@pytest.mark.parametrize("codes,interrupted", [
    ((130, -signal.SIGTERM), True), ((130, 75), True),  # a second Ctrl-C: one rank at once, the others stopped
    ((75, 75), False), ((130, 1), False), ((1, -signal.SIGTERM), False),
])
def test_ranks_stopped_by_a_second_ctrl_c_make_a_130(codes, interrupted):
    assert _interrupted([SimpleNamespace(exitcode=code) for code in codes]) is interrupted


@pytest.mark.parametrize("message,reason", [
    ("[third_party/gloo/gloo/transport/tcp/pair.cc:545] Read error [127.0.0.1]:5799: "
     "Connection reset by peer. This is typically caused by a remote worker hanging",
     "Connection reset by peer"),
    ("[third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] "
     "Timed out waiting 1800000ms for recv operation to complete",
     "Timed out waiting 1800000ms for recv operation to complete"),
    ("DataLoader timed out after 5 seconds", None),  # not a lost peer: the traceback stays
    ("mat1 and mat2 shapes cannot be multiplied", None),
])
def test_a_broken_collective_is_told_from_other_errors(message, reason):
    assert _lost_peer_reason(RuntimeError(message)) == reason


@needs_linux
def test_a_killed_worker_is_named_and_the_survivor_says_one_line(data, tmp_path):
    result = two_processes(data, tmp_path / "ws", *RUN, kill_at=2, rank=1)
    assert result.returncode == 1, explain(result)
    output = result.stdout + result.stderr
    assert "rank 1 (local rank 1" in result.stderr and "SIGKILL" in result.stderr, explain(result)
    assert "Traceback" not in output and "gloo" not in output, explain(result)
    survivor = [line for line in result.stderr.splitlines() if not line.startswith("multiproc.py:")]
    assert len(survivor) <= 1, explain(result)
    if survivor:  # rank 0 noticed before torchrun stopped it
        assert survivor[0].startswith("error: rank 0 stops: another process of the job is gone")


@pytest.mark.slow
@needs_linux
def test_a_hung_worker_ends_the_survivor_s_wait_in_one_line_after_the_timeout(data, tmp_path):
    """A process that is alive but never answers (what a lost NCCL peer looks like): no hang, exit 5."""
    result = two_processes(data, tmp_path / "ws", *RUN, "--dist-timeout", "3", "--print-freq", "1",
                           hang_at=2, rank=1)
    assert result.returncode == 1, explain(result)
    survivor = [line for line in result.stderr.splitlines() if line.startswith("error: rank 0")]
    assert len(survivor) == 1, explain(result)
    assert "no answer from the other processes for 3 s while reading the print window" in survivor[0]
    assert "rank 0 (local rank 0" in result.stderr and "exited with code 5" in result.stderr, explain(result)
    assert "Traceback" not in result.stdout + result.stderr, explain(result)


@needs_linux
@pytest.mark.slow
def test_two_processes_resume_mid_epoch_exactly_with_every_rank_s_random_stream(data, straight_two, tmp_path):
    killed = two_processes(data, tmp_path / "ws", *RUN, "--checkpoint-interval", "2", kill_at=3, rank=0)
    assert killed.returncode == 1, explain(killed)
    saved = load(tmp_path / "ws" / "checkpoint.pth.tar")
    assert (saved["epoch"], saved["batch"], saved["world_size"]) == (0, 2, 2)  # mid-epoch, by 2 processes
    TALLY["kills"] += 1
    TALLY["redone"] += 1

    resumed = two_processes(data, tmp_path / "ws", *RUN, record=tmp_path / "resumed.txt")
    assert resumed.returncode == 0, explain(resumed)
    assert_same_state(load(straight_two / "straight" / "checkpoint.pth.tar"),
                      load(tmp_path / "ws" / "checkpoint.pth.tar"))
    before, after = mixup_draws(straight_two / "straight.txt"), mixup_draws(tmp_path / "resumed.txt")
    for rank in (0, 1):
        assert len(before[rank]) == 6 and after[rank] == before[rank][2:]  # the same draws, from batch 3 on
    assert after[0] != after[1]  # each rank has its own stream


@pytest.mark.slow
@needs_linux
def test_a_worker_killed_mid_epoch_is_restarted_and_the_run_ends_as_if_never_stopped(data, straight_two, tmp_path):
    """multiproc.py --max-restarts: torchrun starts both processes again, which resume from the interval
    checkpoint; the final weights are those of the uninterrupted run, bit for bit."""
    result = two_processes(data, tmp_path / "ws", *RUN, "--checkpoint-interval", "2", max_restarts=2,
                           kill_at=3, rank=1, once=tmp_path / "killed")
    assert result.returncode == 0 and (tmp_path / "killed").exists(), explain(result)
    restarts = [line for line in result.stderr.splitlines() if "restarting the processes" in line]
    assert len(restarts) == 1 and "restart 1 of --max-restarts 2" in restarts[0], explain(result)
    assert "loaded checkpoint (epoch 1, batch 2)" in result.stdout, explain(result)
    assert "Traceback" not in result.stdout + result.stderr, explain(result)
    assert_same_state(load(straight_two / "straight" / "checkpoint.pth.tar"),
                      load(tmp_path / "ws" / "checkpoint.pth.tar"))
    TALLY["kills"] += 1
    TALLY["redone"] += 1
