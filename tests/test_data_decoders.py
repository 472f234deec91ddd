"""Which JPEG decoder the pytorch and pytorch-gpu backends use: TorchCodec's where it decodes as Pillow's,
else torchvision's before its deprecation, else Pillow's; on a device TorchCodec's, else torchvision's; said at
start-up; the same batches whichever is taken, and no deprecation warning of torchvision's decoders."""

from __future__ import annotations

import io
import warnings

import numpy as np
import pytest
import torch
from PIL import Image

from image_classification.data import DataConfig, decoders, get_loaders
from image_classification.data.orientation import ORIENTATION_TAG, jpeg_orientation
from image_classification.system.runtime import Runtime


@pytest.fixture
def fresh_choice():
    """Each test decides anew (the choice is made once per process)."""
    decoders._cpu_choice.cache_clear()
    decoders._device_choice.cache_clear()
    yield
    decoders._cpu_choice.cache_clear()
    decoders._device_choice.cache_clear()


def fake(library: str, cpu_shift: int = 0, device_shift: int = 0, refuses: bool = False,
         deprecated: bool = False) -> decoders.JpegDecoder:
    """Pillow's decoders under another name, their pixels moved up by ``cpu_shift`` grey levels on the CPU and
    ``device_shift`` on a device, or refusing every batch on a device."""
    real = decoders._pillow()

    def shifted(data, shift):
        return (real.decode(data).int() + shift).clamp(0, 255).to(torch.uint8)

    def decode_batch(data, device):
        if refuses:
            raise RuntimeError("decode_jpegs_cuda: not compiled with nvJPEG support")
        # a device that stands in for CUDA ("meta") gets CPU tensors: the probes' pixels are read back
        return [shifted(one, device_shift).to(device if device.type == "cpu" else "cpu") for one in data]

    return decoders.JpegDecoder(library, "9.9", lambda data: shifted(data, cpu_shift), decode_batch, deprecated)


def absent():
    raise ImportError("No module named 'torchcodec'")


def test_torchcodec_is_taken_where_it_decodes_the_probes_as_pillow_else_pillow(fresh_choice, monkeypatch):
    """The same pixels on every probe, or Pillow's decoder (torchvision 0.29 deprecating its own): one grey level
    off, a JPEG turned by its EXIF orientation (which the crop boxes, drawn from the stored size, would miss),
    or not installed."""
    monkeypatch.setitem(decoders._LOADERS, "torchcodec", lambda: fake("torchcodec"))
    monkeypatch.setitem(decoders._LOADERS, "torchvision", lambda: fake("torchvision", deprecated=True))
    assert decoders.cpu_decoder().name == "torchcodec 9.9"
    decoders._cpu_choice.cache_clear()
    monkeypatch.setitem(decoders._LOADERS, "torchcodec", lambda: fake("torchcodec", cpu_shift=1))
    assert decoders.cpu_decoder().library == "pillow"  # one grey level off: not the pytorch backend's batches
    decoders._cpu_choice.cache_clear()
    monkeypatch.setitem(decoders._LOADERS, "torchcodec", absent)
    assert decoders.cpu_decoder().library == "pillow"
    decoders._cpu_choice.cache_clear()
    real = decoders._pillow()

    def by_exif(data):  # a decoder that turns the image its EXIF orientation names, as TorchCodec 0.17's does
        image = real.decode(data)
        return image.rot90(-1, (1, 2)) if bytes(data[:200].tolist()).find(b"Exif") >= 0 else image

    monkeypatch.setitem(decoders._LOADERS, "torchcodec", lambda: decoders.JpegDecoder("torchcodec", "9.9", by_exif,
                                                                                      real.decode_batch))
    assert decoders.cpu_decoder().library == "pillow"
    assert tuple(by_exif(decoders.probe_jpegs()[3]).shape) == (3, 64, 48)


