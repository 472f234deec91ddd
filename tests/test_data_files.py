"""Which files a class holds, how they open, and what reading them leaves behind in the training process."""

from __future__ import annotations

import contextlib
import io
import os
import random
import re
import struct

import numpy as np
import pytest
import torch
from PIL import Image

from helpers import REPO, FakeCuda, libjpeg_decode, one_error_line, run_script, write_image_folder
from image_classification.data import common
from image_classification.data.common import DataConfig, DeviceLoader
from image_classification.data.files import open_rgb, walk_class
from image_classification.data.folder import folder_loaders
from image_classification.data.layout import check_dataset, list_samples
from image_classification.deploy.inference import load_image
from image_classification.system.runtime import Runtime, make_runtime

LEFT_OUT = "train/ entries left out (links not followed, files that are not regular): {}"


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
    assert "leaving out" in err and "loop" in err and "another class folder" in err
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
    with Image.open(path) as image:
        assert image.mode.startswith("I")
    expected = np.rint(ramp / 257.0)
    for image in (open_rgb(path), load_image(path)):  # training and classify.py
        pixels = np.asarray(image)
        assert image.mode == "RGB" and pixels.shape == (4, 256, 3)
        assert np.abs(pixels[..., 0] - expected).max() <= 1
        assert abs(pixels.mean() - 127.5) < 1  # a saturating conversion gives about 254


def _loader_config(data, workers):
    return DataConfig(data=str(data), data_backend="pytorch", image_size=32, batch_size=4, workers=workers, seed=3,
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
    # the same crops, flips and normalisation: the workers' (x - mean) / std is the main process's, bit for bit
    # (as it is the CUDA prefetcher's, which normalises the uint8 batch on the device the same way)
    assert all(torch.equal(a, b) for a, b in zip(in_process, with_workers))


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
    assert LEFT_OUT.format(1) in out and "class_02/loop" in out
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

    from image_classification.data.transforms import TrainTransform

    config = DataConfig(data=None, data_backend="pytorch", image_size=32, batch_size=4, crop_scale=(0.08, 1.0), hflip=0)
    ours = TrainTransform(config)
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


@pytest.mark.parametrize("interpolation", ["bilinear", "bicubic"])
def test_training_crops_are_torchvision_s_pixels_exactly(interpolation):
    """A sample seeded as before gets the same box and the same pixels as torchvision's v2 transforms give
    (resuming a run made before the faster crop replays the same images)."""
    from torchvision.transforms import v2

    from image_classification.data.transforms import INTERPOLATION, TrainTransform

    config = DataConfig(data=None, data_backend="pytorch", image_size=32, batch_size=4, interpolation=interpolation)
    ours = TrainTransform(config)
    theirs = v2.Compose([v2.RandomResizedCrop(32, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3),
                                              interpolation=INTERPOLATION[interpolation], antialias=True),
                         v2.RandomHorizontalFlip(0.5)])
    image = torch.randint(0, 256, (3, 75, 100), dtype=torch.uint8)
    for seed in range(40):
        torch.manual_seed(seed)
        expected = theirs(image)
        torch.manual_seed(seed)
        assert torch.equal(ours(image), expected), seed


def test_a_worker_s_batch_is_normalised_in_shared_memory(monkeypatch):
    """Workers hand the training process (x - mean) / std in NCHW; the batch is made in shared memory, so
    passing it over costs no copy of it."""
    from image_classification.data import folder as folder_module, workers

    images = [torch.randint(0, 256, (8, 6, 3), dtype=torch.uint8) for _ in range(3)]
    batch = [(images[0], 0, None), (None, 1, ("broken.jpg", "OSError: truncated")), (images[1], 2, None),
             (images[2], 1, None)]
    mean, std = torch.tensor([120.0, 110.0, 100.0]), torch.tensor([60.0, 55.0, 50.7])
    normalize = (mean.view(1, 3, 1, 1), std.view(1, 3, 1, 1))
    monkeypatch.setattr(workers, "get_worker_info", lambda: object())  # as inside a worker
    out, labels, broken = folder_module.collate_uint8(batch, normalize)
    expected = (torch.stack(images).permute(0, 3, 1, 2).float() - mean.view(1, 3, 1, 1)) / std.view(1, 3, 1, 1)
    assert out.shape == (3, 3, 8, 6) and out.is_contiguous() and torch.equal(out, expected)
    assert labels.tolist() == [0, 2, 1] and broken == [("broken.jpg", "OSError: truncated")]
    assert out.is_shared()
    uint8, _, _ = folder_module.collate_uint8(batch)  # CUDA: uint8 NCHW, normalised on the device
    assert uint8.dtype == torch.uint8 and uint8.is_shared() and torch.equal(uint8, torch.stack(images).permute(0, 3, 1, 2))


