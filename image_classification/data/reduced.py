"""Decoding a JPEG at reduced size: only the pixels its crop or its resize needs (``--decode-scale auto``).

libjpeg(-turbo) scales a JPEG while it decodes (in the DCT domain): at 1/2, 1/4 or 1/8 it gives a
``ceil(W/s)`` x ``ceil(H/s)`` image, each pixel the average of an ``s`` x ``s`` block, for a fraction of the
work (the inverse DCT, the colour conversion and the memory shrink ``s**2``-fold; the entropy decoding stays).
Pillow's ``Image.draft`` asks libjpeg for it; Pillow bundles libjpeg-turbo, so this needs no other library
(docs/performance.md has the measurement that chose it).

The invariants, for every path that uses it (the ``pytorch`` backend's training and validation, from a folder
or its packed copy; classify.py, ``--evaluate``, int8 calibration):

* **The draws are unchanged.**  The crop box is drawn on the image's full-size coordinates, from its header,
  with the same generator calls as a full decode, so the same seed gives the same boxes and flips, and a resume
  replays them exactly.
* **Nothing is upsampled that was not before.**  A training box is decoded at ``1/s`` only where it still spans
  at least ``s`` times the output's side in both directions (:func:`crop_scale`); a validation image only where
  its reduced short side is still at least the resize's short side (:func:`resize_scale`).  Elsewhere, and for
  every image that is not an 8-bit greyscale or YCbCr JPEG, the decode and the resize are today's, bit for bit.
* **The geometry is the full decode's.**  The reduced image is resized from the box's exact, fractional
  position in it (Pillow's resize with a box), and a validation image to the very size its full decode would be
  resized to: only the pixels the resize starts from differ, by at most :data:`MEAN_BOUND` grey levels on average
  and :data:`MAX_BOUND` at most over a batch (tests/test_reduced.py holds the bound on photographs).
* **The turn is the full decode's.**  A JPEG whose EXIF orientation says to turn it (:mod:`.orientation`) is
  turned at the reduced scale, before its resize: its box and its size are the turned image's, as for a full
  decode, and where a flip brings libjpeg's last, partial column or row to the image's start, the extent
  shifts by what that column or row overhangs.
* ``--decode-scale full`` decodes every pixel, as before this module: the batches of older runs.
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np
from PIL import Image

from ..models.image_size import check_size
from .files import decode_rgb_tensor, is_jpeg, jpeg_frame, open_image
from .orientation import STEPS, jpeg_orientation, turn_image, turn_tensor, turned_size

SCALES = (8, 4, 2)  # libjpeg's reduced scales that Pillow's draft asks for, smallest image first
# The difference from the full-size decode at the same box, measured on photographs (tests/test_reduced.py):
# the mean absolute difference of a batch and the largest of any pixel, in grey levels (0-255).
MEAN_BOUND = 3.0
MAX_BOUND = 64
# the PIL filter of each --interpolation (PIL's bilinear filter is a triangle filter, DALI's INTERP_TRIANGULAR)
FILTERS = {"bilinear": Image.BILINEAR, "bicubic": Image.BICUBIC, "triangular": Image.BILINEAR}
_COMPONENTS = frozenset({1, 3})  # greyscale and YCbCr: CMYK, YCCK and 12-bit JPEGs decode as before


def crop_scale(box_height: int, box_width: int, size: int) -> int:
    """The reduction ``s`` (8, 4, 2 or 1) at which a ``box_height`` x ``box_width`` box still spans at least
    ``size`` pixels in each direction: the largest with ``s * size`` at most the box's shorter side."""
    return next((scale for scale in SCALES if scale * size <= min(box_height, box_width)), 1)


