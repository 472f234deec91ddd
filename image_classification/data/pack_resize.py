"""``--max-size``: the images a pack stores smaller, resized once when packing so that decoding one never needs more
than its longest side (:mod:`.pack`)."""

from __future__ import annotations

import io
from dataclasses import dataclass

from ..errors import UserError
from .files import open_image, open_rgb
from .orientation import ORIENTATION_TAG, image_orientation

DEFAULT_QUALITY = 90  # --max-size's JPEG quality unless --quality says


@dataclass(frozen=True)
class Resizing:
    """``--max-size``: the longest side an image is stored at, and the JPEG quality of those resized."""

    max_size: int
    quality: int = DEFAULT_QUALITY

    def record(self) -> dict:
        """What the manifest records of it."""
        return {"max_size": self.max_size, "quality": self.quality}

    def target(self, width: int, height: int) -> tuple[int, int] | None:
        """The stored size of a ``width`` x ``height`` image: the longer side at ``max_size``, the other in
        proportion (rounded, at least 1); None where the image is no larger than that."""
        longer = max(width, height)
        if longer <= self.max_size:
            return None
        if width >= height:
            return self.max_size, max(1, round(height * self.max_size / width))
        return max(1, round(width * self.max_size / height)), self.max_size

    def shrink(self, data: bytes) -> bytes | None:
        """``data`` (an image file's bytes) stored smaller: resized to :meth:`target` (Pillow's antialiased
        Lanczos, from libjpeg's reduced scale where that still holds the target) and encoded as a JPEG; None
        where it keeps its bytes (no larger, or not readable: training then reports it as on the folder).  The
        pixels stay as stored, and the EXIF orientation tag goes with them, alone."""
        from PIL import Image

        try:
            with open_image(io.BytesIO(data)) as image:
                target = self.target(*image.size)
                if target is None:
                    return None
                exif = Image.Exif()
                if image_orientation(image) != 1:
                    exif[ORIENTATION_TAG] = image_orientation(image)
                extent = (0, 0, *image.size)
                if image.format == "JPEG":
                    # the largest of libjpeg's reductions that keeps the target; the image's extent in it, which
                    # its last row and column may overhang
                    extent = image.draft("RGB", target)[1]
                    pixels = image.convert("RGB")
                else:
                    pixels = open_rgb(io.BytesIO(data), turn=False)
            out = io.BytesIO()
            pixels.resize(target, Image.LANCZOS, box=extent).save(out, "JPEG", quality=self.quality,
                                                                  exif=exif.tobytes() if exif else b"")
        except Exception:  # anything Pillow raises: the bytes are stored as they are, and reported where read
            return None
        return out.getvalue()


def resizing(max_size: int | None, quality: int | None) -> Resizing | None:
    """``--max-size`` and ``--quality`` as a :class:`Resizing` (None without ``--max-size``); UserError for a
    quality out of range, or given alone."""
    if max_size is None:
        if quality is not None:
            raise UserError("--quality sets the JPEG quality of the images --max-size resizes; give --max-size too")
        return None
    if quality is not None and not 1 <= quality <= 100:
        raise UserError(f"--quality {quality}: give 1 to 100 (JPEG's scale; 90 unless told)")
    return Resizing(max_size, DEFAULT_QUALITY if quality is None else quality)
