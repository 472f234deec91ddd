"""Distributed training: two real gloo processes on the CPU through multiproc.py, resumed on one, a killed
worker, and the watchdog of a wait for peers.

The two-process runs are real processes (that is the point: multiproc.py forked from the test's process,
its workers fresh interpreters); the one-process runs they are compared with run main.py in the test's
process, on one thread like each of multiproc's workers.  The model is the tiny ResNet throughout.
"""

from __future__ import annotations

import os
import re
import signal
import sys
import time
import uuid
from pathlib import Path

import pytest
import torch

from faults.harness import RUNNER
from helpers import (REPO, explain, multiproc_cmd, patient, run_config, run_process, run_script, start_process,
                     tiny_registered)
from image_classification.records.raport import read_raport

needs_proc = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="finds worker pids in /proc")

# The tiny ResNet (helpers.tiny_arch_row): the processes are the subject here, not the model.  A run in this
# process has it registered (the tiny_arch fixture, helpers.tiny_registered); multiproc.py's workers, fresh
# interpreters, run tests/faults/runner.py, main.py with the tiny ResNet registered (no fault without its variables).
TINY = ["--arch", "tiny", "--num-classes", "3", "--device", "cpu", "--data-backend", "pytorch", "-j", "0",
        "--seed", "1"]
pytestmark = pytest.mark.usefixtures("tiny_arch")


def _worker(*args) -> list[str]:
    """main.py's command line for a worker of multiproc.py: the runner, which is main.py with ``tiny`` known."""
    return [str(RUNNER), *map(str, args)]


def _in_this_process(*args) -> list[str]:
    return [str(REPO / "main.py"), *map(str, args)]


def _one_process(capsys, *args, cwd: Path):
    """main.py as one process would run it, on one thread like each of multiproc's two (same sums)."""
    return run_script(_in_this_process(*args), capsys, cwd=cwd, threads=1)


def _check(result) -> None:
    assert result.returncode == 0, explain(result)


@pytest.fixture(scope="module")
def two_processes(image_folder, tmp_path_factory) -> Path:
    """A run of two processes (multiproc.py, gloo) from saved initial weights, one image per micro-batch
    and 3 steps; its workspace is ``two`` and its logs are beside it."""
    from image_classification.models import build_model

    root = tmp_path_factory.mktemp("two_processes")
    torch.manual_seed(0)
    with tiny_registered():
        torch.save(build_model("tiny", num_classes=3).state_dict(), root / "init.pth")
    result = run_process(multiproc_cmd(2, *_worker(image_folder, *COMMON, "--prof", "3",
                                                    "--workspace", root / "two"), log_dir=root),
                         cwd=root, timeout=patient(300))
    _check(result)
    (root / "stdout.txt").write_text(result.stdout)  # rank 0's
    return root


# -b 1: one image per micro-batch; a modest learning rate keeps the steps from amplifying rounding differences
COMMON = [*TINY, "--image-size", "64", "-b", "1", "--lr", "0.01", "--epochs", "1",
          "--pretrained-weights", "init.pth"]


def test_two_processes_train_validate_and_resume_on_one(two_processes, image_folder, tmp_path, capsys):
    workspace = two_processes / "two"
    records = read_raport(workspace / "experiment_raport.json")
    parameters = {k: v for r in records if r.get("step") == "PARAMETER" for k, v in r["data"].items()}
    assert parameters["world_size"] == 2
    assert any("val.top1" in r.get("data", {}) for r in records)
    assert not (two_processes / "GPU_1.log").exists()  # rank 1 printed nothing, so its empty log went
    checkpoint = torch.load(workspace / "checkpoint.pth.tar", map_location="cpu", weights_only=False)
    assert checkpoint["epoch"] == 1
    assert not [key for key in checkpoint["state_dict"] if key.startswith("module.")]

    resumed = _one_process(capsys, image_folder, *TINY, "--image-size", "64", "-b", "1", "--epochs", "2",
                           "--prof", "1", "--resume", workspace / "checkpoint.pth.tar",
                           "--workspace", tmp_path / "ws_resumed", cwd=tmp_path)
    _check(resumed)
    assert "RUNNING EPOCHS FROM 2 TO 2" in resumed.stdout
    assert torch.load(tmp_path / "ws_resumed" / "checkpoint.pth.tar", map_location="cpu",
                      weights_only=False)["epoch"] == 2


