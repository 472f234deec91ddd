"""classify.py on a split in ImageFolder layout: each image as before, then top-1 and top-k against the class
folders, and the classes most often confused."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch

from helpers import refused, write_colour_checkpoint
from image_classification.deploy.inference import main as classify_main
from image_classification.system.cli import run

CLASSES = ["class_00", "class_01", "class_02"]
FP32 = ["--precision", "FP32", "--cpu", "--image-size", "32"]  # 32 px: the size the colours were trained at


@pytest.fixture(scope="module")
def weights(image_folder, tmp_path_factory) -> dict[str, Path]:
    """The colour model as trained (no class names recorded), and with the class folders' names recorded."""
    folder = tmp_path_factory.mktemp("weights")
    plain = write_colour_checkpoint(image_folder, folder / "plain.pth.tar")
    checkpoint = torch.load(plain, weights_only=True)
    checkpoint["classes"] = CLASSES
    torch.save(checkpoint, folder / "named.pth.tar")
    return {"plain": plain, "named": folder / "named.pth.tar"}


@pytest.fixture
def split(image_folder, tmp_path) -> Path:
    """A copy of the colour dataset's val/ (4 images a class), one red image moved into the blue folder."""
    copy = Path(shutil.copytree(image_folder / "val", tmp_path / "val"))
    (copy / "class_00" / "img_003.jpg").rename(copy / "class_02" / "red.jpg")
    return copy


def outputs(capsys, argv: list[str]) -> tuple[list[str], list[str]]:
    assert run(classify_main, argv) == 0
    captured = capsys.readouterr()
    return captured.out.splitlines(), captured.err.splitlines()


def test_a_split_gets_each_images_predictions_then_top1_topk_and_the_confusions(weights, split, capsys):
    argv = ["--weights", str(weights["named"]), *FP32, "--image", str(split)]
    out, err = outputs(capsys, [*argv, "--json", "--topk", "1"])
    *images, summary = [json.loads(line) for line in out]
    assert err == []
    assert [Path(record["path"]).relative_to(split).parts[0] for record in images] == \
        ["class_00"] * 3 + ["class_01"] * 4 + ["class_02"] * 5  # walked class by class, as training does
    assert all(len(record["predictions"]) == 1 for record in images)  # --topk as asked; top-3 counted all the same
    assert summary == {"split": str(split), "images": 12, "left_out": 0, "classes": 3, "top1": 91.67,
                       "top3": 100.0, "confused": [{"true": "class_02", "predicted": "class_00", "images": 1}]}

    out, err = outputs(capsys, argv)
    assert out[-4:] == ["", f"{split}: top-1 91.67%, top-3 100.00% of 12 images in 3 class folders",
                        "most often confused (true class -> predicted class, images):",
                        "  class_02 -> class_00  1"]
    assert out[0] == str(split / "class_00" / "img_000.jpg") and out[1].startswith("class_00: ")


def test_a_splits_images_are_predicted_as_when_they_are_given_one_by_one(weights, split, capsys):
    """The same preprocessing (the weights' size, the turn by the EXIF orientation) and the same batches."""
    argv = ["--weights", str(weights["named"]), *FP32, "--json", "--topk", "3", "--image"]
    whole, _ = outputs(capsys, [*argv, str(split)])
    files = sorted(split.glob("*/*.jpg"))
    alone, _ = outputs(capsys, [*argv, *map(str, files)])
    assert whole[:-1] == alone


def test_a_folder_no_class_of_the_weights_bears_is_said_and_counts_as_wrong(weights, split, image_folder,
                                                                            capsys):
    zebra = split / "zebra"
    zebra.mkdir()
    for image in sorted((image_folder / "val" / "class_01").iterdir())[:2]:
        shutil.copy(image, zebra / image.name)
    (split / ".ipynb_checkpoints").mkdir()  # a folder of no images is no class to say
    out, err = outputs(capsys, ["--weights", str(weights["named"]), *FP32, "--json", "--image", str(split)])
    assert err == [f"warning: 1 class folder of {split} (zebra) is not the name of one class of the weights: "
                   "its 2 images count as wrong"]
    summary = json.loads(out[-1])
    assert (summary["images"], summary["classes"], summary["top1"]) == (14, 5, round(100 * 11 / 14, 2))
    assert {"true": "zebra", "predicted": "class_01", "images": 2} in summary["confused"]


def test_a_split_whose_folders_name_no_class_of_the_weights_stops_before_classifying(weights, split, tmp_path,
                                                                                      capsys):
    """Weights that record no names are named by their indices, 0, 1, 2: every figure would be 0, a wrong
    number; --labels gives the names."""
    plain = ["--weights", str(weights["plain"]), *FP32]
    error = refused(run(classify_main, [*plain, "--image", str(split)]), capsys)
    assert error == (f"error: none of the 3 class folders of {split} (class_00, class_01, class_02) is the name "
                     "of a class of the weights (0, 1, 2), so no image could count as right; pass --labels FILE, "
                     "the folder names one a line in the weights' class order")
    root = split.parent
    error = refused(run(classify_main, [*plain, "--image", str(root)]), capsys)
    assert error.endswith(f"give one of its splits, e.g. {root}/val")

    labels = tmp_path / "labels.txt"
    labels.write_text("\n".join(CLASSES) + "\n")
    out, _ = outputs(capsys, [*plain, "--labels", str(labels), "--json", "--image", str(split)])
    assert json.loads(out[-1])["top1"] == 91.67


def test_a_split_is_walked_by_trainings_rules_and_its_unreadable_images_are_left_out(weights, split, capsys):
    """A link into another class folder is not followed (the image would count twice, under two classes), an
    image that cannot be read is named and left out, as training does, and the figures say how many."""
    os.symlink(split / "class_01" / "img_000.jpg", split / "class_02" / "linked.jpg")
    (split / "class_02" / "broken.jpg").write_bytes(b"not a jpeg")
    out, err = outputs(capsys, ["--weights", str(weights["named"]), *FP32, "--image", str(split)])
    assert len(err) == 2, err
    linked, broken = split / "class_02" / "linked.jpg", split / "class_02" / "broken.jpg"
    assert err[0].startswith(f"warning: leaving out {linked}: links into another class folder")
    assert err[1].startswith(f"warning: skipped: {broken} could not be read")
    assert (f"{split}: top-1 91.67%, top-3 100.00% of 12 images in 3 class folders (1 unreadable, left out: "
            "each is named above)") in out


def test_a_split_of_empty_class_folders_is_one_line_before_the_model_is_built(tmp_path, capsys):
    for name in CLASSES:
        (tmp_path / "val" / name).mkdir(parents=True)
    error = refused(run(classify_main, ["--image", str(tmp_path / "val")]), capsys)
    assert error == f"error: folder {tmp_path / 'val'} holds no image files, nor do its 3 class folders"
