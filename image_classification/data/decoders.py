"""The JPEG decoders of the ``pytorch`` and ``pytorch-gpu`` backends: TorchCodec's, torchvision's or Pillow's,
all libjpeg-turbo on the CPU, chosen once per process so that the pixels are the same whichever is taken.

torchvision deprecates its image decoders from 0.29 on (:data:`TORCHVISION_DEPRECATES`), in favour of
TorchCodec's (``torchcodec.decoders``, 0.16 and later, which need no FFmpeg for images).  Pillow's pixels are the
reference: Pillow is always installed and already decodes every other format and the reduced scales
(:mod:`.reduced`).  A process decides at its first decode (:func:`cpu_decoder`, :func:`device_decoder`):

* on the CPU, the first of :data:`LIBRARIES` that loads, is not deprecated, and decodes the probe JPEGs
  (:func:`probe_jpegs`: colour, greyscale, progressive, CMYK, and one whose EXIF orientation says "turn me") to
  Pillow's pixels exactly: TorchCodec's, else torchvision's before 0.29, else Pillow's, which takes more CPU
  time for the same pixels (docs/performance.md, "JPEG decoders on the CPU") and hands the few JPEGs it
  refuses to torchvision's (:func:`last_resort`).  A decoder here gives the image as stored: the callers turn
  it by its EXIF orientation afterwards, by the one reading of the tag every path shares (:mod:`.orientation`),
  or leave it as stored for weights that trained so.  TorchCodec turns a JPEG by its own reading of the tag,
  so it is handed each JPEG with that tag hidden (:func:`exif_hidden`);
* on a device, the first of TorchCodec's and torchvision's decoders (nvJPEG; on the CPU, the CPU decoder
  first) that decodes the probes there within :data:`DEVICE_LEVELS` of the CPU's pixels and at their sizes
  (the bound the GPU tests hold the batches to), else none (:func:`device_problem` says why).

torchvision's decoders warn of their deprecation at every call; where one is used (on a device without
TorchCodec, as the last resort, or asked for by :func:`use_decoder`) that warning is filtered out, by its
message alone (:data:`TORCHVISION_DEPRECATION`), once in each process that loads it, so that no other warning
is hidden.  :func:`decoder_notice` is the start-up line that names the decoder a backend uses.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import io
import re
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image

from .orientation import ORIENTATION_TAG

LIBRARIES = ("torchcodec", "torchvision", "pillow")  # the CPU's order of preference
REFERENCE = "pillow"  # whose pixels the others must give
# The mean absolute difference from the CPU decoder's pixels, in grey levels, within which a device's decoder is
# taken: the bound the GPU tests hold a backend's batches to.
DEVICE_LEVELS = 3.0
TORCHVISION_DEPRECATION = "The image decoding and encoding capabilities of TorchVision are deprecated"
TORCHVISION_DEPRECATES = (0, 29)  # the first release whose decoders warn of their deprecation
PROBES_ON_DEVICES = 4  # the first probes: those a device decodes (CMYK JPEGs are decoded on the CPU)


@dataclass(frozen=True)
class JpegDecoder:
    """One library's JPEG decoders: ``decode`` one JPEG's bytes (a uint8 tensor) on the CPU, ``decode_batch`` a
    list of them on a device, each to a uint8 CHW RGB tensor; both raise RuntimeError for a JPEG they refuse.
    ``deprecated``: its library warns that they are."""

    library: str
    version: str
    decode: Callable[[torch.Tensor], torch.Tensor]
    decode_batch: Callable[[list[torch.Tensor], torch.device], list[torch.Tensor]]
    deprecated: bool = False

    @property
    def name(self) -> str:
        return f"{self.library} {self.version}"


def quiet_torchvision_deprecation() -> None:
    """Leave out torchvision's deprecation warning of its image decoders (its message alone; any other warning,
    deprecations included, shows as before)."""
    warnings.filterwarnings("ignore", message=TORCHVISION_DEPRECATION, category=DeprecationWarning)


def release(version: str) -> tuple[int, ...]:
    """(major, minor) of a version string such as ``0.29.1+cu130``."""
    return tuple(int(part) for part in re.findall(r"\d+", version)[:2])


@functools.cache
def _torchvision() -> JpegDecoder:
    import torchvision
    from torchvision.io import ImageReadMode, decode_jpeg

    # taken on a device where TorchCodec is not installed, and wherever use_decoder asks for it: its deprecation
    # warning, at every call from 0.29 on, says nothing a user can act on there
    quiet_torchvision_deprecation()
    version = torchvision.__version__.split("+")[0]
    return JpegDecoder("torchvision", version, lambda data: decode_jpeg(data, mode=ImageReadMode.RGB),
                       lambda data, device: decode_jpeg(list(data), mode=ImageReadMode.RGB, device=device),
                       deprecated=release(version) >= TORCHVISION_DEPRECATES)


@functools.cache
def _torchcodec() -> JpegDecoder:
    import torchcodec
    from torchcodec.decoders import decode_jpeg

    return JpegDecoder("torchcodec", torchcodec.__version__.split("+")[0],
                       lambda data: decode_jpeg(exif_hidden(data), mode="RGB"),
                       lambda data, device: decode_jpeg([exif_hidden(one) for one in data], mode="RGB",
                                                        device=device))


def rgb_tensor(image: Image.Image) -> torch.Tensor:
    """An 8-bit RGB PIL image's pixels as a uint8 CHW tensor over HWC memory, the layout libjpeg-turbo's decoders
    give."""
    return torch.from_numpy(np.array(image, dtype=np.uint8)).permute(2, 0, 1)


def host_bytes(data: torch.Tensor) -> bytes:
    """A copy of a contiguous uint8 CPU tensor's bytes (a JPEG's, which are host memory on every device), read
    from its pointer: no Tensor method that could read a device back is called."""
    return ctypes.string_at(data.data_ptr(), data.numel()) if data.numel() else b""


def _pillow_decode(data: torch.Tensor) -> torch.Tensor:
    """Pillow's decode, else torchvision's where Pillow refuses and torchvision is installed (:func:`last_resort`);
    RuntimeError where neither decodes."""
    try:
        with Image.open(io.BytesIO(host_bytes(data.contiguous()))) as image:
            return rgb_tensor(image if image.mode == "RGB" else image.convert("RGB"))
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as error:
        refused = error
    fallback = last_resort()
    if fallback is None:
        raise RuntimeError(f"Pillow: {refused}") from refused
    return fallback.decode(data)


def last_resort() -> JpegDecoder | None:
    """torchvision's decoder, kept (deprecated or not) for the JPEGs Pillow refuses: Pillow reads a JPEG's markers
    in Python before libjpeg decodes it, and gives up on some that libjpeg decodes (a TEM marker or stray bytes
    before the frame, which TorchCodec, nvJPEG and DALI decode); None where torchvision's decoders are gone."""
    return load("torchvision")


