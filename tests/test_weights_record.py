"""One reading of what a set of weights records (class count, architecture, preprocessing), shared by
training, --evaluate, classify.py and model2onnx.py."""

from __future__ import annotations

import pytest

from helpers import refused
from image_classification.deploy.inference import main as classify_main
from image_classification.errors import UserError
from image_classification.models import build_model
from image_classification.models.preprocessing import Preprocessing, choose_preprocessing
from image_classification.models.weights import (checked_arch, checked_num_classes, recorded_class_names,
                                                 recorded_num_classes)
from image_classification.system.cli import run
from image_classification.training import main as train_main


def test_the_class_count_is_the_record_else_the_head_rows():
    state = build_model("resnet18", num_classes=7).state_dict()
    assert recorded_num_classes(state) == 7  # a plain state dict: its head
    assert recorded_num_classes({"state_dict": state}) == 7
    assert recorded_num_classes({"arch": "resnet18", "num_classes": 5, "state_dict": state}) == 5  # the record
    assert recorded_num_classes({"arch": "resnet18", "model_options": {"num_classes": 4}}) == 4
    assert recorded_num_classes(None) is None and recorded_num_classes({"optimizer": {}}) is None


def test_the_class_count_check_and_the_class_names():
    state = build_model("resnet18", num_classes=3).state_dict()
    assert checked_num_classes(state, None, "w") == 3 and checked_num_classes(state, 3, "w") == 3
    assert checked_num_classes({}, 8, "w") == 8 and checked_num_classes({}, None, "w") is None
    with pytest.raises(UserError, match="^w has 3 classes, but --num-classes is 10; pass --num-classes 3$"):
        checked_num_classes(state, 10, "w")
    record = {"arch": "resnet18", "num_classes": 3, "classes": ["cat", "dog", "owl"], "state_dict": state}
    assert recorded_class_names(record, 3) == ["cat", "dog", "owl"]
    assert recorded_class_names(record, 4) is None  # names for another head are no names
    assert recorded_class_names({**record, "classes": ["cat", 2, "owl"]}, 3) is None
    assert recorded_class_names(state, 3) is None


def test_the_architecture_check_is_one_message_everywhere(tmp_path, image_folder, capsys):
    assert checked_arch({"arch": "resnet18"}, None, "w") == "resnet18"
    assert checked_arch({}, "resnet50", "w") == "resnet50"
    with pytest.raises(UserError, match="w holds a resnet18 checkpoint, not resnet50; pass --arch resnet18"):
        checked_arch({"arch": "resnet18"}, "resnet50", "w")

    workspace = tmp_path / "run"
    common = ["-b", "4", "--image-size", "32", "--device", "cpu", "--data-backend", "pytorch", "-j", "0",
              "--workspace", str(workspace)]
    assert train_main(["-a", "resnet18", "--epochs", "1", *common, str(image_folder)]) == 0
    path = workspace / "checkpoint.pth.tar"
    expected = f"{path} holds a resnet18 checkpoint, not resnet34; pass --arch resnet18"
    assert expected in refused(run(train_main, ["-a", "resnet34", "--resume", str(path), *common,
                                                str(image_folder)]), capsys)
    assert expected in refused(run(classify_main, ["-a", "resnet34", "--weights", str(path), "--image",
                                                   str(next(image_folder.glob("val/*/*.jpg")))]), capsys)
    for pretrained in (["--pretrained-weights", str(path)], ["--evaluate", "--pretrained-weights", str(path)]):
        argv = ["-a", "resnet34", *pretrained, "--epochs", "1", *common, "--workspace", str(tmp_path / "new")]
        line = refused(run(train_main, [*argv, str(image_folder)]), capsys)
        assert line == f"error: {expected}", line  # not the keys that do not fit, one by one


def test_flags_beat_the_record_which_beats_the_default_and_each_override_is_said_once():
    lines: list[str] = []
    assert choose_preprocessing(None, 224, "w", lines.append) == Preprocessing(224)
    recorded = Preprocessing(64, "bicubic", 64 / 72, train_crop_size=48)
    assert choose_preprocessing(recorded, 224, "w", lines.append) == recorded and lines == []
    chosen = choose_preprocessing(recorded, 224, "'w.pth'", lines.append, image_size=96)
    assert (chosen.image_size, chosen.train_size, chosen.interpolation) == (96, 96, "bicubic")
    assert chosen.crop_ratio == recorded.crop_ratio  # the record's resize rule, at the new size
    assert lines == ["--image-size 96 overrides the 64 recorded in 'w.pth' (and its 48 px training crops)"]
    lines.clear()
    chosen = choose_preprocessing(recorded, 224, "w", lines.append, val_resize_size=80, interpolation="bilinear")
    assert (chosen.image_size, chosen.resize_size, chosen.train_size) == (64, 80, 48)
    assert lines == ["--val-resize-size 80 overrides the 72 recorded in w",
                     "--interpolation bilinear overrides the bicubic recorded in w"]
    with pytest.raises(UserError, match="--val-resize-size 60 is smaller than the validation crop, 64"):
        choose_preprocessing(None, 64, "w", lines.append, val_resize_size=60)


@pytest.mark.parametrize("sizes, message", [
    ({"image_size": 9000}, "--image-size 9000 is outside 32-8192"),
    ({"train_crop_size": 9000}, "--train-crop-size 9000 is outside 32-8192"),
    ({"val_crop_size": 32, "val_resize_size": 400}, "--val-resize-size 400 is more than 10 times the validation crop"),
])
def test_sizes_a_checkpoint_could_not_record_are_refused(sizes, message):
    """Every preprocessing chosen reads back from the checkpoint it is recorded in."""
    with pytest.raises(UserError, match=message):
        choose_preprocessing(None, 224, "w", print, **sizes)
    fine = choose_preprocessing(None, 224, "w", print, val_crop_size=32, val_resize_size=320)
    assert Preprocessing.from_dict(fine.to_dict()) == fine


@pytest.mark.parametrize("recorded, flags, origin", [
    (None, {"image_size": 8192, "val_resize_size": 9460}, "--val-resize-size 9460 for 8192 px crops"),
    (Preprocessing(64, crop_ratio=0.1), {"val_crop_size": 1024}, "--val-crop-size 1024 with the crop ratio 0.1 "
                                                                   "recorded in w"),
    (Preprocessing(8192, crop_ratio=0.5), {}, "w records 8192 px crops with crop ratio 0.5"),
])
def test_a_validation_resize_larger_than_an_image_may_be_is_refused_naming_what_set_it(recorded, flags, origin):
    """The resize of a square image may hold no more pixels than a decoded image may (89,478,485, a
    9,459 px side): each size passes its own rule, their combination is refused for training, --evaluate,
    classify.py and export alike, as they all choose here."""
    with pytest.raises(UserError, match=f"^{origin}: a [0-9]+ px short side, .* more than the 89,478,485 an "
                                        "input image may have"):
        choose_preprocessing(recorded, 224, "w", print, **flags)
    fits = choose_preprocessing(None, 224, "w", print, image_size=8192, val_resize_size=9459)
    assert fits.resize_size == 9459 and choose_preprocessing(None, 224, "w", print, image_size=8192).resize_size == 9362
