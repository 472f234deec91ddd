"""Phone photographs as a person sees them: every backend, decoder and scale turns a JPEG by its EXIF
orientation before it draws a crop box, and its crops are those of the same photograph stored turned (each
backend against itself); weights recorded before the turn see images as stored; a damaged or hostile EXIF
block is no tag."""

from __future__ import annotations

import io
import struct
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image, ImageOps

from helpers import REPO, run_script
from image_classification.data import DataConfig, get_loaders, reduced
from image_classification.data.common import STD_255
from image_classification.data.files import decode_rgb_tensor, open_rgb
from image_classification.data.orientation import (ORIENTATION_TAG, image_orientation, jpeg_orientation,
                                                   turn_image, turn_tensor)
from image_classification.data.pack import Resizing
from image_classification.deploy.inference import image_transform, load_resized
from image_classification.models.preprocessing import Preprocessing
from image_classification.system.runtime import Runtime

SIZE = 32
WIDTH, HEIGHT = 151, 101  # odd sides: libjpeg's reduced decode ends in a partial column and row
ORIENTATIONS = range(1, 9)
# The mean difference per image, in grey levels, from the crops of the photograph stored turned: a full
# decode differs by the JPEG's re-encoding alone (0.1 measured); a reduced one also averages other pixel pairs
# where a flip moves libjpeg's blocks (0.9 measured; 3 to 7 when the partial column's overhang is left out)
FULL_LEVELS, REDUCED_LEVELS = 0.5, 1.5


def photograph() -> Image.Image:
    """A non-square picture no turn leaves alike: a wave across, another down, a soft blue spot near the
    top-left corner (smooth, so that re-encoding it turned changes a pixel by a grey level or so)."""
    y, x = np.mgrid[0:HEIGHT, 0:WIDTH].astype(float)
    red = 128 + 100 * np.sin(2 * np.pi * x / 47)
    green = 128 + 100 * np.sin(2 * np.pi * y / 31)
    blue = 40 + 200 * np.exp(-((x - 22) ** 2 + (y - 16) ** 2) / (2 * 9 ** 2))
    return Image.fromarray(np.clip(np.stack([red, green, blue], -1), 0, 255).astype(np.uint8))


def jpeg(image: Image.Image, orientation: int | None = None, exif: bytes | None = None) -> bytes:
    """``image`` as a JPEG (quality 100, no chroma subsampling) with an EXIF orientation tag when given."""
    if orientation is not None:
        tags = Image.Exif()
        tags[ORIENTATION_TAG] = orientation
        exif = tags.tobytes()
    out = io.BytesIO()
    image.save(out, "JPEG", quality=100, subsampling=0, exif=exif or b"")
    return out.getvalue()


def tagged(orientation: int) -> bytes:
    return jpeg(photograph(), orientation)


def pre_turned(orientation: int) -> bytes:
    """The photograph turned as its tag says (Pillow's ``exif_transpose``), stored so, untagged."""
    return jpeg(ImageOps.exif_transpose(Image.open(io.BytesIO(tagged(orientation)))))


@pytest.fixture(scope="module")
def photos(tmp_path_factory) -> Path:
    """Three ImageFolders of a class per orientation, one photograph in each split: ``tagged`` (stored as the
    camera read it, tagged), ``turned`` (stored turned, untagged) and ``plain`` (stored as read, untagged)."""
    root = tmp_path_factory.mktemp("orientations")
    for kind, encode in (("tagged", tagged), ("turned", pre_turned), ("plain", lambda _: jpeg(photograph()))):
        for split in ("train", "val"):
            for orientation in ORIENTATIONS:
                folder = root / kind / split / f"o{orientation}"
                folder.mkdir(parents=True)
                (folder / "photo.jpg").write_bytes(encode(orientation))
    return root


