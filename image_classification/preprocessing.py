"""How a model's input images are prepared, recorded in every checkpoint so inference repeats it.

A model trained on 32-pixel crops predicts garbage on 224-pixel ones, with no error anywhere. So a
checkpoint (and the weights file ``checkpoint2model.py`` extracts) records the :class:`Preprocessing`
it was trained with, and ``classify.py``, ``main.py --evaluate``, ``model2onnx.py`` use it unless a flag
overrides it (and then they say so).

Validation and inference: resize the short side to ``round(image_size / crop_ratio)`` with
``interpolation`` (antialiased), take the centre ``image_size`` square, subtract ``mean`` and divide by
``std`` (both on the 0-255 scale, per RGB channel). Training crops ``train_crop_size`` squares, the
validation crop unless it is set (FixRes: torchvision's recipe trains at 176 and validates at 224 of 232);
a record without it (every checkpoint before the flag existed) trained at ``image_size``.

Whatever sets the sizes, a flag or a record, the resized image of a square photo may hold no more pixels
than a decoded image may (``data.files.MAX_IMAGE_PIXELS``): :func:`choose_preprocessing` refuses the rest.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass

from .errors import UserError

IMAGENET_MEAN_255 = (0.485 * 255, 0.456 * 255, 0.406 * 255)
IMAGENET_STD_255 = (0.229 * 255, 0.224 * 255, 0.225 * 255)
CROP_RATIO = 0.875  # validation crops 224 out of 256
INTERPOLATIONS = ("bilinear", "bicubic", "triangular")
# --decode-scale: "auto" decodes a JPEG at the smallest of libjpeg's scales that keeps the crop's or the resize's
# pixels (data.reduced), "full" decodes every pixel
DECODE_SCALES = ("auto", "full")
# What a recorded preprocessing may say: a ResNet needs 32 px, and nothing trains on gigapixel crops.
IMAGE_SIZES = range(32, 8192 + 1)
MIN_CROP_RATIO = 0.1


def val_resize_size(image_size: int, crop_ratio: float = CROP_RATIO) -> int:
    """Short side before the centre crop: 256 for 224, in proportion at other sizes."""
    return round(image_size / crop_ratio)


@dataclass(frozen=True)
class Preprocessing:
    image_size: int
    interpolation: str = "bilinear"
    crop_ratio: float = CROP_RATIO
    mean: tuple[float, float, float] = IMAGENET_MEAN_255
    std: tuple[float, float, float] = IMAGENET_STD_255
    train_crop_size: int | None = None  # None: training crops are image_size too

    def __post_init__(self):
        if self.train_crop_size == self.image_size:  # one spelling per meaning, so equal records compare equal
            object.__setattr__(self, "train_crop_size", None)

    @property
    def train_size(self) -> int:
        """The side of the training crops."""
        return self.train_crop_size or self.image_size

    @property
    def resize_size(self) -> int:
        """The short side before the centre crop: 256 for 224."""
        return val_resize_size(self.image_size, self.crop_ratio)

    def to_dict(self) -> dict:
        record = asdict(self)
        record["mean"], record["std"] = list(self.mean), list(self.std)
        record["train_crop_size"] = self.train_size
        record["resize"] = "short side to round(image_size / crop_ratio), then centre crop"
        return record

    @classmethod
    def from_dict(cls, record: Mapping, source: str = "the checkpoint") -> "Preprocessing":
        """Read a recorded preprocessing back; anything malformed is a :class:`UserError`."""
        try:
            size = record["image_size"]
            interpolation = record.get("interpolation", "bilinear")
            ratio = float(record.get("crop_ratio", CROP_RATIO))
            mean = tuple(float(v) for v in record.get("mean", IMAGENET_MEAN_255))
            std = tuple(float(v) for v in record.get("std", IMAGENET_STD_255))
            train_size = record.get("train_crop_size", size)
        except (KeyError, TypeError, ValueError):
            raise UserError(f"{source} records its preprocessing in a form this version cannot read") from None
        valid = (
            isinstance(size, int) and not isinstance(size, bool) and size in IMAGE_SIZES
            and interpolation in INTERPOLATIONS and MIN_CROP_RATIO <= ratio <= 1 and len(mean) == 3
            and len(std) == 3 and all(math.isfinite(v) for v in mean + std) and all(v > 0 for v in std)
            and isinstance(train_size, int) and not isinstance(train_size, bool) and train_size in IMAGE_SIZES
        )
        if not valid:
            shown = repr(dict(record))
            raise UserError(f"{source} records an invalid preprocessing (image size {IMAGE_SIZES.start}-"
                            f"{IMAGE_SIZES.stop - 1}, crop ratio {MIN_CROP_RATIO}-1, 3 finite means and "
                            f"positive stds): {shown[:200]}{'...' if len(shown) > 200 else ''}")
        return cls(size, interpolation, ratio, mean, std, train_size)  # type: ignore[arg-type]

    def describe(self) -> str:
        trained = f" (trained on {self.train_crop_size}px crops)" if self.train_crop_size else ""
        return f"{self.image_size}px crops of a {self.resize_size}px short side, {self.interpolation}{trained}"


def choose_preprocessing(recorded: Preprocessing | None, default_size: int, source: str,
                         log: Callable[[str], None], *, image_size: int | None = None,
                         train_crop_size: int | None = None, val_crop_size: int | None = None,
                         val_resize_size: int | None = None, interpolation: str | None = None) -> Preprocessing:
    """What every entry point prepares images with: each flag given, else what the weights recorded, else
    the architecture's defaults. ``image_size`` sets both crops; the other sizes set one each (the
    validation resize becomes the crop ratio). A flag that changes the record says so, once, through ``log``.
    """
    size = val_crop_size or image_size or (recorded.image_size if recorded else default_size)
    train_size = train_crop_size or image_size or (recorded.train_size if recorded else size)
    resampling = interpolation or (recorded.interpolation if recorded else "bilinear")
    for flag, value in (("--val-crop-size" if val_crop_size else "--image-size", size),
                        ("--train-crop-size" if train_crop_size else "--image-size", train_size)):
        if value not in IMAGE_SIZES:  # what a checkpoint may record, so that it can be read back
            raise UserError(f"{flag} {value} is outside {IMAGE_SIZES.start}-{IMAGE_SIZES.stop - 1}")
    if val_resize_size is not None:
        if val_resize_size < size:
            raise UserError(f"--val-resize-size {val_resize_size} is smaller than the validation crop, {size}: "
                            "the centre crop must fit in the resized image")
        if size / val_resize_size < MIN_CROP_RATIO:
            raise UserError(f"--val-resize-size {val_resize_size} is more than {1 / MIN_CROP_RATIO:g} times the "
                            f"validation crop, {size}")
        ratio = size / val_resize_size
    else:
        ratio = recorded.crop_ratio if recorded else CROP_RATIO
    mean, std = (recorded.mean, recorded.std) if recorded else (IMAGENET_MEAN_255, IMAGENET_STD_255)
    chosen = Preprocessing(size, resampling, ratio, mean, std, train_size)
    size_flag = ("--val-crop-size" if val_crop_size else "--image-size") if val_crop_size or image_size else None
    _check_resize_fits(chosen, recorded, source, size_flag, val_resize_size is not None)
    if recorded is None:
        return chosen
    given = (("--image-size", image_size, recorded.image_size),
             ("--val-crop-size", val_crop_size, recorded.image_size),
             ("--train-crop-size", train_crop_size, recorded.train_size),
             ("--val-resize-size", val_resize_size, recorded.resize_size),
             ("--interpolation", interpolation, recorded.interpolation))
    for flag, ours, theirs in given:
        if ours is not None and ours != theirs:
            extra = f" (and its {recorded.train_size} px training crops)" \
                if flag == "--image-size" and recorded.train_crop_size and not train_crop_size else ""
            log(f"{flag} {ours} overrides the {theirs} recorded in {source}{extra}")
    return chosen


def _check_resize_fits(chosen: Preprocessing, recorded: Preprocessing | None, source: str, size_flag: str | None,
                       resize_flag: bool) -> None:
    """Refuse a validation resize whose image cannot be held, naming what set it (a flag or the record).

    A square image resized to a short side of ``resize_size`` has that many pixels squared; it may have no
    more than a decoded image may (``data.files.MAX_IMAGE_PIXELS``): the largest crop, 8192, fits at the
    default crop ratio, while a recorded ratio of 0.1 would resize it to 81,920 px (6.7 gigapixels).
    """
    from .data.files import MAX_IMAGE_PIXELS  # here: the data package imports this module

    side, size = chosen.resize_size, chosen.image_size
    if side * side <= MAX_IMAGE_PIXELS:
        return
    if resize_flag:
        origin, remedy = f"--val-resize-size {side} for {size} px crops", ""
    elif recorded is not None and size_flag is None:
        origin = f"{source} records {size} px crops with crop ratio {chosen.crop_ratio:g}"
        remedy = "; pass a smaller --image-size"
    else:
        flag = size_flag or "--image-size"
        where = f" recorded in {source}" if recorded is not None else ""
        origin, remedy = f"{flag} {size} with the crop ratio {chosen.crop_ratio:g}{where}", f"; pass a smaller {flag}"
    raise UserError(f"{origin}: a {side} px short side, {side * side:,} pixels for a square image, more than the "
                    f"{MAX_IMAGE_PIXELS:,} an input image may have (the short side can be at most "
                    f"{math.isqrt(MAX_IMAGE_PIXELS)} px){remedy}")