def test_jpegs_decode_to_the_same_pixels_as_pil(tmp_path):
    from image_classification.data.files import read_rgb_tensor

    path = tmp_path / "photo.jpg"
    samples = pytest.importorskip("skimage.data")

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
    assert warnings.count("leaving out") == 3
    assert "another class folder" in warnings and "another split" in warnings and "already walked" in warnings
    from image_classification.system.cli import run

    run(check_main, [str(root)])
    report = capsys.readouterr().out
    assert "train/: 2 classes, 7 images" in report and LEFT_OUT.format(3) in report


def test_a_hard_linked_image_counts_once_and_the_start_up_says_how_many_were_left_out(tmp_path, capsys):
    """cp -al and deduplicating tools give one file two names, in two classes: it counts under the name walked
    first; one warning says how many images were left out for it, data.check lists each."""
    from conftest import write_image_folder
    from image_classification.data.check import main as check_main
    from image_classification.data.layout import list_samples
    from image_classification.system.cli import run

    root = write_image_folder(tmp_path / "d", num_classes=2, train_per_class=3, val_per_class=2)
    train = root / "train"
    os.link(train / "class_00" / "img_000.jpg", train / "class_01" / "dup_a.jpg")
    os.link(train / "class_00" / "img_001.jpg", train / "class_01" / "dup_b.jpg")
    samples = list_samples(train, ["class_00", "class_01"])
    assert len(samples) == 6 and not any("dup_" in path for path, _ in samples)
    warnings = capsys.readouterr().err.splitlines()
    assert warnings == [f"warning: leaving out 2 images that are hard links to images already counted under "
                        f"another name, the first {train / 'class_01' / 'dup_a.jpg'}, the same file as "
                        f"{train / 'class_00' / 'img_000.jpg'} (a file counts once, under the name walked first; "
                        "python -m image_classification.data.check lists them all)"]
    run(check_main, [str(root)])
    report = capsys.readouterr().out
    assert "train/: 2 classes, 6 images" in report and LEFT_OUT.format(2) in report
    assert f"{train / 'class_01' / 'dup_b.jpg'}: a hard link to an image already counted under another name " \
           f"({train / 'class_00' / 'img_001.jpg'})" in report


