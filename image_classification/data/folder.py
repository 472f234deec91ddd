"""The ``pytorch`` backend: an ImageFolder (or the shards packed from it) read with PIL, augmented with
torchvision, batched as uint8.

Every sample's augmentation is seeded from (seed, epoch, position in the epoch), so a batch is the
same whatever the number of workers, and an epoch can be replayed exactly after a resume.
"""

from __future__ import annotations

import functools
import io
import random
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset, get_worker_info
from torchvision import transforms
from torchvision.transforms import v2

from ..runtime import Runtime
from ..signals import ignore_in_worker
from .common import CROP_RATIO, DataConfig, DeviceLoader, ShardSampler, Unreadable, train_sampler
from ..preprocessing import val_resize_size
from .files import decode_rgb_tensor, open_rgb
from .layout import Split, open_split

_INTERPOLATION = {
    "bilinear": transforms.InterpolationMode.BILINEAR,
    "bicubic": transforms.InterpolationMode.BICUBIC,
    # PIL's bilinear filter is a triangle filter, which is what DALI calls INTERP_TRIANGULAR.
    "triangular": transforms.InterpolationMode.BILINEAR,
}


def _open_rgb_bytes(raw: bytes, short_side: int | None = None) -> Image.Image:
    return open_rgb(io.BytesIO(raw), short_side)


class ImageFiles(Dataset):
    """Reads one image (a file of a folder, or its bytes in a shard) and augments it under its own seed; a
    broken one yields None.

    With ``tensors`` the image is decoded into a uint8 tensor and ``transform`` works on tensors (the
    training path); otherwise it is a PIL image (validation, the same pipeline classify.py uses), which
    ``transform`` resizes whole to a ``resize`` px short side: an image too large for that is broken too.
    """

    def __init__(self, samples: Split, transform, tensors: bool = False, resize: int | None = None):
        self.samples = samples
        self.transform = transform
        self.decode = decode_rgb_tensor if tensors else functools.partial(_open_rgb_bytes, short_side=resize)

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, item: tuple[int, int]):
        index, seed = item
        label = self.samples.label(index)
        try:
            image = self.decode(self.samples.read(index))
        except (OSError, ValueError, Image.DecompressionBombError) as error:
            return None, label, (self.samples.name(index), f"{error.__class__.__name__}: {error}")
        if get_worker_info() is not None:  # a worker process: its generators are its own
            return self._augment(image, seed), label, None
        # -j 0: the training process itself; its generators (MixUp, dropout) must not see the reseeding
        python_state = random.getstate()
        with torch.random.fork_rng(devices=[]):
            try:
                return self._augment(image, seed), label, None
            finally:
                random.setstate(python_state)

    def _augment(self, image, seed: int) -> torch.Tensor:
        """The augmented image as an HWC uint8 tensor."""
        # The CPU generator alone: the transforms draw nothing else, and torch.manual_seed would also
        # queue a seed for every lazy accelerator, formatting a stack trace each time (~1 ms a sample).
        torch.default_generator.manual_seed(seed)
        random.seed(seed)
        out = self.transform(image)
        if isinstance(out, torch.Tensor):
            return out.permute(1, 2, 0)
        return torch.from_numpy(np.array(out, dtype=np.uint8))  # a writable copy: PIL's buffer is read-only


