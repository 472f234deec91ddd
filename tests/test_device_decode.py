"""The ``pytorch-gpu`` backend: workers read bytes, the training process decodes and augments on the device.

Every test but the GPU ones runs the backend on the CPU, through its Python API with a CPU runtime, where
torchvision's CPU decoder stands in for nvJPEG: the same code, so its batches must be the ``pytorch`` backend's
bit for bit.  The GPU tests (``-m gpu``) hold the device's batches to the CPU's within the decoder's and the
resize's rounding; each has its CPU twin here.
"""

from __future__ import annotations

import io
import re
import sys

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision import transforms

from helpers import REPO, FakeCuda, count_step_syncs, load_script, refused, run_script, train_until_crash, write_image_folder
from image_classification.data import DataConfig, default_backend_notice, get_loaders, resolve_backend
from image_classification.data import decoders, device_decode
from image_classification.data.common import STD_255, ShardSampler
from image_classification.data.encoded import EncodedImages
from image_classification.data.files import decode_rgb_tensor
from image_classification.data.layout import open_split
from image_classification.data.transforms import INTERPOLATION, TrainTransform, crop_box, resized_crop
from image_classification.errors import UserError
from image_classification.system.cli import run
from image_classification.system.runtime import Runtime
from image_classification.training import main

SIZE = 32
PHOTOS = ("astronaut", "chelsea", "coffee", "rocket", "immunohistochemistry", "retina", "hubble_deep_field")
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def runtime(device: str = "cpu", memory_format=torch.contiguous_format) -> Runtime:
    return Runtime(torch.device(device, 0) if device == "cuda" else torch.device(device), None, memory_format)


def passes(root, backend: str, *, device: str = "cpu", epoch: int = 1, start_batch: int = 0, **fields):
    """One training and one validation pass of ``backend`` on ``root`` (32 px, batches of 4, seed 3): each as
    a list of (images, targets) on the CPU, the (train, val) images skipped, and the (train, val) pass counts."""
    settings = dict(data=str(root), data_backend=backend, image_size=SIZE, batch_size=4, seed=3, workers=0)
    memory_format = fields.pop("memory_format", torch.contiguous_format)
    train, val = get_loaders(DataConfig(**{**settings, **fields}), runtime(device, memory_format), want_train=True,
                             want_val=True)
    train.set_epoch(epoch, start_batch)
    val.set_epoch(epoch)
    batches = [[(images.cpu(), targets.cpu()) for images, targets in loader] for loader in (train, val)]
    return (*batches, (train.skipped, val.skipped), (train.pass_counts(), val.pass_counts()))


def same(a: list, b: list) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) and torch.equal(s, t) for (x, s), (y, t) in zip(a, b))


def levels(a: list, b: list) -> float:
    """Mean absolute difference per pixel of two passes' normalised images, in grey levels (0-255)."""
    std = torch.tensor(STD_255).view(1, 3, 1, 1)
    assert [t.tolist() for _, t in a] == [t.tolist() for _, t in b]
    return float(torch.cat([((x - y).abs() * std).flatten() for (x, _), (y, _) in zip(a, b)]).mean())


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    """scikit-image's photographs as JPEGs (a class each), in train/ and val/."""
    samples = pytest.importorskip("skimage.data")

    root = tmp_path_factory.mktemp("photos")
    for split in ("train", "val"):
        for name in PHOTOS:
            folder = root / split / name
            folder.mkdir(parents=True)
            pixels = getattr(samples, name)()
            pixels = np.stack([pixels] * 3, -1) if pixels.ndim == 2 else pixels[..., :3]
            Image.fromarray(pixels).save(folder / "photo.jpg", quality=92)
    return root


# -- the same data as the pytorch backend ---------------------------------------------------------------
@pytest.mark.parametrize("augmentation, workers, memory_format", [
    (None, 0, torch.contiguous_format), (None, 2, torch.channels_last), ("trivialaugment", 0, torch.channels_last),
    ("autoaugment", 2, torch.contiguous_format), ("randaugment", 0, torch.contiguous_format),
])
def test_on_the_cpu_the_batches_are_the_pytorch_backend_s_bit_for_bit(image_folder, augmentation, workers,
                                                                     memory_format):
    """The same crops from the same draws, the same decoder, resize and (x - mean) / std, whatever the workers;
    ``--augmentation`` drawing on from where the crop and flip left each image's generator."""
    fields = dict(augmentation=augmentation, workers=workers, memory_format=memory_format)
    ours, theirs = passes(image_folder, "pytorch-gpu", **fields), passes(image_folder, "pytorch", **fields)
    assert len(ours[0]) == 6 and same(ours[0], theirs[0])
    assert all(images.is_contiguous(memory_format=memory_format) for images, _ in ours[0] + ours[1])
    assert levels(ours[1], theirs[1]) < 0.05  # validation: torch's antialiased resize in place of PIL's


def test_the_crops_are_the_boxes_the_pytorch_backend_draws(image_folder):
    """The workers find each image's size in its header and draw its box and flip under the sample's seed: the
    box torchvision's RandomResizedCrop draws from the decoded image, the flip RandomHorizontalFlip draws."""
    samples = open_split(image_folder, "train", ["class_00", "class_01", "class_02"])
    config = DataConfig(data=str(image_folder), data_backend="pytorch-gpu", image_size=SIZE, batch_size=4,
                        crop_scale=(0.25, 0.9))
    dataset = EncodedImages(samples, TrainTransform(config))
    sampler = ShardSampler(len(samples), 0, 1, shuffle=True, seed=3)
    sampler.set_epoch(2)
    flips = set()
    for index, seed in sampler:
        sample, problem = dataset[(index, seed)]
        assert problem is None and sample.encoded is not None and sample.pixels is None
        image = decoders.cpu_decoder().decode(torch.frombuffer(bytearray(samples.read(index)), dtype=torch.uint8))
        torch.manual_seed(seed)
        box = transforms.RandomResizedCrop.get_params(image, [0.25, 0.9], [3 / 4, 4 / 3])
        assert sample.draw.box == tuple(box) and (sample.height, sample.width) == tuple(image.shape[-2:])
        assert sample.draw.flip == bool(torch.rand(1) < 0.5)
        flips.add(sample.draw.flip)
    assert flips == {True, False}


