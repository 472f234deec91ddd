"""A model is fed as it was trained: checkpoints record their preprocessing and every consumer uses it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from helpers import refused
from image_classification.deploy import inference
from image_classification.deploy.export import checkpoint2model_main, model2onnx_main
from image_classification.deploy.inference import image_transform, load_model
from image_classification.models.preprocessing import Preprocessing
from image_classification.records.raport import read_raport
from image_classification.system.cli import run
from image_classification.training import main as train_main

TRAIN_SIZE = 32


@pytest.fixture(scope="module")
def trained(tmp_path_factory, image_folder) -> Path:
    """A checkpoint trained at 32 px with bicubic resizing (a size and filter no default would guess)."""
    root = tmp_path_factory.mktemp("trained32")
    assert train_main(["-a", "resnet18", "--image-size", str(TRAIN_SIZE), "--interpolation", "bicubic", "-b", "8",
                       "--device", "cpu", "--epochs", "1", "--prof", "1", "--data-backend", "pytorch", "-j", "0",
                       "--seed", "2", "--workspace", str(root), str(image_folder)]) == 0
    return root / "checkpoint.pth.tar"


def test_validation_preprocessing_computed_by_hand():
    """Short side to round(224 / 0.875) = 256, centre 224 crop, ImageNet mean/std: checked without the code."""
    data = pytest.importorskip("skimage.data")

    image = Image.fromarray(data.coffee())  # 600 x 400
    width, height = image.size
    new_w, new_h = int(256 * width / height), 256
    resized = image.resize((new_w, new_h), Image.BILINEAR)
    left, top = int(round((new_w - 224) / 2.0)), int(round((new_h - 224) / 2.0))
    crop = np.asarray(resized.crop((left, top, left + 224, top + 224)), dtype=np.float32)
    mean = np.array([0.485, 0.456, 0.406], dtype=np.float32) * 255
    std = np.array([0.229, 0.224, 0.225], dtype=np.float32) * 255
    expected = torch.from_numpy(((crop - mean) / std).transpose(2, 0, 1).copy())
    got = image_transform(224)(image)
    assert got.shape == (3, 224, 224)
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=0)


def test_checkpoint_records_how_its_inputs_were_prepared(trained):
    state = torch.load(trained, weights_only=True)
    recorded = Preprocessing.from_dict(state["preprocessing"])
    assert (recorded.image_size, recorded.interpolation, recorded.resize_size) == (32, "bicubic", 37)
    assert state["preprocessing"]["exif_orientation"] is True and recorded.exif_orientation
    assert state["num_classes"] == 3 and state["classes"] == ["class_00", "class_01", "class_02"]


def _used_preprocessing(monkeypatch) -> list[Preprocessing]:
    used = []
    original = inference.image_transform

    def recording(preprocessing):
        used.append(preprocessing)
        return original(preprocessing)

    monkeypatch.setattr(inference, "image_transform", recording)
    return used


def test_classify_uses_the_trained_size_and_says_when_a_flag_overrides_it(trained, image_folder, monkeypatch, capsys):
    used = _used_preprocessing(monkeypatch)
    image = str(next((image_folder / "val" / "class_01").iterdir()))
    assert run(inference.main, ["--weights", str(trained), "--image", image, "--json", "--precision", "FP32"]) == 0
    assert (used[-1].image_size, used[-1].interpolation) == (32, "bicubic")
    captured = capsys.readouterr()
    assert captured.err == "" and json.loads(captured.out)["predictions"][0]["label"].startswith("class_")
    assert run(inference.main, ["--weights", str(trained), "--image", image, "--image-size", "64"]) == 0
    assert used[-1].image_size == 64 and used[-1].interpolation == "bicubic"
    assert "note: --image-size 64 overrides the 32 recorded in" in capsys.readouterr().err


def test_evaluate_resume_uses_the_trained_size(trained, image_folder, tmp_path, capsys):
    assert train_main(["--evaluate", "--resume", str(trained), "-a", "resnet18", "--device", "cpu", "-b", "8",
                       "--data-backend", "pytorch", "-j", "0", "--workspace", str(tmp_path), str(image_folder)]) == 0
    parameters = [r["data"] for r in read_raport(tmp_path / "experiment_raport.json") if r.get("step") == "PARAMETER"]
    assert parameters[0]["image_size"] == 32 and parameters[0]["interpolation"] == "bicubic"
    assert "overrides" not in capsys.readouterr().out
    assert train_main(["--evaluate", "--resume", str(trained), "-a", "resnet18", "--device", "cpu", "-b", "8",
                       "--image-size", "48", "--data-backend", "pytorch", "-j", "0", "--workspace",
                       str(tmp_path / "b"), str(image_folder)]) == 0
    assert "=> --image-size 48 overrides the 32 recorded in the checkpoint" in capsys.readouterr().out


@pytest.mark.slow
def test_extracted_weights_keep_the_description_and_export_uses_it(trained, tmp_path, capsys):
    weights = tmp_path / "w.pth"
    assert run(checkpoint2model_main, ["--checkpoint-path", str(trained), "--weight-path", str(weights)]) == 0
    loaded = load_model(None, str(weights))
    assert (loaded.arch, loaded.num_classes) == ("resnet18", 3)
    assert loaded.preprocessing.image_size == 32 and loaded.class_names == ["class_00", "class_01", "class_02"]
    onnx = pytest.importorskip("onnx")  # the export needs it, and reads the graph with it
    onnx_path = tmp_path / "w.onnx"
    assert run(model2onnx_main, ["--weights", str(weights), "--output", str(onnx_path), "-b", "1"]) == 0
    batch, *dims = onnx.load(str(onnx_path)).graph.input[0].type.tensor_type.shape.dim
    assert [d.dim_value for d in dims] == [3, 32, 32] and batch.dim_param  # the image size recorded; a free batch


def test_a_head_mismatch_names_the_class_count_and_the_flag(trained, tmp_path, capsys, image_folder):
    image = str(next((image_folder / "val" / "class_01").iterdir()))
    weights = tmp_path / "plain.pth"
    torch.save(torch.load(trained, weights_only=True)["state_dict"], weights)  # no description: a foreign file
    assert run(inference.main, ["-a", "resnet18", "--weights", str(weights), "--num-classes", "10",
                                "--image", image]) == 2
    assert "pass --num-classes 3" in capsys.readouterr().err


GIGAPIXEL_RECORD = {"image_size": 8192, "crop_ratio": 0.1}  # within the record rules: an 81,920 px resize


def test_a_checkpoint_whose_resize_cannot_be_held_is_refused_in_one_line(trained, image_folder, tmp_path, capsys):
    """A sealed checkpoint recording 8192 px crops at ratio 0.1 passed validation, then --evaluate and
    classify.py resized each image to an 81,920 px short side (MemoryError); now they and model2onnx.py
    refuse it before any image is read, naming the record, and --image-size still rescues the weights."""
    from image_classification.records.checkpoint import save_checkpoint, save_weights

    state = torch.load(trained, weights_only=True)
    state["preprocessing"] = {**state["preprocessing"], **GIGAPIXEL_RECORD}
    checkpoint, weights = tmp_path / "gigapixel.pth.tar", tmp_path / "gigapixel.pth"
    save_checkpoint(state, checkpoint)
    save_weights(state["state_dict"], {"arch": "resnet18", "num_classes": 3, "preprocessing": state["preprocessing"]},
                 weights)
    tail = ("a 81920 px short side, 6,710,886,400 pixels for a square image, more than the 89,478,485 an input image "
            "may have (the short side can be at most 9459 px); pass a smaller --image-size")
    line = refused(run(train_main, ["--evaluate", "--resume", str(checkpoint), "-a", "resnet18", "--device", "cpu",
                                    "-b", "8", "--data-backend", "pytorch", "-j", "0", "--workspace",
                                    str(tmp_path / "eval"), str(image_folder)]), capsys)
    assert line == f"error: the checkpoint records 8192 px crops with crop ratio 0.1: {tail}"
    image = str(next((image_folder / "val" / "class_01").iterdir()))
    line = refused(run(inference.main, ["--weights", str(weights), "--image", image]), capsys)
    assert line == f"error: '{weights}' records 8192 px crops with crop ratio 0.1: {tail}"
    assert refused(run(model2onnx_main, ["--weights", str(weights), "--output", str(tmp_path / "w.onnx")]),
                   capsys).endswith(tail)
    assert not (tmp_path / "w.onnx").exists()
    assert run(inference.main, ["--weights", str(weights), "--image", image, "--image-size", "64"]) == 0
    assert "--image-size 64 overrides the 8192 recorded" in capsys.readouterr().err


# -- the EXIF orientation: weights recorded before every backend turned images by it ---------------------
def _recorded_before_the_turn(trained: Path, tmp_path: Path) -> tuple[Path, Path]:
    """The trained checkpoint and its weights as this toolkit wrote them before the turn (no exif_orientation
    in their preprocessing)."""
    from image_classification.records.checkpoint import save_checkpoint, save_weights

    state = torch.load(trained, weights_only=True)
    del state["preprocessing"]["exif_orientation"]
    checkpoint, weights = tmp_path / "before.pth.tar", tmp_path / "before.pth"
    save_checkpoint(state, checkpoint)
    description = {"arch": "resnet18", "num_classes": 3, "preprocessing": state["preprocessing"]}
    save_weights(state["state_dict"], description, weights)
    return checkpoint, weights


def _turns_seen(monkeypatch) -> list[bool]:
    """Whether each data configuration the pytorch backend is given turns images by their EXIF orientation."""
    from image_classification.data import folder

    seen, real = [], folder.folder_loaders

    def recording(config, *args, **kwargs):
        seen.append(config.preprocessing.exif_orientation)
        return real(config, *args, **kwargs)

    monkeypatch.setattr(folder, "folder_loaders", recording)
    return seen


BEFORE = "records no EXIF orientation: its weights were trained on images as stored"


def test_weights_recorded_before_the_turn_are_evaluated_and_classified_on_images_as_stored(
        trained, image_folder, tmp_path, monkeypatch, capsys):
    """--evaluate and classify.py follow the record, and say so in one line."""
    checkpoint, weights = _recorded_before_the_turn(trained, tmp_path)
    seen, used = _turns_seen(monkeypatch), _used_preprocessing(monkeypatch)
    assert train_main(["--evaluate", "--resume", str(checkpoint), "-a", "resnet18", "--device", "cpu", "-b",
                       "8", "--data-backend", "pytorch", "-j", "0", "--workspace", str(tmp_path / "eval"),
                       str(image_folder)]) == 0
    assert seen == [False]
    assert f"=> the checkpoint {BEFORE}, and this run sees them so" in capsys.readouterr().out
    image = str(next((image_folder / "val" / "class_01").iterdir()))
    assert run(inference.main, ["--weights", str(weights), "--image", image]) == 0
    assert used[-1].exif_orientation is False
    assert f"note: '{weights}' {BEFORE}, and this run sees them so" in capsys.readouterr().err


def test_a_fine_tune_from_weights_recorded_before_the_turn_trains_on_turned_images(
        trained, image_folder, tmp_path, monkeypatch, capsys):
    _, weights = _recorded_before_the_turn(trained, tmp_path)
    seen = _turns_seen(monkeypatch)
    assert train_main(["-a", "resnet18", "--pretrained-weights", str(weights), "--image-size", "32", "-b",
                       "8", "--device", "cpu", "--epochs", "1", "--prof", "1", "--data-backend", "pytorch",
                       "-j", "0", "--workspace", str(tmp_path / "tuned"), str(image_folder)]) == 0
    assert seen == [True]
    assert (f"=> {weights} {BEFORE}; this run trains on them turned by their EXIF orientation tag"
            in capsys.readouterr().out)
    state = torch.load(tmp_path / "tuned" / "checkpoint.pth.tar", weights_only=True)
    assert state["preprocessing"]["exif_orientation"] is True


def test_a_resumed_run_recorded_before_the_turn_goes_on_as_stored_and_a_bad_record_is_refused():
    from image_classification.errors import UserError
    from image_classification.models.preprocessing import choose_preprocessing

    old = Preprocessing.from_dict({"image_size": 32})
    lines = []
    chosen = choose_preprocessing(old, 224, "the checkpoint", lines.append, training=True)
    assert chosen.exif_orientation is False and Preprocessing.from_dict(chosen.to_dict()) == chosen
    assert lines == [f"the checkpoint {BEFORE}, and this run goes on training so, not turned by their EXIF "
                     "orientation tag as a new run is"]
    assert choose_preprocessing(None, 224, "the weights", lines.append).exif_orientation is True
    assert len(lines) == 1
    with pytest.raises(UserError, match="exif_orientation true or false"):
        Preprocessing.from_dict({"image_size": 32, "exif_orientation": "yes"})
