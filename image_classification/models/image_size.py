"""The size rule every input image is held to, alike on every backend, in ``data.check`` and classify.py: no
more than :data:`MAX_IMAGE_PIXELS` pixels as its header declares them, nor, where it is resized whole
(validation, ``--evaluate``, classify.py), once its short side is resized.  :mod:`image_classification.data.files`
applies it to the images it opens; :mod:`.preprocessing` refuses a resize that no square image could pass.
Standard library only: both import it.
"""

from __future__ import annotations

# PIL's own default limit (Image.MAX_IMAGE_PIXELS: a quarter GiB as 24-bit RGB), applied alike on every backend
# and not a flag.  PIL alone only warns up to twice it, torchvision's and DALI's decoders check nothing.
MAX_IMAGE_PIXELS = 89_478_485


class ImageTooLarge(ValueError):
    """An image past the size rule: more than MAX_IMAGE_PIXELS pixels in its header or, resized to a short side of
    ``resized[0]``, in the ``resized`` image (the same words on every backend)."""

    def __init__(self, resized: tuple[int, int] | None = None):
        if resized is None:
            super().__init__(f"more than {MAX_IMAGE_PIXELS:,} pixels")
        else:
            short, long = resized
            super().__init__(f"more than {MAX_IMAGE_PIXELS:,} pixels once resized to a {short} px short side "
                             f"(a {long:,} px long side)")


def resized_long_side(width: int, height: int, short_side: int) -> int:
    """The long side of a ``width`` x ``height`` image whose short side is resized to ``short_side``, as
    torchvision's ``Resize(short_side)`` and the DALI pipeline scale it (in proportion, rounded down)."""
    return short_side * max(width, height) // max(min(width, height), 1)


def check_size(width: int, height: int, short_side: int | None = None) -> None:
    """Raise ImageTooLarge when a ``width`` x ``height`` image breaks the size rule, or its resize to a
    ``short_side`` px short side would (None: it is not resized whole)."""
    if width * height > MAX_IMAGE_PIXELS:
        raise ImageTooLarge()
    if short_side is not None:
        long_side = resized_long_side(width, height, short_side)
        if short_side * long_side > MAX_IMAGE_PIXELS:
            raise ImageTooLarge((short_side, long_side))
