"""The EMA's flags: torchvision's interval, adjusted decay and warm-up restart; timm's warm-up; exact resume."""

import pytest
import torch
from torch.optim.swa_utils import AveragedModel

from helpers import refused, run_config
from image_classification.arguments import parse_args
from image_classification.errors import UserError
from image_classification.system.cli import run as cli_run
from image_classification.train.ema import ModelEma, timm_ema_decay, torchvision_decay
from image_classification.arguments.optimisation import EmaChoice, OptimConfig
from image_classification.arguments.values import from_args
from test_optim import assert_same_tensors, stopped_and_resumed


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU(),
                               torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(4, 2))


def _train(model: torch.nn.Module, steps: int, after_step) -> None:
    """``steps`` SGD steps in train mode (BatchNorm statistics move too), ``after_step(step)`` after each."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    generator = torch.Generator().manual_seed(1)
    for step in range(1, steps + 1):
        optimizer.zero_grad()
        model(torch.randn(8, 3, 6, 6, generator=generator)).square().mean().backward()
        optimizer.step()
        after_step(step)


def test_torchvision_decay_follows_its_train_py():
    # torchvision's recipe: 8 GPUs x 32 images, an update every 32 steps, 600 epochs, decay 0.99998
    alpha = (1 - 0.99998) * 8 * 32 * 32 / 600
    assert torchvision_decay(0.99998, images_per_step=256, steps=32, epochs=600) == pytest.approx(1 - alpha)
    assert torchvision_decay(0.9, images_per_step=256, steps=32, epochs=10) == 0.0  # alpha is clamped at 1


def test_timm_warmup_copies_first_then_approaches_the_decay():
    assert timm_ema_decay(0.9998, 0) == 0.0
    for updates in (1, 10, 1000):
        assert timm_ema_decay(0.9998, updates) == pytest.approx(1 - (1 + updates) ** (-2 / 3))
    assert timm_ema_decay(0.9998, 10**8) == 0.9998


@pytest.mark.parametrize("warmup_epochs", [0, 1])
def test_torchvision_style_matches_its_averaged_model_with_the_warmup_restart(warmup_epochs):
    """torchvision's ExponentialMovingAverage is an AveragedModel of parameters and buffers, updated every
    --model-ema-steps iterations, its n_averaged set to 0 after each update of an LR warm-up epoch."""
    decay, every, steps_per_epoch = 0.7, 2, 4
    model = _model()
    ours = ModelEma(model, decay, every=every, warmup="none", restart_epochs=warmup_epochs)
    theirs = AveragedModel(model, avg_fn=lambda avg, current, n: decay * avg + (1 - decay) * current,
                           use_buffers=True)

    def after_step(step: int) -> None:
        epoch = (step - 1) // steps_per_epoch
        ours.update(model, step, epoch)
        if step % every == 0:
            theirs.update_parameters(model)
            if epoch < warmup_epochs:
                theirs.n_averaged.fill_(0)

    _train(model, 3 * steps_per_epoch, after_step)
    assert ours.updates == int(theirs.n_averaged)
    expected = theirs.module.state_dict()
    for key, value in ours.state_dict().items():
        if value.is_floating_point():
            torch.testing.assert_close(value, expected[key], rtol=1e-6, atol=1e-7)
        else:  # ours copies the integer buffers (torchvision averages num_batches_tracked and truncates)
            assert torch.equal(value, model.state_dict()[key])
    assert not torch.equal(ours.state_dict()["5.weight"], model.state_dict()["5.weight"])  # an average


def test_timm_warmup_over_the_updates_and_updates_only_every_n_steps():
    decay, every = 0.95, 3
    model = _model()
    ema = ModelEma(model, decay, every=every, warmup="timm")
    expected = {k: v.clone() for k, v in model.state_dict().items()}
    seen = []

    def after_step(step: int) -> None:
        ema.update(model, step)
        if step % every == 0:
            mu = min(decay, 1 - (1 + len(seen)) ** (-2 / 3))
            seen.append(mu)
            for key, value in model.state_dict().items():
                expected[key] = mu * expected[key] + (1 - mu) * value if value.is_floating_point() else value.clone()

    _train(model, 10, after_step)
    assert seen[0] == 0.0 and len(seen) == ema.updates == 3
    for key, value in ema.state_dict().items():
        torch.testing.assert_close(value, expected[key], rtol=1e-6, atol=1e-7)


def _args(*flags: str):
    return parse_args([*flags, "--data-backend", "synthetic"])


def test_use_ema_keeps_the_reference_ema_and_model_ema_is_torchvisions():
    def ema(*flags: str) -> EmaChoice:
        return from_args(OptimConfig, _args(*flags)).ema

    assert ema() == EmaChoice(None, "reference", 1, False)
    assert ema("--use-ema", "0.999") == EmaChoice(0.999, "reference", 1, False)
    assert ema("--use-ema", "0.999", "--model-ema-warmup").warmup is True
    assert ema("--model-ema") == EmaChoice(0.99998, "torchvision", 32, False)
    assert ema("--model-ema-decay", "0.9999", "--model-ema-steps", "4") == EmaChoice(0.9999, "torchvision", 4, False)


@pytest.mark.parametrize("flags, message", [
    (["--use-ema", "0.99", "--model-ema-decay", "0.999"], "--use-ema and --model-ema"),
    (["--use-ema", "0.99", "--model-ema"], "--use-ema and --model-ema"),
    (["--model-ema-steps", "4"], "--model-ema-steps needs"),
    (["--use-ema", "0.99", "--model-ema-steps", "4"], "--model-ema-steps needs"),
    (["--model-ema-warmup"], "--model-ema-warmup needs an EMA"),
    (["--model-ema-decay", "1"], "--model-ema-decay needs a decay between 0 and 1"),
    (["--bn-weight-decay", "--norm-weight-decay", "0"], "--bn-weight-decay and --norm-weight-decay"),
    (["--bias-weight-decay", "-1"], "--bias-weight-decay must be 0 or more"),
    (["--norm-weight-decay", "nan"], "argument --norm-weight-decay: must be 0 or from 1.175e-38"),
])
def test_conflicting_or_bad_flags_are_one_line_and_exit_2(flags, message, capsys):
    from image_classification.training import main

    with pytest.raises(UserError, match=message):
        _args(*flags)
    assert message in refused(cli_run(main, [*flags, "--data-backend", "synthetic"]), capsys)


def test_the_engine_adjusts_torchvisions_decay_to_the_global_batch_of_an_optimizer_step(tiny_arch):
    from image_classification.models import build_model
    from image_classification.models.preprocessing import Preprocessing
    from image_classification.system.runtime import make_runtime
    from image_classification.train.engine import Engine

    runtime = make_runtime("cpu", log=lambda *_: None)
    lines = []
    config = run_config(arch=tiny_arch, num_classes=3, model_options=(), preprocessing=Preprocessing(32),
                       batch_size=16, accumulation=4, epochs=90, warmup=2, ema_decay=0.9999,
                       ema_style="torchvision", ema_steps=8)
    engine = Engine(config, runtime, build_model(tiny_arch, num_classes=3), log=lines.append)
    assert engine.ema.decay == pytest.approx(1 - 1e-4 * 64 * 8 / 90)
    assert (engine.ema.every, engine.ema.warmup, engine.ema.restart_epochs) == (8, "none", 2)
    assert any("EMA every 8 optimizer steps of 64 images" in line for line in lines)


@pytest.mark.parametrize("flags", [
    ["--model-ema-decay", "0.999", "--model-ema-steps", "3", "--warmup", "1"],
    ["--use-ema", "0.9", "--model-ema-warmup"],
])
def test_a_mid_epoch_resume_of_the_ema_is_bitwise_exact(flags, image_folder, tmp_path, tiny_arch):
    argv = ["-a", tiny_arch, "--image-size", "32", "-b", "4", "--device", "cpu", "-p", "1", "--num-classes", "3",
            "--data-backend", "pytorch", "-j", "0", "--epochs", "2", "--seed", "9", "--lr", "0.05", *flags]
    straight, resumed = stopped_and_resumed(image_folder, tmp_path, argv, stop_after=8)  # epoch 2, batch 2
    assert straight["epoch"] == resumed["epoch"] == 2
    assert_same_tensors(straight["state_dict_ema"], resumed["state_dict_ema"], "state_dict_ema")
    assert straight["ema_updates"] == resumed["ema_updates"] > 0
    assert not torch.equal(straight["state_dict_ema"]["fc.weight"], straight["state_dict"]["fc.weight"])


def test_the_average_takes_the_memory_layout_of_the_model_it_follows():
    """An average built over an NCHW copy and updated from a channels-last model holds that model's layout
    (the multi-tensor update pairs tensors of one layout), its values moved index by index."""
    ema = ModelEma(_model(), 0.5, warmup="none")
    channels_last = _model().to(memory_format=torch.channels_last)
    with torch.no_grad():
        channels_last[0].weight.add_(torch.arange(108.0).view(4, 3, 3, 3))
    ema.update(channels_last, 1)  # the first update copies the weights
    ema.update(channels_last, 2)  # the average of equals: the same values
    averaged, followed = ema.state_dict(), channels_last.state_dict()
    assert averaged["0.weight"].is_contiguous(memory_format=torch.channels_last)
    assert all(averaged[name].stride() == tensor.stride() for name, tensor in followed.items())
    assert all(torch.equal(averaged[name], tensor) for name, tensor in followed.items())