def test_two_processes_print_and_record_the_validation_over_both_ranks(two_processes):
    """The validation's last window, line and record, gives the figures over both ranks' images, as the epoch's
    line and record do (it gave rank 0's share: another loss, and another top1 where the shares differ)."""
    from image_classification.records.raport import epoch_records

    raport = two_processes / "two" / "experiment_raport.json"
    epoch = epoch_records(raport)[0]
    window = [r["data"] for r in read_raport(raport) if len(r.get("step", [])) == 3 and "val.loss" in r["data"]][-1]
    assert {name: window[name] for name in ("val.top1", "val.top3", "val.loss")} == \
        {name: epoch[name] for name in ("val.top1", "val.top3", "val.loss")}
    out = (two_processes / "stdout.txt").read_text()
    figures = f"loss {epoch['val.loss']:.4f}, top1 {epoch['val.top1']:.2f}%, top3 {epoch['val.top3']:.2f}%"
    assert re.search(rf"^Epoch 1/1 val \[3/3\] {re.escape(figures)}, ", out, re.M), out
    assert re.search(rf"^Epoch 1/1: train .*; val {re.escape(figures)}$", out, re.M), out


def test_two_processes_equal_one_process_accumulating_their_batches(two_processes, image_folder, capsys):
    """DDP averages the ranks' gradients; one process accumulating the same micro-batches must agree.

    BatchNorm normalises over each micro-batch, so 2 x b and 1 x 2b differ by design; the same
    micro-batches do not.  Rank r's q-th sample is the epoch's sample 2q + r, exactly as in one process,
    so with one image per micro-batch (-b 1) both runs see the same micro-batches in the same steps.
    """
    one = _one_process(capsys, image_folder, *COMMON, "--prof", "6", "--optimizer-batch-size", "2",
                       "--workspace", two_processes / "one", cwd=two_processes)
    _check(one)

    def parameters(folder):
        state = torch.load(two_processes / folder / "checkpoint.pth.tar", map_location="cpu",
                           weights_only=False)
        assert state["optimizer_steps"] == 3
        # running BN statistics are buffers: DDP broadcasts rank 0's, so they are not compared
        return {k: v for k, v in state["state_dict"].items()
                if "running_" not in k and "num_batches" not in k}

    start = torch.load(two_processes / "init.pth")
    two_params, one_params = parameters("two"), parameters("one")
    assert any(not torch.equal(two_params[k], start[k]) for k in two_params)  # training moved the weights
    for key in two_params:
        torch.testing.assert_close(two_params[key], one_params[key], rtol=1e-4, atol=1e-5, msg=key)


@pytest.mark.slow
def test_two_processes_follow_the_progressive_resize_as_one_process_does(two_processes, image_folder, capsys):
    """Each rank trains each epoch at the schedule's size: two processes of one image each end with the
    weights of one process accumulating the same two images per step, over an epoch at 64 px and one at 96 (a
    batch of one image needs a last feature map of more than one pixel: 64 px and up)."""
    ramp = ["--progressive-resize", "64", "96", "0", "1", "--epochs", "2", "--val-crop-size", "96"]
    result = run_process(multiproc_cmd(2, *_worker(image_folder, *COMMON, *ramp, "--prof", "2", "--workspace",
                                                    two_processes / "two_ramp"), log_dir=two_processes / "logs"),
                         cwd=two_processes, timeout=patient(300))
    _check(result)
    one = _one_process(capsys, image_folder, *COMMON, *ramp, "--prof", "4", "--optimizer-batch-size", "2",
                       "--workspace", two_processes / "one_ramp", cwd=two_processes)
    _check(one)
    assert "=> epoch 2: training crops of 96 px (from 64 px)" in result.stdout + one.stdout

    def parameters(folder):
        state = torch.load(two_processes / folder / "checkpoint.pth.tar", map_location="cpu", weights_only=True)
        assert state["optimizer_steps"] == 4
        return {k: v for k, v in state["state_dict"].items() if "running_" not in k and "num_batches" not in k}

    two_params, one_params = parameters("two_ramp"), parameters("one_ramp")
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
                and RUNNER.name.encode() in cmdline:
            return int(entry.name)
    return None


