"""The engine: the fp16 loss scaler it builds, and what one print window costs in collectives."""

from __future__ import annotations

import pytest
import torch

from image_classification.models.preprocessing import Preprocessing
from image_classification.system.runtime import Runtime
from image_classification.train.engine import LOSS_SCALE_GROWTH_INTERVAL, Engine
from image_classification.train.plan import DEFAULT_LOSS_SCALE, RunConfig

FP16, BF16 = torch.float16, torch.bfloat16


def _engine(runtime: Runtime, **settings) -> Engine:
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4, 2))
    config = RunConfig(arch="resnet18", num_classes=2, model_options=(), preprocessing=Preprocessing(32),
                       lr=0.1, momentum=0.0, weight_decay=0.0, **settings)
    return Engine(config, runtime, model, log=lambda *_: None)


def test_an_fp16_engine_builds_the_scaler_its_config_asks_for():
    """The GradScaler settings per flag combination (an fp16 runtime on the CPU: the scaler's logic only)."""
    fp16 = Runtime(torch.device("cpu"), FP16, torch.contiguous_format)
    dynamic = _engine(fp16)  # RunConfig's defaults are what --amp alone resolves to
    assert dynamic.scaler.get_scale() == DEFAULT_LOSS_SCALE
    assert dynamic.scaler.get_growth_interval() == LOSS_SCALE_GROWTH_INTERVAL
    fixed = _engine(fp16, loss_scale=256.0, dynamic_loss_scale=False)
    assert fixed.scaler.get_scale() == 256.0 and fixed.scaler.get_growth_interval() > 10**9
    assert _engine(Runtime(torch.device("cpu"), BF16, torch.contiguous_format)).scaler is None


def test_a_dynamic_scale_grows_after_clean_steps_and_a_fixed_one_does_not():
    fp16 = Runtime(torch.device("cpu"), FP16, torch.contiguous_format)
    images, targets = torch.ones(2, 1, 2, 2), torch.tensor([0, 1])
    grown = {}
    for dynamic in (True, False):
        engine = _engine(fp16, loss_scale=8.0, dynamic_loss_scale=dynamic)
        for _ in range(LOSS_SCALE_GROWTH_INTERVAL):
            engine.train_step(images, targets, accumulation=1, step_now=True)
        grown[dynamic] = engine.grad_scale
    assert grown == {True: 16.0, False: 8.0}


def test_a_window_is_one_all_reduce_that_carries_the_stop_and_save_flags(monkeypatch):
    """Loss and the processes' stop/save requests share one collective and one host read."""
    from image_classification.train import engine as engine_module

    calls = []

    def all_reduce(tensor, op=None):  # two ranks: this one, and one that asks to save
        calls.append(tensor.clone())
        tensor.mul_(2)
        tensor[2] += 1  # the other rank asks to save; its stop flag is unset, as ours

    monkeypatch.setattr(engine_module.dist, "all_reduce", all_reduce)
    engine = _engine(Runtime(torch.device("cpu"), None, torch.contiguous_format))
    engine.runtime = Runtime(torch.device("cpu"), None, torch.contiguous_format, rank=0, world_size=2)
    engine.train_step(torch.ones(2, 1, 2, 2), torch.tensor([0, 1]), accumulation=1, step_now=True)
    local_loss = float(engine._loss_sum)
    reading = engine.read_window("here", (False, False))
    assert len(calls) == 1 and calls[0].shape == (3,)
    assert reading.flags == (False, True)
    assert reading.loss == pytest.approx(local_loss)  # (2 x loss) / 2 ranks