def test_torchvision_s_decoder_is_taken_on_the_cpu_only_where_it_is_not_deprecated(fresh_choice, monkeypatch):
    """An older torchvision's decoder (as fast as TorchCodec's, faster than Pillow's) where TorchCodec is absent;
    from 0.29 on, Pillow's."""
    monkeypatch.setitem(decoders._LOADERS, "torchcodec", absent)
    monkeypatch.setitem(decoders._LOADERS, "torchvision", lambda: fake("torchvision"))
    assert decoders.cpu_decoder().library == "torchvision"
    decoders._cpu_choice.cache_clear()
    monkeypatch.setitem(decoders._LOADERS, "torchvision", lambda: fake("torchvision", deprecated=True))
    assert decoders.cpu_decoder().library == "pillow"


def test_the_installed_torchvision_is_said_deprecated_exactly_where_its_decoder_warns():
    """The release rule (0.29 and later) against what the installed torchvision's decoder does."""
    import torchvision.io

    decoder = decoders._torchvision()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torchvision.io.decode_jpeg(decoders.probe_jpegs()[0])
    warned = any(issubclass(w.category, DeprecationWarning) and decoders.TORCHVISION_DEPRECATION in str(w.message)
                 for w in caught)
    assert decoder.deprecated == warned
    assert decoders.release("0.29.1+cu130") == (0, 29) and decoders.release("0.28.0") < decoders.TORCHVISION_DEPRECATES


def tagged_jpeg(orientation: int = 6, **options) -> bytes:
    image = Image.fromarray(np.random.default_rng(1).integers(0, 256, (24, 40, 3), dtype=np.uint8))
    exif = Image.Exif()
    exif[ORIENTATION_TAG] = orientation
    encoded = io.BytesIO()
    image.save(encoded, "JPEG", quality=85, exif=exif.tobytes(), **options)
    return encoded.getvalue()


def between_scans(raw: bytes, segment: bytes) -> bytes:
    """A progressive JPEG with ``segment`` inserted after its first scan (before the second SOS marker)."""
    second = raw.index(b"\xff\xda", raw.index(b"\xff\xda") + 2)
    return raw[:second] + segment + raw[second:]


def test_exif_hidden_leaves_no_tag_for_any_decoder_to_turn_by_and_every_pixel_as_it_was():
    """TorchCodec reads the first APP1 segment libjpeg saves (between scans too) or walks the markers itself:
    every APP1 is renamed, every Exif header in a segment that no decoder reads is broken, the tables and the
    scans are untouched; a JPEG without either is handed over as it is."""
    pillow = decoders._pillow()
    exif = tagged_jpeg(6)
    app1 = exif[exif.index(b"\xff\xe1"):]
    app1 = app1[:2 + int.from_bytes(app1[2:4], "big")]
    plain = io.BytesIO()
    Image.open(io.BytesIO(exif)).save(plain, "JPEG", quality=85, progressive=True)
    assert b"Exif" not in plain.getvalue()
    payload = b"padding\xff\xe1\x00\x08Exif\0\0"  # a fake EXIF segment inside a comment
    comment = b"\xff\xfe" + (len(payload) + 2).to_bytes(2, "big") + payload
    for raw in (exif, tagged_jpeg(3, progressive=True), between_scans(plain.getvalue(), app1),
                exif[:2] + comment + exif[2:]):
        data = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
        hidden = decoders.exif_hidden(data).numpy().tobytes()
        assert jpeg_orientation(raw) != 1 or raw.count(b"Exif\0\0") > 0
        assert b"Exif\0\0" not in hidden and jpeg_orientation(hidden) == 1 and len(hidden) == len(raw)
        assert not Image.open(io.BytesIO(hidden)).getexif()
        assert torch.equal(pillow.decode(torch.frombuffer(bytearray(hidden), dtype=torch.uint8)), pillow.decode(data))
    untagged = decoders.probe_jpegs()[0]
    assert decoders.exif_hidden(untagged) is untagged


def test_torchcodec_0_17_is_taken_with_its_exif_reading_hidden():
    """Where TorchCodec 0.17 is installed: its pixels are Pillow's on every probe once the tag is hidden (it turns
    a JPEG by the tag itself otherwise), so it is the CPU decoder."""
    torchcodec = pytest.importorskip("torchcodec")
    if not torchcodec.__version__.startswith("0.17"):
        pytest.skip(f"the docs speak of TorchCodec 0.17, not {torchcodec.__version__}")
    from torchcodec.decoders import decode_jpeg

    ours, pillow = decoders._torchcodec(), decoders._pillow()
    probes = decoders.probe_jpegs()
    assert tuple(decode_jpeg(probes[3]).shape) == (3, 64, 48)  # turned by its own reading of the tag
    assert all(torch.equal(ours.decode(probe), pillow.decode(probe)) for probe in probes)
    decoders._cpu_choice.cache_clear()
    assert decoders.cpu_decoder().library == "torchcodec"
    decoders._cpu_choice.cache_clear()


