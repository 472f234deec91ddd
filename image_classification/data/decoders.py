"""The JPEG decoders of the ``pytorch`` and ``pytorch-gpu`` backends: TorchCodec's where it is installed and
decodes as torchvision does, else torchvision's.

torchvision deprecates its image decoders from 0.29 on, in favour of TorchCodec's (``torchcodec.decoders``,
0.16 and later, which need no FFmpeg for images).  Both wrap libjpeg-turbo on the CPU and nvJPEG on a GPU.  A
process decides once, at its first decode (:func:`cpu_decoder`, :func:`device_decoder`):

* on the CPU, TorchCodec's decoder where it imports and decodes the probe JPEGs (:func:`probe_jpegs`: colour,
  greyscale, progressive, and one whose EXIF orientation says "turn me") to torchvision's pixels exactly, so
  that the batches stay what they are with either.  A decoder here gives the image as stored: the callers
  turn it by its EXIF orientation afterwards, by the one reading of the tag every path shares
  (:mod:`.orientation`), or leave it as stored for weights that trained so.  TorchCodec 0.17 turns a JPEG by
  the tag itself, by its own reading of it: it fails that probe, and torchvision's decoder is taken;
* on a device, the CPU's choice where its decoder decodes the probes there within :data:`DEVICE_LEVELS` of the
  CPU's pixels and sizes (the bound the GPU tests hold the batches to; a decoder that turned the probe by its
  tag would give it another size), else torchvision's, else none (:func:`device_problem` says why).

torchvision's decoders warn of their deprecation at every call: that warning is filtered out, by its message
alone (:data:`TORCHVISION_DEPRECATION`), once in each process that decodes, so that no other warning is hidden.
:func:`decoder_notice` is the start-up line that names the decoder a backend uses.
"""

from __future__ import annotations

import contextlib
import functools
import io
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image

from .orientation import ORIENTATION_TAG

LIBRARIES = ("torchcodec", "torchvision")  # in the order of preference
# The mean absolute difference from the CPU decoder's pixels, in grey levels, within which a device's decoder is
# taken: the bound the GPU tests hold a backend's batches to.
DEVICE_LEVELS = 3.0
TORCHVISION_DEPRECATION = "The image decoding and encoding capabilities of TorchVision are deprecated"


@dataclass(frozen=True)
class JpegDecoder:
    """One library's JPEG decoders: ``decode`` one JPEG's bytes (a uint8 tensor) on the CPU, ``decode_batch`` a
    list of them on a device, each to a uint8 CHW RGB tensor; both raise RuntimeError for a JPEG they refuse."""

    library: str
    version: str
    decode: Callable[[torch.Tensor], torch.Tensor]
    decode_batch: Callable[[list[torch.Tensor], torch.device], list[torch.Tensor]]

    @property
    def name(self) -> str:
        return f"{self.library} {self.version}"


def quiet_torchvision_deprecation() -> None:
    """Leave out torchvision's deprecation warning of its image decoders (its message alone; any other warning,
    deprecations included, shows as before)."""
    warnings.filterwarnings("ignore", message=TORCHVISION_DEPRECATION, category=DeprecationWarning)


@functools.cache
def _torchvision() -> JpegDecoder:
    import torchvision
    from torchvision.io import ImageReadMode, decode_jpeg

    quiet_torchvision_deprecation()
    return JpegDecoder("torchvision", torchvision.__version__.split("+")[0],
                       lambda data: decode_jpeg(data, mode=ImageReadMode.RGB),
                       lambda data, device: decode_jpeg(list(data), mode=ImageReadMode.RGB, device=device))


@functools.cache
def _torchcodec() -> JpegDecoder:
    import torchcodec
    from torchcodec.decoders import decode_jpeg

    return JpegDecoder("torchcodec", torchcodec.__version__.split("+")[0],
                       lambda data: decode_jpeg(data, mode="RGB"),
                       lambda data, device: decode_jpeg(list(data), mode="RGB", device=device))


_LOADERS = {"torchcodec": _torchcodec, "torchvision": _torchvision}
_forced: str | None = None  # use_decoder's choice, in place of the probes'



@functools.cache
def probe_jpegs() -> tuple[torch.Tensor, ...]:
    """Four small JPEGs that tell decoders apart: a textured colour image (64 x 48, 4:2:0, quality 90), the same
    in greyscale, as a progressive JPEG, and with an EXIF orientation of 6 (which a decoder that turns images by it
    decodes as 48 x 64)."""
    rows, cols = np.mgrid[0:48, 0:64]
    noise = np.random.default_rng(0).integers(0, 64, (48, 64, 3))
    pixels = np.stack([rows * 4, cols * 3, (rows + cols) * 2], -1) + noise
    image = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))
    turned = image.getexif()
    turned[ORIENTATION_TAG] = 6  # "turn 90 degrees clockwise to view"
    probes = []
    for picture, options in ((image, {}), (image.convert("L"), {}), (image, {"progressive": True}),
                             (image, {"exif": turned.tobytes()})):
        encoded = io.BytesIO()
        picture.save(encoded, "JPEG", quality=90, **options)
        probes.append(torch.frombuffer(bytearray(encoded.getvalue()), dtype=torch.uint8))
    return tuple(probes)


def load_decoder(library: str) -> JpegDecoder | None:
    """``library``'s decoders, or None where it is not installed or cannot load."""
    try:
        return _LOADERS[library]()
    except (ImportError, OSError, RuntimeError):  # absent, or its native library does not load
        return None


def installed(library: str) -> bool:
    """Whether ``library``'s decoders import and load here."""
    return load_decoder(library) is not None


