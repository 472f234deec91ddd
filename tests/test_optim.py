"""Learning-rate schedules, weight-decay groups, the optimizers' kernels and the EMA, against the formulas."""

import math

import pytest
import torch

from image_classification.models import build_model
from image_classification.optim import build_optimizer, lr_at, split_weight_decay


@pytest.mark.parametrize("epoch, expected", [(0, 0.1), (29, 0.1), (30, 0.01), (59, 0.01), (60, 0.001), (80, 1e-4)])
def test_step_schedule_divides_by_ten_at_30_60_80(epoch, expected):
    assert lr_at(epoch, base_lr=0.1, schedule="step", warmup=0, epochs=90) == pytest.approx(expected)


def test_warmup_is_linear_over_the_first_epochs_for_every_schedule():
    for schedule in ("step", "linear", "cosine"):
        values = [lr_at(e, base_lr=2.048, schedule=schedule, warmup=8, epochs=90) for e in range(8)]
        assert values == pytest.approx([2.048 * (e + 1) / 8 for e in range(8)])


def test_linear_and_cosine_follow_the_spec_formulas():
    base, warmup, epochs = 1.024, 8, 90
    for e in (8, 20, 49, 89):
        progress = (e - warmup) / (epochs - warmup)
        assert lr_at(e, base_lr=base, schedule="linear", warmup=warmup, epochs=epochs) == pytest.approx(
            base * (1 - progress))
        assert lr_at(e, base_lr=base, schedule="cosine", warmup=warmup, epochs=epochs, end_lr=1e-4) == pytest.approx(
            1e-4 + 0.5 * (1 + math.cos(math.pi * progress)) * (base - 1e-4))
    assert lr_at(8, base_lr=base, schedule="cosine", warmup=8, epochs=90) == pytest.approx(base)


def test_every_batchnorm_is_excluded_from_weight_decay_downsample_included():
    model = build_model("resnet50")
    bn, rest = split_weight_decay(model)
    names = {id(p): n for n, p in model.named_parameters()}
    bn_names = {names[id(p)] for p in bn}
    assert "layer1.0.downsample.1.weight" in bn_names and "layer4.0.downsample.1.bias" in bn_names
    assert all(".bn" in n or n.startswith("bn1") or "downsample.1" in n for n in bn_names)
    assert len(bn) == 106 and len(rest) == 55  # the reference decayed 8 downsample BN tensors (98 / 63)
    optimizer = build_optimizer(model, name="sgd", lr=0.1, momentum=0.875, weight_decay=3e-5, log=lambda *_: None)
    assert [g["weight_decay"] for g in optimizer.param_groups] == [0.0, 3e-5]


def test_bn_weight_decay_flag_decays_batchnorm_too_and_rmsprop_is_built():
    model = build_model("resnet18", num_classes=10)
    optimizer = build_optimizer(model, name="rmsprop", lr=0.1, momentum=0.9, weight_decay=1e-4, bn_weight_decay=True,
                                rmsprop_alpha=0.85, rmsprop_eps=0.01, log=lambda *_: None)
    assert isinstance(optimizer, torch.optim.RMSprop)
    assert [g["weight_decay"] for g in optimizer.param_groups] == [1e-4, 1e-4]
    assert optimizer.defaults["alpha"] == 0.85 and optimizer.defaults["eps"] == 0.01


def _train_copies(name: str, steps: int = 4) -> tuple[torch.optim.Optimizer, list, list, list]:
    """(our optimizer, its final weights, the same optimizer's final weights with the plain for-loop update,
    the initial weights), on the tiny ResNet (conv, BatchNorm and fc tensors as ResNet-18 has, fewer)."""
    torch.manual_seed(0)
    ours_model = build_model("tiny", num_classes=10)
    plain_model = build_model("tiny", num_classes=10)
    plain_model.load_state_dict(ours_model.state_dict())
    initial = [p.detach().clone() for p in ours_model.parameters()]
    kwargs = dict(name=name, lr=0.05, momentum=0.9, weight_decay=1e-3, nesterov=name == "sgd", log=lambda *_: None)
    ours = build_optimizer(ours_model, **kwargs)
    plain = build_optimizer(plain_model, **kwargs)
    for group in plain.param_groups:
        group["foreach"] = False
    images, targets = torch.randn(4, 3, 32, 32), torch.tensor([0, 3, 5, 9])
    for _ in range(steps):
        for model, optimizer in ((ours_model, ours), (plain_model, plain)):
            optimizer.zero_grad(set_to_none=True)
            torch.nn.functional.cross_entropy(model(images), targets).backward()
            optimizer.step()
    return ours, list(ours_model.parameters()), list(plain_model.parameters()), initial


@pytest.mark.parametrize("name, flag", [("sgd", "fused"), ("rmsprop", "foreach")])
def test_cpu_optimizers_use_fused_or_foreach_kernels_and_match_the_for_loop(name, flag, tiny_arch):
    ours, got, expected, initial = _train_copies(name)
    assert all(group[flag] is True for group in ours.param_groups)  # SGD has a CPU fused kernel from torch 2.4
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    assert all((a - b).abs().max() > 1e-4 for a, b in zip(got, initial))  # every tensor moved


