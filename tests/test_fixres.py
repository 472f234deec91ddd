"""--train-crop-size, --val-resize-size, --val-crop-size (FixRes): the loaders, the checkpoint's record, and
classify.py / --evaluate following it."""

from __future__ import annotations

import pytest
import torch
from PIL import Image
from torchvision.transforms import v2

from helpers import refused
from image_classification.data import DataConfig, get_loaders
from image_classification.deploy.inference import image_transform, load_model
from image_classification.models.preprocessing import Preprocessing
from image_classification.records.integrity import recorded_description
from image_classification.system.cli import run
from image_classification.system.runtime import make_runtime
from image_classification.training import main

TRAIN, RESIZE, CROP = 48, 72, 64
FLAGS = ["--train-crop-size", str(TRAIN), "--val-resize-size", str(RESIZE), "--val-crop-size", str(CROP)]


@pytest.mark.parametrize("backend", ["pytorch", "pytorch-gpu", "dali-cpu", "synthetic"])
def test_the_loaders_crop_training_and_validation_images_to_their_own_sizes(image_folder, backend):
    if backend == "dali-cpu":
        pytest.importorskip("nvidia.dali")
    config = DataConfig(None if backend == "synthetic" else str(image_folder), backend, CROP, batch_size=4,
                        preprocessing=Preprocessing(CROP, crop_ratio=CROP / RESIZE, train_crop_size=TRAIN),
                        num_classes=3, synthetic_length=1)
    runtime = make_runtime("cpu", log=lambda *_: None)
    train, val = get_loaders(config, runtime, want_train=True, want_val=True)
    train.set_epoch(0)
    val.set_epoch(0)
    assert next(iter(train))[0].shape[-2:] == (TRAIN, TRAIN)
    assert next(iter(val))[0].shape[-2:] == (CROP, CROP)


def test_validation_resizes_to_the_val_resize_size_then_crops(tmp_path):
    image = Image.effect_mandelbrot((120, 90), (-2.0, -1.2, 1.0, 1.2), 60).convert("RGB")
    ours = image_transform(Preprocessing(CROP, crop_ratio=CROP / RESIZE))(image)
    plain = v2.Compose([v2.PILToTensor(), v2.Resize(RESIZE, antialias=True), v2.CenterCrop(CROP),
                        v2.ToDtype(torch.float32, scale=True),
                        v2.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])(image)
    assert ours.shape == plain.shape == (3, CROP, CROP)
    torch.testing.assert_close(ours, plain, atol=0.05, rtol=0)  # PIL's and torchvision's antialiased resizes


def test_the_checkpoint_records_both_sizes_and_classify_follows_them(image_folder, tiny_arch, tmp_path, capsys):
    common = ["-a", tiny_arch, "-b", "4", "--device", "cpu", "--data-backend", "pytorch", "-j", "0", "--epochs", "1",
              "--lr", "0.01", "--workspace", str(tmp_path / "run")]
    assert main(common + FLAGS + [str(image_folder)]) == 0
    checkpoint = torch.load(tmp_path / "run" / "checkpoint.pth.tar", weights_only=True)
    record = recorded_description(checkpoint)["preprocessing"]
    assert (record["image_size"], record["train_crop_size"]) == (CROP, TRAIN)
    recorded = Preprocessing.from_dict(record)
    assert (recorded.image_size, recorded.resize_size, recorded.train_size) == (CROP, RESIZE, TRAIN)

    loaded = load_model(None, str(tmp_path / "run" / "checkpoint.pth.tar"))
    assert loaded.resolve_preprocessing(None) == recorded  # classify.py, model2onnx.py: validation's sizes
    capsys.readouterr()

    # --evaluate and a resume take the recorded sizes without a word; a flag overrides with a notice
    assert main(common + ["--evaluate", "--resume", str(tmp_path / "run" / "checkpoint.pth.tar"),
                          str(image_folder)]) == 0
    assert "overrides" not in capsys.readouterr().out
    assert main(common + ["--epochs", "2", "--resume", "auto", "--train-crop-size", "56", str(image_folder)]) == 0
    assert f"=> --train-crop-size 56 overrides the {TRAIN} recorded in the checkpoint" in capsys.readouterr().out


def test_a_record_without_the_training_crop_trained_at_its_image_size():
    old = {"image_size": 224, "interpolation": "bilinear", "crop_ratio": 0.875}  # every checkpoint before
    # trained before images were turned by their EXIF tag too: on images as stored
    assert Preprocessing.from_dict(old) == Preprocessing(224, exif_orientation=False)
    assert Preprocessing.from_dict(old).train_size == 224 and Preprocessing(224).to_dict()["train_crop_size"] == 224
    with pytest.raises(Exception, match="invalid preprocessing"):
        Preprocessing.from_dict({**old, "train_crop_size": 10**9})


@pytest.mark.parametrize("flags, message", [
    (["--train-crop-size", "16"], "--train-crop-size must be at least 32"),
    (["--val-crop-size", "8"], "--val-crop-size must be at least 32"),
    (["--val-crop-size", "64", "--val-resize-size", "60"], "--val-resize-size 60 is smaller than the validation crop, 64"),
])
def test_bad_sizes_are_one_line(image_folder, tmp_path, capsys, flags, message):
    argv = ["-a", "resnet18", "--device", "cpu", "--data-backend", "synthetic", "--workspace", str(tmp_path), *flags]
    assert message in refused(run(main, argv), capsys)
