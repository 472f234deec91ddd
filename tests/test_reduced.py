"""Reduced-size JPEG decoding (``--decode-scale auto``): the draws, the geometry and the bound on the pixels."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from conftest import write_image_folder
from image_classification.data import reduced
from image_classification.data.common import DataConfig, sample_seed
from image_classification.data.files import decode_rgb_tensor
from image_classification.data.folder import ImageFiles
from image_classification.data.layout import data_change_notice, open_split
from image_classification.data.transforms import INTERPOLATION, TrainTransform, resized_crop, val_transform
from image_classification.deploy.inference import load_resized
from image_classification.models.preprocessing import Preprocessing, val_resize_size

PHOTOS = ("astronaut", "coffee", "chelsea", "rocket")


@pytest.fixture(scope="module")
def camera(tmp_path_factory) -> Path:
    """scikit-image's photographs upscaled to 1024x768 with grain (a camera's texture, smaller), quality 90, a class
    each, 6 train and 2 val images per class."""
    samples = pytest.importorskip("skimage.data")
    root = tmp_path_factory.mktemp("camera")
    rng = np.random.default_rng(0)
    for name in PHOTOS:
        photo = Image.fromarray(getattr(samples, name)()).convert("RGB")
        for split, count in (("train", 6), ("val", 2)):
            folder = root / split / name
            folder.mkdir(parents=True)
            for index in range(count):
                size = (1024, 768) if index % 2 == 0 else (768, 1024)  # landscape and portrait
                pixels = np.asarray(photo.resize(size, Image.BICUBIC), dtype=np.float32)
                pixels = pixels + rng.normal(0, 6, size=pixels.shape[:2] + (1,))
                Image.fromarray(np.clip(np.rint(pixels), 0, 255).astype(np.uint8)).save(
                    folder / f"img_{index}.jpg", quality=90)
    return root


def test_a_box_is_decoded_reduced_only_where_it_keeps_the_output_s_pixels():
    """The largest of 8, 4, 2 at which the box's shorter side holds ``s`` times the output; 1 below twice it, so
    nothing is upsampled that a full decode would not upsample."""
    assert reduced.crop_scale(2000, 1800, 224) == 8 and reduced.crop_scale(1792, 5000, 224) == 8
    assert reduced.crop_scale(1791, 5000, 224) == 4 and reduced.crop_scale(448, 448, 224) == 2
    assert reduced.crop_scale(447, 4000, 224) == 1 and reduced.crop_scale(100, 100, 224) == 1
    # validation: the reduced short side, ceil(side / s), still at least the resize's
    assert reduced.resize_scale(4032, 3024, 256) == 8 and reduced.resize_scale(500, 375, 256) == 1
    assert reduced.resize_scale(2041, 4000, 256) == 8 and reduced.resize_scale(2040, 4000, 256) == 4
    assert reduced.resized_size(500, 375, 256) == (341, 256) and reduced.resized_size(375, 500, 256) == (256, 341)


def passes(root: Path, size: int, decode_scale: str, interpolation: str = "bilinear"):
    """Every train sample's crop (epoch 0's seeds) and every val sample's centre crop, uint8 HWC, as the pytorch
    backend's workers make them."""
    classes = list(PHOTOS)
    config = DataConfig(str(root), "pytorch", size, 4, interpolation=interpolation, crop_scale=(0.25, 1.0))
    train = ImageFiles(open_split(root, "train", classes), TrainTransform(config), tensors=True,
                       decode_scale=decode_scale, interpolation=interpolation)
    resize = val_resize_size(size)
    val = ImageFiles(open_split(root, "val", classes), val_transform(size, interpolation), resize=resize,
                     decode_scale=decode_scale, interpolation=interpolation)
    crops = [train[(index, sample_seed(5, 0, index))] for index in range(len(train.samples))]
    centres = [val[(index, 0)] for index in range(len(val.samples))]
    for image, _, problem in crops + centres:
        assert problem is None and image is not None
    return torch.stack([image for image, _, _ in crops]), torch.stack([image for image, _, _ in centres])


def grey_levels(a: torch.Tensor, b: torch.Tensor) -> tuple[float, int]:
    difference = (a.int() - b.int()).abs()
    return float(difference.float().mean()), int(difference.max())


