"""Learning-rate schedules and weight-decay groups, as the reference's formulas define them."""

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
