"""``--compile``: the compiled model trains the same loss curve as eager and survives a stop and resume.

The default suite compiles through ``aot_eager`` (torch.compile's capture and autograd tracing, the run's own
wrapping, saving and resuming of the compiled model, without code generation); inductor, ``--compile``'s
backend, generates and compiles C++ for every kernel of the forward and backward passes, about half a minute of
2 cores with its cache empty, and runs with the slow tests.
"""

from __future__ import annotations

import functools
import os
import signal
from pathlib import Path

import pytest
import torch

from image_classification.errors import EXIT_PREEMPTED
from image_classification.records.raport import read_raport
from image_classification.train import engine as engine_module
from image_classification.training import main

pytestmark = pytest.mark.skipif(not any(os.access(os.path.join(folder, name), os.X_OK)
                                        for folder in os.environ.get("PATH", "").split(os.pathsep)
                                        for name in ("c++", "g++", "clang++")),
                                reason="torch.compile on the CPU needs a C++ compiler")

STEPS = 20


def step_losses(raport: Path) -> list[float]:
    """train.loss of every logged training step ([epoch, iteration] records), in order."""
    return [record["data"]["train.loss"] for record in read_raport(raport)
            if isinstance(record.get("step"), list) and len(record["step"]) == 2 and "train.loss" in record["data"]]


@pytest.mark.parametrize("backend", ["aot_eager", pytest.param("inductor", marks=pytest.mark.slow)])
def test_compiled_training_follows_eager_and_resumes_after_a_mid_epoch_stop(tiny_arch, tmp_path, monkeypatch,
                                                                           backend):
    common = ["-a", tiny_arch, "--image-size", "32", "-b", "8", "--num-classes", "10", "--device", "cpu",
              "--data-backend", "synthetic", "--prof", str(STEPS), "--epochs", "1", "-p", "1", "--seed", "3",
              "--lr", "0.05", "--training-only", "--checkpoint-interval", "5"]
    assert main(common + ["--workspace", str(tmp_path / "eager")]) == 0
    eager = step_losses(tmp_path / "eager" / "experiment_raport.json")
    assert len(eager) == STEPS

    original, calls = engine_module.Engine.train_step, {"n": 0}

    def stopped_at_step_12(self, *args, **kwargs):
        original(self, *args, **kwargs)
        calls["n"] += 1
        if calls["n"] == 12:
            os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(engine_module.Engine, "train_step", stopped_at_step_12)
    if backend != "inductor":  # torch.compile's default
        monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend=backend))
    compiled = common + ["--compile", "--workspace", str(tmp_path / "compiled")]
    assert main(compiled) == EXIT_PREEMPTED
    partial = torch.load(tmp_path / "compiled" / "checkpoint.pth.tar", weights_only=True)
    assert (partial["epoch"], partial["batch"]) == (0, 12)
    monkeypatch.setattr(engine_module.Engine, "train_step", original)
    assert main(compiled + ["--resume", "auto"]) == 0

    losses = step_losses(tmp_path / "compiled" / "experiment_raport.json")
    assert len(losses) == STEPS  # the resumed run logs steps 13-20 after the stopped run's 1-12
    assert losses[0] == pytest.approx(eager[0], rel=1e-4)  # the same initial weights and first batch
    assert losses == pytest.approx(eager, rel=2e-3, abs=2e-3)
    state = torch.load(tmp_path / "compiled" / "checkpoint.pth.tar", weights_only=True)["state_dict"]
    assert not any(key.startswith("_orig_mod") for key in state)  # saved as the plain model, loadable anywhere


@pytest.mark.slow  # compiles a model twice: minutes on 2 cores
def test_a_new_training_size_says_that_the_model_is_compiled_again(tiny_arch, tmp_path, capsys):
    """--progressive-resize under --compile: the epoch whose crops are a new input shape says that torch.compile
    compiled the model again, and what that step cost."""
    assert main(["-a", tiny_arch, "--num-classes", "10", "--device", "cpu", "--data-backend", "synthetic",
                 "--prof", "2", "-b", "4", "--epochs", "3", "-p", "1", "--seed", "3", "--training-only",
                 "--no-checkpoints", "--compile", "--progressive-resize", "32", "64", "0", "1",
                 "--workspace", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "=> epoch 2: training crops of 64 px (from 32 px)" in out
    said = [line for line in out.splitlines() if line.startswith("=> --compile:")]
    assert len(said) == 1 and said[0].startswith("=> --compile: 64 px crops are a new input shape: the model was "
                                                 "compiled again ("), said  # epoch 2 keeps 64 px: nothing to say
