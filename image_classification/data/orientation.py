"""EXIF orientation: how a photograph's tag says it is to be turned, read from its bytes, and the turn itself.

A camera or a phone stores a photograph as its sensor read it and records in an EXIF tag (0x0112, values 1-8)
how to turn it for viewing; viewers, DALI's decoders and TorchCodec's turn it, torchvision's decoder and PIL
leave it as stored.  Every decode path of this toolkit turns an image by its tag, before any crop box is
drawn, where the run's preprocessing says so (:attr:`..models.preprocessing.Preprocessing.exif_orientation`:
weights recorded before it was trained on images as stored).  One reader of the tag serves every path: in a
JPEG the first APP1 segment that holds EXIF before the scan, as Pillow finds it (:func:`jpeg_orientation`, on
the bytes: about ten microseconds, no decode); in a PIL image the same block (:func:`image_orientation`).
The tag's entry is read as DALI reads it, so that a malformed one turns alike on every backend; a block that
says nothing sure (no TIFF header, a directory outside it, a value outside 1-8: 0, 9) reads as 1, no turn.
The reader never raises, and walks each segment and each entry of one directory once: no offset it follows can
make it loop.

Each orientation is a transpose (5-8) followed by mirrors of the turned image (:data:`STEPS`), so the pixels,
the size and a box all turn by the same three steps.  No torch at import (the pack's command needs none): a
tensor is turned by its own methods.
"""

from __future__ import annotations

import struct

from PIL import Image

ORIENTATION_TAG = 0x0112
ORIENTATIONS = range(1, 9)
# orientation: (transpose, mirror left-right, mirror top-bottom), the transpose first: 1 identity, 2 mirror, 3
# turn # 180, 4 flip, 5 transpose, 6 turn 90 clockwise, 7 transverse, 8 turn 90 counter-clockwise (as Pillow's
# # ImageOps.exif_transpose turns them)
STEPS = {1: (False, False, False), 2: (False, True, False), 3: (False, True, True), 4: (False, False, True),
         5: (True, False, False), 6: (True, True, False), 7: (True, True, True), 8: (True, False, True)}
_PIL_TURNS = {2: Image.Transpose.FLIP_LEFT_RIGHT, 3: Image.Transpose.ROTATE_180,
              4: Image.Transpose.FLIP_TOP_BOTTOM,
              5: Image.Transpose.TRANSPOSE, 6: Image.Transpose.ROTATE_270, 7: Image.Transpose.TRANSVERSE,
              8: Image.Transpose.ROTATE_90}
_EXIF_HEADER = b"Exif\0\0"
_STANDALONE = {0x01, 0xD8, *range(0xD0, 0xD8)}  # TEM, a repeated SOI, RST0-7: no length follows
_SCAN_OR_END = {0xDA, 0xD9}


def exif_orientation(exif: bytes | memoryview | None) -> int:
    """The orientation (1-8) an EXIF block records in its first image directory; 1 where it records none or
    nothing sure.  ``exif``: a TIFF structure, behind ``Exif\\0\\0`` or not (as JPEG's APP1, PNG's eXIf and
    WebP's EXIF chunk hold it).  The tag's value is read as DALI's decoders read it, the 16 bits its entry's
    value field starts with, whatever type and count the entry claims: a well-formed tag (a SHORT, one value)
    reads as Pillow reads it, and a malformed one reads alike on every backend."""
    if not exif:
        return 1
    data = memoryview(exif)
    if data[:6] == _EXIF_HEADER:
        data = data[6:]
    order = {b"II*\0": "<", b"MM\0*": ">"}.get(bytes(data[:4]))
    if order is None or len(data) < 8:
        return 1
    (first,) = struct.unpack_from(order + "I", data, 4)
    if first < 8 or first + 2 > len(data):
        return 1
    (count,) = struct.unpack_from(order + "H", data, first)
    for at in range(first + 2, min(first + 2 + 12 * count, len(data) - 11), 12):  # whole entries only
        tag, value = struct.unpack_from(order + "H6xH", data, at)
        if tag == ORIENTATION_TAG:
            return value if value in ORIENTATIONS else 1
    return 1


def jpeg_exif(raw: bytes) -> memoryview | None:
    """The first APP1 segment of a JPEG that holds EXIF (its payload, from ``Exif\\0\\0``), among the segments
    before the scan, as Pillow's reader takes it; None where there is none, or the markers stop making
    sense."""
    data, at = memoryview(raw), 2
    while at + 4 <= len(data):
        if data[at] != 0xFF:
            return None
        marker = data[at + 1]
        if marker == 0xFF:  # a fill byte
            at += 1
            continue
        if marker in _STANDALONE:
            at += 2
            continue
        if marker in _SCAN_OR_END:
            return None
        length = (data[at + 2] << 8) | data[at + 3]
        if length < 2:
            return None
        if marker == 0xE1 and data[at + 4:at + 10] == _EXIF_HEADER:
            return data[at + 4:at + 2 + length]
        at += 2 + length
    return None


def jpeg_orientation(raw: bytes) -> int:
    """The orientation (1-8) a JPEG's EXIF records, from its bytes (see the module docstring)."""
    return exif_orientation(jpeg_exif(raw))


def image_orientation(image: Image.Image) -> int:
    """The orientation (1-8) of an opened PIL image by its EXIF block as its format's reader found it (a
    JPEG's first APP1, the block :func:`jpeg_orientation` reads; PNG's eXIf, WebP's EXIF chunk); 1 where it
    has none.  A TIFF reads as 1: Pillow's reader turns it by its own tag as it loads it, on every path
    alike."""
    exif = image.info.get("exif")
    return exif_orientation(exif) if isinstance(exif, bytes) else 1


def turned_size(width: int, height: int, orientation: int) -> tuple[int, int]:
    """(width, height) of a ``width`` x ``height`` image once turned."""
    return (height, width) if STEPS[orientation][0] else (width, height)


def turn_image(image: Image.Image, orientation: int) -> Image.Image:
    """A PIL image turned as its orientation says (the image itself for 1)."""
    return image if orientation == 1 else image.transpose(_PIL_TURNS[orientation])


def turn_tensor(image, orientation: int):
    """A (..., H, W) tensor, on any device, turned as its orientation says (the tensor itself for 1; else a
    contiguous copy)."""
    if orientation == 1:
        return image
    transpose, mirror, flip = STEPS[orientation]
    if transpose:
        image = image.transpose(-1, -2)
    dims = [dim for dim, step in ((-1, mirror), (-2, flip)) if step]
    return image.flip(dims) if dims else image.contiguous()
