"""The engine: the fp16 loss scaler it builds, what one print window costs in collectives, and a resume in
another memory layout."""

from __future__ import annotations

import io

import pytest
import torch

from helpers import run_config, tiny_bottleneck_row
from image_classification.models import build_model
from image_classification.models.archs import ARCHS
from image_classification.models.preprocessing import Preprocessing
from image_classification.system.runtime import Runtime
from image_classification.train.engine import LOSS_SCALE_GROWTH_INTERVAL, Engine
from image_classification.arguments.precision import DEFAULT_LOSS_SCALE

FP16, BF16 = torch.float16, torch.bfloat16


def _engine(runtime: Runtime, **settings) -> Engine:
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4, 2))
    config = run_config(arch="resnet18", num_classes=2, model_options=(), preprocessing=Preprocessing(32),
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


NCHW, CHANNELS_LAST = torch.contiguous_format, torch.channels_last
BATCHES = [(torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(i)),
            torch.tensor([0, 1, 2, i % 3])) for i in range(4)]


def _bottleneck_engine(monkeypatch, memory_format: torch.memory_format,
                       checkpoint: dict | None = None) -> Engine:
    """A tiny bottleneck model in ``memory_format`` with SGD at a rate large enough for a wrong momentum to
    show, and an EMA; fresh or resumed from ``checkpoint`` as a run's set-up does (the weights loaded, the
    model laid out, then the engine's state)."""
    monkeypatch.setitem(ARCHS, "tiny-bottleneck", tiny_bottleneck_row())
    torch.manual_seed(0)
    model = build_model("tiny-bottleneck", num_classes=3)
    if checkpoint is not None:
        model.load_state_dict(checkpoint["state_dict"])
    model = model.to(memory_format=memory_format)
    config = run_config(arch="tiny-bottleneck", num_classes=3, model_options=(),
                       preprocessing=Preprocessing(32), optimizer="sgd", lr=0.2, momentum=0.9,
                       weight_decay=1e-4, ema_decay=0.5)
    engine = Engine(config, Runtime(torch.device("cpu"), None, memory_format), model, log=lambda *_: None)
    if checkpoint is not None:
        engine.load_state_dict(checkpoint)
    return engine


def _train(engine: Engine, batches) -> None:
    for images, targets in batches:
        images = images.contiguous(memory_format=engine.runtime.memory_format)  # as every loader delivers
        engine.train_step(images, targets, accumulation=1, step_now=True)


def _written(engine: Engine) -> bytes:
    """The engine's checkpoint as a file holds it (strides included)."""
    buffer = io.BytesIO()
    torch.save(engine.state_dict(), buffer)
    return buffer.getvalue()


def _read(written: bytes) -> dict:
    """A checkpoint read afresh: torch's optimizer takes the file's tensors as they are where their dtype and
    device fit, so two resumes from one copy would share (and both step) its momentum buffers."""
    return torch.load(io.BytesIO(written), weights_only=True)


@pytest.mark.parametrize("written_in, resumed_in", [(NCHW, CHANNELS_LAST), (CHANNELS_LAST, NCHW)])
def test_a_checkpoint_resumed_in_another_memory_layout_trains_as_in_its_own(monkeypatch, written_in,
                                                                            resumed_in):
    """A checkpoint of an NCHW run (a GPU's, ``--memory-format nchw``) resumed where ``auto`` takes
    channels-last, or the reverse: SGD's momentum pairs with the right weights (torch's fused kernel, which
    the CPU takes, pairs them by memory position), so the weights and the EMA after two more steps are those
    of a resume in the checkpoint's own layout, but for the layouts' rounding."""
    writer = _bottleneck_engine(monkeypatch, written_in)
    _train(writer, BATCHES[:2])
    written = _written(writer)
    after = {}
    for layout in (written_in, resumed_in):
        engine = _bottleneck_engine(monkeypatch, layout, _read(written))
        _train(engine, BATCHES[2:])
        after[layout] = {**engine.base_model.state_dict(),
                         **{f"ema.{name}": tensor for name, tensor in engine.ema.state_dict().items()}}
    resumed = _read(written)["state_dict"]
    weights = [name for name, _ in writer.base_model.named_parameters()]
    step = max((after[written_in][name] - resumed[name]).abs().max() for name in weights)
    apart = {name: (after[resumed_in][name] - tensor).abs().max()
             for name, tensor in after[written_in].items() if tensor.is_floating_point()}
    worst = max(apart, key=apart.get)
    assert apart[worst] <= 1e-4 * step, \
        f"{worst} apart by {apart[worst]:.3g} after weight steps of up to {step:.3g}"


def test_the_ema_resumed_from_a_checkpoint_of_another_layout_is_held_in_the_models(monkeypatch):
    """Its update pairs the model's tensors with tensors of their own strides, and its values are the
    checkpoint's, index by index."""
    writer = _bottleneck_engine(monkeypatch, NCHW)
    _train(writer, BATCHES[:1])
    written = _written(writer)
    engine = _bottleneck_engine(monkeypatch, CHANNELS_LAST, _read(written))
    model, ema = engine.base_model.state_dict(), engine.ema.state_dict()
    saved = _read(written)["state_dict_ema"]
    assert ema["layer1.0.conv2.weight"].is_contiguous(memory_format=CHANNELS_LAST)
    assert all(ema[name].stride() == tensor.stride() for name, tensor in model.items())
    assert all(torch.equal(ema[name], tensor) for name, tensor in saved.items())
