"""Which files a class holds, how they open, and what reading them leaves behind in the training process."""

from __future__ import annotations

import contextlib
import io
import os
import random

import numpy as np
import pytest
import torch
from PIL import Image

from helpers import REPO, one_error_line, run_script, write_image_folder
from image_classification.data.common import DataConfig
from image_classification.data.files import open_rgb, walk_class
from image_classification.data.folder import folder_loaders
from image_classification.data.layout import check_dataset, list_samples
from image_classification.inference import load_image
from image_classification.runtime import make_runtime


@pytest.fixture
def folder(tmp_path):
    return write_image_folder(tmp_path / "data", num_classes=3, train_per_class=8, val_per_class=2)


def _labels_by_class(samples, classes):
    counts = {name: 0 for name in classes}
    for path, label in samples:
        counts[classes[label]] += 1
    return counts


def test_a_symlink_loop_does_not_relabel_images(folder, capsys):
    train = folder / "train"
    os.symlink("..", train / "class_00" / "loop")  # train/class_00/loop -> train/
    os.symlink("../class_01", train / "class_00" / "sibling")  # another class's images
    classes = check_dataset(str(folder), None, want_train=True, want_val=True)
    samples = list_samples(train, classes)
    assert _labels_by_class(samples, classes) == {"class_00": 8, "class_01": 8, "class_02": 8}
    for path, label in samples:  # every image keeps its own folder's label
        assert os.path.realpath(path).split(os.sep)[-2] == classes[label]
    err = capsys.readouterr().err
    assert "not following" in err and "loop" in err and "another class folder" in err
    list_samples(train, classes)
    assert capsys.readouterr().err == ""  # each link is reported once


def test_links_inside_a_class_are_followed_once(folder):
    extra = folder / "extra"
    extra.mkdir()
    Image.new("RGB", (8, 8)).save(extra / "x.jpg")
    class_dir = folder / "train" / "class_02"
    os.symlink(extra, class_dir / "more")
    os.symlink(extra, class_dir / "again")  # the same directory twice: its image counts once
    walk = walk_class(class_dir, folder / "train")
    assert len(walk.files) == 9 and any("already walked" in problem for problem in walk.skipped_links)


def test_sixteen_bit_greyscale_is_scaled_not_clipped(tmp_path):
    ramp = np.linspace(0, 65535, 256 * 4, dtype=np.uint16).reshape(4, 256)
    path = tmp_path / "ramp16.png"
    Image.fromarray(ramp).save(path)  # a 16-bit greyscale PNG
    assert Image.open(path).mode.startswith("I")
    expected = np.rint(ramp / 257.0)
    for image in (open_rgb(path), load_image(path)):  # training and classify.py
        pixels = np.asarray(image)
        assert image.mode == "RGB" and pixels.shape == (4, 256, 3)
        assert np.abs(pixels[..., 0] - expected).max() <= 1
        assert abs(pixels.mean() - 127.5) < 1  # a saturating conversion gives about 254


def _loader_config(data, workers):
    return DataConfig(data=str(data), backend="pytorch", image_size=32, batch_size=4, workers=workers, seed=3,
                      crop_scale=(0.3, 1.0))


def test_reading_with_no_workers_leaves_the_training_process_generators_alone(folder):
    runtime = make_runtime("cpu", False, None, "nchw", False)
    classes = check_dataset(str(folder), None, want_train=True, want_val=False)

    def batches(workers):
        train, _ = folder_loaders(_loader_config(folder, workers), runtime, classes, want_train=True, want_val=False)
        train.set_epoch(1)
        return [images.clone() for images, _ in train]

    def draws():
        return torch.rand(3), random.random(), np.random.rand()

    def seed_all():
        torch.manual_seed(11)
        random.seed(11)
        np.random.seed(11)

    seed_all()
    expected = draws()
    seed_all()
    in_process = batches(0)
    after = draws()
    assert torch.equal(after[0], expected[0]) and after[1:] == expected[1:]
    with_workers = batches(2)
    assert len(in_process) == len(with_workers) == 6
    # the same crops and flips (workers normalise with a fused multiply-add: rounding differs)
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(in_process, with_workers))


@pytest.fixture
def data_check(capsys):
    """``python -m image_classification.data.check ARGS``, run in this process (see helpers.run_script)."""
    return lambda *argv: run_script(["-m", "image_classification.data.check", *argv], capsys, cwd=REPO)