def _batch_tensor(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """An empty tensor for a batch; in a worker it lives in shared memory, so sending it is not a copy."""
    if get_worker_info() is None:
        return torch.empty(shape, dtype=dtype)
    storage = torch.empty(0, dtype=dtype)._typed_storage()._new_shared(int(np.prod(shape)))
    return torch.empty(0, dtype=dtype).new(storage).resize_(shape)  # as torch's default_collate does


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
            images = _batch_tensor((len(good), height, width, channels), torch.uint8)
            torch.stack([image for image, _ in good], out=images)
            images = images.permute(0, 3, 1, 2)
        else:
            # One pass converts, transposes and writes each image; then (x - mean) / std in place.
            images = _batch_tensor((len(good), channels, height, width), torch.float32)
            for slot, (image, _) in zip(images, good):
                slot.copy_(image.permute(2, 0, 1))
            mean, std = normalize
            images.sub_(mean).div_(std)
        labels = torch.tensor([label for _, label in good], dtype=torch.int64)
    else:
        images = torch.empty(0, dtype=torch.uint8)
        labels = torch.empty(0, dtype=torch.int64)
    return images, labels, broken


class FolderBatches:
    """Host batches from a DataLoader; the broken images its workers report are warned about once."""

    def __init__(self, loader: DataLoader, sampler: ShardSampler):
        self.loader = loader
        self.sampler = sampler
        self.unreadable = Unreadable()

    @property
    def skipped(self) -> int:
        return len(self.unreadable)

    def __len__(self) -> int:
        return len(self.sampler) // self.loader.batch_size if self.loader.drop_last else len(self.loader)

    def set_epoch(self, epoch: int, start_batch: int = 0) -> None:
        self.sampler.set_epoch(epoch, start=start_batch * self.loader.batch_size)

    def fingerprint(self) -> dict:
        return self.loader.dataset.samples.fingerprint()

    def __iter__(self):
        for images, labels, broken in self.loader:
            for path, reason in broken:
                self.unreadable.add(path, reason)
            if len(labels):
                yield images, labels


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


class RandomResizedCrop:
    """torchvision's RandomResizedCrop on a uint8 CHW tensor: the same box from the same generator state,
    the same pixels.  Only the crop is copied to channels-last memory before torchvision resizes it, as
    torch's uint8 antialiased kernels are fastest there; the result is a CHW view of HWC memory, so the
    batch's HWC stack is a plain copy."""

    def __init__(self, size: int, scale: tuple[float, float], interpolation: transforms.InterpolationMode):
        self.size, self.scale, self.interpolation = [size, size], list(scale), interpolation

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        top, left, height, width = transforms.RandomResizedCrop.get_params(image, self.scale, [3 / 4, 4 / 3])
        crop = image[None, :, top:top + height, left:left + width].contiguous(memory_format=torch.channels_last)
        return v2.functional.resize(crop, self.size, self.interpolation, antialias=True)[0]


def train_transform(config: DataConfig):
    """torchvision's RandomResizedCrop, flip and ``--augmentation``, on uint8 CHW tensors (antialiased resize)."""
    steps = [RandomResizedCrop(config.train_size, tuple(config.crop_scale), _INTERPOLATION[config.interpolation])]
    if config.hflip > 0:
        steps.append(v2.RandomHorizontalFlip(config.hflip))
    augmentation = auto_augmentation(config)
    if augmentation is not None:
        steps.append(augmentation)
    return v2.Compose(steps)


def val_transform(image_size: int, interpolation: str = "bilinear", crop_ratio: float = CROP_RATIO):
    """Resize the short side to ``val_resize_size`` and take the centre crop (PIL in, PIL out)."""
    return transforms.Compose([
        transforms.Resize(val_resize_size(image_size, crop_ratio), interpolation=_INTERPOLATION[interpolation]),
        transforms.CenterCrop(image_size),
    ])


def _worker_init(_worker_id: int) -> None:
    # Each sample reseeds torch and random itself; numpy is seeded for any user transform.
    np.random.seed(torch.initial_seed() % 2**32)
    ignore_in_worker()


def _loader(samples: Split, transform, config: DataConfig, runtime: Runtime, train: bool) -> DeviceLoader:
    resize = None if train else val_resize_size(config.image_size, config.crop_ratio)
    dataset = ImageFiles(samples, transform, tensors=train, resize=resize)
    sampler = train_sampler(len(samples), config, runtime) if train else \
        ShardSampler(len(samples), runtime.rank, runtime.world_size, shuffle=False, seed=config.seed)
    workers = config.workers
    normalize_in_workers = not runtime.is_cuda and workers > 0
    scale = (torch.tensor(config.mean).view(1, 3, 1, 1), torch.tensor(config.std).view(1, 3, 1, 1)) \
        if normalize_in_workers else None
    loader = DataLoader(
        dataset,
        batch_size=config.batch_size,
        sampler=sampler,
        num_workers=workers,
        collate_fn=functools.partial(collate_uint8, normalize=scale),
        pin_memory=runtime.is_cuda,
        drop_last=train,
        persistent_workers=workers > 0,
        prefetch_factor=config.prefetch if workers > 0 else None,
        worker_init_fn=_worker_init if workers > 0 else None,
        generator=torch.Generator().manual_seed(config.seed),  # leaves the global RNG untouched
    )
    return DeviceLoader(FolderBatches(loader, sampler), runtime, num_samples=len(sampler),
                        normalized=normalize_in_workers, mean=config.mean, std=config.std)


def folder_loaders(
    config: DataConfig, runtime: Runtime, classes: list[str], *, want_train: bool, want_val: bool,
) -> tuple[DeviceLoader | None, DeviceLoader | None]:
    root = Path(config.data)
    train = val = None
    if want_train:
        samples = open_split(root, "train", classes, batch_size=config.batch_size, world_size=runtime.world_size)
        train = _loader(samples, train_transform(config), config, runtime, train=True)
    if want_val:
        samples = open_split(root, "val", classes)
        transform = val_transform(config.image_size, config.interpolation, config.crop_ratio)
        val = _loader(samples, transform, config, runtime, False)
    return train, val