@pytest.mark.parametrize("shift, refuses, chosen", [(2, False, "torchcodec"), (4, False, "torchvision"),
                                                    (0, True, "torchvision")])
def test_a_device_takes_the_cpu_s_library_where_its_pixels_are_within_the_gpu_tests_bound(fresh_choice, monkeypatch,
                                                                                         shift, refuses, chosen):
    """The CPU twin of the choice on a GPU: the device's decoder of the CPU's library where it decodes the probes
    within DEVICE_LEVELS grey levels of the CPU's pixels, else torchvision's; where none does, why each does not."""
    monkeypatch.setitem(decoders._LOADERS, "torchcodec", lambda: fake("torchcodec", 0, shift, refuses))
    assert decoders.cpu_decoder().library == "torchcodec"
    assert decoders.device_decoder(torch.device("cpu")).library == chosen
    assert decoders.device_problem(torch.device("cpu")) is None
    decoders._device_choice.cache_clear()
    monkeypatch.setitem(decoders._LOADERS, "torchvision", lambda: fake("torchvision", refuses=True))
    if chosen == "torchvision":
        problem = decoders.device_problem(torch.device("cpu"))
        assert problem.startswith("torchcodec: ") and "; torchvision: RuntimeError: decode_jpegs_cuda: not compiled" \
            in problem
        with pytest.raises(RuntimeError, match="no JPEG decoder on cpu: torchcodec: "):
            decoders.device_decoder(torch.device("cpu"))


def test_off_the_cpu_torchcodec_s_decoder_comes_first_then_torchvision_s_and_pillow_s_never(fresh_choice,
                                                                                          monkeypatch):
    """On a device (here "meta", standing in for CUDA) the CPU's choice does not count: TorchCodec's batched decoder
    where it fits (even where its CPU decoder did not), else torchvision's (deprecated or not: nothing else
    decodes there), never Pillow's."""
    meta = torch.device("meta")
    monkeypatch.setitem(decoders._LOADERS, "torchcodec", lambda: fake("torchcodec", cpu_shift=1))
    monkeypatch.setitem(decoders._LOADERS, "torchvision", lambda: fake("torchvision", deprecated=True))
    assert decoders.cpu_decoder().library == "pillow"
    assert decoders.device_decoder(meta).library == "torchcodec"
    decoders._device_choice.cache_clear()
    monkeypatch.setitem(decoders._LOADERS, "torchcodec", absent)
    assert decoders.device_decoder(meta).library == "torchvision"
    decoders._device_choice.cache_clear()
    monkeypatch.setitem(decoders._LOADERS, "torchvision", lambda: fake("torchvision", refuses=True))
    assert decoders.device_problem(meta) == ("torchcodec: not installed; torchvision: RuntimeError: "
                                             "decode_jpegs_cuda: not compiled with nvJPEG support")


def test_pillow_s_decoder_decodes_batches_on_the_cpu_alone():
    probes = list(decoders.probe_jpegs())
    assert [tuple(image.shape) for image in decoders._pillow().decode_batch(probes, torch.device("cpu"))] == \
        [(3, 48, 64)] * 5
    with pytest.raises(RuntimeError, match="Pillow decodes on the CPU, not on cuda:0"):
        decoders._pillow().decode_batch(probes, torch.device("cuda", 0))


