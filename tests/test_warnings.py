"""No deprecation warning that our own code causes: a short training (the pytorch backend, validation included), a
resume, an evaluation, pytorch-gpu's CPU twin and classify.py, in this process, with every warning recorded."""

from __future__ import annotations

import re
import warnings

import torch

from image_classification.data import DataConfig, decoders, get_loaders
from image_classification.deploy.inference import main as classify_main
from image_classification.system.cli import run
from image_classification.system.runtime import Runtime
from image_classification.training import main as train_main


def shown(caught: list[warnings.WarningMessage]) -> list[str]:
    return [f"{w.filename}:{w.lineno}: {w.category.__name__}: {str(w.message).splitlines()[0]}" for w in caught]


def test_training_evaluation_the_gpu_backend_s_twin_and_classify_warn_of_nothing(image_folder, tmp_path, tiny_arch,
                                                                                  capsys, monkeypatch):
    """Every warning shown, none left out by an earlier filter: the filter of torchvision's deprecation of its
    decoders is off too, so that a call of them on these paths would show (the warning comes from inside
    torchvision, of the call we make); then no deprecation, and no other warning."""
    monkeypatch.setattr(decoders, "quiet_torchvision_deprecation", lambda: None)
    decoders._cpu_choice.cache_clear()
    decoders._device_choice.cache_clear()
    workspace = tmp_path / "run"
    common = ["-a", tiny_arch, "--num-classes", "3", "--device", "cpu", "-j", "0", "--image-size", "32", "-b", "4",
              "--workspace", str(workspace), str(image_folder)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.resetwarnings()
        warnings.simplefilter("always")
        assert train_main([*common, "--epochs", "1", "--data-backend", "pytorch"]) == 0
        assert train_main([*common, "--epochs", "2", "--data-backend", "pytorch", "--resume",
                           str(workspace / "checkpoint.pth.tar")]) == 0
        assert train_main([*common, "--evaluate", "--resume", str(workspace / "model_best.pth.tar")]) == 0
        config = DataConfig(data=str(image_folder), data_backend="pytorch-gpu", image_size=32, batch_size=4, workers=0)
        train, val = get_loaders(config, Runtime(torch.device("cpu"), None, torch.contiguous_format),
                                 want_train=True, want_val=True)
        train.set_epoch(0)
        assert sum(len(targets) for loader in (train, val) for _, targets in loader) == 36
        assert run(classify_main, ["-a", tiny_arch, "--weights", str(workspace / "model_best.pth.tar"),
                                   "--image-size", "32", "--precision", "FP32", "--image",
                                   str(image_folder / "val" / "class_00")]) == 0
    capsys.readouterr()
    assert [line for line in shown(caught) if re.search(r"(Deprecation|Future)Warning", line)] == []
    assert shown(caught) == []
