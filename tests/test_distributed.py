"""multiproc.py, SLURM rendezvous, --gpu-affinity, and real two-process training on the CPU (gloo)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import torch

from image_classification import gpu_affinity as ga
from image_classification import multiproc, worker_shim
from image_classification.cli import run
from image_classification.raport import read_raport

REPO = Path(__file__).resolve().parents[1]
needs_proc = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="finds worker pids in /proc")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def multiproc_cmd(nproc: int, *script_and_args: str, log_dir: Path | None = None) -> list[str]:
    cmd = [sys.executable, str(REPO / "multiproc.py"), "--nproc_per_node", str(nproc),
           "--master_port", str(free_port())]
    if log_dir is not None:
        cmd += ["--log_dir", str(log_dir)]
    return cmd + [str(arg) for arg in script_and_args]


# ------------------------------------------------------------------------------------------------
# multiproc.py with a tiny script (no torch in the workers: seconds, not minutes)
# ------------------------------------------------------------------------------------------------
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
    time.sleep(120)
"""


@pytest.fixture
def worker_script(tmp_path) -> Path:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    return script


def test_multiproc_sets_the_environment_and_logs_ranks_above_0(worker_script, tmp_path):
    logs = tmp_path / "logs"
    result = subprocess.run(multiproc_cmd(4, worker_script, "a", "--b", log_dir=logs), capture_output=True,
                            text=True, cwd=tmp_path, timeout=120, env={**os.environ, "QUIET_RANK": "3"})
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
    start = time.monotonic()
    result = subprocess.run(multiproc_cmd(2, worker_script, "fail"), capture_output=True, text=True,
                            cwd=tmp_path, timeout=120)
    elapsed = time.monotonic() - start
    assert result.returncode == 1
    assert elapsed < 30  # rank 0 would sleep for 120 s
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
    assert multiproc.first_host(nodelist) == host


def test_slurm_rendezvous_env():
    step = {"SLURM_PROCID": "3", "SLURM_JOB_NODELIST": "big[1-8]", "SLURM_STEP_NODELIST": "big[5-6]"}
    assert multiproc.slurm_rendezvous_env(step) == {"MASTER_ADDR": "big5", "MASTER_PORT": "29500"}
    explicit = {**step, "MASTER_ADDR": "10.1.1.1", "MASTER_PORT": "4000"}
    assert multiproc.slurm_rendezvous_env(explicit) == {"MASTER_ADDR": "10.1.1.1", "MASTER_PORT": "4000"}
    job_only = {"SLURM_PROCID": "0", "SLURM_JOB_NODELIST": "a[1-2]"}
    assert multiproc.slurm_rendezvous_env(job_only)["MASTER_ADDR"] == "a1"
    assert multiproc.slurm_rendezvous_env({}) == {}
    with pytest.raises(ValueError):
        multiproc.first_host("node[01-04")


# ------------------------------------------------------------------------------------------------
# --gpu-affinity: the core splitting on made-up machines
# ------------------------------------------------------------------------------------------------
def two_socket_machine(cores_per_socket: int = 4):
    """2 sockets of ``cores_per_socket`` physical cores with 2 threads each, numbered like Linux does."""
    total = 2 * cores_per_socket
    siblings = {c: [c % total, c % total + total] for c in range(2 * total)}
    socket_cpus = [set(range(0, cores_per_socket)) | set(range(total, total + cores_per_socket)),
                   set(range(cores_per_socket, total)) | set(range(total + cores_per_socket, 2 * total))]
    return siblings, socket_cpus


