"""What the ``pytorch-gpu`` backend's loader workers do: read each image's bytes (from a folder or its shards),
find its size and its EXIF orientation in its header (:mod:`.orientation`: the draws are made in the turned
image, which the training process turns once decoded), apply the size rule and draw its augmentation
(:class:`.transforms.TrainTransform`;
``--augmentation``'s operations too, :class:`.transforms.PolicyDraws`) under its own seed.  Decoding is the training process's (:mod:`.device_decode`).

A JPEG that nvJPEG decodes (baseline, extended or progressive Huffman coding, 8 bits, greyscale or three
components, whole to its end marker) stays encoded; any other image (PNG, CMYK or 12-bit JPEG, a JPEG cut short,
...) is decoded here on the CPU, as the ``pytorch`` backend decodes it, and handed over as pixels.  An image that cannot be read, or breaks the size
rule, is left out and reported as the ``pytorch`` backend reports it.  A worker's batch is an
:class:`EncodedBatch`: its JPEG bytes in one tensor and its decoded pixels in another, both in shared memory,
so handing it to the training process copies nothing.
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset

from ..models.image_size import check_size
from .files import decode_rgb_tensor, is_jpeg, jpeg_frame, open_rgb
from .layout import Split
from .orientation import jpeg_orientation, turned_size
from .transforms import Draw, PolicyDraws, TrainTransform, seeded
from .workers import shared_tensor

# The frame headers (SOFn markers) whose coding nvJPEG decodes: baseline, extended sequential and progressive
# Huffman.  Arithmetic coding, lossless and hierarchical JPEGs are decoded on the CPU.
GPU_CODINGS = frozenset({0xC0, 0xC1, 0xC2})
GPU_COMPONENTS = frozenset({1, 3})  # greyscale and YCbCr; CMYK and YCCK (4) are decoded on the CPU
JPEG_END = b"\xff\xd9"  # the end-of-image marker


@dataclass
class Sample:
    """One image as a worker hands it over: its JPEG bytes and the orientation to turn it by once decoded, or
    its pixels (CHW uint8, turned already) where the GPU would not decode it; its size (turned); and, for
    training, its draws and ``--augmentation``'s operations, drawn after them."""

    index: int
    label: int
    height: int
    width: int
    encoded: bytes | None = None
    pixels: torch.Tensor | None = None
    draw: Draw | None = None
    augmentation: tuple[tuple[str, float], ...] | None = None
    orientation: int = 1


def gpu_decodable(raw: bytes, short_side: int | None = None) -> tuple[int, int] | None:
    """(height, width) of a JPEG that nvJPEG decodes, after the size rule (for its resize to ``short_side``
    too, when given); None for any other image, one whose header says 0 pixels high or wide included (the CPU's
    decoder refuses it, as in the pytorch backend).  Raises ImageTooLarge and UnreadableHeader.

    A JPEG that does not end in its end-of-image marker (zero padding aside) was cut short, or has bytes after
    its end: libjpeg-turbo refuses the first and ignores the second, where nvJPEG might decode a truncated image
    without complaint, so both are left to the CPU's decoder, which then decides as in the pytorch backend."""
    if not is_jpeg(raw) or not raw.rstrip(b"\0").endswith(JPEG_END):
        return None
    handle = io.BytesIO(raw)  # shares the bytes: no copy
    handle.seek(2)  # past the start of image
    frame = jpeg_frame(handle)
    if not frame.width or not frame.height:  # no image (libjpeg refuses it), and no crop box to draw in it
        return None
    check_size(frame.width, frame.height, short_side)
    if frame.marker in GPU_CODINGS and frame.precision == 8 and frame.components in GPU_COMPONENTS:
        return frame.height, frame.width
    return None


