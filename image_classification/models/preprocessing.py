"""How a model's input images are prepared, recorded in every checkpoint so inference repeats it.

A model trained on 32-pixel crops predicts garbage on 224-pixel ones, with no error anywhere. So a
checkpoint (and the weights file ``checkpoint2model.py`` extracts) records the :class:`Preprocessing`
it was trained with, and ``classify.py``, ``main.py --evaluate``, ``model2onnx.py`` use it unless a flag
overrides it (and then they say so).

Validation and inference: resize the short side to ``round(image_size / crop_ratio)`` with
``interpolation`` (antialiased), take the centre ``image_size`` square, subtract ``mean`` and divide by
``std`` (both on the 0-255 scale, per RGB channel). Training crops ``train_crop_size`` squares, the
validation crop unless it is set (FixRes: torchvision's recipe trains at 176 and validates at 224 of 232);
a record without it (every checkpoint before the flag existed) trained at ``image_size``.  With a
:class:`ResizeSchedule` (``--progressive-resize``) the training crop changes with the epoch, a pure function
of it (:meth:`ResizeSchedule.size_at`), and ``train_crop_size`` is the schedule's last size.

Every image is turned by its EXIF orientation tag before it is cropped, as a person sees it
(``exif_orientation``; ``data.orientation``).  A record without the field was written before every backend
did so: its weights trained on images as stored (the ``pytorch`` backends' way then), and inference and
``--evaluate`` follow the record, saying so in one line (:func:`orientation_notice`); a run that trains from
such weights anew turns them.

Whatever sets the sizes, a flag or a record, the resized image of a square photo may hold no more pixels
than a decoded image may (:data:`.image_size.MAX_IMAGE_PIXELS`): :func:`choose_preprocessing` refuses the rest.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass

from ..errors import UserError
from .image_size import MAX_IMAGE_PIXELS

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
# A ResNet reduces its input 32-fold: the sizes a ramp passes through are multiples of this (FFCV's rule), so
# every stage's feature map has a whole side and a compiled model meets few shapes.
SIZE_STEP = 32


def val_resize_size(image_size: int, crop_ratio: float = CROP_RATIO) -> int:
    """Short side before the centre crop: 256 for 224, in proportion at other sizes."""
    return round(image_size / crop_ratio)


@dataclass(frozen=True)
class ResizeSchedule:
    """``--progressive-resize MIN MAX START END``: the side of the training crops of each 0-based epoch.

    ``min_size`` up to epoch ``start``, ``max_size`` from epoch ``end`` on; in between the line from one to
    the other, rounded to the nearest multiple of :data:`SIZE_STEP` (a half up) and kept within
    ``[min_size, max_size]``.  FFCV's ``get_resolution`` gives the same sizes for its published ramps (it
    rounds a half to even, which none of them meets).  ``start == end`` is a step at ``end``.
    """

    min_size: int
    max_size: int
    start: int
    end: int

    def size_at(self, epoch: int) -> int:
        if epoch >= self.end:
            return self.max_size
        if epoch <= self.start:
            return self.min_size
        span = self.end - self.start
        # the line's value is numerator / span; rounded to a multiple of SIZE_STEP in integers, so that no float
        # decides a half
        numerator = self.min_size * span + (self.max_size - self.min_size) * (epoch - self.start)
        stepped = SIZE_STEP * ((2 * numerator + SIZE_STEP * span) // (2 * SIZE_STEP * span))
        return min(self.max_size, max(self.min_size, stepped))

    def sizes(self, epochs: int) -> list[tuple[int, int]]:
        """(first epoch, size) of each change of size over epochs ``0 .. epochs - 1``."""
        changes: list[tuple[int, int]] = []
        for epoch in range(epochs):
            size = self.size_at(epoch)
            if not changes or changes[-1][1] != size:
                changes.append((epoch, size))
        return changes

    def describe(self) -> str:
        return (f"{self.min_size} px up to epoch {self.start}, {self.max_size} px from epoch {self.end} on, "
                f"multiples of {SIZE_STEP} px in between")

    def as_flag(self) -> list[int]:
        return [self.min_size, self.max_size, self.start, self.end]

    @staticmethod
    def problem(values, epochs: int | None = None) -> str | None:
        """Why ``values`` (MIN MAX START END) is no schedule, in the words of a one-line refusal; None when it
        is one (and, with ``epochs``, one that ends within the run)."""
        if not (isinstance(values, (list, tuple)) and len(values) == 4
                and all(isinstance(v, int) and not isinstance(v, bool) for v in values)):
            return "needs four whole numbers, MIN MAX START END"
        low, high, start, end = values
        if low < IMAGE_SIZES.start or high < IMAGE_SIZES.start:
            return f"MIN and MAX must be at least {IMAGE_SIZES.start} px (the network reduces its input 32-fold)"
        if high >= IMAGE_SIZES.stop:
            return f"MAX must be at most {IMAGE_SIZES.stop - 1} px"
        if low > high:
            return f"MIN {low} is larger than MAX {high}"
        if start < 0 or start > end:
            return f"needs 0 <= START <= END (epochs, counted from 0), got START {start} and END {end}"
        if epochs is not None and end >= epochs:
            return (f"END {end} is not before --epochs {epochs}: epoch END is the first at MAX {high} px, and the "
                    f"run's last epoch is {epochs - 1} (epochs counted from 0), so it would never train at {high} px; "
                    f"give END at most {epochs - 1}")
        return None


@dataclass(frozen=True)
class Preprocessing:
    image_size: int
    interpolation: str = "bilinear"
    crop_ratio: float = CROP_RATIO
    mean: tuple[float, float, float] = IMAGENET_MEAN_255
    std: tuple[float, float, float] = IMAGENET_STD_255
    train_crop_size: int | None = None  # None: training crops are image_size too
    train_schedule: ResizeSchedule | None = None  # --progressive-resize; train_crop_size is then its max_size
    exif_orientation: bool = True  # each image turned by its EXIF orientation tag (False: as stored)

    def __post_init__(self):
        if self.train_schedule is not None:
            object.__setattr__(self, "train_crop_size", self.train_schedule.max_size)
        if self.train_crop_size == self.image_size:  # one spelling per meaning, so equal records compare equal
            object.__setattr__(self, "train_crop_size", None)

    @property
    def train_size(self) -> int:
        """The side of the training crops."""
        return self.train_crop_size or self.image_size

    def train_size_at(self, epoch: int) -> int:
        """The side of the training crops of 0-based ``epoch``."""
        return self.train_schedule.size_at(epoch) if self.train_schedule is not None else self.train_size

    @property
    def resize_size(self) -> int:
        """The short side before the centre crop: 256 for 224."""
        return val_resize_size(self.image_size, self.crop_ratio)

    def to_dict(self) -> dict:
        record = asdict(self)
        record["mean"], record["std"] = list(self.mean), list(self.std)
        record["train_crop_size"] = self.train_size
        if self.train_schedule is None:
            del record["train_schedule"]
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
            schedule = record.get("train_schedule")
            turned = record.get("exif_orientation", False)  # not recorded: trained on the images as stored
            if schedule is not None:
                values = [schedule[key] for key in ("min_size", "max_size", "start", "end")]
        except (KeyError, TypeError, ValueError):
            raise UserError(f"{source} records its preprocessing in a form this version cannot read") from None
        valid = (
            isinstance(size, int) and not isinstance(size, bool) and size in IMAGE_SIZES
            and interpolation in INTERPOLATIONS and MIN_CROP_RATIO <= ratio <= 1 and len(mean) == 3
            and len(std) == 3 and all(math.isfinite(v) for v in mean + std) and all(v > 0 for v in std)
            and isinstance(train_size, int) and not isinstance(train_size, bool) and train_size in IMAGE_SIZES
            and (schedule is None or (ResizeSchedule.problem(values) is None and values[1] == train_size))
            and isinstance(turned, bool)
        )
        if not valid:
            shown = repr(dict(record))
            raise UserError(f"{source} records an invalid preprocessing (image size {IMAGE_SIZES.start}-"
                            f"{IMAGE_SIZES.stop - 1}, crop ratio {MIN_CROP_RATIO}-1, 3 finite means, "
                            f"positive stds, exif_orientation true or false): "
                            f"{shown[:200]}{'...' if len(shown) > 200 else ''}")
        return cls(size, interpolation, ratio, mean, std, train_size,  # type: ignore[arg-type]
                   ResizeSchedule(*values) if schedule is not None else None, turned)

    def describe(self) -> str:
        trained = f" (trained on {self.train_crop_size}px crops)" if self.train_crop_size else ""
        if self.train_schedule is not None:
            trained = f" (trained on crops of {self.train_schedule.describe()})"
        return f"{self.image_size}px crops of a {self.resize_size}px short side, {self.interpolation}{trained}"


def choose_preprocessing(recorded: Preprocessing | None, default_size: int, source: str,
                         log: Callable[[str], None], *, image_size: int | None = None,
                         train_crop_size: int | None = None, val_crop_size: int | None = None,
                         val_resize_size: int | None = None, interpolation: str | None = None,
                         progressive_resize: list[int] | None = None, training: bool = False) -> Preprocessing:
    """What every entry point prepares images with: each flag given, else what the weights recorded, else
    the architecture's defaults. ``image_size`` sets both crops; the other sizes set one each (the
    validation resize becomes the crop ratio); ``progressive_resize`` (MIN MAX START END) makes the training
    crop a schedule, and a fixed training size given (``train_crop_size``, ``image_size``) replaces a recorded
    schedule. A flag that changes the record says so, once, through ``log`` (what replaces a recorded
    schedule only for ``training``: inference never trains).
    """
    size = val_crop_size or image_size or (recorded.image_size if recorded else default_size)
    fixed_train = train_crop_size or image_size
    schedule = ResizeSchedule(*progressive_resize) if progressive_resize is not None else (
        recorded.train_schedule if recorded is not None and not fixed_train else None)
    train_size = schedule.max_size if schedule is not None else (
        fixed_train or (recorded.train_size if recorded else size))
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
    turned = recorded.exif_orientation if recorded else True
    chosen = Preprocessing(size, resampling, ratio, mean, std, train_size, schedule, turned)
    size_flag = ("--val-crop-size" if val_crop_size else "--image-size") if val_crop_size or image_size else None
    _check_resize_fits(chosen, recorded, source, size_flag, val_resize_size is not None)
    if recorded is None:
        return chosen
    if not turned:
        log(orientation_notice(source, training))
    ramp = recorded.train_schedule
    given = (("--image-size", image_size, recorded.image_size),
             ("--val-crop-size", val_crop_size, recorded.image_size),
             ("--train-crop-size", train_crop_size, recorded.train_size),
             ("--val-resize-size", val_resize_size, recorded.resize_size),
             ("--interpolation", interpolation, recorded.interpolation),
             ("--progressive-resize", _flag_text(schedule) if progressive_resize is not None else None,
              _flag_text(ramp)))
    replaced = training and ramp is not None and schedule is None  # said once, below
    for flag, ours, theirs in given:
        if ours is not None and ours != theirs and not (replaced and flag == "--train-crop-size"):
            extra = f" (and its {recorded.train_size} px training crops)" \
                if flag == "--image-size" and recorded.train_crop_size and not train_crop_size else ""
            log(f"{flag} {ours} overrides the {theirs} recorded in {source}{extra}")
    if replaced:
        flag = "--train-crop-size" if train_crop_size else "--image-size"
        log(f"{flag} {train_size} replaces the progressive resize recorded in {source} ({ramp.describe()}): "
            f"every epoch trains on {train_size} px crops")
    return chosen


def orientation_notice(source: str, training: bool = False, trains_anew: bool = False) -> str:
    """The line that says weights recorded before the EXIF orientation was applied were trained on images as
    stored, and what this run does: follows them (inference, ``--evaluate``, a resumed run), or turns each
    image by its tag (``trains_anew``: a fine-tune from them)."""
    then = f"{source} records no EXIF orientation: its weights were trained on images as stored"
    if trains_anew:
        return f"{then}; this run trains on them turned by their EXIF orientation tag, as every new run does"
    doing = "goes on training" if training else "sees them"
    return f"{then}, and this run {doing} so, not turned by their EXIF orientation tag as a new run is"


def trained_as_stored(description: Mapping) -> bool:
    """Whether weights' description (a checkpoint's or a weights file's) records a preprocessing that did not
    turn images by their EXIF orientation (recorded before it did, or saying so); False where none is
    recorded."""
    record = description.get("preprocessing")
    return isinstance(record, Mapping) and record.get("exif_orientation", False) is False


def _flag_text(schedule: ResizeSchedule | None) -> str:
    return " ".join(map(str, schedule.as_flag())) if schedule is not None else "none"


def _check_resize_fits(chosen: Preprocessing, recorded: Preprocessing | None, source: str, size_flag: str | None,
                       resize_flag: bool) -> None:
    """Refuse a validation resize whose image cannot be held, naming what set it (a flag or the record).

    A square image resized to a short side of ``resize_size`` has that many pixels squared; it may have no
    more than a decoded image may (:data:`.image_size.MAX_IMAGE_PIXELS`): the largest crop, 8192, fits at the
    default crop ratio, while a recorded ratio of 0.1 would resize it to 81,920 px (6.7 gigapixels).
    """
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
