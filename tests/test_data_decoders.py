"""Which JPEG decoder the pytorch and pytorch-gpu backends use: TorchCodec's where it decodes as torchvision's,
else torchvision's, said at start-up, without torchvision's deprecation warning."""

from __future__ import annotations

import pytest
import torch

from image_classification.data import DataConfig, decoders, get_loaders
from image_classification.system.runtime import Runtime


@pytest.fixture
def fresh_choice():
    """Each test decides anew (the choice is made once per process)."""
    decoders._cpu_choice.cache_clear()
    decoders._device_choice.cache_clear()
    yield
    decoders._cpu_choice.cache_clear()
    decoders._device_choice.cache_clear()


def fake(library: str, cpu_shift: int = 0, device_shift: int = 0, refuses: bool = False) -> decoders.JpegDecoder:
    """torchvision's decoders under another name, their pixels moved up by ``cpu_shift`` grey levels on the CPU
    and ``device_shift`` on a device, or refusing every batch on a device."""
    real = decoders._torchvision()

    def shifted(data, shift):
        return (real.decode(data).int() + shift).clamp(0, 255).to(torch.uint8)

    def decode_batch(data, device):
        if refuses:
            raise RuntimeError("decode_jpegs_cuda: not compiled with nvJPEG support")
        return [shifted(one, device_shift).to(device) for one in data]

    return decoders.JpegDecoder(library, "9.9", lambda data: shifted(data, cpu_shift), decode_batch)


def test_torchcodec_is_taken_where_it_decodes_the_probes_as_torchvision_else_torchvision(fresh_choice, monkeypatch):
    """The same pixels on every probe, or torchvision's decoder: one grey level off, a JPEG turned by its EXIF
    orientation (which the crop boxes, drawn from the stored size, would miss), or not installed."""
    monkeypatch.setitem(decoders._LOADERS, "torchcodec", lambda: fake("torchcodec"))
    assert decoders.cpu_decoder().name == "torchcodec 9.9"
    decoders._cpu_choice.cache_clear()
    monkeypatch.setitem(decoders._LOADERS, "torchcodec", lambda: fake("torchcodec", cpu_shift=1))
    assert decoders.cpu_decoder().library == "torchvision"  # one grey level off: not the pytorch backend's batches
    decoders._cpu_choice.cache_clear()

    def absent():
        raise ImportError("No module named 'torchcodec'")

    monkeypatch.setitem(decoders._LOADERS, "torchcodec", absent)
    assert decoders.cpu_decoder().library == "torchvision"
    decoders._cpu_choice.cache_clear()
    real = decoders._torchvision()

    def by_exif(data):  # a decoder that turns the image its EXIF orientation names, as TorchCodec 0.17's does
        image = real.decode(data)
        return image.rot90(-1, (1, 2)) if bytes(data[:200].tolist()).find(b"Exif") >= 0 else image

    monkeypatch.setitem(decoders._LOADERS, "torchcodec", lambda: decoders.JpegDecoder("torchcodec", "9.9", by_exif,
                                                                                      real.decode_batch))
    assert decoders.cpu_decoder().library == "torchvision"
    assert tuple(by_exif(decoders.probe_jpegs()[-1]).shape) == (3, 64, 48)


def test_torchcodec_0_17_turns_jpegs_by_their_exif_orientation_so_torchvision_s_decoder_is_taken(fresh_choice):
    """What the docs say of the installed TorchCodec 0.17: its pixels are torchvision's but for the EXIF turn."""
    torchcodec = pytest.importorskip("torchcodec")
    if not torchcodec.__version__.startswith("0.17"):
        pytest.skip(f"the docs speak of TorchCodec 0.17, not {torchcodec.__version__}")
    ours, theirs = decoders._torchcodec(), decoders._torchvision()
    probes = decoders.probe_jpegs()
    assert all(torch.equal(ours.decode(probe), theirs.decode(probe)) for probe in probes[:-1])
    assert tuple(ours.decode(probes[-1]).shape) == (3, 64, 48) != tuple(theirs.decode(probes[-1]).shape)
    assert decoders.cpu_decoder().library == "torchvision"


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
    """torchvision 0.29 warns at every decode; the filter leaves out that warning alone: with every deprecation
    warning made an error, a decode through torchvision's decoder runs, and another deprecation still raises.
    In this process as a fresh one under ``-W error::DeprecationWarning`` runs it: the error filter first,
    then the decoder built (which adds its filter), so a decoder that stopped adding it fails here."""
    import warnings

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


def test_torchcodec_s_and_torchvision_s_decoders_give_the_same_batches(image_folder):
    """Where TorchCodec is installed: on JPEGs without an EXIF orientation the pytorch and pytorch-gpu backends'
    batches are the same, bit for bit, with either decoder (the CPU twin of pytorch-gpu)."""
    pytest.importorskip("torchcodec")
    config = dict(data=str(image_folder), image_size=32, batch_size=4, seed=3, workers=0)
    runtime = Runtime(torch.device("cpu"), None, torch.contiguous_format)
    batches = {}
    for library in decoders.LIBRARIES:
        with decoders.use_decoder(library):
            for backend in ("pytorch", "pytorch-gpu"):
                train, val = get_loaders(DataConfig(backend=backend, **config), runtime, want_train=True,
                                         want_val=True)
                train.set_epoch(1)
                batches[library, backend] = [images for loader in (train, val) for images, _ in loader]
    for backend in ("pytorch", "pytorch-gpu"):
        ours, theirs = batches["torchcodec", backend], batches["torchvision", backend]
        assert len(ours) == len(theirs) == 9 and all(torch.equal(a, b) for a, b in zip(ours, theirs))