class EncodedImages(Dataset):
    """Reads one image and draws its augmentation under its own seed (``transform``: training, with ``policy``'s
    operations where ``--augmentation`` asks for them; None for validation, whose images are resized whole to a
    ``resize`` px short side, under the size rule too); each turned by its EXIF orientation where ``turn``."""

    def __init__(self, samples: Split, transform: TrainTransform | None, resize: int | None = None,
                 policy: PolicyDraws | None = None, turn: bool = True):
        self.samples, self.transform, self.resize, self.policy = samples, transform, resize, policy
        self.turn = turn

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, item: tuple[int, ...]) -> tuple[Sample | None, tuple[str, str] | None]:
        index, seed, *size = item  # training samples carry their epoch's crop size
        try:
            sample = self._read(index)
        except (OSError, ValueError, Image.DecompressionBombError) as error:
            return None, (self.samples.name(index), f"{error.__class__.__name__}: {error}")
        if self.transform is not None:
            sample.draw, sample.augmentation = seeded(seed, self._draw, sample.height, sample.width, *size)
        return sample, None

    def _read(self, index: int) -> Sample:
        raw = self.samples.read(index)
        label = self.samples.label(index)
        size = gpu_decodable(raw, self.resize)
        if size is not None:
            orientation = jpeg_orientation(raw) if self.turn else 1
            width, height = turned_size(size[1], size[0], orientation)
            return Sample(index, label, height, width, encoded=raw, orientation=orientation)
        if self.resize is None:
            pixels = decode_rgb_tensor(raw, self.turn)  # the pytorch backend's: libjpeg-turbo, else PIL
        else:
            resized = open_rgb(io.BytesIO(raw), self.resize, self.turn)
            pixels = torch.from_numpy(np.array(resized)).permute(2, 0, 1)
        return Sample(index, label, *pixels.shape[-2:], pixels=pixels)

    def _draw(self, height: int, width: int, size: int | None = None) -> tuple[Draw, tuple | None]:
        """The crop and flip (at ``size``, the epoch's crop side, when given), then the policy's operations for the
        crop, drawn on from where they left the generator: what the ``pytorch`` backend's workers draw, in that
        order."""
        draw = self.transform.draw(height, width, size)
        return draw, (self.policy.draw(draw.size, draw.size) if self.policy is not None else None)


@dataclass
class EncodedBatch:
    """A batch of :class:`Sample`\\ s in a few tensors: ``data`` holds the JPEG bytes of the samples at
    ``encoded`` (the k-th ends at ``ends[k]``, to be turned by ``orientations[k]`` once decoded), ``pixels``
    the flattened images of the others; ``sizes`` is every sample's (height, width), turned, ``draws`` and
    ``augmentations`` its training draws."""

    indices: list[int]
    sizes: list[tuple[int, int]]
    data: torch.Tensor
    ends: list[int]
    encoded: list[int]
    pixels: torch.Tensor
    draws: list[Draw] | None = None
    augmentations: list[tuple] | None = None
    orientations: list[int] | None = None  # None: every JPEG as stored

    def __len__(self) -> int:
        return len(self.indices)

    def jpeg(self, k: int) -> torch.Tensor:
        """The k-th encoded sample's bytes, a view of ``data``."""
        return self.data[(self.ends[k - 1] if k else 0):self.ends[k]]


def _packed(chunks: list[np.ndarray], dtype: torch.dtype) -> tuple[torch.Tensor, list[int]]:
    """``chunks`` end to end in one (shared-memory) tensor, and where each ends."""
    ends = np.cumsum([len(chunk) for chunk in chunks], dtype=np.int64).tolist() if chunks else []
    packed = shared_tensor((ends[-1] if ends else 0,), dtype)
    if chunks:
        np.concatenate(chunks, out=packed.numpy())
    return packed, ends


def collate_encoded(batch: list[tuple[Sample | None, tuple[str, str] | None]]):
    """(EncodedBatch, labels, broken): the readable samples packed, their labels, the broken ones' (name,
    reason)."""
    good = [sample for sample, _ in batch if sample is not None]
    broken = [problem for _, problem in batch if problem is not None]
    encoded = [position for position, sample in enumerate(good) if sample.encoded is not None]
    data, ends = _packed([np.frombuffer(good[position].encoded, dtype=np.uint8) for position in encoded],
                         torch.uint8)
    pixels, _ = _packed([sample.pixels.reshape(-1).numpy() for sample in good if sample.pixels is not None],
                        torch.uint8)
    draws = [sample.draw for sample in good] if good and good[0].draw is not None else None
    augmentations = [sample.augmentation for sample in good] if good and good[0].augmentation is not None else None
    labels = torch.tensor([sample.label for sample in good], dtype=torch.int64)
    sizes = [(sample.height, sample.width) for sample in good]
    orientations = [good[position].orientation for position in encoded]
    batch = EncodedBatch([sample.index for sample in good], sizes, data, ends, encoded, pixels, draws,
                         augmentations, orientations)
    return batch, labels, broken