@pytest.mark.parametrize("size, interpolation", [(64, "bilinear"), (112, "bicubic"), (224, "bilinear")])
def test_reduced_batches_stay_within_the_documented_bound_of_the_full_decode(camera, size, interpolation,
                                                                             monkeypatch):
    """The same boxes (drawn from the header) and the same validation geometry; the pixels differ from a full
    decode's by at most MEAN_BOUND grey levels on average and MAX_BOUND at any pixel, on photographs; and the
    reduced scales are really used."""
    scales = []
    drafted = reduced.drafted
    monkeypatch.setattr(reduced, "drafted", lambda raw, w, h, scale: scales.append(scale) or drafted(raw, w, h, scale))
    ours = passes(camera, size, "auto", interpolation)
    assert max(scales) >= (4 if size < 224 else 2), scales
    theirs = passes(camera, size, "full", interpolation)
    for mine, full in zip(ours, theirs):
        assert mine.shape == full.shape
        mean, largest = grey_levels(mine, full)
        print(f"{size} {interpolation}: mean {mean:.3f}, max {largest}")
        assert mean <= reduced.MEAN_BOUND and largest <= reduced.MAX_BOUND, (mean, largest)


def test_decode_scale_full_gives_today_s_pixels_and_a_small_box_is_decoded_whole(camera):
    """``full``: torchvision's decode and torch's resize of the box, bit for bit; ``auto`` where the box is under
    twice the output (here, every box at 400 px crops of a 768 px short side): the same bits."""
    config = DataConfig(str(camera), "pytorch", 400, 4, crop_scale=(0.25, 1.0))
    samples = open_split(camera, "train", list(PHOTOS))
    for mode in ("full", "auto"):
        dataset = ImageFiles(samples, TrainTransform(config), tensors=True, decode_scale=mode)
        for index in range(4):
            seed = sample_seed(1, 0, index)
            image, _, _ = dataset[(index, seed)]
            whole = decode_rgb_tensor(samples.read(index))
            torch.manual_seed(seed)
            draw = TrainTransform(config).draw(*whole.shape[-2:])
            assert reduced.crop_scale(draw.box[2], draw.box[3], 400) == 1
            expected = resized_crop(whole, draw.box, 400, INTERPOLATION["bilinear"])
            if draw.flip:
                expected = expected.flip(-1)
            assert torch.equal(image, expected.permute(1, 2, 0)), (mode, index)