def test_what_pillow_refuses_torchvision_s_decoder_decodes_as_the_last_resort_where_it_is_installed(monkeypatch):
    """Pillow reads the markers in Python and gives up on a TEM marker before the frame, which libjpeg skips:
    torchvision's decoder decodes it, to the pixels Pillow gives the same JPEG without it; without torchvision,
    or where libjpeg refuses too, a RuntimeError."""
    probe = decoders.probe_jpegs()[0].numpy().tobytes()
    tem = torch.frombuffer(bytearray(probe[:2] + b"\xff\x01" + probe[2:]), dtype=torch.uint8)
    with pytest.raises(OSError):
        Image.open(io.BytesIO(tem.numpy().tobytes()))
    pillow = decoders._pillow()
    assert torch.equal(pillow.decode(tem), pillow.decode(decoders.probe_jpegs()[0]))
    # cut short: libjpeg refuses too (torchvision 0.29 names decode_jpeg, 0.26 says the image is truncated)
    with pytest.raises(RuntimeError, match="decode_jpeg|truncated"):
        pillow.decode(tem[:200])
    monkeypatch.setattr(decoders, "last_resort", lambda: None)
    with pytest.raises(RuntimeError, match="^Pillow: cannot identify image file"):
        pillow.decode(tem)


def test_the_start_up_line_names_each_backend_s_decoder(fresh_choice, monkeypatch):
    monkeypatch.setitem(decoders._LOADERS, "torchcodec", lambda: fake("torchcodec"))
    cuda = torch.device("cuda", 0)
    monkeypatch.setattr(decoders, "_device_choice", lambda device: (fake("torchcodec"), None))
    assert decoders.decoder_notice("pytorch", cuda, "full") == \
        "=> JPEG decoder: torchcodec 9.9 (libjpeg-turbo, in the loader workers; other formats: PIL)"
    assert decoders.decoder_notice("pytorch", cuda) == \
        "=> JPEG decoder: torchcodec 9.9 (libjpeg-turbo, in the loader workers; at 1/2, 1/4 or 1/8 scale where the " \
        "crop or resize allows: Pillow's draft; other formats: PIL)"
    assert decoders.decoder_notice("pytorch-gpu", cuda) == \
        "=> JPEG decoder: torchcodec 9.9 (nvJPEG on cuda:0); the JPEGs it refuses: torchcodec 9.9 (libjpeg-turbo, " \
        "on the CPU)"
    assert decoders.decoder_notice("dali-gpu", cuda) == "=> JPEG decoder: DALI's own (nvJPEG on the GPU)"
    assert decoders.decoder_notice("dali-cpu", cuda) == "=> JPEG decoder: DALI's own (libjpeg-turbo on the CPU)"
    assert decoders.decoder_notice("synthetic", cuda) is None


def test_main_says_the_decoder_at_start_up(image_folder, tmp_path, tiny_arch, capsys):
    from image_classification.training import main

    assert main(["-a", tiny_arch, "--num-classes", "3", "--device", "cpu", "--data-backend", "pytorch", "-j", "0",
                 "--image-size", "32", "-b", "4", "--epochs", "1", "--prof", "1", "--training-only",
                 "--no-checkpoints", "--workspace", str(tmp_path), str(image_folder)]) == 0
    name = decoders.cpu_decoder().name
    assert f"=> JPEG decoder: {name} (libjpeg-turbo, in the loader workers; at 1/2, 1/4 or 1/8 scale where the crop " \
           "or resize allows: Pillow's draft; other formats: PIL)\n" in capsys.readouterr().out


def test_no_deprecation_warning_of_torchvision_s_decoders_reaches_the_user():
    """torchvision 0.29 warns at every decode; where its decoder is used the filter leaves out that warning alone: with every deprecation
    warning made an error, a decode through torchvision's decoder runs, and another deprecation still raises.
    In this process as a fresh one under ``-W error::DeprecationWarning`` runs it: the error filter first,
    then the decoder built (which adds its filter), so a decoder that stopped adding it fails here."""
    from image_classification.data.files import decode_rgb_tensor

    decoders._torchvision.cache_clear()  # built below, under the filters a user's -W sets at start-up
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", DeprecationWarning)
            with decoders.use_decoder("torchvision"):
                image = decode_rgb_tensor(decoders.probe_jpegs()[0].numpy().tobytes())
            assert tuple(image.shape) == (3, 48, 64)
            with pytest.raises(DeprecationWarning, match="another deprecation"):
                warnings.warn("another deprecation", DeprecationWarning)
    finally:
        decoders._torchvision.cache_clear()  # built again under the suite's filters, adding its own to them


