"""The ``pytorch`` backend: an ImageFolder (or the shards packed from it) read with PIL, augmented with
torchvision (:mod:`.transforms`), batched as uint8.

Every sample's augmentation is seeded from (seed, epoch, position in the epoch), so a batch is the
same whatever the number of workers, and an epoch can be replayed exactly after a resume.
"""

from __future__ import annotations

import functools
import io
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset

from ..models.preprocessing import val_resize_size
from ..system.runtime import Runtime
from .common import DataConfig, DeviceLoader
from .files import decode_rgb_tensor, open_rgb
from .layout import Split, open_split
from .reduced import DecodeFailed, decode_for_crop
from .transforms import TrainTransform, open_resized, seeded, val_transform
from .workers import HostBatches, host_loader, shared_tensor, split_sampler


def _open_rgb_bytes(raw: bytes, short_side: int | None = None, turn: bool = True) -> Image.Image:
    return open_rgb(io.BytesIO(raw), short_side, turn)


class ImageFiles(Dataset):
    """Reads one image (a file of a folder, or its bytes in a shard) and augments it under its own seed; a
    broken one yields None.

    With ``tensors`` the image is decoded into a uint8 tensor and ``transform`` works on tensors (the
    training path); otherwise it is a PIL image (validation, the same pipeline classify.py uses), which
    ``transform`` resizes whole to a ``resize`` px short side: an image too large for that is broken too.
    With ``decode_scale`` "auto" a JPEG is decoded at reduced size where its crop or its resize keeps its pixels
    (:mod:`.reduced`): in training, once its box is drawn from its header; in validation, resized here already.
    Every image is turned by its EXIF orientation first where ``turn`` (:mod:`.orientation`).
    """

    def __init__(self, samples: Split, transform, tensors: bool = False, resize: int | None = None,
                 decode_scale: str = "full", interpolation: str = "bilinear", turn: bool = True):
        self.samples = samples
        self.transform = transform
        if decode_scale == "auto":
            self.decode = functools.partial(decode_for_crop, turn=turn) if tensors else functools.partial(
                open_resized, short_side=resize, interpolation=interpolation, turn=turn)
        else:
            self.decode = functools.partial(decode_rgb_tensor, turn=turn) if tensors else functools.partial(
                _open_rgb_bytes, short_side=resize, turn=turn)

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, item: tuple[int, ...]):
        index, seed, *size = item  # training samples carry their epoch's crop size
        label = self.samples.label(index)
        try:
            image = self.decode(self.samples.read(index))
        except (OSError, ValueError, Image.DecompressionBombError) as error:
            return None, label, (self.samples.name(index), f"{error.__class__.__name__}: {error}")
        try:
            return seeded(seed, self._augment, image, *size), label, None
        except DecodeFailed as failed:  # a JPEG decoded once its box was drawn
            return None, label, (self.samples.name(index), f"{failed.cause.__class__.__name__}: {failed.cause}")

    def _augment(self, image, *size: int) -> torch.Tensor:
        """The augmented image (at ``size``, a training crop's side, when given) as an HWC uint8 tensor."""
        out = self.transform(image, *size)
        if isinstance(out, torch.Tensor):
            return out.permute(1, 2, 0)
        return torch.from_numpy(np.array(out, dtype=np.uint8))  # a writable copy: PIL's buffer is read-only


def collate_uint8(batch, normalize: tuple[torch.Tensor, torch.Tensor] | None = None):
    """Stack HWC uint8 images into an NCHW tensor (channels-last in memory); broken samples are dropped
    and reported.

    With ``normalize`` = (mean, std) (CPU training) the workers also normalise, so the main process does
    not; the batch is then float32 NCHW, contiguous, and bitwise what :class:`DeviceLoader` makes of the uint8
    batch on CUDA: the same ``(x - mean) / std``, a subtraction then a division, each rounded once (a
    multiply-add by 1/std would round differently).
    """
    good = [(image, label) for image, label, _ in batch if image is not None]
    broken = [problem for _, _, problem in batch if problem is not None]
    if good:
        height, width, channels = good[0][0].shape
        if normalize is None:
            images = shared_tensor((len(good), height, width, channels), torch.uint8)
            torch.stack([image for image, _ in good], out=images)
            images = images.permute(0, 3, 1, 2)
        else:
            # One pass converts, transposes and writes each image; then (x - mean) / std in place.
            images = shared_tensor((len(good), channels, height, width), torch.float32)
            for slot, (image, _) in zip(images, good):
                slot.copy_(image.permute(2, 0, 1))
            mean, std = normalize
            images.sub_(mean).div_(std)
        labels = torch.tensor([label for _, label in good], dtype=torch.int64)
    else:
        images = torch.empty(0, dtype=torch.uint8)
        labels = torch.empty(0, dtype=torch.int64)
    return images, labels, broken


def _loader(samples: Split, transform, config: DataConfig, runtime: Runtime, train: bool) -> DeviceLoader:
    resize = None if train else val_resize_size(config.preprocessing.image_size, config.preprocessing.crop_ratio)
    dataset = ImageFiles(samples, transform, tensors=train, resize=resize, decode_scale=config.decode_scale,
                         interpolation=config.preprocessing.interpolation, turn=config.preprocessing.exif_orientation)
    sampler = split_sampler(len(samples), config, runtime, train)
    normalize_in_workers = not runtime.is_cuda and config.workers > 0
    scale = (torch.tensor(config.preprocessing.mean).view(1, 3, 1, 1), torch.tensor(config.preprocessing.std).view(1, 3, 1, 1)) \
        if normalize_in_workers else None
    loader = host_loader(dataset, sampler, functools.partial(collate_uint8, normalize=scale), config, train=train,
                         pin_memory=runtime.is_cuda)
    return DeviceLoader(HostBatches(loader, sampler), runtime, num_samples=len(sampler),
                        normalized=normalize_in_workers, mean=config.preprocessing.mean, std=config.preprocessing.std)


def folder_loaders(
    config: DataConfig, runtime: Runtime, classes: list[str], *, want_train: bool, want_val: bool,
) -> tuple[DeviceLoader | None, DeviceLoader | None]:
    root = Path(config.data)
    train = val = None
    if want_train:
        samples = open_split(root, "train", classes, batch_size=config.batch_size, world_size=runtime.world_size)
        train = _loader(samples, TrainTransform(config), config, runtime, train=True)
    if want_val:
        samples = open_split(root, "val", classes)
        transform = val_transform(config.preprocessing.image_size, config.preprocessing.interpolation, config.preprocessing.crop_ratio)
        val = _loader(samples, transform, config, runtime, False)
    return train, val