def test_validation_crops_differ_from_the_pytorch_backend_s_by_the_resize_alone(photos):
    """On real photographs: torch's antialiased uint8 resize against PIL's, the same sizes and offsets (the pytorch
    backend decoding every pixel, as the GPU decodes them)."""
    for size in (224, SIZE):
        ours = passes(photos, "pytorch-gpu", image_size=size, batch_size=7)[1]
        theirs = passes(photos, "pytorch", image_size=size, batch_size=7, decode_scale="full")[1]
        assert levels(ours, theirs) < 0.05, size


@pytest.mark.parametrize("interpolation", ["bilinear", "bicubic"])
def test_the_gpu_s_resize_arithmetic_differs_by_rounding_alone(photos, interpolation):
    """On a GPU torchvision resizes uint8 crops in float32 and rounds back: on real photographs that arithmetic,
    run here, is within a fraction of a grey level of the CPU's uint8 kernel (the GPU test's bound leaves room for
    nvJPEG's decoding on top)."""
    differences = []
    for name in PHOTOS:
        image = decode_rgb_tensor((photos / "train" / name / "photo.jpg").read_bytes(), turn=False)
        for seed in range(4):
            torch.manual_seed(seed)
            box = crop_box(*image.shape[-2:], (0.08, 1.0))
            uint8 = resized_crop(image, box, 224, INTERPOLATION[interpolation])
            as_float = resized_crop(image.float(), box, 224, INTERPOLATION[interpolation])
            rounded = as_float.clamp(0, 255).round().to(torch.uint8)
            differences.append(float((uint8.int() - rounded.int()).abs().float().mean()))
    assert max(differences) < 0.5 and np.mean(differences) < 0.3, differences


def test_a_batch_does_not_depend_on_the_workers_and_an_epoch_resumes_part_way(image_folder):
    full = passes(image_folder, "pytorch-gpu", workers=0)[0]
    assert same(passes(image_folder, "pytorch-gpu", workers=2)[0], full)
    assert same(passes(image_folder, "pytorch-gpu", workers=1, start_batch=2)[0], full[2:])
    assert not same(passes(image_folder, "pytorch-gpu", epoch=2)[0], full)


def test_a_packed_set_gives_its_folder_s_batches(image_folder, tmp_path):
    packed = tmp_path / "packed"
    result = run_script(["-m", "image_classification.data.pack", image_folder, packed, "--shard-size", "64KB"],
                        cwd=REPO)
    assert result.returncode == 0, result.stderr
    folder, shards = passes(image_folder, "pytorch-gpu"), passes(packed, "pytorch-gpu")
    assert same(folder[0], shards[0]) and same(folder[1], shards[1])