def test_every_installed_decoder_gives_pillow_s_batches(image_folder):
    """The pytorch and pytorch-gpu backends' batches (the CPU twin of pytorch-gpu) are the same, bit for bit, with
    each installed decoder as with Pillow's: torchvision's, the decoder of every run before Pillow's became the
    default, and TorchCodec's where it is installed."""
    config = dict(data=str(image_folder), image_size=32, batch_size=4, seed=3, workers=0)
    runtime = Runtime(torch.device("cpu"), None, torch.contiguous_format)
    batches = {}
    libraries = [library for library in decoders.LIBRARIES if decoders.installed(library)]
    assert "torchvision" in libraries and libraries[-1] == "pillow"
    for library in libraries:
        with decoders.use_decoder(library), warnings.catch_warnings():
            warnings.filterwarnings("ignore", decoders.TORCHVISION_DEPRECATION)  # pytest put back the filters
            for backend in ("pytorch", "pytorch-gpu"):
                train, val = get_loaders(DataConfig(data_backend=backend, **config), runtime, want_train=True,
                                         want_val=True)
                train.set_epoch(1)
                batches[library, backend] = [images for loader in (train, val) for images, _ in loader]
    for library in libraries[:-1]:
        for backend in ("pytorch", "pytorch-gpu"):
            ours, theirs = batches[library, backend], batches["pillow", backend]
            assert len(ours) == len(theirs) == 9 and all(torch.equal(a, b) for a, b in zip(ours, theirs))


def jpeg_kinds() -> dict[str, bytes]:
    """A textured image (gradients, sharp edges, noise) at two sizes as encoders write it: every chroma
    subsampling, baseline and progressive, optimised Huffman tables, qualities 50 to 100, greyscale, CMYK, restart
    markers and torchvision's encoder."""
    from torchvision.io import encode_jpeg

    kinds = {}
    for width, height in ((333, 251), (17, 9)):
        rows, cols = np.mgrid[0:height, 0:width]
        noise = np.random.default_rng(width).integers(0, 96, (height, width, 3))
        edges = ((rows // 7 + cols // 5) % 2 * 120)[..., None]
        pixels = np.clip(np.stack([rows, cols, rows + cols], -1) % 256 + noise + edges - 60, 0, 255).astype(np.uint8)
        image = Image.fromarray(pixels)
        options = {f"subsampling {sub}": {"subsampling": sub} for sub in ("4:4:4", "4:2:2", "4:2:0", "4:1:1")}
        options |= {"progressive": {"progressive": True}, "optimised, quality 50": {"optimize": True, "quality": 50},
                    "quality 100": {"quality": 100}, "restart markers": {"restart_marker_blocks": 3}}
        for kind, saved in {**options, "greyscale": {}, "CMYK": {}}.items():
            encoded = io.BytesIO()
            image.convert({"greyscale": "L", "CMYK": "CMYK"}.get(kind, "RGB")).save(encoded, "JPEG",
                                                                                     **{"quality": 90, **saved})
            kinds[f"{width}x{height}: {kind}"] = encoded.getvalue()
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", decoders.TORCHVISION_DEPRECATION, DeprecationWarning)
            tensor = torch.from_numpy(pixels).permute(2, 0, 1).contiguous()
            kinds[f"{width}x{height}: torchvision's encoder"] = encode_jpeg(tensor, quality=85).numpy().tobytes()
    return kinds


def test_every_installed_decoder_gives_pillow_s_pixels_on_every_kind_of_jpeg():
    """Beyond the probes: the pixels of record do not hang on the library (libjpeg-turbo in each, with its default
    arithmetic), so the batches of a run, and of its resume, are the same whichever a machine takes."""
    pillow = decoders._pillow()
    others = [decoders.load(library) for library in decoders.LIBRARIES[:-1] if decoders.installed(library)]
    assert others
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", decoders.TORCHVISION_DEPRECATION, DeprecationWarning)
        for kind, raw in jpeg_kinds().items():
            data = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
            expected = pillow.decode(data)
            assert all(torch.equal(other.decode(data), expected) for other in others), kind
