"""The torchvision augmentation of the ``pytorch`` and ``pytorch-gpu`` backends, in one place.

A training sample's draws (the random-resized crop's box, the flip, then ``--augmentation``'s) come from torch's
CPU generator seeded with the sample's seed (:func:`seeded`): a pure function of the run's seed, the epoch and
the position in it, so a batch is the same whatever the number of workers and a resumed epoch replays its
crops.  The two backends draw with the same code, :meth:`TrainTransform.draw`; the ``pytorch`` backend then
crops on the CPU in its workers, ``pytorch-gpu`` on the device after decoding.  The draws are torchvision's
own: ``RandomResizedCrop.get_params``, then one ``torch.rand(1)`` for the flip as ``RandomHorizontalFlip``
draws it, so a run replays the crops torchvision's ``v2.Compose`` of the same transforms would make.

Validation resizes a whole image (:func:`open_resized`, a JPEG decoded at a reduced scale where the resize allows,
:mod:`.reduced`) and centre-crops it (:func:`val_transform`).  Every image is turned by its EXIF orientation
before its box is drawn or it is resized, where the run's preprocessing says so (:mod:`.orientation`): the box
is drawn in the turned image.
"""

from __future__ import annotations

import copy
import io
import random
from dataclasses import dataclass

import torch
from torchvision import transforms
from torchvision.transforms import v2

from ..models.preprocessing import CROP_RATIO, val_resize_size
from .common import DataConfig
from . import reduced
from .files import open_image, open_rgb, read_bytes
from .reduced import ScalableJpeg, crop_scale

INTERPOLATION = {
    "bilinear": transforms.InterpolationMode.BILINEAR,
    "bicubic": transforms.InterpolationMode.BICUBIC,
    # PIL's bilinear filter is a triangle filter, which is what DALI calls INTERP_TRIANGULAR.
    "triangular": transforms.InterpolationMode.BILINEAR,
}
ASPECT_RATIOS = (3 / 4, 4 / 3)  # RandomResizedCrop's default range, on every backend


def seeded(seed: int, draw, *args):
    """``draw(*args)`` with torch's CPU generator and ``random`` seeded from ``seed``.  In a loader worker the
    generators are the worker's own; in the training process (``-j 0``) they are put back afterwards, so that
    MixUp and dropout never see the reseeding."""
    from torch.utils.data import get_worker_info

    if get_worker_info() is not None:
        return _reseeded(seed, draw, *args)
    python_state = random.getstate()
    with torch.random.fork_rng(devices=[]):
        try:
            return _reseeded(seed, draw, *args)
        finally:
            random.setstate(python_state)


def _reseeded(seed: int, draw, *args):
    # The CPU generator alone: the transforms draw nothing else, and torch.manual_seed would also queue a
    # seed for every lazy accelerator, formatting a stack trace each time (~1 ms a sample).
    torch.default_generator.manual_seed(seed)
    random.seed(seed)
    return draw(*args)


def crop_box(height: int, width: int, scale: tuple[float, float]) -> tuple[int, int, int, int]:
    """(top, left, height, width) of torchvision's RandomResizedCrop in a ``height`` x ``width`` image, drawn
    from torch's CPU generator by torchvision's own ``get_params``."""
    like = torch.empty(1).expand(1, height, width)  # get_params reads only the shape
    return tuple(transforms.RandomResizedCrop.get_params(like, list(scale), list(ASPECT_RATIOS)))


# Devices on which the crop is copied to channels-last memory before its resize: torch's uint8 antialiased CPU
# kernels are fastest there.  On a GPU torchvision resizes in float32, and torch's antialiased CUDA kernel makes
# a channels-last input contiguous first: the copy would add a uint8 and a float32 copy of the crop, nothing else.
CHANNELS_LAST_RESIZE = ("cpu",)