def _pillow_batch(data: list[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
    if device.type != "cpu":
        raise RuntimeError(f"Pillow decodes on the CPU, not on {device}")
    return [_pillow_decode(one) for one in data]


@functools.cache
def _pillow() -> JpegDecoder:
    import PIL

    return JpegDecoder("pillow", PIL.__version__, _pillow_decode, _pillow_batch)


_LOADERS = {"torchcodec": _torchcodec, "torchvision": _torchvision, "pillow": _pillow}
_forced: str | None = None  # use_decoder's choice, in place of the probes'

_APP1, _RENAMED = 0xE1, 0xEF  # EXIF's segment, and APP15, a segment no decoder reads
_EXIF = b"Exif\0\0"
# the next marker where libjpeg finds it: past any byte that is not 0xFF, fill bytes, a stuffed 0xFF 0x00 and the
# restart markers of a scan
_NEXT_MARKER = re.compile(rb"\xff+([^\x00\xd0-\xd7\xff])")
_NO_LENGTH = {0x01, 0xD8}  # TEM, SOI


def exif_hidden(data: torch.Tensor) -> torch.Tensor:
    """A JPEG's bytes (a uint8 tensor) in which no decoder finds an EXIF orientation: every APP1 marker libjpeg
    reads renamed APP15, and every ``Exif\\0\\0`` in a segment that no decoder reads (APPn, COM) broken, for a
    reader that walks the markers less carefully; ``data`` itself where there is none.  No pixel changes: the
    tables and the scans are left as they are."""
    raw = host_bytes(data.contiguous())
    if _EXIF not in raw and b"\xff\xe1" not in raw:
        return data
    patched, at = bytearray(raw), 2
    while (found := _NEXT_MARKER.search(raw, at)) is not None and found[1] != b"\xd9":
        start, marker = found.end(), found[1][0]
        if marker in _NO_LENGTH or start + 2 > len(raw):
            at = start
            continue
        at = start + max((raw[start] << 8) | raw[start + 1], 2)
        if marker == _APP1:
            patched[start - 1] = _RENAMED
        if 0xE0 <= marker <= 0xEF or marker == 0xFE:
            for exif in re.finditer(re.escape(_EXIF), raw[start:at]):
                patched[start + exif.start() + 5] = 1
    return torch.frombuffer(patched, dtype=torch.uint8)


@functools.cache
def probe_jpegs() -> tuple[torch.Tensor, ...]:
    """Five small JPEGs that tell decoders apart: a textured colour image (64 x 48, 4:2:0, quality 90), the same
    in greyscale, as a progressive JPEG, with an EXIF orientation of 6 (which a decoder that turns images by it
    decodes as 48 x 64), and in CMYK (last: devices are not given it, see :data:`PROBES_ON_DEVICES`)."""
    rows, cols = np.mgrid[0:48, 0:64]
    noise = np.random.default_rng(0).integers(0, 64, (48, 64, 3))
    pixels = np.stack([rows * 4, cols * 3, (rows + cols) * 2], -1) + noise
    image = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))
    turned = image.getexif()
    turned[ORIENTATION_TAG] = 6  # "turn 90 degrees clockwise to view"
    probes = []
    for picture, options in ((image, {}), (image.convert("L"), {}), (image, {"progressive": True}),
                             (image, {"exif": turned.tobytes()}), (image.convert("CMYK"), {})):
        encoded = io.BytesIO()
        picture.save(encoded, "JPEG", quality=90, **options)
        probes.append(torch.frombuffer(bytearray(encoded.getvalue()), dtype=torch.uint8))
    return tuple(probes)