def passes(root: Path, backend: str, device: str = "cpu", **fields) -> tuple[list[torch.Tensor], list]:
    """One training and one validation pass of ``backend`` on ``root`` (32 px, batches of 4, seed 3, crops of
    at least 60% of the image, so that most decode at half scale): (train, val) images, (train, val)
    targets."""
    settings = dict(data=str(root), data_backend=backend, image_size=SIZE, batch_size=4, seed=3, workers=0,
                    crop_scale=(0.6, 1.0))
    runtime = Runtime(torch.device(device, 0) if device == "cuda" else torch.device(device), None,
                      torch.contiguous_format)
    if "exif_orientation" in fields:  # a preprocessing of weights that record the images as stored
        fields["preprocessing"] = Preprocessing(SIZE, exif_orientation=fields.pop("exif_orientation"))
    train, val = get_loaders(DataConfig(**{**settings, **fields}), runtime, want_train=True, want_val=True)
    train.set_epoch(1)
    val.set_epoch(1)
    batches = [list(loader) for loader in (train, val)]
    return ([torch.cat([images.cpu() for images, _ in batch]) for batch in batches],
            [torch.cat([targets.cpu() for _, targets in batch]) for batch in batches])


def levels_per_image(a: torch.Tensor, b: torch.Tensor) -> list[float]:
    """The mean absolute difference of each pair of normalised images, in grey levels (0-255)."""
    return ((a - b).abs() * torch.tensor(STD_255).view(1, 3, 1, 1)).mean(dim=(1, 2, 3)).tolist()


BACKENDS = [("pytorch", {"decode_scale": "full"}, FULL_LEVELS),
            ("pytorch", {"decode_scale": "auto"}, REDUCED_LEVELS),
            ("pytorch-gpu", {}, FULL_LEVELS),  # its CPU twin: the device code, the CPU's decoder
            ("dali-cpu", {}, FULL_LEVELS)]
BACKEND_IDS = ["pytorch-full", "pytorch-auto", "pytorch-gpu-on-cpu", "dali-cpu"]


def _needs(backend: str) -> None:
    if backend.startswith("dali"):
        pytest.importorskip("nvidia.dali")


# -- reading the tag, turning the pixels -----------------------------------------------------------------
@pytest.mark.parametrize("orientation", ORIENTATIONS)
def test_the_tag_reads_as_pillow_reads_it_in_jpeg_png_and_webp(orientation):
    image = photograph()
    tags = Image.Exif()
    tags[ORIENTATION_TAG] = orientation
    for format in ("JPEG", "PNG", "WEBP"):
        out = io.BytesIO()
        image.save(out, format, exif=tags.tobytes())
        opened = Image.open(io.BytesIO(out.getvalue()))
        assert image_orientation(opened) == opened.getexif()[ORIENTATION_TAG] == orientation
    assert jpeg_orientation(tagged(orientation)) == orientation


# Pillow reads a JPEG's EXIF as it opens it (for its resolution) and warns of a damaged block: the damage is the
# point of these tests, and the warning Pillow's own, about the file
DAMAGED_EXIF_WARNS = pytest.mark.filterwarnings("ignore:Corrupt EXIF data:UserWarning")


@DAMAGED_EXIF_WARNS
def test_a_big_endian_block_reads_as_a_little_endian_one():
    block = b"Exif\0\0MM\0*" + struct.pack(">IH", 8, 1) + struct.pack(">HHIHH", ORIENTATION_TAG, 3, 1, 8, 0)
    assert jpeg_orientation(jpeg(photograph(), exif=block)) == 8
    assert Image.open(io.BytesIO(jpeg(photograph(), exif=block))).getexif()[ORIENTATION_TAG] == 8


@pytest.mark.parametrize("orientation", ORIENTATIONS)
def test_the_pixels_turn_as_pillow_s_exif_transpose_turns_them(orientation):
    stored = Image.open(io.BytesIO(tagged(orientation))).convert("RGB")
    expected = np.asarray(ImageOps.exif_transpose(Image.open(io.BytesIO(tagged(orientation)))).convert("RGB"))
    assert np.array_equal(np.asarray(turn_image(stored, orientation)), expected)
    tensor = turn_tensor(torch.from_numpy(np.array(stored)).permute(2, 0, 1), orientation)
    assert np.array_equal(tensor.permute(1, 2, 0).numpy(), expected)
    assert np.array_equal(decode_rgb_tensor(tagged(orientation)).permute(1, 2, 0).numpy(), expected)
    assert np.array_equal(np.asarray(open_rgb(io.BytesIO(tagged(orientation)))), expected)


def _block(entries: list[bytes], count: int | None = None, first: int = 8, after: int = 0) -> bytes:
    """A little-endian EXIF block: its first directory at ``first``, holding ``entries`` (``count`` of them,
    it says), pointing to a next one at ``after``."""
    number = len(entries) if count is None else count
    return b"Exif\0\0II*\0" + struct.pack("<IH", first, number) + b"".join(entries) + struct.pack("<I", after)


