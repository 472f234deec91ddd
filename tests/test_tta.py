"""Flip test-time augmentation: ``--val-tta flip`` (main.py: validation during training and ``--evaluate``) and
``--tta flip`` (classify.py) average the logits of each image and its mirror image; the raport keeps the plain
figures as they were and gives the averaged ones beside them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from image_classification.data import get_loaders
from image_classification.data.common import DataConfig
from image_classification.data.layout import check_dataset
from image_classification.deploy.inference import load_model
from image_classification.deploy.inference import main as classify_main
from image_classification.deploy.tta import flip_tta
from image_classification.records.raport import read_raport
from image_classification.system.runtime import Runtime
from image_classification.training import main


class LeftHeavy(torch.nn.Module):
    """Logits that tell an image from its mirror: a weighted sum over the columns, heavier on the left."""

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        weights = torch.linspace(2.0, 0.0, images.shape[-1])
        left = (images.mean(dim=(1, 2)) * weights).sum(dim=1)
        return torch.stack([left, -left, images.mean(dim=(1, 2, 3))], dim=1)


@pytest.mark.parametrize("memory_format", [torch.contiguous_format, torch.channels_last], ids=["nchw", "nhwc"])
def test_flip_tta_is_the_mean_of_the_logits_of_the_images_and_their_mirrors(memory_format):
    images = torch.randn(4, 3, 8, 6).contiguous(memory_format=memory_format)
    model, seen = LeftHeavy(), []
    recording = lambda batch: (seen.append(batch), model(batch))[1]  # noqa: E731
    logits = model(images)
    averaged = flip_tta(recording, images, logits.half())
    mirror = torch.flip(images, dims=[3])
    assert torch.equal(seen[0], mirror) and seen[0].is_contiguous(memory_format=memory_format)
    assert averaged.dtype == torch.float32
    torch.testing.assert_close(averaged, (logits.half().float() + model(mirror)) / 2)
    assert not torch.allclose(averaged, logits)  # the mirror counted


def _train(workspace: Path, data: Path, arch: str, *extra: str) -> int:
    return main(["-a", arch, "--num-classes", "3", "--device", "cpu", "--data-backend", "pytorch", "-j", "0",
                 "--image-size", "32", "-b", "4", "--epochs", "2", "--seed", "5", "--lr", "0.05", "-p", "100",
                 "--workspace", str(workspace), *extra, str(data)])


def _epochs(raport: Path) -> list[dict]:
    """Each epoch's figures (its DEFAULT and VERBOSE records merged), in order."""
    epochs: dict[int, dict] = {}
    for record in read_raport(raport):
        if record.get("type") == "LOG" and isinstance(record.get("step"), list) and len(record["step"]) == 1:
            epochs.setdefault(record["step"][0], {}).update(record["data"])
    return [epochs[number] for number in sorted(epochs)]


def _summary(raport: Path) -> dict:
    return {k: v for record in read_raport(raport) if record.get("step") == [] for k, v in record["data"].items()}


def test_validation_during_training_reports_the_flip_figures_beside_the_plain_ones_unchanged(image_folder, tmp_path,
                                                                                            tiny_arch, capsys):
    """The plain val.top1 and val.loss of every epoch, the best model and the weights are those of a run without
    --val-tta: the averaged logits are a separate figure, which leaves the NVIDIA-comparable one alone."""
    assert _train(tmp_path / "plain", image_folder, tiny_arch, "--use-ema", "0.9") == 0
    assert _train(tmp_path / "tta", image_folder, tiny_arch, "--use-ema", "0.9", "--val-tta", "flip") == 0
    plain, tta = _epochs(tmp_path / "plain" / "experiment_raport.json"), _epochs(tmp_path / "tta" /
                                                                                 "experiment_raport.json")
    names = ("val.top1", "val.top3", "val.loss", "val_ema.top1")
    assert [{k: e[k] for k in names} for e in plain] == [{k: e[k] for k in names} for e in tta]
    assert all("val.tta_top1" not in e for e in plain)
    assert all({"val.tta_top1", "val.tta_top3", "val.tta_loss", "val_ema.tta_top1"} <= set(e) for e in tta)
    assert "val.tta_top1" in _summary(tmp_path / "tta" / "experiment_raport.json")
    for name in ("checkpoint.pth.tar", "model_best.pth.tar"):
        a, b = (torch.load(tmp_path / run / name, weights_only=True) for run in ("plain", "tta"))
        assert a["best_prec1"] == b["best_prec1"]
        assert all(torch.equal(a["state_dict"][k], b["state_dict"][k]) for k in a["state_dict"])
    assert "; with flip TTA: " in capsys.readouterr().out