@pytest.mark.slow
@needs_proc
def test_a_killed_worker_stops_the_job(image_folder, tmp_path):
    """A rank killed mid-run ends the job (exit 1, the rank and its signal named) rather than leaving the
    survivor waiting for it: the wait below is a guard against that hang, not a measure of speed."""
    marker = uuid.uuid4().hex
    job = start_process(
        multiproc_cmd(2, *_worker(image_folder, *TINY, "--image-size", "32", "-b", "4", "--epochs", "1000",
                                   "--no-checkpoints", "--training-only", "--workspace", tmp_path / "ws"),
                      log_dir=tmp_path),
        tmp_path / "out.txt", cwd=tmp_path, env={**os.environ, "TEST_MARKER": marker})
    try:
        deadline = time.monotonic() + patient(240)
        while "RUNNING EPOCHS" not in (tmp_path / "out.txt").read_text():
            output = (tmp_path / "out.txt").read_text()
            assert job.poll() is None and time.monotonic() < deadline, output[-3000:]
            time.sleep(0.2)
        pid = _pid_of_local_rank(marker, 1)
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        code = job.wait(timeout=600)
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
    log = (tmp_path / "out.txt").read_text()
    assert code == 1 and "rank 1 (local rank 1" in log and "SIGKILL" in log


# ------------------------------------------------------------------------------------------------
# The wait for peers
# ------------------------------------------------------------------------------------------------
def test_the_watchdog_ends_a_wait_for_peers_that_lasts_too_long_in_one_line(capsys):
    from image_classification.system.distributed import PeerWatchdog

    exits = []
    limit = round(patient(0.2), 1)  # a loaded machine may hold up the quick wait itself for a while
    watchdog = PeerWatchdog(rank=1, timeout_s=limit, exit_process=exits.append)
    with watchdog.guard("quick"):
        time.sleep(0.01)
    time.sleep(1.5 * limit)
    assert exits == []  # a wait that ended in time, and the time after it, never count
    with watchdog.guard("reading the print window at epoch 0, iteration 10"):
        deadline = time.monotonic() + patient(5)
        while not exits and time.monotonic() < deadline:
            time.sleep(0.02)
    assert exits == [5]
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: rank 1 stops: no answer from the other processes for {limit:g} s while reading "
                   "the print window at epoch 0, iteration 10; one of them is gone or hung (--dist-timeout)"]


def test_a_one_process_gloo_ddp_run_in_fp16_with_accumulation_equals_the_same_steps_without_ddp(monkeypatch, tiny_arch):
    """The CPU twin of test_gpu's NCCL test (whose fp16 weights were 1,084 off under the fused SGD): DDP's path
    (bucket views, no_sync on accumulation steps, the window's all-reduce) with fp16 autocast and the loss
    scaler, a first step that overflows included, against the same steps without DDP."""
    import copy

    import torch
    import torch.distributed as dist

    from helpers import free_port
    from image_classification.models import build_model
    from image_classification.models.preprocessing import Preprocessing
    from image_classification.system.runtime import Runtime
    from image_classification.train.engine import Engine

    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        # 2**30 overflows the first steps' fp16 gradients: the scaler halves it until they fit
        config = run_config(arch=tiny_arch, num_classes=10, model_options=(), preprocessing=Preprocessing(32),
                           accumulation=2, lr=0.05, loss_scale=2.0**30)
        torch.manual_seed(0)
        model = build_model(tiny_arch, num_classes=10)
        twin = copy.deepcopy(model)
        generator = torch.Generator().manual_seed(0)
        batches = [(torch.randn(4, 3, 32, 32, generator=generator), torch.randint(0, 10, (4,), generator=generator))
                   for _ in range(8)]
        engines = {}
        for name, net, joined in (("ddp", model, True), ("plain", twin, False)):
            runtime = Runtime(torch.device("cpu"), torch.float16, torch.contiguous_format, process_group=joined)
            engine = engines[name] = Engine(config, runtime, net, log=lambda *_: None)
            assert isinstance(engine.model, torch.nn.parallel.DistributedDataParallel) == joined
            for index, (images, targets) in enumerate(batches):
                engine.train_step(images, targets, accumulation=2, step_now=index % 2 == 1)
            engine.read_window("the test")
        ddp, plain = engines["ddp"], engines["plain"]
        assert ddp.progress.optimizer_steps == plain.progress.optimizer_steps == 4
        assert ddp.progress.skipped_steps == plain.progress.skipped_steps > 0 and ddp.grad_scale == plain.grad_scale
        for (key, a), b in zip(model.state_dict().items(), twin.state_dict().values()):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=key)
    finally:
        dist.destroy_process_group()
