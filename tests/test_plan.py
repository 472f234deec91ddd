"""Set-up: what a run decides from its flags before the first step."""

from __future__ import annotations

import pytest
import torch

from image_classification.plan import DEFAULT_LOSS_SCALE, choose_loss_scale

FP16, BF16 = torch.float16, torch.bfloat16


@pytest.mark.parametrize("amp_dtype, static, dynamic, expected", [
    # --amp alone in fp16: dynamic, from torch's usual start (the reference's scaler was always dynamic too)
    (FP16, None, False, (DEFAULT_LOSS_SCALE, True)),
    (FP16, None, True, (DEFAULT_LOSS_SCALE, True)),
    (FP16, 128.0, True, (128.0, True)),  # the AMP presets: dynamic from 128
    (FP16, 256.0, False, (256.0, False)),  # asked for explicitly: fixed, and said so
])
def test_fp16_loss_scale_follows_the_flags(amp_dtype, static, dynamic, expected):
    scale, is_dynamic, notice = choose_loss_scale(amp_dtype, static, dynamic)
    assert (scale, is_dynamic) == expected
    assert (notice is not None) == (not is_dynamic)
    if notice:
        assert "fixed at 256" in notice and "--dynamic-loss-scale" in notice


@pytest.mark.parametrize("amp_dtype", [None, BF16])
def test_scale_flags_without_fp16_are_ignored_aloud(amp_dtype):
    assert choose_loss_scale(amp_dtype, None, False)[2] is None
    for static, dynamic in ((128.0, False), (None, True)):
        notice = choose_loss_scale(amp_dtype, static, dynamic)[2]
        assert notice is not None and "ignored" in notice


def test_a_new_run_never_silently_replaces_the_run_in_its_workspace(tmp_path, capsys):
    """The second model's run in the same workspace stops with one line; --overwrite or --resume auto go on."""
    from image_classification.cli import run
    from image_classification.training import main

    def train(*extra):
        return run(main, ["--data-backend", "synthetic", "-a", "resnet18", "--image-size", "32", "-b", "4",
                          "--prof", "1", "--epochs", "1", "--num-classes", "4", "--seed", "1", "--lr", "0.01",
                          "--workspace", str(tmp_path), *extra])

    assert train() == 0
    before = (tmp_path / "checkpoint.pth.tar").read_bytes()
    capsys.readouterr()
    assert train("--epochs", "2") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "already holds another run" in err[0] and "--resume auto" in err[0]
    assert (tmp_path / "checkpoint.pth.tar").read_bytes() == before
    assert train("--epochs", "2", "--resume", "auto") == 0
    assert train("--overwrite") == 0 and "replaces the one in" in capsys.readouterr().out


def test_a_preset_s_imagenet_class_count_gives_way_to_the_dataset_s(image_folder, monkeypatch):
    """launch.py's presets carry num_classes 1000, ImageNet's; on a 3-class dataset the folders decide."""
    from image_classification import launch

    seen = {}
    monkeypatch.setattr("image_classification.training.train", lambda args: seen.setdefault("args", args) and 0)
    preset = ["--model", "resnet50", "--precision", "FP32", "--mode", "convergence", "--platform", "CPU"]
    assert launch.main([*preset, str(image_folder)], cuda_available=False) == 0
    assert seen.pop("args").num_classes is None  # plan.py then takes the dataset's 3, and says so
    assert launch.main([*preset, "--num-classes", "1000", str(image_folder)], cuda_available=False) == 0
    assert seen["args"].num_classes == 1000  # typed: kept


def test_a_head_larger_than_the_dataset_is_said(image_folder, capsys):
    import argparse

    from image_classification.plan import resolve_num_classes

    args = argparse.Namespace(num_classes=1000, evaluate=True)
    assert resolve_num_classes(args, {}, None, ["a", "b", "c"], print) == 1000
    assert "a 1000-class head for the dataset's 3 class folders" in capsys.readouterr().out
