"""The torchvision augmentation of the ``pytorch`` and ``pytorch-gpu`` backends, in one place.

A training sample's draws (the random-resized crop's box, the flip, then ``--augmentation``'s) come from torch's
CPU generator seeded with the sample's seed (:func:`seeded`): a pure function of the run's seed, the epoch and
the position in it, so a batch is the same whatever the number of workers and a resumed epoch replays its
crops.  The two backends draw with the same code, :meth:`TrainTransform.draw`; the ``pytorch`` backend then
crops on the CPU in its workers, ``pytorch-gpu`` on the device after decoding.  The draws are torchvision's
own: ``RandomResizedCrop.get_params``, then one ``torch.rand(1)`` for the flip as ``RandomHorizontalFlip``
draws it, so a run replays the crops torchvision's ``v2.Compose`` of the same transforms would make.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch
from torchvision import transforms
from torchvision.transforms import v2

from ..preprocessing import CROP_RATIO, val_resize_size
from .common import DataConfig

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


def resized_crop(image: torch.Tensor, box: tuple[int, int, int, int], size: int,
                 interpolation: transforms.InterpolationMode) -> torch.Tensor:
    """The ``box`` of a uint8 CHW ``image`` (on any device) resized to ``size`` x ``size``, antialiased, as
    torchvision's ``resized_crop`` makes it.  Only the crop is copied to channels-last memory before the resize,
    as torch's uint8 antialiased CPU kernels are fastest there; the result is a CHW view of HWC memory.  On a GPU
    torchvision resizes in float32 and rounds back to uint8."""
    top, left, height, width = box
    crop = image[None, :, top:top + height, left:left + width].contiguous(memory_format=torch.channels_last)
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
        "randaugment": lambda: v2.RandAugment(num_ops=config.randaugment_num_ops,
                                              magnitude=config.randaugment_magnitude),
        "trivialaugment": lambda: v2.TrivialAugmentWide(),
        "augmix": lambda: v2.AugMix(),
    }[config.augmentation]()


class TrainTransform:
    """torchvision's RandomResizedCrop, flip and ``--augmentation`` on a uint8 CHW tensor, in two halves that
    the ``pytorch-gpu`` backend runs in different places: :meth:`draw` (the box and the flip, from the image's
    size alone) and :meth:`crop`; ``augmentation`` then draws on from the generator where :meth:`draw` left it.
    Called on an image, it does all three, as the ``pytorch`` backend's workers do.  ``size`` (the epoch's crop
    side, which the sampler hands the workers with each sample) replaces the configuration's."""

    def __init__(self, config: DataConfig):
        self.size, self.scale = config.train_size, tuple(config.crop_scale)
        self.interpolation, self.hflip = INTERPOLATION[config.interpolation], config.hflip
        self.augmentation = auto_augmentation(config)

    def draw(self, height: int, width: int, size: int | None = None) -> Draw:
        box = crop_box(height, width, self.scale)
        # as v2.RandomHorizontalFlip draws: one number, flipped below hflip; no draw when flips are off
        return Draw(box, self.hflip > 0 and bool(torch.rand(1) < self.hflip), size or self.size)

    def crop(self, image: torch.Tensor, draw: Draw) -> torch.Tensor:
        out = resized_crop(image, draw.box, draw.size, self.interpolation)
        return v2.functional.horizontal_flip(out) if draw.flip else out

    def __call__(self, image: torch.Tensor, size: int | None = None) -> torch.Tensor:
        out = self.crop(image, self.draw(*image.shape[-2:], size))
        return out if self.augmentation is None else self.augmentation(out)


def val_transform(image_size: int, interpolation: str = "bilinear", crop_ratio: float = CROP_RATIO):
    """Resize the short side to ``val_resize_size`` and take the centre crop (PIL in, PIL out)."""
    return transforms.Compose([
        transforms.Resize(val_resize_size(image_size, crop_ratio), interpolation=INTERPOLATION[interpolation]),
        transforms.CenterCrop(image_size),
    ])


def val_crop(image: torch.Tensor, image_size: int, interpolation: str = "bilinear",
             crop_ratio: float = CROP_RATIO) -> torch.Tensor:
    """:func:`val_transform` on a uint8 CHW tensor (on any device): the same sizes and offsets, torch's
    antialiased resize in place of PIL's."""
    short_side = val_resize_size(image_size, crop_ratio)
    resized = v2.functional.resize(image, [short_side], INTERPOLATION[interpolation], antialias=True)
    return v2.functional.center_crop(resized, [image_size, image_size])