def _entry(kind: int, count: int, value: bytes, tag: int = ORIENTATION_TAG) -> bytes:
    return struct.pack("<HHI", tag, kind, count) + value


HOSTILE = {
    "a directory past the block's end": b"Exif\0\0II*\0" + struct.pack("<I", 0xFFFFFF00),
    "a directory inside the header": b"Exif\0\0II*\0" + struct.pack("<I", 0),
    "directories that point to themselves": _block([_entry(4, 1, struct.pack("<I", 8), tag=0x8769),
                                                   _entry(3, 1, struct.pack("<HH", 0, 0))], after=8),
    "65535 entries in a block of one": _block([_entry(3, 1, struct.pack("<HH", 6, 0), tag=0x0100)],
                                              count=65535),
    "an orientation of 0": _block([_entry(3, 1, struct.pack("<HH", 0, 0))]),
    "an orientation of 9": _block([_entry(3, 1, struct.pack("<HH", 9, 0))]),
    "an orientation of 65535": _block([_entry(3, 1, struct.pack("<HH", 65535, 0))]),
    "an entry cut short": _block([_entry(3, 1, struct.pack("<HH", 6, 0))])[:22],
    "a TIFF header alone": b"Exif\0\0II*\0",
    "no TIFF header": b"Exif\0\0" + b"\xff" * 40,
    "nothing after Exif": b"Exif\0\0",
}


@pytest.mark.parametrize("damage", HOSTILE)
@DAMAGED_EXIF_WARNS
def test_a_damaged_or_hostile_exif_block_reads_as_no_tag_and_the_image_decodes_as_stored(damage):
    raw = jpeg(photograph(), exif=HOSTILE[damage])
    started = time.perf_counter()
    assert jpeg_orientation(raw) == 1
    assert time.perf_counter() - started < 0.05
    stored = decode_rgb_tensor(jpeg(photograph()))
    assert torch.equal(decode_rgb_tensor(raw), stored)
    assert np.array_equal(np.asarray(open_rgb(io.BytesIO(raw))), stored.permute(1, 2, 0).numpy())


def test_a_block_of_many_entries_is_read_once_without_looping():
    """64 KB of entries, none the orientation: read in one pass, in milliseconds."""
    entries = [_entry(3, 1, struct.pack("<HH", 6, 0), tag=0x0100)] * 5400
    started = time.perf_counter()
    assert jpeg_orientation(jpeg(photograph(), exif=_block(entries))) == 1
    assert time.perf_counter() - started < 0.5


def test_a_malformed_entry_reads_as_dali_reads_it_so_that_the_backends_agree():
    """DALI takes the 16 bits the entry's value field starts with, whatever type and count it claims: so does
    the reader every other path uses."""
    for kind, count in ((4, 1), (3, 2), (3, 0), (1, 1)):
        block = _block([_entry(kind, count, struct.pack("<HH", 6, 0))])
        assert jpeg_orientation(jpeg(photograph(), exif=block)) == 6


# -- every backend --------------------------------------------------------------------------------------
@pytest.mark.parametrize("backend, fields, bound", BACKENDS, ids=BACKEND_IDS)
def test_every_backend_trains_and_validates_on_the_photograph_as_a_person_sees_it(photos, backend, fields,
                                                                                   bound, monkeypatch):
    """Validation's centre crops and training's random crops (their boxes drawn in the turned image) are those
    of the photograph stored turned, for each of the eight orientations; half-scale decodes included."""
    _needs(backend)
    reduced_scales = []
    drafted = reduced.drafted
    monkeypatch.setattr(reduced, "drafted", lambda raw, w, h, scale: reduced_scales.append(scale)
                        or drafted(raw, w, h, scale))
    ours, ours_targets = passes(photos / "tagged", backend, **fields)
    turned, turned_targets = passes(photos / "turned", backend, **fields)
    assert [t.tolist() for t in ours_targets] == [t.tolist() for t in turned_targets]
    for split in (0, 1):
        assert len(ours[split]) == 8 and max(levels_per_image(ours[split], turned[split])) < bound
    if fields.get("decode_scale") == "auto":
        assert len(reduced_scales) >= 16 and set(reduced_scales) == {2}  # both splits decoded at half scale