def test_cpu_lists_and_nvml_masks():
    assert ga.parse_cpu_list("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]
    assert ga.mask_to_cpus([0b1011, 1 << 63, 1]) == {0, 1, 3, 127, 128}


def test_physical_cores_group_hyperthreads():
    siblings, socket_cpus = two_socket_machine()
    assert ga.physical_cores(socket_cpus[0], siblings) == [(0, 8), (1, 9), (2, 10), (3, 11)]
    # siblings outside the allowed set are dropped; unknown CPUs are cores of their own
    assert ga.physical_cores({0, 1, 9, 20}, siblings) == [(0,), (1, 9), (20,)]


def test_socket_modes_on_four_gpus():
    siblings, socket_cpus = two_socket_machine()
    per_gpu = ga.gpu_cores([socket_cpus[0], socket_cpus[0], socket_cpus[1], socket_cpus[1]],
                           range(16), siblings)
    contiguous = ga.assign_cores("socket_unique_contiguous", per_gpu)
    assert contiguous == [[(0, 8), (1, 9)], [(2, 10), (3, 11)], [(4, 12), (5, 13)], [(6, 14), (7, 15)]]
    interleaved = ga.assign_cores("socket_unique_interleaved", per_gpu)
    assert interleaved == [[(0, 8), (2, 10)], [(1, 9), (3, 11)], [(4, 12), (6, 14)], [(5, 13), (7, 15)]]
    assert ga.assign_cores("socket", per_gpu)[3] == per_gpu[2]
    assert ga.assign_cores("socket_single", per_gpu) == [[(0, 8)], [(0, 8)], [(4, 12)], [(4, 12)]]
    assert ga.assign_cores("socket_single_unique", per_gpu) == [[(0, 8)], [(1, 9)], [(4, 12)], [(5, 13)]]
    assert ga.assign_cores("none", per_gpu) == per_gpu
    assert ga.logical_cpus(contiguous[1]) == {2, 3, 10, 11}
    assert ga.logical_cpus(contiguous[1], "single_logical") == {2, 3}


def test_balanced_split_takes_the_smallest_share():
    siblings, socket_cpus = two_socket_machine()
    # socket 0 has 3 GPUs (4 cores -> 1 each), socket 1 has 1 GPU (4 cores)
    per_gpu = ga.gpu_cores([socket_cpus[0]] * 3 + [socket_cpus[1]], range(16), siblings)
    balanced = ga.assign_cores("socket_unique_contiguous", per_gpu, balanced=True)
    assert [len(cores) for cores in balanced] == [1, 1, 1, 1]
    unbalanced = ga.assign_cores("socket_unique_contiguous", per_gpu, balanced=False)
    assert [len(cores) for cores in unbalanced] == [2, 1, 1, 4]
    assert ga.assign_cores("socket_unique_interleaved", per_gpu, balanced=False)[0] == [(0, 8), (3, 11)]


def test_more_gpus_than_cores_share_them():
    siblings, socket_cpus = two_socket_machine(cores_per_socket=1)
    per_gpu = ga.gpu_cores([socket_cpus[0]] * 3, range(4), siblings)
    assert ga.assign_cores("socket_unique_contiguous", per_gpu) == [[(0, 2)]] * 3


def test_available_cpus_limit_the_choice_and_overlaps_are_refused():
    siblings, socket_cpus = two_socket_machine()
    per_gpu = ga.gpu_cores([socket_cpus[0], socket_cpus[1]], {0, 1, 2, 8, 9, 10, 4, 12}, siblings)
    assert per_gpu == [[(0, 8), (1, 9), (2, 10)], [(4, 12)]]
    with pytest.raises(ga.TopologyError):
        ga.gpu_cores([{0, 1}, {1, 2}], range(4), {})


def test_mode_none_never_touches_nvml(monkeypatch):
    class Exploding:
        def __getattr__(self, name):
            raise AssertionError("NVML was used")

    monkeypatch.setitem(sys.modules, "pynvml", Exploding())
    assert ga.set_affinity(0, mode="none") == os.sched_getaffinity(0)


def test_without_nvml_affinity_is_left_alone_with_one_notice(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails
    before = os.sched_getaffinity(0)
    assert ga.set_affinity(0, mode="socket_unique_contiguous") == before
    assert ga.set_affinity(1, mode="socket_unique_contiguous") == before
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "NVML is not available" in err


def test_set_affinity_pins_to_the_chosen_cores(monkeypatch):
    """NVML faked: 2 GPUs, one per 'socket', over the CPUs this process may use."""
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2:
        pytest.skip("needs two CPUs")
    halves = [allowed[: len(allowed) // 2], allowed[len(allowed) // 2:]]

    class FakeNVML:
        class NVMLError(Exception):
            pass

        def nvmlInit(self):
            pass

        def nvmlShutdown(self):
            pass

        def nvmlDeviceGetCount(self):
            return 2

        def nvmlDeviceGetHandleByIndex(self, index):
            return index

        def nvmlDeviceGetCpuAffinity(self, handle, words):
            mask = [0] * words
            for cpu in halves[handle]:
                mask[cpu // 64] |= 1 << (cpu % 64)
            return mask

    monkeypatch.setitem(sys.modules, "pynvml", FakeNVML())
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(ga, "read_siblings", lambda cpus: {})
    applied = []
    monkeypatch.setattr(os, "sched_setaffinity", lambda pid, cpus: applied.append(set(cpus)))
    ga.set_affinity(1, mode="socket")
    assert applied == [set(halves[1])]


# ------------------------------------------------------------------------------------------------
# Real training with two processes (gloo on the CPU)
# ------------------------------------------------------------------------------------------------
TINY = ["--arch", "resnet18", "--num-classes", "3", "--device", "cpu", "--data-backend", "pytorch", "-j", "0",
        "--seed", "1"]


def _main_py(*args) -> list[str]:
    return [str(REPO / "main.py"), *map(str, args)]


def _one_process(*args, cwd: Path) -> subprocess.CompletedProcess:
    """main.py in one process, on one thread like each of multiproc's two (same sums, same speed)."""
    return subprocess.run([sys.executable, *_main_py(*args)], capture_output=True, text=True, cwd=cwd,
                          timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})


def _check(result: subprocess.CompletedProcess) -> None:
    assert result.returncode == 0, (result.stdout[-3000:], result.stderr[-3000:])


def test_two_processes_train_validate_and_resume_on_one(image_folder, tmp_path):
    workspace = tmp_path / "ws"
    result = subprocess.run(
        multiproc_cmd(2, *_main_py(image_folder, *TINY, "--image-size", "32", "-b", "4", "--epochs", "1",
                                   "--workspace", workspace), log_dir=tmp_path),
        capture_output=True, text=True, cwd=tmp_path, timeout=300)
    _check(result)
    records = read_raport(workspace / "experiment_raport.json")
    parameters = {k: v for r in records if r.get("step") == "PARAMETER" for k, v in r["data"].items()}
    assert parameters["world_size"] == 2
    assert any("val.top1" in r.get("data", {}) for r in records)
    assert not (tmp_path / "GPU_1.log").exists()  # rank 1 printed nothing, so its empty log went
    checkpoint = torch.load(workspace / "checkpoint.pth.tar", map_location="cpu", weights_only=False)
    assert checkpoint["epoch"] == 1
    assert not [key for key in checkpoint["state_dict"] if key.startswith("module.")]

    resumed = _one_process(image_folder, *TINY, "--image-size", "32", "-b", "4", "--epochs", "2",
                           "--prof", "1", "--resume", workspace / "checkpoint.pth.tar",
                           "--workspace", tmp_path / "ws_resumed", cwd=tmp_path)
    _check(resumed)
    assert "RUNNING EPOCHS FROM 1 TO 2" in resumed.stdout
    assert torch.load(tmp_path / "ws_resumed" / "checkpoint.pth.tar", map_location="cpu",
                      weights_only=False)["epoch"] == 2


def test_two_processes_equal_one_process_accumulating_their_batches(image_folder, tmp_path):
    """DDP averages the ranks' gradients; one process accumulating the same micro-batches must agree.

    BatchNorm normalises over each micro-batch, so 2 x b and 1 x 2b differ by design; the same
    micro-batches do not.  Rank r's q-th sample is the epoch's sample 2q + r, exactly as in one process,
    so with one image per micro-batch (-b 1) both runs see the same micro-batches in the same steps.
    A modest learning rate keeps the three steps from amplifying rounding differences.
    """
    from image_classification.models import build_model

    torch.manual_seed(0)
    init = tmp_path / "init.pth"
    torch.save(build_model("resnet18", num_classes=3).state_dict(), init)
    common = [*TINY, "--image-size", "64", "-b", "1", "--lr", "0.01", "--epochs", "1", "--training-only",
              "--pretrained-weights", init]
    two = subprocess.run(multiproc_cmd(2, *_main_py(image_folder, *common, "--prof", "3",
                                                    "--workspace", tmp_path / "two"), log_dir=tmp_path),
                         capture_output=True, text=True, cwd=tmp_path, timeout=300)
    _check(two)
    one = _one_process(image_folder, *common, "--prof", "6", "--optimizer-batch-size", "2",
                       "--workspace", tmp_path / "one", cwd=tmp_path)
    _check(one)

    def parameters(folder):
        state = torch.load(tmp_path / folder / "checkpoint.pth.tar", map_location="cpu", weights_only=False)
        assert state["optimizer_steps"] == 3
        # running BN statistics are buffers: DDP broadcasts rank 0's, so they are not compared
        return {k: v for k, v in state["state_dict"].items()
                if "running_" not in k and "num_batches" not in k}

    start = torch.load(init)
    two_params, one_params = parameters("two"), parameters("one")
    assert any(not torch.equal(two_params[k], start[k]) for k in two_params)  # training moved the weights
    for key in two_params:
        torch.testing.assert_close(two_params[key], one_params[key], rtol=1e-4, atol=1e-5, msg=key)


def _pid_of_local_rank(marker: str, local_rank: int) -> int | None:
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if f"TEST_MARKER={marker}".encode() in environ and f"LOCAL_RANK={local_rank}".encode() in environ \
                and b"main.py" in cmdline:
            return int(entry.name)
    return None


@needs_proc
def test_a_killed_worker_stops_the_job_within_seconds(image_folder, tmp_path):
    marker = uuid.uuid4().hex
    out = (tmp_path / "out.txt").open("w")
    job = subprocess.Popen(
        multiproc_cmd(2, *_main_py(image_folder, *TINY, "--image-size", "32", "-b", "4", "--epochs", "1000",
                                   "--no-checkpoints", "--training-only", "--workspace", tmp_path / "ws"),
                      log_dir=tmp_path),
        stdout=out, stderr=subprocess.STDOUT, text=True, cwd=tmp_path,
        env={**os.environ, "TEST_MARKER": marker})
    try:
        deadline = time.monotonic() + 240
        while "RUNNING EPOCHS" not in (tmp_path / "out.txt").read_text():
            output = (tmp_path / "out.txt").read_text()
            assert job.poll() is None and time.monotonic() < deadline, output[-3000:]
            time.sleep(0.2)
        pid = _pid_of_local_rank(marker, 1)
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        killed = time.monotonic()
        code = job.wait(timeout=60)
        elapsed = time.monotonic() - killed
    finally:
        if job.poll() is None:
            job.kill()
        out.close()
    log = (tmp_path / "out.txt").read_text()
    assert code == 1 and "rank 1 (local rank 1" in log and "SIGKILL" in log
    assert elapsed < 20, elapsed


# ------------------------------------------------------------------------------------------------
# Start-up order and the wait for peers
# ------------------------------------------------------------------------------------------------
def test_affinity_is_set_for_the_process_s_gpu_before_cuda_and_the_process_group(monkeypatch):
    """One visible GPU per task (SLURM --gpus-per-task): local rank 3 uses cuda:0, pinned first."""
    from image_classification import runtime as rt

    events = []
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("LOCAL_RANK", "3")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "set_device", lambda gpu: events.append(("set_device", gpu)))
    monkeypatch.setattr(ga, "set_affinity", lambda gpu, **kw: events.append(("affinity", gpu, kw["mode"])))
    monkeypatch.setattr(rt.dist, "is_initialized", lambda: False)
    monkeypatch.setattr(rt.dist, "init_process_group",
                        lambda backend, **kw: events.append(("init", backend, kw["timeout"].total_seconds())))
    runtime = rt.make_runtime("cuda", gpu_affinity="socket", dist_timeout=120, log=lambda *_: None)
    assert events == [("affinity", 0, "socket"), ("set_device", 0),
                      ("init", "nccl", 120 + rt.BACKEND_TIMEOUT_MARGIN_S)]
    assert runtime.device == torch.device("cuda", 0) and runtime.watchdog.timeout_s == 120


def test_the_watchdog_ends_a_wait_for_peers_that_lasts_too_long_in_one_line(capsys):
    from image_classification.distributed import PeerWatchdog

    exits = []
    watchdog = PeerWatchdog(rank=1, timeout_s=0.2, exit_process=exits.append)
    with watchdog.guard("quick"):
        time.sleep(0.01)
    time.sleep(0.3)
    assert exits == []  # a wait that ended in time, and the time after it, never count
    with watchdog.guard("reading the print window at epoch 0, iteration 10"):
        deadline = time.monotonic() + 5
        while not exits and time.monotonic() < deadline:
            time.sleep(0.02)
    assert exits == [5]
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: rank 1 stops: no answer from the other processes for 0.2 s while reading the print "
                   "window at epoch 0, iteration 10; one of them is gone or hung (--dist-timeout)"]