# -- one size rule: every backend and data.check -------------------------------------------------------
def write_grey_jpeg(path, width: int, height: int) -> None:
    """A real baseline JPEG of uniform grey 128, written without ever holding its pixels: with the standard
    tables each 8x8 block of that grey codes as the same 6 bits (DC unchanged, end of block), so 20000x20000
    is 4.7 MB made in milliseconds."""
    buffer = io.BytesIO()
    Image.new("L", (16, 16), 128).save(buffer, "JPEG", quality=90)
    data = buffer.getvalue()
    frame = data.index(b"\xff\xc0")
    data = data[:frame + 5] + struct.pack(">HH", height, width) + data[frame + 9:]
    scan = data.index(b"\xff\xda")
    start = scan + 2 + struct.unpack(">H", data[scan + 2:scan + 4])[0]
    blocks = -(-width // 8) * -(-height // 8)
    assert blocks % 4 == 0  # four blocks fill three bytes exactly
    path.write_bytes(data[:start] + b"\x28\xa2\x8a" * (blocks // 4) + b"\xff\xd9")


def write_black_png(path, width: int, height: int) -> None:
    """A real 1-bit greyscale PNG, all black: 20000x20000 compresses to about 50 KB."""
    import zlib

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    row = b"\x00" * (1 + -(-width // 8))  # filter byte, then the row's bits
    compressor = zlib.compressobj(6)
    pixels = b"".join(compressor.compress(row) for _ in range(height)) + compressor.flush()
    header = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", pixels) + chunk(b"IEND", b""))


def test_the_grey_jpeg_writer_writes_a_real_jpeg(tmp_path):
    write_grey_jpeg(tmp_path / "grey.jpg", 64, 48)
    write_black_png(tmp_path / "black.png", 70, 9)
    assert np.asarray(Image.open(tmp_path / "grey.jpg")).tolist() == [[128] * 64] * 48
    assert np.asarray(Image.open(tmp_path / "black.png").convert("L")).tolist() == [[0] * 70] * 9


# 20000x20000 is past twice PIL's limit (where PIL refuses); 9472x9472 is past it by 0.3% (where PIL warns).
OVERSIZED = ("jpeg_20000.jpg", "png_20000.png", "jpeg_9472.jpg")


@pytest.fixture(scope="module")
def oversized(tmp_path_factory):
    """A two-class dataset whose class_00 holds, in train/ and val/, the images past the size rule."""
    root = write_image_folder(tmp_path_factory.mktemp("oversized"), num_classes=2, train_per_class=6,
                              val_per_class=2)
    for split in ("train", "val"):
        folder = root / split / "class_00"
        write_grey_jpeg(folder / OVERSIZED[0], 20000, 20000)
        write_black_png(folder / OVERSIZED[1], 20000, 20000)
        write_grey_jpeg(folder / OVERSIZED[2], 9472, 9472)
    return root


def _warned(err: str) -> list[str]:
    """The names of the images skipped as too large in ``err``, one entry per warning."""
    return sorted(line.split("/")[-1].split(" ")[0] for line in err.splitlines()
                  if line.startswith("warning: skipped unreadable image")
                  and line.endswith("(ImageTooLarge: more than 89,478,485 pixels)"))


@pytest.mark.parametrize("backend", ["pytorch", "pytorch-gpu", "dali-cpu"])
def test_images_past_the_size_rule_are_skipped_alike_by_every_backend(oversized, backend, capsys):
    """Each image past 89,478,485 pixels is named once, in training and validation, and left out; the
    rest are all seen.  (Before the rule, the pytorch backend trained on the JPEGs and DALI on all.)"""
    seen, err, skipped = _two_epochs(oversized, backend, capsys)
    assert seen == [(15 - 3, 4)] * 2  # training: 5 batches of 3, less the 3 skipped
    assert _warned(err) == sorted(OVERSIZED * 2)
    assert skipped == (3, 3)


def _two_epochs(root, backend: str, capsys) -> tuple[list[tuple[int, int]], str, tuple[int, int]]:
    """Two epochs of training and validation at 32 px, batches of 3: the images each pass saw, (train, val) per
    epoch; what was said on stderr; how many images each loader skipped."""
    if backend == "dali-cpu":
        pytest.importorskip("nvidia.dali")
    from image_classification.data import get_loaders

    runtime = make_runtime("cpu", False, None, "nchw", False)
    config = DataConfig(data=str(root), data_backend=backend, image_size=32, batch_size=3, workers=0)
    train, val = get_loaders(config, runtime, want_train=True, want_val=True)
    capsys.readouterr()
    seen = []
    for epoch in (0, 1):
        train.set_epoch(epoch)
        val.set_epoch(epoch)
        seen.append(tuple(sum(len(targets) for _, targets in loader) for loader in (train, val)))
    return seen, capsys.readouterr().err, (train.skipped, val.skipped)


def test_data_check_applies_the_same_size_rule(oversized, data_check):
    result = data_check(str(oversized), "-j", "1")
    assert result.returncode == 1
    for split in ("train", "val"):
        assert f"{split}/ unreadable images: 3" in result.stdout
    flagged = [line for line in result.stdout.splitlines() if "(ImageTooLarge: more than 89,478,485 pixels)" in line]
    assert sorted(line.strip().split("/")[-1].split(" ")[0] for line in flagged) == sorted(OVERSIZED * 2)


def test_classify_refuses_an_image_past_the_size_rule_in_one_line(oversized):
    from image_classification.errors import UserError

    path = oversized / "val" / "class_00" / OVERSIZED[1]
    for decode in (False, True):
        with pytest.raises(UserError, match="more than 89,478,485 pixels"):
            load_image(path, decode=decode)


# -- the size rule for the resize of validation and classify.py -----------------------------------------------
# At 32 px crops validation resizes the short side to 37 px: a 65,361 x 1 strip would become 37 x 2,418,357,
# 89,479,209 pixels, past the rule; 65,360 x 1 makes 89,477,840, within it.  Both decode to a few hundred KB.
STRIPS = {"wide_65361.png": (65361, 1), "tall_65361.png": (1, 65361)}
KEPT_STRIP = ("wide_65360.png", (65360, 1))


@pytest.fixture(scope="module")
def strips(tmp_path_factory):
    """A two-class dataset whose class_00 holds, in train/ and val/, the strips of STRIPS and KEPT_STRIP."""
    root = write_image_folder(tmp_path_factory.mktemp("strips"), num_classes=2, train_per_class=6,
                              val_per_class=2)
    for split in ("train", "val"):
        for name, (width, height) in (*STRIPS.items(), KEPT_STRIP):
            write_black_png(root / split / "class_00" / name, width, height)
    return root


def _warned_resize(err: str, short_side: int) -> list[str]:
    """The names of the images skipped in ``err`` as too large once resized to ``short_side``."""
    words = f"(ImageTooLarge: more than 89,478,485 pixels once resized to a {short_side} px short side (a "
    return sorted(line.split("/")[-1].split(" ")[0] for line in err.splitlines()
                  if line.startswith("warning: skipped unreadable image") and words in line)


@pytest.mark.parametrize("backend", ["pytorch", "pytorch-gpu", "dali-cpu"])
def test_validation_skips_an_image_whose_resize_breaks_the_size_rule_on_every_backend(strips, backend, capsys):
    """A strip of 65,361 x 1 pixels passes the size rule, but resized to a 37 px short side it would make 89.5
    million pixels (a 200,000 x 1 one, 13 billion at 256 px: a MemoryError); validation names it once and leaves
    it out, on either backend, to the pixel the same rule.  Training crops before it resizes: it keeps them."""
    seen, err, skipped = _two_epochs(strips, backend, capsys)
    assert seen == [(15, 4 + 1)] * 2  # training: all 15 images; validation keeps the 65,360-pixel strip
    assert _warned_resize(err, 37) == sorted(STRIPS)
    assert skipped == (0, 2)


def test_data_check_names_the_strips_validation_could_not_resize(strips, data_check):
    """Only val/ is resized whole; its resize is main.py's for 224 px crops (256) unless told."""
    for flags, short_side, flagged in (((), 256, sorted([*STRIPS, KEPT_STRIP[0]])),
                                       (("--val-resize-size", "37"), 37, sorted(STRIPS))):
        result = data_check(str(strips), "-j", "1", *flags)
        assert result.returncode == 1 and "train/ unreadable images" not in result.stdout, result.stdout
        assert f"val/ unreadable images: {len(flagged)}" in result.stdout
        words = f"(ImageTooLarge: more than 89,478,485 pixels once resized to a {short_side} px short side (a "
        named = [line.strip() for line in result.stdout.splitlines() if words in line]
        assert sorted(line.split("/")[-1].split(" ")[0] for line in named) == flagged


def test_classify_s_reader_applies_the_resize_s_size_rule_to_the_pixel(tmp_path):
    """At 224 px crops classify.py resizes the short side to 256: 1,366 x 1 pixels would make 89,522,176,
    1,365 x 1 makes 89,456,640; the first is refused from its header, the second read."""
    from image_classification.errors import UserError

    write_black_png(tmp_path / "past.png", 1366, 1)
    write_black_png(tmp_path / "within.png", 1365, 1)
    for decode in (False, True):
        with pytest.raises(UserError, match=r"past.png could not be read as an image \(more than 89,478,485 "
                                            r"pixels once resized to a 256 px short side \(a 349,696 px long side"):
            load_image(tmp_path / "past.png", decode=decode, short_side=256)
        load_image(tmp_path / "within.png", decode=decode, short_side=256)


# -- the frame header found is the one libjpeg decodes -----------------------------------------------------
def _frame(width: int, height: int) -> bytes:
    """A baseline frame header (SOF0) of one component."""
    return b"\xff\xc0" + struct.pack(">HBHHB", 11, 8, height, width, 1) + b"\x01\x11\x00"


def _comment(body: bytes) -> bytes:
    return b"\xff\xfe" + struct.pack(">H", 2 + len(body)) + body


def write_tem_jpeg(path, width: int, height: int) -> None:
    """A real ``width`` x ``height`` JPEG behind a TEM marker (FF 01, which has no length), two junk bytes
    and a comment holding a fake 8x8 frame header.  Read as if FF 01 had a length, the junk (6) lands on
    the fake frame; libjpeg skips the junk (warning of 2 extraneous bytes), then the comment, and decodes
    the real frame."""
    write_grey_jpeg(path, width, height)
    real = path.read_bytes()
    path.write_bytes(real[:2] + b"\xff\x01" + b"\x00\x06" + _comment(_frame(8, 8)) + real[2:])


@pytest.fixture(scope="module")
def tem_folder(tmp_path_factory):
    """A two-class dataset whose class_00 holds, in train/ and val/, a 9500x9500 JPEG behind a TEM marker."""
    root = write_image_folder(tmp_path_factory.mktemp("tem"), num_classes=2, train_per_class=5, val_per_class=2)
    for split in ("train", "val"):
        write_tem_jpeg(root / split / "class_00" / "tem_9500.jpg", 9500, 9500)
    return root


def test_a_large_jpeg_behind_a_marker_without_length_breaks_the_size_rule_in_training(tem_folder, capsys):
    """libjpeg decodes the 9500x9500 frame (the header reader once found the fake 8x8 one, and the pytorch
    backend trained on the image); both splits now leave it out under the size rule."""
    path = tem_folder / "train" / "class_00" / "tem_9500.jpg"
    assert libjpeg_decode(path.read_bytes()).shape == (1, 9500, 9500)
    runtime = make_runtime("cpu", False, None, "nchw", False)
    config = DataConfig(data=str(tem_folder), data_backend="pytorch", image_size=32, batch_size=11, workers=0)
    classes = check_dataset(str(tem_folder), None, want_train=True, want_val=True)
    train, val = folder_loaders(config, runtime, classes, want_train=True, want_val=True)
    capsys.readouterr()
    train.set_epoch(0)
    val.set_epoch(0)
    assert sum(len(targets) for _, targets in train) == 10 and sum(len(targets) for _, targets in val) == 4
    assert train.skipped == val.skipped == 1
    assert _warned(capsys.readouterr().err) == ["tem_9500.jpg", "tem_9500.jpg"]


def test_data_check_and_classify_name_the_size_rule_for_it(tem_folder, data_check):
    result = data_check(str(tem_folder), "-j", "1")
    flagged = [line.strip() for line in result.stdout.splitlines() if "tem_9500.jpg" in line]
    assert len(flagged) == 2 and all(line.endswith("(ImageTooLarge: more than 89,478,485 pixels)") for line in flagged)
    from image_classification.errors import UserError

    for decode in (False, True):
        with pytest.raises(UserError, match=r"tem_9500.jpg could not be read as an image \(more than 89,478,485"):
            load_image(tem_folder / "val" / "class_00" / "tem_9500.jpg", decode=decode)


# What may stand between the start of an image and its frame header, and how libjpeg reads it.
DECODED = {
    "fill bytes": b"\xff\xff\xff",
    "TEM": b"\xff\x01",
    "RST0 and RST7": b"\xff\xd0\xff\xd7",
    "junk": b"\x12\x00\x34",
    "a stuffed zero": b"\xff\x00",
    "TEM, junk and a comment holding a fake frame": b"\xff\x01\x00\x06" + _comment(_frame(8, 8)),
    "an APP1 segment holding a fake frame": b"\xff\xe1\x00\x0f" + _frame(8, 8),
    "an APP segment of length 0": b"\xff\xe1\x00\x00",
    "a comment of length 1": b"\xff\xfe\x00\x01",
}
REFUSED = {
    "JPG0 before the frame": b"\xff\xf0\x00\x02",
    "a reserved marker": b"\xff\x02\x00\x02",
    "a second SOI": b"\xff\xd8",
    "EOI": b"\xff\xd9",
    "SOS": b"\xff\xda\x00\x02",
    "a DQT of length 0": b"\xff\xdb\x00\x00",
}


def _small_jpeg() -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (40, 24), (90, 140, 200)).save(buffer, "JPEG")
    return buffer.getvalue()


@pytest.mark.parametrize("inserted", DECODED.values(), ids=DECODED.keys())
def test_the_header_reader_finds_the_frame_libjpeg_decodes(inserted):
    """... and the pytorch backend decodes it where it starts as a JPEG does, to libjpeg's pixels (Pillow gives up
    on a TEM marker or stray bytes before the frame: torchvision's decoder, the last resort, decodes those)."""
    from image_classification.data.files import decode_rgb_tensor, is_jpeg, jpeg_size

    raw = _small_jpeg()
    data = raw[:2] + inserted + raw[2:]
    decoded = libjpeg_decode(data, "RGB")
    assert decoded.shape == (3, 24, 40)
    assert jpeg_size(io.BytesIO(data[2:])) == (40, 24)
    assert not is_jpeg(data) or torch.equal(decode_rgb_tensor(data), decoded)


@pytest.mark.parametrize("inserted", [*REFUSED.values(), None], ids=[*REFUSED.keys(), "the file ends first"])
def test_a_jpeg_libjpeg_finds_no_frame_in_is_unreadable_naming_the_size_rule(inserted, tmp_path, data_check):
    """Where libjpeg stops before a frame header, no size can be known: unreadable on every path, saying
    why, where PIL had opened some of these files (then failed to decode them) or called them unidentifiable."""
    from image_classification.data.files import read_rgb_tensor
    from image_classification.errors import UserError

    raw = _small_jpeg()
    data = raw[:2] + inserted + raw[2:] if inserted is not None else raw[:raw.index(b"\xff\xc0") + 6]
    with pytest.raises(RuntimeError):
        libjpeg_decode(data)
    root = write_image_folder(tmp_path / "data", num_classes=1, train_per_class=1, val_per_class=1)
    path = root / "val" / "class_00" / "odd.jpg"
    path.write_bytes(data)
    rule = "JPEG header cannot be read with certainty (size rule)"
    with pytest.raises(ValueError, match=re.escape(rule)):
        read_rgb_tensor(str(path))
    with pytest.raises(UserError, match=re.escape(rule)):
        load_image(path, decode=False)
    assert f"odd.jpg (UnreadableHeader: {rule}" in data_check(str(root), "-j", "1").stdout


def test_data_check_writes_to_the_stdout_of_the_moment_it_runs(folder):
    """A redirect made after import (a caller's, pytest's capture) gets the report."""
    from image_classification.data.check import check

    with contextlib.redirect_stdout(io.StringIO()) as report:
        assert check(folder, workers=0) == 0
    assert "ok: nothing to fix" in report.getvalue()


def test_the_image_extensions_are_torchvision_imagefolders():
    """The folder walk names its own list (so that data.pack and data.check need no torch): it must take the
    files torchvision's ImageFolder takes, and no others."""
    from torchvision.datasets.folder import IMG_EXTENSIONS

    from image_classification.data.files import IMG_EXTENSIONS as ours

    assert ours == IMG_EXTENSIONS


def test_the_cuda_prefetcher_keeps_one_side_stream_for_every_pass(monkeypatch):
    """The batches the caching allocator keeps for a side stream serve that stream alone: a stream made for each
    pass would strand every earlier pass's cached memory (the CPU twin of the GPU test: torch.cuda's streams
    faked, the batches left on the CPU)."""
    cuda = FakeCuda(monkeypatch)
    monkeypatch.setattr(common, "channel_values", lambda values, device: torch.tensor(values).view(1, 3, 1, 1))
    monkeypatch.setattr(DeviceLoader, "_prepare", lambda self, images, targets: (images, targets))
    batch = (torch.zeros(2, 3, 4, 4, dtype=torch.uint8), torch.zeros(2, dtype=torch.int64))
    loader = DeviceLoader([batch] * 3, Runtime(torch.device("cuda", 1), None, torch.contiguous_format), 6)
    for _ in range(3):
        assert len(list(loader)) == 3
    assert cuda.streams == [torch.device("cuda", 1)]