def load(library: str) -> JpegDecoder | None:
    """``library``'s decoders, or None where it is not installed or cannot load."""
    try:
        return _LOADERS[library]()
    except (ImportError, OSError, RuntimeError):  # absent, or its native library does not load
        return None


def installed(library: str) -> bool:
    """Whether ``library``'s decoders import and load here."""
    return load(library) is not None


def _decodes_alike(candidate: JpegDecoder, reference: JpegDecoder) -> bool:
    try:
        return all(torch.equal(candidate.decode(probe), reference.decode(probe)) for probe in probe_jpegs())
    except RuntimeError:
        return False


@functools.cache
def _cpu_choice() -> JpegDecoder:
    reference = _LOADERS[REFERENCE]()
    for library in LIBRARIES:
        candidate = load(library)
        if candidate is not None and not candidate.deprecated and _decodes_alike(candidate, reference):
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
    reference, probes, found = cpu_decoder(), probe_jpegs()[:PROBES_ON_DEVICES], []
    for image, probe in zip(decoder.decode_batch(list(probes), device), probes):
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


def device_candidates(device: torch.device) -> list[str]:
    """The libraries tried on ``device``, in order: TorchCodec's, then torchvision's; on the CPU (the GPU
    backend's twin) the CPU's own choice first, whose pixels the pytorch backend's are."""
    first = [cpu_decoder().library] if device.type == "cpu" else []
    return list(dict.fromkeys([*first, "torchcodec", "torchvision"]))


@functools.cache
def _device_choice(device: torch.device) -> tuple[JpegDecoder | None, str | None]:
    problems = []
    for library in device_candidates(device):
        decoder = load(library)
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
    (benchmarks compare them); loader workers forked inside it keep it."""
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