def resize_scale(width: int, height: int, short_side: int) -> int:
    """The reduction ``s`` (8, 4, 2 or 1) at which a ``width`` x ``height`` image's short side, as libjpeg scales
    it (``ceil(side / s)``), is still at least ``short_side``."""
    return next((scale for scale in SCALES if -(-min(width, height) // scale) >= short_side), 1)


def resized_size(width: int, height: int, short_side: int) -> tuple[int, int]:
    """(width, height) of a ``width`` x ``height`` image after torchvision's ``Resize(short_side)``: the short side
    to ``short_side``, the long side ``int(short_side * long / short)`` (its own float arithmetic)."""
    if width <= height:
        return short_side, int(short_side * height / width)
    return int(short_side * width / height), short_side


class DecodeFailed(Exception):
    """A JPEG whose header read but whose data did not decode; ``cause`` is what the decoder raised, in whose
    words the image is reported, as any unreadable image is."""

    def __init__(self, cause: Exception):
        super().__init__(str(cause))
        self.cause = cause


@dataclass(frozen=True)
class ScalableJpeg:
    """A JPEG whose size was read from its header, not yet decoded: what training draws its box from.
    ``width`` and ``height`` are the image's once turned by its ``orientation`` (1: as stored), as the box is
    drawn."""

    raw: bytes
    width: int
    height: int
    orientation: int = 1

    @property
    def shape(self) -> tuple[int, int, int]:
        """(channels, height, width), as a decoded CHW tensor's shape reads."""
        return 3, self.height, self.width

    @property
    def stored_size(self) -> tuple[int, int]:
        """(width, height) as the JPEG stores the image, before its turn."""
        return turned_size(self.width, self.height, self.orientation)

    def reduced(self, scale: int) -> tuple[Image.Image, float, float]:
        """The image decoded at 1/``scale`` and turned, with where the turned full image's extent starts in
        it, (left, top): 0 but along an axis whose flip brings libjpeg's partial last column or row first."""
        width, height = self.stored_size
        image = turn_image(drafted(self.raw, width, height, scale), self.orientation)
        overhang = (-(-width // scale) - width / scale, -(-height // scale) - height / scale)  # stored (x, y)
        transpose, mirror, flip = STEPS[self.orientation]
        across, down = overhang[::-1] if transpose else overhang
        return image, across if mirror else 0.0, down if flip else 0.0

    def resized_crop(self, box: tuple[int, int, int, int], size: int, interpolation: str):
        """The ``box`` (top, left, height, width, in full-size pixels) resized to ``size`` x ``size``, as a
        uint8 CHW tensor, decoded at :func:`crop_scale`'s reduction (callers use this only where it is above 1)."""
        import torch

        top, left, height, width = box
        scale = crop_scale(height, width, size)
        try:
            image, x, y = self.reduced(scale)
        except (OSError, ValueError, Image.DecompressionBombError) as error:
            raise DecodeFailed(error) from error
        left, top = x + left / scale, y + top / scale
        out = image.resize((size, size), FILTERS[interpolation],
                           box=(left, top, left + width / scale, top + height / scale))
        return torch.from_numpy(np.array(out, dtype=np.uint8)).permute(2, 0, 1)

    def decoded(self):
        """The whole image at full size and turned, as :func:`.files.decode_rgb_tensor` decodes it (a uint8
        CHW tensor)."""
        try:
            return turn_tensor(decode_rgb_tensor(self.raw, turn=False), self.orientation)
        except (OSError, ValueError, Image.DecompressionBombError) as error:
            raise DecodeFailed(error) from error


def decode_for_crop(raw: bytes, turn: bool = True):
    """What training crops from an image file's bytes: a :class:`ScalableJpeg` (its header read and the size
    rule applied, nothing decoded) or, for any other image, its uint8 CHW tensor
    (:func:`.files.decode_rgb_tensor`); either turned by its EXIF orientation where ``turn``."""
    jpeg = scalable_jpeg(raw, turn)
    if jpeg is None:
        return decode_rgb_tensor(raw, turn=turn)
    check_size(jpeg.width, jpeg.height)
    return jpeg


def scalable_jpeg(raw: bytes, turn: bool = True) -> ScalableJpeg | None:
    """``raw`` as a :class:`ScalableJpeg` where it is an 8-bit greyscale or YCbCr JPEG, with its EXIF
    orientation where ``turn`` (else as stored); None for any other image.  Raises what the header walk raises
    (:class:`.files.UnreadableHeader`)."""
    if not is_jpeg(raw):
        return None
    handle = io.BytesIO(raw)
    handle.seek(2)
    frame = jpeg_frame(handle)
    if frame.precision != 8 or frame.components not in _COMPONENTS or not frame.width or not frame.height:
        return None
    orientation = jpeg_orientation(raw) if turn else 1
    return ScalableJpeg(raw, *turned_size(frame.width, frame.height, orientation), orientation)


def drafted(raw: bytes, width: int, height: int, scale: int) -> Image.Image:
    """The JPEG ``raw`` (``width`` x ``height``) decoded at 1/``scale`` as an RGB image of ``ceil(width / scale)``
    x ``ceil(height / scale)``.  Raises what Pillow raises for a file it cannot decode, and ValueError where the
    header libjpeg reads disagrees with ``width`` x ``height``."""
    with open_image(io.BytesIO(raw)) as image:
        if image.size != (width, height):
            raise ValueError(f"a JPEG of {image.size[0]}x{image.size[1]} where its header said {width}x{height}")
        image.draft("RGB", (width // scale, height // scale))  # Pillow picks the largest scale that keeps these
        if image.size != (-(-width // scale), -(-height // scale)):
            raise ValueError(f"libjpeg did not scale a {width}x{height} JPEG by 1/{scale}")
        return image.convert("RGB")