# -- what nvJPEG cannot decode ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def mixed_folder(tmp_path_factory):
    """Two classes of JPEGs; class_00 also holds what the workers decode on the CPU (a PNG, a CMYK JPEG), what the
    device's decoder takes besides colour baseline JPEGs (greyscale, progressive) and what nothing decodes
    (truncated, empty, not an image)."""
    root = write_image_folder(tmp_path_factory.mktemp("mixed"), num_classes=2, train_per_class=6, val_per_class=3)
    rng = np.random.default_rng(1)
    photo = Image.fromarray(rng.integers(0, 256, (30, 44, 3), dtype=np.uint8))
    for split in ("train", "val"):
        folder = root / split / "class_00"
        photo.save(folder / "png.png")
        photo.convert("CMYK").save(folder / "cmyk.jpg", quality=90)
        photo.convert("L").save(folder / "grey.jpg", quality=90)
        photo.save(folder / "progressive.jpg", quality=90, progressive=True)
        whole = io.BytesIO()
        photo.save(whole, "JPEG", quality=90)
        (folder / "truncated.jpg").write_bytes(whole.getvalue()[:len(whole.getvalue()) // 2])
        (folder / "empty.jpg").write_bytes(b"")
        (folder / "text.jpg").write_bytes(b"not an image at all")
    return root


def _warnings(err: str) -> list[str]:
    """The skipped-image warnings of ``err``, a PIL message's object address left out."""
    return sorted(re.sub(r" at 0x[0-9a-f]+", "", line) for line in err.splitlines()
                  if line.startswith("warning: skipped unreadable image"))


def passes_with_warnings(root, capsys, device: str = "cpu", batch_size: int = 3) -> tuple[tuple, tuple]:
    """``pytorch-gpu`` (on ``device``) and ``pytorch`` passes over ``root``, each with the skipped-image warnings
    it printed."""
    capsys.readouterr()
    ours = passes(root, "pytorch-gpu", device=device, batch_size=batch_size), _warnings(capsys.readouterr().err)
    theirs = passes(root, "pytorch", batch_size=batch_size), _warnings(capsys.readouterr().err)
    return ours, theirs


def test_the_workers_leave_encoded_only_what_the_gpu_decodes_as_the_cpu_would(mixed_folder):
    """Colour, greyscale and progressive JPEGs go to the device whole; a PNG, a CMYK JPEG, and a JPEG cut short
    or with bytes after its end (which nvJPEG might decode where libjpeg-turbo refuses it, or the reverse) are
    the CPU's."""
    from image_classification.data.encoded import gpu_decodable

    folder = mixed_folder / "train" / "class_00"
    whole = (folder / "img_000.jpg").read_bytes()
    assert gpu_decodable(whole) == (40, 48) and gpu_decodable(whole + b"\0" * 7) == (40, 48)
    for name in ("grey.jpg", "progressive.jpg"):
        assert gpu_decodable((folder / name).read_bytes()) == (30, 44), name
    for raw in ((folder / "png.png").read_bytes(), (folder / "cmyk.jpg").read_bytes(), whole + b"trailer",
                (folder / "truncated.jpg").read_bytes()):
        assert gpu_decodable(raw) is None


def test_what_cannot_be_decoded_is_skipped_and_counted_as_the_pytorch_backend_does(mixed_folder, capsys):
    """PNG, CMYK and truncated JPEGs are decoded by the workers on the CPU (the last refused there), greyscale
    and progressive JPEGs by the device's decoder; each broken image is named once in the pytorch backend's
    words, and counted."""
    (ours, ours_warnings), (theirs, theirs_warnings) = passes_with_warnings(mixed_folder, capsys)
    assert ours[2] == theirs[2] == (3, 3)
    assert ours_warnings == theirs_warnings and len(ours_warnings) == 6
    assert same(ours[0], theirs[0]) and sum(len(t) for _, t in ours[0]) == 18 - 3
    assert levels(ours[1], theirs[1]) < 0.05


def test_a_jpeg_whose_header_says_zero_pixels_is_skipped_and_counted_as_the_pytorch_backend_does(tmp_path, capsys):
    """A frame header of height 0 (or width 0) is no image: the crop box of a 0-pixel image was a
    ZeroDivisionError in a worker.  It is skipped and counted, in the pytorch backend's words."""
    from image_classification.data.encoded import gpu_decodable

    root = write_image_folder(tmp_path / "data", num_classes=2, train_per_class=4, val_per_class=2)
    for split in ("train", "val"):
        raw = bytearray((root / split / "class_00" / "img_000.jpg").read_bytes())
        frame = raw.index(b"\xff\xc0")  # SOF0: length (2 bytes), precision (1), height (2), width (2)
        for name, field in (("zero_high.jpg", frame + 5), ("zero_wide.jpg", frame + 7)):
            flat = bytearray(raw)
            flat[field:field + 2] = b"\0\0"
            (root / split / "class_00" / name).write_bytes(bytes(flat))
            assert gpu_decodable(bytes(flat)) is None
    (ours, ours_warnings), (theirs, theirs_warnings) = passes_with_warnings(root, capsys)
    assert ours[2] == theirs[2] == (2, 2)
    assert ours_warnings == theirs_warnings and len(ours_warnings) == 4
    assert same(ours[0], theirs[0])


def refusing_decoder(monkeypatch, refuses, calls: list | None = None) -> None:
    """The device's decoder replaced by the CPU's, raising ``refuses(data)`` (an exception, or None to decode) for
    a call on ``data``, each call's length appended to ``calls``."""
    real = decoders.cpu_decoder()

    def decode_batch(data, device):
        if calls is not None:
            calls.append(len(data))
        error = refuses(data)
        if error is not None:
            raise error
        return real.decode_batch(data, device)

    fake = decoders.JpegDecoder("refusing", "0", real.decode, decode_batch)
    monkeypatch.setattr(device_decode, "device_decoder", lambda device: fake)


def test_a_jpeg_the_device_s_decoder_refuses_is_decoded_on_the_cpu_counted_and_said_once(image_folder,
                                                                                         monkeypatch, capsys):
    """The device's decoder refusing one image fails the batch's call: the batch is decoded image by image, and the
    one refused goes through the pytorch backend's CPU decoder (the same pixels here).  Each is counted in the pass
    (for the raport's ``train.cpu_decoded``), and the first refusal named once on stderr, where nothing said it."""
    refused_size = len((image_folder / "train" / "class_01" / "img_003.jpg").read_bytes())
    calls = []
    expected = passes(image_folder, "pytorch-gpu")
    assert expected[3] == ({"cpu_decoded": 0}, {"cpu_decoded": 0})
    refusing_decoder(monkeypatch, lambda data: RuntimeError("Error while decoding JPEG images: unsupported")
                     if any(len(one) == refused_size for one in data) else None, calls)
    capsys.readouterr()
    ours = passes(image_folder, "pytorch-gpu")
    assert same(ours[0], expected[0]) and same(ours[1], expected[1])
    assert 1 in calls and 4 in calls  # batches in one call, then the failing one's images one by one
    assert ours[3] == ({"cpu_decoded": 1}, {"cpu_decoded": 0})  # class_01's img_003 is a training image
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("warning: --data-backend pytorch-gpu (train): the device's JPEG "
                                               "decoder refused a run of ") and "unsupported" in err[0], err


def test_an_image_the_device_s_decoder_gives_at_another_size_is_decoded_on_the_cpu_and_counted(image_folder,
                                                                                              monkeypatch):
    """A decoder that turns a JPEG by its own reading of a tag (TorchCodec's, where a file hid the tag from the
    hiding) gives it at another size than its header's: it is taken for a refusal, the CPU decodes the image, the
    batches are the pytorch backend's and the pass counts it."""
    turned = (image_folder / "train" / "class_02" / "img_001.jpg").read_bytes()
    expected = passes(image_folder, "pytorch-gpu")
    real = decoders.cpu_decoder()

    def decode_batch(data, device):
        return [image.transpose(1, 2) if one.numpy().tobytes() == turned else image
                for one, image in zip(data, real.decode_batch(data, device))]

    monkeypatch.setattr(device_decode, "device_decoder",
                        lambda device: decoders.JpegDecoder("turning", "0", real.decode, decode_batch))
    ours = passes(image_folder, "pytorch-gpu")
    assert same(ours[0], expected[0]) and same(ours[1], expected[1])
    assert ours[3] == ({"cpu_decoded": 1}, {"cpu_decoded": 0})


def test_the_decoder_running_out_of_memory_empties_the_cache_once_then_ends_the_run(image_folder, monkeypatch,
                                                                                  capsys):
    """Out of memory is not a JPEG the decoder refuses: no image goes to the CPU for it.  The first time, torch's
    CUDA cache (whose blocks nvJPEG's own allocations cannot use) is emptied and the decode retried, said once;
    an error again goes through, whatever the decoder calls it."""
    emptied, failures = [], iter([torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")])
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: emptied.append(True))
    expected = passes(image_folder, "pytorch-gpu")
    refusing_decoder(monkeypatch, lambda data: next(failures, None))
    capsys.readouterr()
    ours = passes(image_folder, "pytorch-gpu")
    assert same(ours[0], expected[0]) and ours[3] == ({"cpu_decoded": 0}, {"cpu_decoded": 0}) and emptied == [True]
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "ran out of memory decoding JPEGs (OutOfMemoryError: CUDA out of memory." in err[0]
    for message in ("Error while decoding JPEG images: CUDA out of memory. Tried to allocate 20.00 MiB",
                    "Failed to decode batch: 5", "cudaErrorMemoryAllocation: out of memory"):
        refusing_decoder(monkeypatch, lambda data, message=message: RuntimeError(message))
        with pytest.raises(RuntimeError, match=re.escape(message)):
            passes(image_folder, "pytorch-gpu")
    refusing_decoder(monkeypatch, lambda data: RuntimeError("Failed to decode batch: 3"))  # NVJPEG_STATUS_BAD_JPEG
    assert passes(image_folder, "pytorch-gpu")[3][0] == {"cpu_decoded": 24}


def test_every_call_of_the_device_s_decoder_waits_first_for_the_stream_it_allocates_on(image_folder, monkeypatch):
    """torchvision's CUDA decoder writes its outputs from a stream that does not wait for the caller's, into blocks
    the caller's stream may still be reading: each call, the batch's and each one-image retry after a refusal,
    comes after :func:`settle` (the CPU twin of the GPU test below; on the CPU the wait does nothing)."""
    events = []
    refused_size = len((image_folder / "train" / "class_01" / "img_003.jpg").read_bytes())
    refusing_decoder(monkeypatch, lambda data: events.append(("decode", len(data))) or (
        RuntimeError("Error while decoding JPEG images: unsupported")
        if len(data) > 1 and any(len(one) == refused_size for one in data) else None))
    settle = device_decode.settle
    monkeypatch.setattr(device_decode, "settle", lambda device: events.append(("settle", device.type)) or
                        settle(device))
    jpegs = [torch.frombuffer(bytearray(path.read_bytes()), dtype=torch.uint8)
             for path in sorted((image_folder / "train" / "class_01").glob("*.jpg"))[:4]]
    assert any(len(one) == refused_size for one in jpegs)
    assert all(image is not None for image in device_decode.decode_jpegs(jpegs, torch.device("cpu")))
    assert events == [("settle", "cpu"), ("decode", 4)] + [("settle", "cpu"), ("decode", 1)] * 4


def test_the_decode_holds_a_bounded_number_of_pixels(image_folder, monkeypatch):
    """Decoded images are held a run of at most CHUNK_PIXELS at a time (a larger image alone), in order."""
    assert list(device_decode.chunks([(10, 10)] * 5 + [(30, 30), (10, 10)], limit=250)) == \
        [[0, 1], [2, 3], [4], [5], [6]]
    calls = []
    decode = device_decode.decode_jpegs
    monkeypatch.setattr(device_decode, "decode_jpegs", lambda data, device, fallbacks: calls.append(len(data)) or
                        decode(data, device, fallbacks))
    expected = passes(image_folder, "pytorch-gpu")
    monkeypatch.setattr(device_decode, "CHUNK_PIXELS", 2 * 48 * 40)
    calls.clear()
    monkeypatch.setattr(device_decode.decoded_images, "__defaults__", (None, 2 * 48 * 40))
    assert same(passes(image_folder, "pytorch-gpu")[0], expected[0])
    assert calls and max(calls) == 2


def resize_peaks(monkeypatch, image: torch.Tensor, measure) -> tuple[int, int]:
    """(bytes at the peak of torch's CPU allocator while ``measure(image)`` runs the GPU's arithmetic on the CPU,
    the CPU kernel's own intermediate image among them): no native uint8 resize, no channels-last copy."""
    from torch.profiler import ProfilerActivity, profile

    from image_classification.data import transforms as train_transforms

    monkeypatch.setattr(train_transforms, "CHANNELS_LAST_RESIZE", ())
    monkeypatch.setattr("torchvision.transforms.v2.functional._geometry._do_native_uint8_resize_on_cpu",
                        lambda interpolation: False)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as profiled:
        measure(image)
    events = sorted((event.start_ns(), event.nbytes()) for event in profiled.profiler.kineto_results.events()
                    if event.name() == "[memory]")
    live = peak = 0
    for _, change in events:
        live += change
        peak = max(peak, live)
    return peak


@pytest.mark.slow
def test_the_device_holds_at_most_what_the_memory_bound_s_docstring_states(monkeypatch, capsys):
    """The largest images the size rule admits (89,478,485 px), through the GPU's arithmetic run on the CPU, their
    allocations counted by torch's profiler: a training crop holds its float32 copy beside the decoded image (4
    bytes a value: 4U, U the image's uint8 bytes), validation the image's float32 copy and its resized float32
    image.  The CPU's resize adds an intermediate image (C x height x resized width) and weight tables that CUDA's
    does not; the figures are printed for docs/data.md."""
    from image_classification.models.image_size import MAX_IMAGE_PIXELS, check_size
    from image_classification.data.transforms import Draw, TrainTransform

    side = int(MAX_IMAGE_PIXELS ** 0.5)  # 9,459: the largest square, whose whole-image crop box can be drawn
    strip = (255, 348_000)  # (height, width): the largest resize under the rule for validation, 256 x 349,364
    check_size(side, side)
    check_size(strip[1], strip[0], 256)
    mib, figures = 1 << 20, {}
    crop = TrainTransform(DataConfig(data=None, data_backend="pytorch-gpu", image_size=224, batch_size=1)).crop
    square = torch.zeros(3, side, side, dtype=torch.uint8)
    cases = {"training crop of the largest square": (square, lambda image: crop(image, Draw((0, 0, side, side), False, 224)),
                                                     4 * square.numel(), 3 * side * 224 * 4),
             "validation of the largest square": (square, lambda image: device_decode.val_crop(image, 224),
                                                  4 * square.numel(), 3 * side * 256 * 4),
             "validation of the largest strip": (torch.zeros(3, *strip, dtype=torch.uint8),
                                                 lambda image: device_decode.val_crop(image, 224),
                                                 4 * 3 * (255 * 348_000 + 256 * 349_364), 3 * 255 * 349_364 * 4)}
    for name, (image, measure, on_gpu, cpu_only) in cases.items():
        peak = resize_peaks(monkeypatch, image, measure)
        figures[name] = (image.numel(), peak, on_gpu, cpu_only)
        assert on_gpu <= peak <= on_gpu + cpu_only + 32 * mib, (name, peak / mib, on_gpu / mib, cpu_only / mib)
    with capsys.disabled():
        for name, (decoded, peak, on_gpu, cpu_only) in figures.items():
            print(f"\n{name}: decoded {decoded / mib:.0f} MiB; measured on the CPU {peak / mib:.0f} MiB more, of "
                  f"which {cpu_only / mib:.0f} MiB the CPU kernel's intermediate image; on a GPU "
                  f"{on_gpu / mib:.0f} MiB more, {(decoded + on_gpu) / mib:.0f} MiB in all")


HOST_READS = ("item", "tolist", "__bool__", "cpu", "numpy", "__float__", "__int__")


@pytest.mark.parametrize("augmentation", [None, "autoaugment", "randaugment", "trivialaugment"])
def test_preparing_batches_reads_nothing_back(image_folder, monkeypatch, augmentation):
    """The training process decodes, crops, augments and normalises (in its background thread) and hands batches
    over (in the loop's) without reading a tensor back to the host: on a GPU each read would wait for the device
    (the CPU twin of the GPU test below; the DataLoader's and the sampler's own reads of host tensors are not
    counted).  ``--augmentation``'s draws, reads of torch's CPU generator, are the workers'."""
    import threading

    from image_classification.data.device_decode import DeviceDecodedLoader

    config = DataConfig(data=str(image_folder), data_backend="pytorch-gpu", image_size=SIZE, batch_size=4, workers=1,
                        augmentation=augmentation)
    train, val = get_loaders(config, runtime(), want_train=True, want_val=True)
    reads, counting = [], threading.local()
    for name in HOST_READS:
        original = getattr(torch.Tensor, name)
        monkeypatch.setattr(torch.Tensor, name, lambda self, *args, _original=original, _name=name, **kwargs:
                            (reads.append(_name) if getattr(counting, "on", False) else None)
                            or _original(self, *args, **kwargs))

    def counted(method, materialise=False):
        def call(*args):
            counting.on = True
            try:
                return list(method(*args)) if materialise else method(*args)
            finally:
                counting.on = False
        return call

    monkeypatch.setattr(DeviceDecodedLoader, "_prepare", counted(DeviceDecodedLoader._prepare))
    monkeypatch.setattr(DeviceDecodedLoader, "_deliver", counted(DeviceDecodedLoader._deliver, materialise=True))
    for loader in (train, val):
        loader.set_epoch(0)
        assert sum(len(targets) for _, targets in loader) > 0
    assert reads == []


@pytest.mark.parametrize("augmentation", ["autoaugment", "randaugment", "trivialaugment"])
def test_on_an_asynchronous_device_the_policies_wait_for_nothing(augmentation):
    """Every operation of the policy's space, applied as the background thread applies it, on the meta device:
    tensors without values, where a read back to the host or a shape that depends on values fails.  Under
    NonBlockingConstants no tensor is built on the device from Python values: torchvision's affine and rotation
    matrices and its sharpness kernel are built on the host and copied without waiting (built on a GPU directly,
    each is a copy that waits for everything queued); without it they are (the CPU twin of the GPU test below)."""
    from torch.overrides import TorchFunctionMode

    from image_classification.data.transforms import PolicyDraws, auto_augmentation

    built = []

    class DeviceConstants(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func in (torch.tensor, torch.as_tensor) and torch.device(kwargs.get("device") or "cpu").type != "cpu":
                built.append(func.__name__)
            return func(*args, **kwargs)

    config = DataConfig(data=None, data_backend="pytorch-gpu", image_size=SIZE, batch_size=4, augmentation=augmentation)
    halves = PolicyDraws(auto_augmentation(config))
    operations = []
    for name, (magnitudes, signed) in halves.policy._AUGMENTATION_SPACE.items():
        values = magnitudes(10, SIZE, SIZE)
        operations.append((name, -float(values[5]) if signed else float(values[5]) if values is not None else 0.0))
    image = torch.zeros(3, SIZE, SIZE, dtype=torch.uint8, device="meta")
    with DeviceConstants():
        with device_decode.NonBlockingConstants():
            for operation in operations:
                out = halves.apply(image, (operation,))
                assert out.device.type == "meta" and out.shape == image.shape and out.dtype == torch.uint8
    assert built == []
    with DeviceConstants():
        for operation in operations:
            halves.apply(image, (operation,))
    assert built and set(built) == {"tensor"}


def test_the_background_thread_touches_no_random_generator(image_folder, monkeypatch):
    """The loop's thread draws from torch's CPU generator (MixUp, CutMix, random erasing) while the next batch is
    prepared in the background: the background thread neither draws from that generator nor sets its state (a
    set_state there would race with the loop's draws), since the workers drew each image's policy under its seed.
    The loop's draws are those it makes alone, and the batches the pytorch backend's."""
    import threading

    real, touched = torch.default_generator, []

    class Watched:
        def __getattr__(self, name):
            if threading.current_thread() is not threading.main_thread():
                touched.append(name)
            return getattr(real, name)

    fields = dict(augmentation="randaugment", workers=1)
    expected = passes(image_folder, "pytorch", **fields)[0]
    torch.manual_seed(7)
    alone = [torch.rand(3) for _ in range(len(expected) + 1)]
    monkeypatch.setattr(torch, "default_generator", Watched())
    config = DataConfig(data=str(image_folder), data_backend="pytorch-gpu", image_size=SIZE, batch_size=4, seed=3,
                        **fields)
    train, _ = get_loaders(config, runtime(), want_train=True, want_val=False)
    train.set_epoch(1)
    torch.manual_seed(7)
    ours, drawn = [], []
    for images, targets in train:
        drawn.append(torch.rand(3))
        ours.append((images, targets))
    drawn.append(torch.rand(3))
    assert touched == [] and same(ours, expected)
    assert all(torch.equal(a, b) for a, b in zip(drawn, alone)) and len(drawn) == len(alone)


def test_the_background_thread_is_on_the_runtime_s_device_from_its_start(image_folder, monkeypatch):
    """A new thread starts on CUDA device 0, and leaving a stream's context there makes device 0 current again:
    a context on GPU 0 for every process of a job.  The thread that prepares the batches sets the runtime's
    device before anything else (the CPU twin of the GPU test below: torch.cuda's set_device recorded per thread,
    the runtime's device as CUDA 3); a CPU runtime's thread sets none."""
    import threading

    from image_classification.data.device_decode import DeviceDecodedLoader

    cuda = FakeCuda(monkeypatch)
    pool = device_decode.decode_thread(torch.device("cuda", 1))
    thread = pool.submit(threading.current_thread).result()
    assert cuda.devices == {thread: [torch.device("cuda", 1)]}
    device_decode.decode_thread(torch.device("cpu")).submit(lambda: None).result()
    assert len(cuda.devices) == 1
    make, prepared_in, prepare = device_decode.decode_thread, [], DeviceDecodedLoader._prepare
    monkeypatch.setattr(device_decode, "decode_thread", lambda device: make(torch.device("cuda", 3)))
    monkeypatch.setattr(DeviceDecodedLoader, "_prepare", lambda self, *args: prepared_in.append(
        list(cuda.devices.get(threading.current_thread(), []))) or prepare(self, *args))
    passes(image_folder, "pytorch-gpu")
    assert len(prepared_in) == 6 + 3 and all(devices == [torch.device("cuda", 3)] for devices in prepared_in)


def test_the_raport_counts_the_jpegs_decoded_on_the_cpu_per_epoch(image_folder, tmp_path, tiny_arch, monkeypatch):
    """A run whose device decoder refuses an image says so in its raport, epoch by epoch and in the summary, for
    training and validation alike (main.py's loop with the backend on the CPU's decoder)."""
    from image_classification.records.raport import read_raport

    monkeypatch.setattr("image_classification.train.plan.check_backend", lambda *args, **kwargs: None)
    refused_size = len((image_folder / "train" / "class_01" / "img_003.jpg").read_bytes())
    refusing_decoder(monkeypatch, lambda data: RuntimeError("Error while decoding JPEG images: unsupported")
                     if any(len(one) == refused_size for one in data) else None)
    assert main(["-a", tiny_arch, "--num-classes", "3", "--device", "cpu", "--data-backend", "pytorch-gpu", "-j", "0",
                 "--image-size", str(SIZE), "-b", "4", "--epochs", "2", "--use-ema", "0.9", "--no-checkpoints",
                 "--workspace", str(tmp_path), str(image_folder)]) == 0
    records = read_raport(tmp_path / "experiment_raport.json")
    epochs, summary = {}, {}
    for record in records:
        if record.get("type") == "LOG" and isinstance(record["step"], list) and len(record["step"]) <= 1:
            (epochs.setdefault(record["step"][0], {}) if record["step"] else summary).update(record["data"])
    epochs = [epochs[epoch] for epoch in sorted(epochs)]
    names = ("train.cpu_decoded", "val.cpu_decoded", "val_ema.cpu_decoded")
    assert [[epoch[name] for name in names] for epoch in epochs] == [[1, 0, 0], [1, 0, 0]]
    assert [summary[name] for name in names] == [2, 0, 0]


# -- choosing the backend, and what refuses it --------------------------------------------------------------
def test_main_refuses_the_backend_off_cuda_naming_the_pytorch_backend(image_folder, tmp_path, capsys):
    code = run(main, ["-a", "resnet18", "--device", "cpu", "--data-backend", "pytorch-gpu", "--workspace",
                      str(tmp_path), str(image_folder)])
    assert "--data-backend pytorch," in refused(code, capsys)
    assert not any(tmp_path.iterdir())


def test_a_torchvision_without_gpu_decoding_and_augmix_are_refused_naming_what_to_use(image_folder, monkeypatch):
    monkeypatch.setattr(device_decode, "gpu_decoding_problem", lambda: "RuntimeError: not compiled with nvJPEG")
    with pytest.raises(UserError, match=r"needs a GPU JPEG decoder .* lacks \(torchvision [^;]+; RuntimeError: not "
                                        r"compiled with nvJPEG\); use --data-backend pytorch$"):
        device_decode.check_device_decode_request(True, None, training=True)
    config = DataConfig(data=str(image_folder), data_backend="pytorch-gpu", image_size=SIZE, batch_size=4,
                        augmentation="augmix")
    with pytest.raises(UserError, match="augmix is not supported with --data-backend pytorch-gpu.*use "
                                        "--data-backend pytorch$"):
        get_loaders(config, runtime(), want_train=True, want_val=False)
    get_loaders(config, runtime(), want_train=False, want_val=True)  # validation applies no augmentation


@pytest.mark.parametrize("dali, cuda, problem, backend", [
    (True, True, None, "dali-cpu"), (False, True, None, "pytorch-gpu"), (False, True, "no nvJPEG", "pytorch"),
    (False, False, None, "pytorch"),
])
def test_the_default_is_the_fastest_backend_installed(monkeypatch, dali, cuda, problem, backend):
    """On CUDA without DALI, the GPU decoding backend where torchvision can decode there; the CPU keeps its
    default; --data-backend always wins.  The start-up line says which and why."""
    monkeypatch.setattr("image_classification.data.dali_available", lambda: dali)
    monkeypatch.setattr(device_decode, "gpu_decoding_problem", lambda: problem)
    assert resolve_backend(None, cuda) == backend
    assert resolve_backend("pytorch", cuda) == "pytorch"
    notice = default_backend_notice(backend, cuda)
    assert notice.startswith(f"=> data backend: {backend}, the default ") and "\n" not in notice
    assert (problem or "GPU") in notice if cuda and not dali else True


def test_no_preset_names_a_data_backend_but_synthetic_data():
    """launch.py's presets and recipes leave the backend to main.py's default, the fastest installed."""
    import yaml

    text = (REPO / "configs.yml").read_text()
    assert text == (REPO / "image_classification" / "configs.yml").read_text()
    presets = yaml.safe_load(text)
    named = [value for section in ("anchors", "recipes", "mode") for value in presets[section].values()
             if isinstance(value, dict) and "data_backend" in value]
    assert [value["data_backend"] for value in named] == ["synthetic"]


def test_trains_end_to_end_on_the_cpu_and_resumes_a_crashed_run_bitwise(image_folder, tmp_path, tiny_arch,
                                                                       monkeypatch):
    """main.py's loop with the backend, on the CPU's decoder (main.py itself refuses it off CUDA), the recipe
    augmentations on top: a run killed after a mid-epoch checkpoint and resumed ends with the weights of one
    that was not."""
    monkeypatch.setattr("image_classification.train.plan.check_backend", lambda *args, **kwargs: None)
    run = ["-a", tiny_arch, "--num-classes", "3", "--device", "cpu", "--data-backend", "pytorch-gpu", "-j", "1",
           "--image-size", str(SIZE), "-b", "4", "-p", "1", "--lr", "0.05", "--seed", "3", "--epochs", "1",
           "--augmentation", "trivialaugment", "--mixup", "0.2", "--cutmix", "1.0", "--random-erase", "0.25",
           "--checkpoint-interval", "2", "--resume", "auto", str(image_folder)]
    assert main(run + ["--workspace", str(tmp_path / "straight")]) == 0
    train_until_crash(run + ["--workspace", str(tmp_path / "crashed")], 5)  # a step after the checkpoint at 4
    assert torch.load(tmp_path / "crashed" / "checkpoint.pth.tar", weights_only=True)["batch"] == 4
    assert main(run + ["--workspace", str(tmp_path / "crashed")]) == 0
    straight, resumed = (torch.load(tmp_path / name / "checkpoint.pth.tar", weights_only=True)
                         for name in ("straight", "crashed"))
    assert straight["epoch"] == resumed["epoch"] == 1 and straight["best_prec1"] == resumed["best_prec1"]
    for name, tensor in straight["state_dict"].items():
        assert torch.equal(tensor, resumed["state_dict"][name]), name


def test_compare_val_backends_holds_one_model_s_top1_to_the_pytorch_backend_s(image_folder, tmp_path, tiny_arch,
                                                                            capsys):
    """The script evaluates a checkpoint's model with both backends: their top-1s and differing predictions, and
    whether they agree within --within points (exit 1 where not).  The validation pixels differ by the resize's
    rounding, so a barely trained model's near-tied logits may flip an image: the test holds the verdict to the
    figures the script prints, not to a figure of its own."""
    assert main(["-a", tiny_arch, "--device", "cpu", "--data-backend", "pytorch", "--image-size", str(SIZE), "-b", "4",
                 "-j", "0", "--epochs", "1", "--lr", "0.01", "--seed", "1", "--workspace", str(tmp_path),
                 str(image_folder)]) == 0
    compare = load_script("compare_val_backends")
    argv = ["--backend", "pytorch-gpu", "--checkpoint", str(tmp_path / "checkpoint.pth.tar"), "--device", "cpu",
            "-j", "0", str(image_folder)]
    capsys.readouterr()
    code = compare.main(argv)
    out = capsys.readouterr().out
    found = re.search(r"^12 images of .*/val: pytorch top-1 ([\d.]+)%, pytorch-gpu top-1 ([\d.]+)%, difference "
                      r"([+-][\d.]+) points; (\d+) of 12 predictions differ$", out, re.M)
    assert found, out
    difference = float(found[3])
    assert float(found[2]) - float(found[1]) == pytest.approx(difference, abs=0.005)
    assert abs(difference) <= 100 / 12 * int(found[4]) + 0.005  # each differing prediction moves top-1 1/12 at most
    agree = abs(difference) <= 0.2
    assert code == (0 if agree else 1)
    assert out.rstrip().endswith("agree within 0.2 points" if agree else "differ by more than 0.2 points")
    assert compare.main([*argv, "--within", "-1"]) == 1
    assert capsys.readouterr().out.rstrip().endswith("differ by more than -1.0 points")


def test_compare_val_backends_holds_the_pixels_to_the_whole_image_decode_unless_told_otherwise(capsys):
    """The grey-level figure is the resampling's alone: the pytorch backend decodes every pixel, as pytorch-gpu does
    (here on the CPU), unless --decode-scale auto adds its reduced decode of the photographs (512 px, at 32 px crops
    decoded at 1/8)."""
    pytest.importorskip("skimage")
    compare = load_script("compare_val_backends")
    means = {}
    for decode_scale in ("full", "auto"):
        assert compare.main(["--backend", "pytorch-gpu", "--device", "cpu", "--image-size", "32",
                             *(["--decode-scale", decode_scale] if decode_scale == "auto" else [])]) == 0
        line = capsys.readouterr().out.strip()
        found = re.fullmatch(rf"32 px, pytorch-gpu against pytorch \(--decode-scale {decode_scale}\): mean ([\d.]+) "
                             r"levels \(astronaut [\d.]+, .*\)", line)
        assert found, line
        means[decode_scale] = float(found[1])
    assert means["full"] < 0.05 < means["auto"], means


def test_compare_val_backends_without_scikit_image_is_one_line(monkeypatch, capsys):
    """Its photographs are scikit-image's, which `make demo` does not install: one line, exit 2, no traceback."""
    monkeypatch.setitem(sys.modules, "skimage", None)  # `import skimage` raises ImportError
    monkeypatch.setitem(sys.modules, "skimage.data", None)
    compare = load_script("compare_val_backends")
    assert run(compare.main, ["--backend", "pytorch-gpu", "--device", "cpu", "--image-size", "32"]) == 2
    assert capsys.readouterr().err == ("error: compare_val_backends.py without --checkpoint cuts its images from "
                                       "scikit-image's sample photographs, and scikit-image is not installed "
                                       "here: pip install scikit-image (requirements-dev.txt pins it)\n")


# -- on a GPU (each has its CPU twin above) -----------------------------------------------------------------
@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("memory_format", [torch.contiguous_format, torch.channels_last])
def test_on_cuda_the_batches_are_the_cpu_s_within_the_decoder_s_rounding(photos, memory_format):
    """nvJPEG and the float resize on the device against libjpeg-turbo and the uint8 resize on the CPU: the same
    images in the same crops and order, the pixels within a few grey levels on average."""
    fields = dict(image_size=64, batch_size=7, memory_format=memory_format)
    ours = passes(photos, "pytorch-gpu", device="cuda", **fields)
    theirs = passes(photos, "pytorch", decode_scale="full", **fields)
    assert ours[2] == theirs[2] == (0, 0)
    assert ours[3] == ({"cpu_decoded": 0}, {"cpu_decoded": 0})  # clean JPEGs: none falls back to the CPU
    assert all(images.is_contiguous(memory_format=memory_format) for images, _ in ours[0])
    bound = decoders.DEVICE_LEVELS
    assert levels(ours[0], theirs[0]) < bound and levels(ours[1], theirs[1]) < bound


@pytest.mark.gpu
@needs_cuda
def test_on_cuda_a_decode_never_writes_memory_its_stream_is_still_reading():
    """Tensors freed on the stream while kernels queued behind a long one still read them: the decode that
    follows, on that stream, may be handed their blocks, and torchvision's decoder would overwrite them before
    those kernels run; :func:`settle` makes it wait.  Each trial's sums are exact only if it did."""
    def encoded(pixels: np.ndarray) -> torch.Tensor:
        out = io.BytesIO()
        Image.fromarray(pixels).save(out, "JPEG", quality=75)
        return torch.frombuffer(bytearray(out.getvalue()), dtype=torch.uint8)

    device, shape = torch.device("cuda", torch.cuda.current_device()), (3, 256, 256)
    rng = np.random.default_rng(0)
    jpegs = [encoded(rng.integers(0, 256, (256, 256, 3), dtype=np.uint8)) for _ in range(8)]
    stream = torch.cuda.Stream(device)
    with torch.cuda.stream(stream):
        for _ in range(10):
            tensors = [torch.full(shape, 7, dtype=torch.uint8, device=device) for _ in jpegs]
            torch.cuda.synchronize(device)
            torch.cuda._sleep(50_000_000)  # tens of milliseconds of work queued ahead of the sums
            sums = torch.stack([tensor.sum(dtype=torch.int64) for tensor in tensors])
            del tensors
            decoded = device_decode.decode_jpegs(jpegs, device)
            stream.synchronize()
            assert sums.tolist() == [7 * 3 * 256 * 256] * len(jpegs)
            assert all(image.shape == shape for image in decoded)


@pytest.mark.gpu
@needs_cuda
def test_on_cuda_what_cannot_be_decoded_is_skipped_and_counted_as_on_the_cpu(mixed_folder, capsys):
    (ours, ours_warnings), (theirs, theirs_warnings) = passes_with_warnings(mixed_folder, capsys, device="cuda")
    assert ours[2] == theirs[2] == (3, 3)
    assert ours_warnings == theirs_warnings
    assert levels(ours[0], theirs[0]) < 3


@pytest.mark.gpu
@needs_cuda
def test_on_cuda_without_dali_a_run_takes_the_backend_by_default_and_never_syncs_in_a_step(image_folder, tmp_path,
                                                                                         tiny_arch, monkeypatch,
                                                                                         capsys):
    """The default on CUDA without DALI, said at start-up; CUDA's sync debug mode finds no synchronisation inside
    the training steps, while the next batch is decoded beside them."""
    syncs = count_step_syncs(monkeypatch)
    monkeypatch.setattr("image_classification.data.dali_available", lambda: False)
    code = main(["-a", tiny_arch, "--device", "cuda", "--image-size", str(SIZE), "-b", "4", "-j", "2", "-p", "2",
                 "--epochs", "1", "--lr", "0.01", "--augmentation", "trivialaugment", "--mixup", "0.2",
                 "--workspace", str(tmp_path), str(image_folder)])
    assert code == 0
    out = capsys.readouterr().out
    assert "=> data backend: pytorch-gpu, the default on CUDA without NVIDIA DALI" in out
    assert re.search(r"^=> JPEG decoder: \S+ \S+ \(nvJPEG on cuda:\d\)", out, re.M), out
    assert len(syncs) == 6 and syncs[1:] == [0] * 5, syncs
    from image_classification.records.raport import read_raport

    summary = {}
    for record in read_raport(tmp_path / "experiment_raport.json"):
        summary.update(record["data"] if record.get("step") == [] else {})
    assert summary["train.cpu_decoded"] == summary["val.cpu_decoded"] == 0


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("augmentation", [None, "autoaugment", "randaugment", "trivialaugment"])
def test_on_cuda_preparing_batches_synchronises_nothing(photos, augmentation):
    """CUDA's sync debug mode warns at every synchronisation in the process, the background thread's included:
    none while a pass is decoded, cropped, augmented and handed over (settle's event waits are not counted:
    they are meant, in the background thread), for every policy."""
    import warnings

    config = DataConfig(data=str(photos), data_backend="pytorch-gpu", image_size=64, batch_size=7, workers=1, seed=3,
                        augmentation=augmentation)
    train, _ = get_loaders(config, runtime("cuda"), want_train=True, want_val=False)
    for epoch in range(2):  # the first pass makes the thread, the streams and the decoder's buffers
        train.set_epoch(epoch)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                images = [batch for batch, _ in train]
            finally:
                torch.cuda.set_sync_debug_mode("default")
        assert images and all(batch.is_cuda for batch in images)
        synchronised = [str(warning.message) for warning in caught if "synchroniz" in str(warning.message)]
        assert epoch == 0 or synchronised == [], synchronised


@pytest.mark.gpu
@needs_cuda
def test_on_cuda_resizing_holds_the_float32_copies_the_memory_bound_states_and_no_more():
    """Measured by torch's CUDA allocator (the CPU twin: the slow test above): a crop's resize holds its float32
    copy (4 bytes a value) and a small output, no channels-last uint8 copy and no second float32 copy (CUDA's
    antialiased kernel makes a channels-last input contiguous first); validation the image's float32 copy and its
    float32 resized image."""
    from image_classification.data.transforms import Draw, TrainTransform

    device, side, slack = torch.device("cuda", torch.cuda.current_device()), 4096, 8 << 20
    image = torch.randint(0, 256, (3, side, side), dtype=torch.uint8, device=device)
    crop = TrainTransform(DataConfig(data=None, data_backend="pytorch-gpu", image_size=224, batch_size=1)).crop
    strip = torch.randint(0, 256, (3, 255, 60_000), dtype=torch.uint8, device=device)  # resized up to 256 x 60,235
    for picture, work, expected in ((image, lambda: crop(image, Draw((0, 0, side, side), False, 224)), 4 * image.numel()),
                                    (image, lambda: device_decode.val_crop(image, 224), 4 * image.numel()),
                                    (strip, lambda: device_decode.val_crop(strip, 224),
                                     4 * strip.numel() + 4 * 3 * 256 * (256 * 60_000 // 255))):
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        work()
        torch.cuda.synchronize(device)
        extra = torch.cuda.max_memory_allocated(device) - before
        assert expected <= extra <= expected + slack, (tuple(picture.shape), extra, expected)


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_on_a_second_gpu_the_background_thread_works_there(image_folder, monkeypatch):
    """A rank on GPU 1: its background thread's current device is GPU 1 from its first batch, so leaving the side
    stream's context never makes GPU 0 current there (and a CUDA context on it)."""
    from image_classification.data.device_decode import DeviceDecodedLoader

    current, prepare = [], DeviceDecodedLoader._prepare
    monkeypatch.setattr(DeviceDecodedLoader, "_prepare", lambda self, *args: current.append(
        torch.cuda.current_device()) or prepare(self, *args))
    settings = dict(data=str(image_folder), data_backend="pytorch-gpu", image_size=SIZE, batch_size=4, seed=3, workers=0)
    train, _ = get_loaders(DataConfig(**settings), Runtime(torch.device("cuda", 1), None, torch.contiguous_format),
                           want_train=True, want_val=False)
    train.set_epoch(0)
    assert all(images.device == torch.device("cuda", 1) for images, _ in train)
    assert current and set(current) == {1}