def _decodes_alike(candidate: JpegDecoder, reference: JpegDecoder) -> bool:
    try:
        return all(torch.equal(candidate.decode(probe), reference.decode(probe)) for probe in probe_jpegs())
    except RuntimeError:
        return False


@functools.cache
def _cpu_choice() -> JpegDecoder:
    reference = _torchvision()
    for library in LIBRARIES[:-1]:
        candidate = load_decoder(library)
        if candidate is not None and _decodes_alike(candidate, reference):
            return candidate
    return reference


def cpu_decoder() -> JpegDecoder:
    """The CPU decoder of this process (see the module docstring)."""
    return _LOADERS[_forced]() if _forced else _cpu_choice()


@dataclass(frozen=True)
class ProbeDifference:
    """One probe JPEG decoded on a device beside the CPU decoder: both shapes (C, H, W), and the mean and largest
    absolute difference of their pixels in grey levels (None where the shapes differ)."""

    shape: tuple[int, ...]
    expected: tuple[int, ...]
    mean_levels: float | None
    max_levels: int | None

    @property
    def problem(self) -> str | None:
        """Why these pixels keep the decoder from being taken, or None."""
        if self.shape != self.expected:
            return f"it decodes a {self.expected} image as {self.shape}"
        if self.mean_levels > DEVICE_LEVELS:
            return f"its pixels differ from the CPU decoder's by {self.mean_levels:.2f} grey levels on average"
        return None


def probe_differences(decoder: JpegDecoder, device: torch.device) -> list[ProbeDifference]:
    """Each of :func:`probe_jpegs` decoded by ``decoder`` on ``device`` against the CPU decoder's pixels; raises
    what the decoder raises."""
    reference, found = cpu_decoder(), []
    for image, probe in zip(decoder.decode_batch(list(probe_jpegs()), device), probe_jpegs()):
        expected = reference.decode(probe)
        shape, wanted = tuple(image.shape), tuple(expected.shape)
        if shape != wanted:
            found.append(ProbeDifference(shape, wanted, None, None))
            continue
        difference = (image.cpu().int() - expected.int()).abs()
        found.append(ProbeDifference(shape, wanted, float(difference.float().mean()), int(difference.max())))
    return found


def _device_fit(decoder: JpegDecoder, device: torch.device) -> str | None:
    """Why ``decoder`` is not taken on ``device`` (an error, or pixels too far from the CPU's), or None."""
    try:
        differences = probe_differences(decoder, device)
    except Exception as error:  # an old torchvision's TypeError, one built without nvJPEG's RuntimeError, ...
        return failure_text(error)
    return next((difference.problem for difference in differences if difference.problem), None)


def failure_text(error: BaseException) -> str:
    """A decoder's failure in one line: its type and the first line of its message."""
    return f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else 'no GPU decoder'}"


def device_candidates() -> list[str]:
    """The libraries tried on a device, in order: the CPU's choice, then torchvision's."""
    return list(dict.fromkeys([cpu_decoder().library, "torchvision"]))


@functools.cache
def _device_choice(device: torch.device) -> tuple[JpegDecoder | None, str | None]:
    problems = []
    for library in device_candidates():
        decoder = load_decoder(library)
        problem = "not installed" if decoder is None else _device_fit(decoder, device)
        if problem is None:
            return decoder, None
        problems.append(f"{library}: {problem}")
    return None, "; ".join(problems)


def device_decoder(device: torch.device) -> JpegDecoder:
    """The decoder of the batches on ``device`` (see the module docstring); raises RuntimeError where none
    decodes there (:func:`device_problem` says why first)."""
    if _forced:
        return _LOADERS[_forced]()
    decoder, problem = _device_choice(device)
    if decoder is None:
        raise RuntimeError(f"no JPEG decoder on {device}: {problem}")
    return decoder


def device_problem(device: torch.device) -> str | None:
    """Why no decoder decodes JPEGs on ``device`` as the CPU does, or None when one does."""
    return _device_choice(device)[1]


@contextlib.contextmanager
def use_decoder(library: str) -> Iterator[JpegDecoder]:
    """``library``'s decoders on the CPU and every device while the block runs, whatever the probes would choose
    (benchmarks compare the two); loader workers forked inside it keep it."""
    global _forced
    before, _forced = _forced, library
    try:
        yield _LOADERS[library]()
    finally:
        _forced = before


def decoder_notice(backend: str, device: torch.device, decode_scale: str = "auto") -> str | None:
    """The start-up line that names the JPEG decoder ``backend`` uses on ``device`` (None for synthetic data);
    with ``decode_scale`` "auto" the ``pytorch`` backend decodes a JPEG whose crop allows it at a reduced scale
    with Pillow's ``draft`` (:mod:`.reduced`), and the line says so."""
    if backend == "synthetic":
        return None
    if backend.startswith("dali"):
        where = "nvJPEG on the GPU" if backend == "dali-gpu" else "libjpeg-turbo on the CPU"
        return f"=> JPEG decoder: DALI's own ({where})"
    cpu = cpu_decoder()
    if backend == "pytorch":
        reduced = "; at 1/2, 1/4 or 1/8 scale where the crop or resize allows: Pillow's draft" if decode_scale == "auto" else ""
        return f"=> JPEG decoder: {cpu.name} (libjpeg-turbo, in the loader workers{reduced}; other formats: PIL)"
    if device.type != "cuda":
        return f"=> JPEG decoder: {cpu.name} (libjpeg-turbo, in the training process: the CPU twin of nvJPEG)"
    return (f"=> JPEG decoder: {device_decoder(device).name} (nvJPEG on {device}); the JPEGs it refuses: "
            f"{cpu.name} (libjpeg-turbo, on the CPU)")