def resized_crop(image: torch.Tensor, box: tuple[int, int, int, int], size: int,
                 interpolation: transforms.InterpolationMode) -> torch.Tensor:
    """The ``box`` of a uint8 CHW ``image`` (on any device) resized to ``size`` x ``size``, antialiased, as
    torchvision's ``resized_crop`` makes it.  On the CPU only the crop is copied, to channels-last memory, before
    the resize (the result is then a CHW view of HWC memory); on a GPU torchvision resizes a float32 copy of the
    crop (4 bytes a value) and rounds back to uint8."""
    top, left, height, width = box
    crop = image[None, :, top:top + height, left:left + width]
    if image.device.type in CHANNELS_LAST_RESIZE:
        crop = crop.contiguous(memory_format=torch.channels_last)
    return v2.functional.resize(crop, [size, size], interpolation, antialias=True)[0]


@dataclass(frozen=True)
class Draw:
    """One training sample's geometric draws: its crop box, whether it is flipped, and the side its crop is
    resized to (the epoch's, under ``--progressive-resize``)."""

    box: tuple[int, int, int, int]
    flip: bool
    size: int


def auto_augmentation(config: DataConfig):
    """torchvision's transform for ``--augmentation`` (None when off), with torchvision's defaults (nearest
    interpolation for the geometric operations, black fill), after the crop and flip, on uint8 images."""
    if config.augmentation is None:
        return None
    return {
        "autoaugment": lambda: v2.AutoAugment(v2.AutoAugmentPolicy.IMAGENET),
        "randaugment": lambda: v2.RandAugment(num_ops=config.randaugment[1],
                                              magnitude=config.randaugment[0]),
        "trivialaugment": lambda: v2.TrivialAugmentWide(),
        "augmix": lambda: v2.AugMix(),
    }[config.augmentation]()


class PolicyDraws:
    """An ``--augmentation`` policy (torchvision's AutoAugment, RandAugment or TrivialAugmentWide) in two halves:
    :meth:`draw` runs the policy's own ``forward`` on a stand-in of the image's size (its draws depend on the size
    alone) and records the operations and magnitudes it picks instead of applying them, drawing from torch's CPU
    generator exactly as the policy does; :meth:`apply` applies recorded operations with the policy's own
    code, drawing nothing.  ``apply(image, draw(*size))`` is ``policy(image)`` bit for bit; apart, the
    ``pytorch-gpu`` backend draws in its loader workers, under each image's seed, and applies on the GPU in a
    thread that touches no generator.  (AugMix mixes by the image's pixels: it has no such halves.)"""

    def __init__(self, policy):
        if not isinstance(policy, (v2.AutoAugment, v2.RandAugment, v2.TrivialAugmentWide)):
            raise TypeError(f"{type(policy).__name__} does not draw apart from the image it augments")
        self.policy = policy
        self._recorder = copy.copy(policy)  # a shallow copy whose one method records
        self._recorder._apply_image_or_video_transform = self._record
        self._drawn: list[tuple[str, float]] = []

    def _record(self, image, transform_id: str, magnitude: float, interpolation, fill):
        self._drawn.append((transform_id, magnitude))
        return image

    def draw(self, height: int, width: int) -> tuple[tuple[str, float], ...]:
        """The (operation, magnitude) pairs the policy draws for a ``height`` x ``width`` image, in order."""
        self._drawn = []
        self._recorder(torch.empty(1, dtype=torch.uint8).expand(3, height, width))
        return tuple(self._drawn)

    def apply(self, image: torch.Tensor, drawn: tuple[tuple[str, float], ...]) -> torch.Tensor:
        """``drawn``'s operations on a uint8 CHW ``image`` (on any device), as the policy applies them."""
        policy = self.policy
        for transform_id, magnitude in drawn:
            image = policy._apply_image_or_video_transform(image, transform_id, magnitude,
                                                           interpolation=policy.interpolation, fill=policy._fill)
        return image