def test_evaluate_reports_the_flip_figures_of_the_averaged_logits(image_folder, tmp_path, tiny_arch):
    """--evaluate --val-tta flip: val.tta_top1 and val.tta_loss are those of the mean of each validation image's
    logits and its mirror's, worked out here from the same images; val.top1 is the plain evaluation's."""
    assert _train(tmp_path / "run", image_folder, tiny_arch, "--epochs", "1") == 0
    checkpoint = tmp_path / "run" / "checkpoint.pth.tar"
    for name, extra in (("plain", []), ("tta", ["--val-tta", "flip"])):
        assert _train(tmp_path / name, image_folder, tiny_arch, "--evaluate", "--resume", str(checkpoint),
                      *extra) == 0
    plain, tta = (_summary(tmp_path / name / "experiment_raport.json") for name in ("plain", "tta"))
    assert plain["val.top1"] == tta["val.top1"] and plain["val.loss"] == tta["val.loss"]

    model = load_model(tiny_arch, str(checkpoint), 3).model
    runtime = Runtime(torch.device("cpu"), None, torch.contiguous_format)
    config = DataConfig(data=str(image_folder), data_backend="pytorch", image_size=32, batch_size=4, num_classes=3)
    _, val = get_loaders(config, runtime, check_dataset(image_folder, 3, want_train=False, want_val=True),
                         want_train=False, want_val=True)
    val.set_epoch(0)
    hits, losses, count = 0, 0.0, 0
    with torch.no_grad():
        for images, targets in val:
            averaged = (model(images) + model(torch.flip(images, dims=[3]))) / 2
            hits += int((averaged.argmax(dim=1) == targets).sum())
            losses += float(torch.nn.functional.cross_entropy(averaged, targets, reduction="sum"))
            count += len(targets)
    assert tta["val.tta_top1"] == pytest.approx(100.0 * hits / count)
    assert tta["val.tta_loss"] == pytest.approx(losses / count, rel=1e-4)


def test_classify_with_tta_flip_ranks_by_the_averaged_logits(image_folder, tmp_path, tiny_arch, capsys):
    assert _train(tmp_path / "run", image_folder, tiny_arch, "--epochs", "1") == 0
    checkpoint = tmp_path / "run" / "checkpoint.pth.tar"
    images = sorted((image_folder / "val").rglob("*.jpg"))[:3]
    argv = ["--arch", tiny_arch, "--weights", str(checkpoint), "--cpu", "--precision", "FP32", "--json", "--topk",
            "3", "--image", *map(str, images)]
    capsys.readouterr()
    outputs = {}
    for name, extra in (("plain", []), ("tta", ["--tta", "flip"])):
        assert classify_main(argv + extra) == 0
        outputs[name] = [json.loads(line) for line in capsys.readouterr().out.splitlines()]

    from image_classification.deploy.inference import image_transform, load_image

    loaded = load_model(tiny_arch, str(checkpoint), 3)
    transform = image_transform(loaded.preprocessing)
    batch = torch.stack([transform(load_image(path)) for path in images]).contiguous(memory_format=torch.channels_last)
    with torch.no_grad():
        model = loaded.model.to(memory_format=torch.channels_last)
        expected = ((model(batch) + model(torch.flip(batch, dims=[3]))) / 2).softmax(dim=1)
    for row, probabilities in zip(outputs["tta"], expected):
        got = {p["index"]: p["probability"] for p in row["predictions"]}
        assert got == pytest.approx({i: float(p) for i, p in enumerate(probabilities)}, abs=1e-5)
    assert outputs["tta"] != outputs["plain"]