@pytest.mark.parametrize("backend, fields, _", BACKENDS, ids=BACKEND_IDS)
def test_weights_recorded_before_the_turn_see_the_images_as_stored_on_every_backend(photos, backend, fields,
                                                                                    _):
    _needs(backend)
    ours, ours_targets = passes(photos / "tagged", backend, exif_orientation=False, **fields)
    plain, plain_targets = passes(photos / "plain", backend, **fields)
    assert all(torch.equal(a, b) for a, b in zip(ours + ours_targets, plain + plain_targets))


@pytest.mark.parametrize("backend", ["pytorch", "dali-cpu"])
def test_the_packed_shards_give_the_tagged_folder_s_batches_bitwise(photos, tmp_path, backend):
    """The pack stores each file's bytes, tag and all: the shards turn as the folder does, in both ways."""
    _needs(backend)
    destination = tmp_path / "packed"
    result = run_script(["-m", "image_classification.data.pack", photos / "tagged", destination], cwd=REPO)
    assert result.returncode == 0, result.stderr
    for turn in (True, False):
        folder, shards = (passes(root, backend, exif_orientation=turn)
                          for root in (photos / "tagged", destination))
        assert all(torch.equal(a, b) for a, b in zip(folder[0] + folder[1], shards[0] + shards[1]))


@pytest.mark.parametrize("orientation", ORIENTATIONS)
def test_a_pack_that_resizes_an_image_keeps_its_orientation_tag(orientation):
    """``--max-size`` stores the pixels as stored, smaller, and the tag with them: decoded, they are the
    smaller copy of the photograph stored turned."""
    resizing = Resizing(120, 100)
    smaller = resizing.shrink(tagged(orientation))
    assert jpeg_orientation(smaller) == orientation
    expected = decode_rgb_tensor(resizing.shrink(jpeg(photograph())), turn=False)
    assert torch.equal(decode_rgb_tensor(smaller, turn=False), expected)
    assert torch.equal(decode_rgb_tensor(smaller), turn_tensor(expected, orientation))


# -- classify.py, --evaluate, model2onnx.py's calibration -----------------------------------------------
@pytest.mark.parametrize("decode_scale", ["auto", "full"])
def test_classify_prepares_the_photograph_as_a_person_sees_it(photos, decode_scale):
    preprocessing = Preprocessing(SIZE)
    transform = image_transform(preprocessing)
    for orientation in ORIENTATIONS:
        ours, turned = (transform(load_resized(photos / kind / "val" / f"o{orientation}" / "photo.jpg",
                                               preprocessing, decode_scale)) for kind in ("tagged", "turned"))
        assert levels_per_image(ours[None], turned[None])[0] < REDUCED_LEVELS


def test_classify_shows_weights_recorded_before_the_turn_the_image_as_stored(photos):
    preprocessing = Preprocessing(SIZE, exif_orientation=False)
    transform = image_transform(preprocessing)
    for orientation in ORIENTATIONS:
        ours, plain = (transform(load_resized(photos / kind / "val" / f"o{orientation}" / "photo.jpg",
                                              preprocessing)) for kind in ("tagged", "plain"))
        assert torch.equal(ours, plain)


# -- on a GPU (their CPU twins above) -------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("backend", ["pytorch-gpu", "dali-gpu"])
def test_on_cuda_the_gpu_decoders_turn_as_their_cpu_twins_do(photos, backend):
    """nvJPEG through torchvision (which leaves the tag to the workers' reading) and through DALI (which reads
    it itself, the validation window too): the crops of the photograph stored turned, on the same device; as
    stored, the untagged photograph's bit for bit."""
    _needs(backend)
    ours, ours_targets = passes(photos / "tagged", backend, device="cuda")
    turned, turned_targets = passes(photos / "turned", backend, device="cuda")
    assert [t.tolist() for t in ours_targets] == [t.tolist() for t in turned_targets]
    assert all(max(levels_per_image(a, b)) < FULL_LEVELS for a, b in zip(ours, turned))
    stored = passes(photos / "tagged", backend, device="cuda", exif_orientation=False)
    plain = passes(photos / "plain", backend, device="cuda")
    assert all(torch.equal(a, b) for a, b in zip(stored[0] + stored[1], plain[0] + plain[1]))
