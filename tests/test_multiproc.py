"""multiproc.py: the environment and logs of its ranks, how a failure ends the job, its flags, SLURM
rendezvous.

The workers here are a tiny script without torch: multiproc.py and torchrun start real processes, which
is what these tests are about, and the workers themselves start in a fraction of a second.  multiproc.py
itself is a process forked from the test's (helpers.run_process).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from helpers import multiproc_cmd, patient, run_process
from image_classification import multiproc
from image_classification.system import slurm, worker_shim
from image_classification.system.cli import run


WORKER = """
import os, sys, time
if os.environ["LOCAL_RANK"] == os.environ.get("QUIET_RANK"):
    sys.exit(0)
keys = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
print(" ".join(os.environ[k] for k in keys), *sys.argv[1:], flush=True)
print("to stderr", file=sys.stderr, flush=True)
if sys.argv[1:2] == ["fail"]:
    if os.environ["RANK"] == "1":
        time.sleep(0.5)
        sys.exit(3)
    time.sleep(600)  # a rank 0 left to sleep shows: the job outlives the limit, or says it slept
    print("rank 0 slept its 600 s", flush=True)
"""


@pytest.fixture
def worker_script(tmp_path) -> Path:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    return script


def test_multiproc_sets_the_environment_and_logs_ranks_above_0(worker_script, tmp_path):
    logs = tmp_path / "logs"
    result = run_process(multiproc_cmd(4, worker_script, "a", "--b", log_dir=logs), cwd=tmp_path,
                         timeout=patient(120), env={**os.environ, "QUIET_RANK": "3"})
    assert result.returncode == 0, result.stderr
    port = result.stdout.split("(master 127.0.0.1:")[1].split(")")[0]
    assert f"0 0 4 127.0.0.1 {port} a --b" in result.stdout
    assert "1 1 4" not in result.stdout
    assert f"multiproc.py: ranks 1-3 write to GPU_1.log ... GPU_3.log in {logs}" in result.stdout
    for rank in (1, 2):
        log = (logs / f"GPU_{rank}.log").read_text()
        assert f"{rank} {rank} 4 127.0.0.1 {port} a --b" in log and "to stderr" in log
    assert sorted(p.name for p in logs.iterdir()) == ["GPU_1.log", "GPU_2.log"]  # rank 3's stayed empty


def test_a_failing_worker_stops_the_others(worker_script, tmp_path):
    result = run_process(multiproc_cmd(2, worker_script, "fail"), cwd=tmp_path, timeout=patient(300))
    assert result.returncode == 1
    assert "slept" not in result.stdout  # rank 0 was stopped in its sleep, not left to finish it
    # rank 0's own line, then ours; torch elastic's "failed (exitcode: 3) ..." and SIGTERM lines held back
    ours = [line for line in result.stderr.splitlines() if line != "to stderr"]
    assert len(ours) == 1, result.stderr
    assert "rank 1 (local rank 1" in ours[0] and "exited with code 3" in ours[0] and "GPU_1.log" in ours[0]
    assert (tmp_path / "GPU_1.log").exists()  # kept after a failure, even when empty


def test_the_process_that_failed_is_named_not_the_ones_that_stopped_because_of_it():
    from types import SimpleNamespace

    from image_classification.errors import PeerLost

    same_second = 1_700_000_000
    failures = {
        0: SimpleNamespace(exitcode=PeerLost.exit_code, timestamp=same_second),  # saw its peer go
        1: SimpleNamespace(exitcode=-signal.SIGKILL, timestamp=same_second),  # the cause
        2: SimpleNamespace(exitcode=-signal.SIGTERM, timestamp=same_second - 1),  # stopped by torchrun
    }
    assert min(failures.items(), key=multiproc._root_cause_first)[0] == 1
    failures[3] = SimpleNamespace(exitcode=1, timestamp=same_second + 1)  # a later crash of its own
    assert min(failures.items(), key=multiproc._root_cause_first)[0] == 1


@pytest.mark.parametrize("argv,lines", [
    (["--nproc_per_node", "1"], ["multiproc.py: starts rank 0 (master 127.0.0.1:29500): CMD"]),
    (["--nproc_per_node", "2", "--log_dir", "ws"],
     ["multiproc.py: starts ranks 0-1 (master 127.0.0.1:29500): CMD",
      "multiproc.py: rank 1 writes to ws/GPU_1.log"]),
    (["--nnodes", "2", "--node_rank", "1", "--nproc_per_node", "8", "--master_addr", "10.0.0.1"],
     ["multiproc.py: node 1 of 2 starts ranks 8-15 (master 10.0.0.1:29500): CMD",
      "multiproc.py: ranks 9-15 write to GPU_1.log ... GPU_7.log in ."]),
])
def test_startup_lines_say_which_rank_writes_where(argv, lines):
    ns = multiproc.build_parser().parse_args([*argv, "main.py"])
    assert multiproc.startup_lines(ns, "CMD") == lines


def test_only_empty_logs_are_removed(tmp_path):
    (tmp_path / "GPU_1.log").write_text("")
    (tmp_path / "GPU_2.log").write_text("epoch 1\n")
    (tmp_path / "GPU_5.log").write_text("")  # not a rank of this run
    multiproc.remove_empty_logs(str(tmp_path), nproc_per_node=4)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["GPU_2.log", "GPU_5.log"]


def test_multiproc_flag_errors_are_one_line(worker_script, capsys):
    assert run(multiproc.main, ["--nnodes", "2", "--node_rank", "2", str(worker_script)]) == 2
    assert "--node_rank" in capsys.readouterr().err
    assert run(multiproc.main, ["--nproc_per_node", "2", "no_such_script.py"]) == 2
    assert "no_such_script.py" in capsys.readouterr().err


class Started(Exception):
    """torchrun was asked to start the processes."""


def _never_started(*args, **kwargs):
    raise Started()


def test_a_job_that_every_process_would_refuse_is_refused_before_any_starts(tmp_path, monkeypatch, capsys):
    """A missing dataset or a workspace that holds another run: one line, exit 2, no process started and
    no log folder made; the workspace is checked only where rank 0 runs (node 0), as that node is writing."""
    from torch.distributed import run as torchrun

    from helpers import REPO, process_state, refused, write_image_folder

    monkeypatch.setattr(torchrun, "run", _never_started)
    data = write_image_folder(tmp_path / "data", num_classes=2, train_per_class=1, val_per_class=1)
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "checkpoint.pth.tar").write_bytes(b"an earlier run's")
    job = ["--nproc_per_node", "8", "--log_dir", str(tmp_path / "logs")]
    for script in ("main.py", "launch.py"):
        preset = ["--model", "resnet50", "--precision", "AMP", "--mode", "convergence", "--platform", "DGXA100"]
        train = [str(REPO / script), *(preset if script == "launch.py" else [])]
        line = refused(run(multiproc.main, [*job, *train, str(tmp_path / "missing")]), capsys)
        assert line == f"error: dataset directory {tmp_path / 'missing'} does not exist", script
        line = refused(run(multiproc.main, [*job, *train, "--workspace", str(workspace), str(data)]), capsys)
        assert "already holds another run (checkpoint.pth.tar); pass --resume auto" in line, script
    assert not (tmp_path / "logs").exists()
    # node 1 of 2 does not look at the workspace; the dataset it does
    with process_state(), pytest.raises(Started):
        multiproc.main(["--nnodes", "2", "--node_rank", "1", *job, str(REPO / "main.py"), "--workspace",
                        str(workspace), str(data)])
    line = refused(run(multiproc.main, ["--nnodes", "2", "--node_rank", "1", *job, str(REPO / "main.py"),
                                        str(tmp_path / "missing")]), capsys)
    assert "does not exist" in line


@pytest.mark.parametrize("kind", ["fifo", "link", "folder"])
def test_a_rank_s_log_that_is_a_fifo_a_link_or_a_folder_is_refused_before_any_process_starts(
        worker_script, tmp_path, monkeypatch, capsys, kind):
    """A FIFO named GPU_1.log would hang rank 1's start for good, and the job with it; a link would have rank 1
    write through it, outside --log_dir; a folder there is no full disk (exit 4).  Each is one line and exit 2,
    nothing started."""
    from torch.distributed import run as torchrun

    from helpers import refused

    monkeypatch.setattr(torchrun, "run", _never_started)
    logs, victim = tmp_path / "logs", tmp_path / "victim.txt"
    logs.mkdir()
    victim.write_text("not a log\n")
    if kind == "fifo":
        os.mkfifo(logs / "GPU_1.log")
    elif kind == "folder":
        (logs / "GPU_1.log").mkdir()
    else:
        (logs / "GPU_1.log").symlink_to(victim)
    line = refused(run(multiproc.main, ["--nproc_per_node", "2", "--log_dir", str(logs), str(worker_script)]), capsys)
    assert str(logs / "GPU_1.log") in line and ("symbolic link" if kind == "link" else "not a regular file") in line
    assert victim.read_text() == "not a log\n"


def test_a_read_only_log_dir_is_refused_before_any_process_starts(worker_script, read_only_folder, monkeypatch,
                                                                  capsys):
    from torch.distributed import run as torchrun

    from helpers import refused

    monkeypatch.setattr(torchrun, "run", _never_started)
    folder, seal = read_only_folder
    seal()
    line = refused(run(multiproc.main, ["--nproc_per_node", "2", "--log_dir", str(folder), str(worker_script)]),
                   capsys)
    assert str(folder) in line and "cannot be written" in line and "Read-only file system" in line, line


def test_an_installed_command_is_found_on_path(tmp_path, monkeypatch):
    command = tmp_path / "ic-train"
    command.write_text("#!/usr/bin/env python\n")
    command.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    monkeypatch.chdir(tmp_path.parent)
    assert multiproc.script_path("ic-train") == str(command)
    assert multiproc.script_path(f"{tmp_path.name}/ic-train") == f"{tmp_path.name}/ic-train"  # a file wins


def test_torchrun_arguments():
    ns = multiproc.build_parser().parse_args(
        ["--nnodes", "2", "--node_rank", "1", "--nproc_per_node", "8", "--master_addr", "10.0.0.1",
         "--master_port", "1234", "main.py", "--epochs", "3", "/data"])
    argv = multiproc.torchrun_argv(ns)
    pairs = dict(zip(argv[:16:2], argv[1:16:2]))
    assert pairs == {"--nnodes": "2", "--node-rank": "1", "--nproc-per-node": "8",
                     "--master-addr": "10.0.0.1", "--master-port": "1234", "--rdzv-backend": "static",
                     "--max-restarts": "0", "--monitor-interval": "0.5"}
    assert argv[16] == worker_shim.__file__ and argv[18:] == ["main.py", "--epochs", "3", "/data"]
    from torch.distributed import run as torchrun

    parsed = torchrun.parse_args(argv)  # torchrun accepts them
    assert parsed.training_script == worker_shim.__file__ and parsed.node_rank == 1

    elastic = multiproc.torchrun_argv(multiproc.build_parser().parse_args(
        ["--nnodes", "2", "--max-restarts", "3", "--rdzv-backend", "c10d", "--rdzv-endpoint", "head:29400",
         "main.py", "/data"]))
    parsed = torchrun.parse_args(elastic)
    assert (parsed.rdzv_backend, parsed.rdzv_endpoint, parsed.max_restarts) == ("c10d", "head:29400", 3)
    assert parsed.rdzv_id == "image-classification"


# ------------------------------------------------------------------------------------------------
# SLURM
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("nodelist,host", [
    ("node17", "node17"),
    ("node[01-04],other", "node01"),
    ("node[07,09-12]", "node07"),
    ("gpu-a100-[003-010,020]", "gpu-a100-003"),
    ("rack[2-3]-gpu[5,7]", "rack2-gpu5"),
    ("login1,node[1-2]", "login1"),
    ("n-1.cluster.org", "n-1.cluster.org"),
])
def test_first_host_of_a_slurm_nodelist(nodelist, host):
    assert slurm.first_host(nodelist) == host


def test_slurm_rendezvous_env():
    step = {"SLURM_PROCID": "3", "SLURM_JOB_NODELIST": "big[1-8]", "SLURM_STEP_NODELIST": "big[5-6]"}
    assert slurm.slurm_rendezvous_env(step) == {"MASTER_ADDR": "big5", "MASTER_PORT": "29500"}
    explicit = {**step, "MASTER_ADDR": "10.1.1.1", "MASTER_PORT": "4000"}
    assert slurm.slurm_rendezvous_env(explicit) == {"MASTER_ADDR": "10.1.1.1", "MASTER_PORT": "4000"}
    job_only = {"SLURM_PROCID": "0", "SLURM_JOB_NODELIST": "a[1-2]"}
    assert slurm.slurm_rendezvous_env(job_only)["MASTER_ADDR"] == "a1"
    assert slurm.slurm_rendezvous_env({}) == {}
    with pytest.raises(ValueError):
        slurm.first_host("node[01-04")


def test_a_slurm_task_count_that_srun_did_not_set_is_said(monkeypatch):
    """main.py takes the number of processes from SLURM_STEP_NUM_TASKS, which srun sets in every task:
    SLURM_NTASKS alone is also a batch script's (the job's count, while one process runs the script).  A task
    that says it is rank 1 with no step count would run alone and meet rank 0's lock: one line, exit 2.  Rank 0
    runs alone, said in a line naming what is read."""
    from image_classification.errors import UserError
    from image_classification.system.runtime import make_runtime

    for name in [key for key in os.environ if key.startswith("SLURM_")] + ["WORLD_SIZE", "RANK", "LOCAL_RANK"]:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SLURM_NTASKS", "2")
    monkeypatch.setenv("SLURM_PROCID", "1")
    with pytest.raises(UserError, match="SLURM_PROCID is 1 but SLURM_STEP_NUM_TASKS is not set"):
        make_runtime("cpu")
    monkeypatch.setenv("SLURM_PROCID", "0")
    said: list[str] = []
    assert make_runtime("cpu", log=said.append).world_size == 1
    assert len(said) == 1 and "SLURM_NTASKS is 2 but SLURM_STEP_NUM_TASKS is not set" in said[0], said
    monkeypatch.setenv("SLURM_NTASKS", "1")
    said.clear()
    assert make_runtime("cpu", log=said.append).world_size == 1 and not said