def test_data_check_reports_every_kind_of_problem(folder, data_check):
    clean = data_check(folder, "-j", "1")
    assert clean.returncode == 0, clean.stderr
    assert "train/: 3 classes, 24 images" in clean.stdout and "val/: 3 classes, 6 images" in clean.stdout
    assert "ok: nothing to fix" in clean.stdout

    (folder / "train" / "class_00" / "empty.jpg").write_bytes(b"")
    whole = (folder / "train" / "class_01" / "img_000.jpg").read_bytes()
    (folder / "train" / "class_01" / "img_000.jpg").write_bytes(whole[: len(whole) // 2])  # truncated
    os.symlink("..", folder / "train" / "class_02" / "loop")
    (folder / "train" / "class_99").mkdir()
    (folder / "val" / "class_98").mkdir()
    Image.new("RGB", (8, 8)).save(folder / "val" / "class_98" / "a.png")
    found = data_check(folder, "-j", "2")
    assert found.returncode == 1, found.stderr
    out = found.stdout
    assert "train/: 4 classes, 25 images" in out  # 24 + empty.jpg; the loop adds none
    assert "train/ unreadable images: 2" in out and "empty.jpg" in out and "img_000.jpg" in out
    assert "train/ links not followed: 1" in out and "class_02/loop" in out
    assert "train/ class folders without images: 1" in out
    assert "classes only in train/: class_99" in out and "classes only in val/: class_98" in out


def test_data_check_on_a_folder_that_is_not_a_dataset(tmp_path, data_check):
    missing = data_check(tmp_path / "nothing")
    assert one_error_line(missing).startswith("error: dataset directory")
    empty = data_check(tmp_path)
    assert "neither train/ nor val/" in one_error_line(empty)


def test_more_workers_than_cores_are_capped_with_one_notice(folder, tiny_arch, capsys):
    cores = len(os.sched_getaffinity(0))
    result = run_script(
        [REPO / "main.py", "--data-backend", "pytorch", "-a", tiny_arch, "--image-size", "32", "-b", "4",
         "--epochs", "1", "--prof", "1", "-j", str(cores + 4), "--workspace", folder / "ws", folder], capsys)
    assert result.returncode == 0, result.stderr[-2000:]
    notice = f"-j {cores + 4} is more than the {cores} cores this process may use: {cores} loader workers"
    assert result.stdout.count(notice) == 1
    assert "worker processes in total" not in result.stderr  # torch's DataLoader warning


def test_training_crops_follow_torchvision_random_resized_crop():
    """The tensor augmentation draws exactly torchvision's RandomResizedCrop boxes (area and aspect
    distributions included): under the same seed, the same box as torchvision's own get_params."""
    from torchvision import transforms as T
    from torchvision.transforms import functional as F

    from image_classification.data.folder import train_transform

    config = DataConfig(data=None, backend="pytorch", image_size=32, batch_size=4, crop_scale=(0.08, 1.0), hflip=0)
    ours = train_transform(config)
    image = torch.randint(0, 256, (3, 60, 80), dtype=torch.uint8)
    areas = []
    for seed in range(200):
        torch.manual_seed(seed)
        top, left, height, width = T.RandomResizedCrop.get_params(image, [0.08, 1.0], [3 / 4, 4 / 3])
        expected = F.resized_crop(image, top, left, height, width, [32, 32], antialias=True)
        torch.manual_seed(seed)
        # the same box; v2 resizes uint8 with its own kernel, so a pixel may round one level apart
        assert (ours(image).int() - expected.int()).abs().max() <= 1, seed
        areas.append(height * width / (60 * 80))
    assert 0.08 <= min(areas) and max(areas) <= 1.0 and 0.3 < sum(areas) / len(areas) < 0.7


def test_jpegs_decode_to_the_same_pixels_as_pil(tmp_path):
    from image_classification.data.files import read_rgb_tensor

    path = tmp_path / "photo.jpg"
    from skimage import data as samples

    Image.fromarray(samples.chelsea()).save(path, quality=90)
    ours = read_rgb_tensor(str(path)).permute(1, 2, 0).numpy().astype(int)
    pil = np.asarray(Image.open(path).convert("RGB")).astype(int)
    assert ours.shape == pil.shape and np.abs(ours - pil).mean() < 1.0  # libjpeg-turbo both: IDCT rounding only


def _linked_dataset(tmp_path):
    from conftest import write_image_folder

    root = write_image_folder(tmp_path / "d", num_classes=2, train_per_class=3, val_per_class=2)
    train, val = root / "train", root / "val"
    (train / "class_00" / "x.jpg").symlink_to(train / "class_01" / "img_000.jpg")  # a file of another class
    (train / "class_00" / "v").symlink_to(val / "class_01")  # validation images, another label
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "o.jpg").write_bytes((train / "class_00" / "img_000.jpg").read_bytes())
    (train / "class_00" / "o").symlink_to(outside)
    (train / "class_01" / "o").symlink_to(outside)  # the same outside folder under two classes
    return root


def test_links_never_relabel_an_image_or_leak_validation_into_training(tmp_path, capsys):
    """Each image counts once, under the class folder it lives in; every link refused is said once."""
    from image_classification.data.check import main as check_main
    from image_classification.data.layout import list_samples

    root = _linked_dataset(tmp_path)
    samples = list_samples(root / "train", ["class_00", "class_01"])
    real = {os.path.realpath(path): label for path, label in samples}
    assert len(real) == len(samples) == 3 + 3 + 1  # the outside image once, under the first class
    assert all("/val/" not in path for path in real)
    assert all(label == int(path.split("class_0")[1][0]) for path, label in real.items() if "/d/" in path)
    warnings = capsys.readouterr().err
    assert warnings.count("not following") == 3
    assert "another class folder" in warnings and "another split" in warnings and "already walked" in warnings
    from image_classification.cli import run

    run(check_main, [str(root)])
    report = capsys.readouterr().out
    assert "train/: 2 classes, 7 images" in report and "train/ links not followed: 3" in report


def test_data_check_writes_to_the_stdout_of_the_moment_it_runs(folder):
    """A redirect made after import (a caller's, pytest's capture) gets the report."""
    from image_classification.data.check import check

    with contextlib.redirect_stdout(io.StringIO()) as report:
        assert check(folder, workers=0) == 0
    assert "ok: nothing to fix" in report.getvalue()