def test_an_optimizer_without_a_fused_kernel_for_the_device_gets_foreach():
    from image_classification.optim import make_optimizer

    class CudaOnlyFused(torch.optim.SGD):
        def __init__(self, params, fused=None, **options):
            if fused:
                raise RuntimeError("`fused=True` requires all the params to be CUDA tensors")
            super().__init__(params, **options)

    params = [torch.nn.Parameter(torch.zeros(2))]
    optimizer = make_optimizer(CudaOnlyFused, [{"params": params}], lr=0.1)
    assert optimizer.param_groups[0]["foreach"] is True and not optimizer.param_groups[0]["fused"]


def test_a_checkpoint_of_another_implementation_loads_without_changing_the_kernels():
    from image_classification.optim import load_optimizer_state

    model = build_model("resnet18", num_classes=10)
    old = torch.optim.SGD([{"params": g} for g in split_weight_decay(model)], lr=0.3, momentum=0.9)
    ours = build_optimizer(model, name="sgd", lr=0.1, momentum=0.9, weight_decay=1e-4, log=lambda *_: None)
    load_optimizer_state(ours, old.state_dict())
    assert [g["lr"] for g in ours.param_groups] == [0.3, 0.3]  # the checkpoint's values are restored
    assert all(g["fused"] is True for g in ours.param_groups)


# ------------------------------------------------------------------------------------------------
# EMA
# ------------------------------------------------------------------------------------------------
def _small_bn_model() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU(),
                               torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(4, 2))


def test_ema_follows_the_formula_over_steps_and_copies_integer_buffers():
    from image_classification.ema import ModelEma, ema_decay

    torch.manual_seed(0)
    model = _small_bn_model()
    ema = ModelEma(model, decay=0.8)
    expected = {k: v.clone() for k, v in model.state_dict().items()}
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    for step in range(1, 6):
        optimizer.zero_grad()
        model(torch.randn(8, 3, 6, 6)).square().mean().backward()  # train mode: BN statistics move too
        optimizer.step()
        ema.update(model, step)
        mu = min(0.8, (1 + step) / (10 + step))
        assert ema_decay(0.8, step) == mu
        for key, value in model.state_dict().items():
            expected[key] = mu * expected[key] + (1 - mu) * value if value.is_floating_point() else value.clone()
    got = ema.state_dict()
    assert got["1.num_batches_tracked"].item() == 5
    for key in expected:
        torch.testing.assert_close(got[key], expected[key], rtol=1e-6, atol=1e-7)
    assert not torch.equal(got["5.weight"], model.state_dict()["5.weight"])  # an average, not a copy


def test_ema_state_dict_round_trips_and_keeps_updating():
    from image_classification.ema import ModelEma

    torch.manual_seed(1)
    model = _small_bn_model()
    first = ModelEma(model, decay=0.9)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(1.0)
    first.update(model, step=50)
    second = ModelEma(_small_bn_model(), decay=0.9)
    second.load_state_dict(first.state_dict())
    for key, value in first.state_dict().items():
        assert torch.equal(second.state_dict()[key], value), key
    with torch.no_grad():
        for param in model.parameters():
            param.mul_(0.5)
    first.update(model, step=51)
    second.update(model, step=51)  # loaded in place: its cached tensors are the module's
    for key, value in first.state_dict().items():
        assert torch.equal(second.state_dict()[key], value), key


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("amp_dtype, use_ema", [(None, False), ("float16", True), ("bfloat16", False)])
def test_cuda_training_steps_never_synchronise_with_the_host(amp_dtype, use_ema):
    """fp16 with GradScaler included: the fused SGD takes the scaler's inf check, the EMA stays on the device."""
    from image_classification.engine import Engine
    from image_classification.plan import RunConfig
    from image_classification.preprocessing import Preprocessing
    from image_classification.runtime import make_runtime

    runtime = make_runtime("cuda", amp=amp_dtype is not None, amp_dtype=amp_dtype, log=lambda *_: None)
    model = build_model("resnet18", num_classes=10).to(runtime.device)
    config = RunConfig(arch="resnet18", num_classes=10, model_options=(), preprocessing=Preprocessing(32),
                       ema_decay=0.99 if use_ema else None, dynamic_loss_scale=True, loss_scale=128.0)
    engine = Engine(config, runtime, model, log=lambda *_: None)
    assert all(group["fused"] for group in engine.optimizer.param_groups)
    images = torch.randn(8, 3, 32, 32, device=runtime.device)
    targets = torch.randint(0, 10, (8,), device=runtime.device)
    engine.train_step(images, targets, accumulation=1, step_now=True)  # one-off set-up may synchronise
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(3):
            engine.train_step(images, targets, accumulation=1, step_now=True)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    reading = engine.read_window("the test")
    assert reading.steps == 4 and engine.progress.optimizer_steps == 4
