"""How a model's input images are prepared, recorded in every checkpoint so inference repeats it.

A model trained on 32-pixel crops predicts garbage on 224-pixel ones, with no error anywhere. So a
checkpoint (and the weights file ``checkpoint2model.py`` extracts) records the :class:`Preprocessing`
it was trained with, and ``classify.py``, ``main.py --evaluate``, ``model2onnx.py`` use it unless a flag
overrides it (and then they say so).

Validation and inference: resize the short side to ``round(image_size / crop_ratio)`` with
``interpolation`` (antialiased), take the centre ``image_size`` square, subtract ``mean`` and divide by
``std`` (both on the 0-255 scale, per RGB channel).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass

from .errors import UserError

IMAGENET_MEAN_255 = (0.485 * 255, 0.456 * 255, 0.406 * 255)
IMAGENET_STD_255 = (0.229 * 255, 0.224 * 255, 0.225 * 255)
CROP_RATIO = 0.875  # validation crops 224 out of 256
INTERPOLATIONS = ("bilinear", "bicubic", "triangular")
# What a recorded preprocessing may say: a ResNet needs 32 px, and nothing trains on gigapixel crops.
IMAGE_SIZES = range(32, 8192 + 1)
MIN_CROP_RATIO = 0.1


@dataclass(frozen=True)
class Preprocessing:
    image_size: int
    interpolation: str = "bilinear"
    crop_ratio: float = CROP_RATIO
    mean: tuple[float, float, float] = IMAGENET_MEAN_255
    std: tuple[float, float, float] = IMAGENET_STD_255

    @property
    def resize_size(self) -> int:
        """The short side before the centre crop: 256 for 224."""
        return round(self.image_size / self.crop_ratio)

    def to_dict(self) -> dict:
        record = asdict(self)
        record["mean"], record["std"] = list(self.mean), list(self.std)
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
        except (KeyError, TypeError, ValueError):
            raise UserError(f"{source} records its preprocessing in a form this version cannot read") from None
        valid = (
            isinstance(size, int) and not isinstance(size, bool) and size in IMAGE_SIZES
            and interpolation in INTERPOLATIONS and MIN_CROP_RATIO <= ratio <= 1 and len(mean) == 3
            and len(std) == 3 and all(math.isfinite(v) for v in mean + std) and all(v > 0 for v in std)
        )
        if not valid:
            shown = repr(dict(record))
            raise UserError(f"{source} records an invalid preprocessing (image size {IMAGE_SIZES.start}-"
                            f"{IMAGE_SIZES.stop - 1}, crop ratio {MIN_CROP_RATIO}-1, 3 finite means and "
                            f"positive stds): {shown[:200]}{'...' if len(shown) > 200 else ''}")
        return cls(size, interpolation, ratio, mean, std)  # type: ignore[arg-type]

    def describe(self) -> str:
        return f"{self.image_size}px crops of a {self.resize_size}px short side, {self.interpolation}"