class TrainTransform:
    """torchvision's RandomResizedCrop, flip and ``--augmentation`` on a uint8 CHW tensor, in two halves that
    the ``pytorch-gpu`` backend runs in different places: :meth:`draw` (the box and the flip, from the image's
    size alone) and :meth:`crop`; ``augmentation`` then draws on from the generator where :meth:`draw` left it.
    Called on an image, it does all three, as the ``pytorch`` backend's workers do.  ``size`` (the epoch's crop
    side, which the sampler hands the workers with each sample) replaces the configuration's."""

    def __init__(self, config: DataConfig):
        self.size, self.scale = config.preprocessing.train_size, tuple(config.crop_scale)
        self.interpolation, self.hflip = INTERPOLATION[config.preprocessing.interpolation], config.hflip
        self.interpolation_name = config.preprocessing.interpolation
        self.augmentation = auto_augmentation(config)

    def draw(self, height: int, width: int, size: int | None = None) -> Draw:
        box = crop_box(height, width, self.scale)
        # as v2.RandomHorizontalFlip draws: one number, flipped below hflip; no draw when flips are off
        return Draw(box, self.hflip > 0 and bool(torch.rand(1) < self.hflip), size or self.size)

    def crop(self, image: torch.Tensor | ScalableJpeg, draw: Draw) -> torch.Tensor:
        """The draw's crop (at its size) of a decoded image, or of a JPEG not yet decoded (:mod:`.reduced`: decoded
        at the smallest scale that keeps the crop's pixels, else whole)."""
        if isinstance(image, ScalableJpeg):
            if crop_scale(draw.box[2], draw.box[3], draw.size) > 1:
                out = image.resized_crop(draw.box, draw.size, self.interpolation_name)
                return v2.functional.horizontal_flip(out) if draw.flip else out
            image = image.decoded()
        out = resized_crop(image, draw.box, draw.size, self.interpolation)
        return v2.functional.horizontal_flip(out) if draw.flip else out

    def __call__(self, image: torch.Tensor | ScalableJpeg, size: int | None = None) -> torch.Tensor:
        out = self.crop(image, self.draw(*image.shape[-2:], size))
        return out if self.augmentation is None else self.augmentation(out)


def val_transform(image_size: int, interpolation: str = "bilinear", crop_ratio: float = CROP_RATIO):
    """Resize the short side to ``val_resize_size`` and take the centre crop (PIL in, PIL out)."""
    return transforms.Compose([
        transforms.Resize(val_resize_size(image_size, crop_ratio), interpolation=INTERPOLATION[interpolation]),
        transforms.CenterCrop(image_size),
    ])


def open_resized(source, short_side: int, interpolation: str = "bilinear", decode_scale: str = "auto",
                 turn: bool = True):
    """The image at ``source`` (a path or an image file's bytes), 8-bit RGB, turned by its EXIF orientation
    where ``turn``, resized as torchvision's ``Resize(short_side)`` resizes it: what validation,
    ``--evaluate`` and classify.py centre-crop.  With ``decode_scale`` "auto" a JPEG is decoded at
    :func:`.reduced.resize_scale`'s reduction where it is above 1, turned, and resized from there to the size
    its full decode is resized to; any other image is opened by :func:`.files.open_rgb` and resized as before.
    Raises what :func:`.files.open_rgb` raises."""
    raw = source if isinstance(source, bytes) else read_bytes(source)
    if decode_scale == "auto":
        jpeg = reduced.scalable_jpeg(raw, turn)
        scale = reduced.resize_scale(jpeg.width, jpeg.height, short_side) if jpeg is not None else 1
        if scale > 1:
            with open_image(io.BytesIO(raw), short_side):  # the size rule, for the resize too
                pass
            image, left, top = jpeg.reduced(scale)
            # from the full image's extent, jpeg.width / scale wide: libjpeg's last column may stand for fewer pixels
            return image.resize(reduced.resized_size(jpeg.width, jpeg.height, short_side),
                                reduced.FILTERS[interpolation],
                                box=(left, top, left + jpeg.width / scale, top + jpeg.height / scale))
    return transforms.functional.resize(open_rgb(io.BytesIO(raw), short_side, turn), short_side,
                                        INTERPOLATION[interpolation])


def val_crop(image: torch.Tensor, image_size: int, interpolation: str = "bilinear",
             crop_ratio: float = CROP_RATIO) -> torch.Tensor:
    """:func:`val_transform` on a uint8 CHW tensor (on any device): the same sizes and offsets, torch's
    antialiased resize in place of PIL's."""
    short_side = val_resize_size(image_size, crop_ratio)
    resized = v2.functional.resize(image, [short_side], INTERPOLATION[interpolation], antialias=True)
    return v2.functional.center_crop(resized, [image_size, image_size])