def test_a_jpeg_that_breaks_after_its_header_is_reported_as_unreadable(camera, tmp_path):
    """Decoded only once its box is drawn: a JPEG cut short is still left out with Pillow's words."""
    raw = (camera / "train" / "astronaut" / "img_0.jpg").read_bytes()
    root = tmp_path / "cut"
    (root / "train" / "a").mkdir(parents=True)
    (root / "train" / "a" / "cut.jpg").write_bytes(raw[:len(raw) // 3])
    config = DataConfig(str(root), "pytorch", 64, 1, crop_scale=(0.9, 1.0))
    dataset = ImageFiles(open_split(root, "train", ["a"]), TrainTransform(config), tensors=True, decode_scale="auto")
    image, _, problem = dataset[(0, 3)]
    assert image is None and problem[0].endswith("cut.jpg") and problem[1].startswith("OSError: ")


def test_classify_resizes_from_the_reduced_decode_to_the_full_decode_s_size(camera):
    """classify.py, ``--evaluate``'s checks and int8 calibration: the resize of the full decode's size, within the
    bound; ``--decode-scale full`` the image validation made before."""
    path = camera / "val" / "rocket" / "img_1.jpg"  # portrait
    preprocessing = Preprocessing(64)
    auto, full = load_resized(path, preprocessing), load_resized(path, preprocessing, "full")
    assert auto.size == full.size == (73, 97)
    before = val_transform(64)(Image.open(path).convert("RGB"))
    assert np.array_equal(np.asarray(val_transform(64)(full)), np.asarray(before))
    mean, largest = grey_levels(torch.from_numpy(np.array(auto)), torch.from_numpy(np.array(full)))
    assert mean <= reduced.MEAN_BOUND and largest <= reduced.MAX_BOUND


def test_a_resume_at_another_decode_scale_or_max_size_says_what_changed():
    """The checkpoint records how its JPEGs were decoded (one of an earlier version decoded every pixel) and the
    pack's --max-size: a resume that reads them otherwise says so; the same reading says nothing."""
    images = {"images": 12, "names_sha256": "ab" * 32}
    auto = {**images, "decode_scale": "auto"}
    assert data_change_notice(auto, auto, 3) is None
    said = data_change_notice(images, auto, 0)
    assert said.startswith("=> the JPEGs were decoded with --decode-scale full then, auto now: the same images, "
                           "order and crop boxes") and "not bitwise exact" in said
    said = data_change_notice({**auto, "max_size": 512}, {**auto, "max_size": 256}, 2)
    assert said.startswith("=> the training images were packed with --max-size 512 then, packed with --max-size "
                           "256 now: ")
    assert "at their own size now" in data_change_notice({**auto, "max_size": 512}, auto, 2)
    assert "dataset changed" in data_change_notice({**auto, "images": 11}, {**auto, "max_size": 512}, 0)


def test_training_with_reduced_decoding_resumes_bitwise_and_records_the_scale(tmp_path, tiny_arch):
    """Photographs large enough that the boxes are decoded at 1/2 and 1/4: a run resumed at an epoch boundary
    ends with the weights of one that was not; the checkpoint records the scale, and a resume with
    ``--decode-scale full`` says that its pixels differ."""
    from test_training import assert_same_weights, train

    data = write_image_folder(tmp_path / "data", train_per_class=6, val_per_class=2, size=(320, 240))
    common = ["--data-backend", "pytorch", "-j", "0", "--epochs", "2", "--seed", "7", "--image-size", "32",
              "--crop-scale", "0.4", "1"]
    assert train(data, tmp_path / "straight", *common) == 0
    assert train(data, tmp_path / "staged", *common, "--run-epochs", "1") == 0
    first = torch.load(tmp_path / "staged" / "checkpoint.pth.tar", weights_only=True)
    assert first["dataset"]["decode_scale"] == "auto"
    assert train(data, tmp_path / "staged", *common, "--resume", "auto") == 0
    straight = torch.load(tmp_path / "straight" / "checkpoint.pth.tar", weights_only=True)
    staged = torch.load(tmp_path / "staged" / "checkpoint.pth.tar", weights_only=True)
    assert_same_weights(straight["state_dict"], staged["state_dict"])
    full = []
    assert train(data, tmp_path / "full", *common, "--run-epochs", "1", "--decode-scale", "full") == 0
    assert torch.load(tmp_path / "full" / "checkpoint.pth.tar", weights_only=True)["dataset"]["decode_scale"] == "full"
    del full


def test_pack_max_size_stores_large_images_smaller_and_keeps_small_ones(camera, tmp_path, capsys):
    """Images above S on their longer side are stored at S (JPEG of the quality asked), the others byte for byte;
    the manifest records S and Q; the fingerprint says S, so a resume onto another copy is told; data.check
    says what the copy changed."""
    import json

    from image_classification.data.check import check
    from image_classification.data.pack import pack, resizing
    from image_classification.data.packed import open_packed_split
    from image_classification.errors import UserError

    source = tmp_path / "source"
    for split in ("train", "val"):
        for name in PHOTOS[:2]:
            (source / split / name).mkdir(parents=True)
            for path in sorted((camera / split / name).iterdir())[:2]:
                (source / split / name / path.name).write_bytes(path.read_bytes())
    small = source / "train" / PHOTOS[0] / "small.png"
    Image.new("RGB", (200, 150), (10, 20, 30)).save(small)
    pack(source, tmp_path / "packed", workers=2, resizing=resizing(512, 80))
    manifest = json.loads((tmp_path / "packed" / "train" / "manifest.json").read_text())
    assert (manifest["max_size"], manifest["quality"]) == (512, 80)
    split = open_packed_split(tmp_path / "packed" / "train", list(PHOTOS[:2]))
    names = [split.names(index) for index in range(len(split))]
    for index, name in enumerate(names):
        raw = split.read(index)
        if name.endswith("small.png"):
            assert raw == small.read_bytes()
            continue
        with Image.open(io.BytesIO(raw)) as image:
            assert image.format == "JPEG" and max(image.size) == 512 and image.size in ((512, 384), (384, 512))
    assert split.fingerprint()["max_size"] == 512
    check(tmp_path / "packed", 1)
    assert "packed with --max-size 512 --quality 80" in capsys.readouterr().out
    with pytest.raises(UserError, match="--quality"):
        resizing(None, 80)
    with pytest.raises(UserError, match="1 to 100"):
        resizing(512, 101)
