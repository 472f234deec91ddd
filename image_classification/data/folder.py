"""The ``pytorch`` backend: an ImageFolder read with PIL, augmented with torchvision, batched as uint8.

Every sample's augmentation is seeded from (seed, epoch, position in the epoch), so a batch is the
same whatever the number of workers, and an epoch can be replayed exactly after a resume.
"""

from __future__ import annotations

import functools
import os
import random
import sys
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset, get_worker_info
from torchvision import transforms
from torchvision.transforms import v2

from ..errors import UserError
from ..runtime import Runtime
from .common import MEAN_255, STD_255, DataConfig, DeviceLoader, ShardSampler, val_resize_size
from .files import is_image_file, open_rgb, read_rgb_tensor, walk_class

_INTERPOLATION = {
    "bilinear": transforms.InterpolationMode.BILINEAR,
    "bicubic": transforms.InterpolationMode.BICUBIC,
    # PIL's bilinear filter is a triangle filter, which is what DALI calls INTERP_TRIANGULAR.
    "triangular": transforms.InterpolationMode.BILINEAR,
}


def class_folders(split_dir: Path) -> list[str]:
    """The class folder names of a split, sorted: their order is the label order."""
    return sorted(entry.name for entry in os.scandir(split_dir) if entry.is_dir())


_reported_links: set[str] = set()


def _report_links(problems: list[str]) -> None:
    """One warning per link not followed, however often the folder is listed."""
    for problem in problems:
        if problem not in _reported_links:
            _reported_links.add(problem)
            print(f"warning: not following {problem}", file=sys.stderr, flush=True)


def list_samples(split_dir: Path, classes: list[str]) -> list[tuple[str, int]]:
    """(path, label) for every image under ``split_dir/<class>/``, in a stable order (see :func:`walk_class`)."""
    samples = []
    for label, name in enumerate(classes):
        class_dir = split_dir / name
        if not class_dir.is_dir():
            continue
        walk = walk_class(class_dir, split_dir)
        _report_links(walk.skipped_links)
        samples.extend((path, label) for path in walk.files)
    return samples


def train_samples(root: Path, classes: list[str], batch_size: int, world_size: int) -> list[tuple[str, int]]:
    """The train/ samples, refusing a set too small for one batch per process."""
    samples = list_samples(root / "train", classes)
    if len(samples) // world_size < batch_size:
        raise UserError(
            f"train/ holds {len(samples)} images, fewer than one batch of {batch_size} per process; "
            "lower -b/--batch-size"
        )
    return samples


def check_dataset(data_dir: str, num_classes: int | None, *, want_train: bool, want_val: bool) -> list[str]:
    """Validate the dataset layout before the first step; return the sorted class names."""
    root = Path(data_dir)
    if not root.is_dir():
        raise UserError(f"dataset directory {data_dir} does not exist")
    splits = [s for s, wanted in (("train", want_train), ("val", want_val)) if wanted]
    found: dict[str, list[str]] = {}
    for split in splits:
        split_dir = root / split
        if not split_dir.is_dir():
            raise UserError(f"{data_dir} has no {split}/ folder; expected {split}/<class>/<image> files")
        classes = class_folders(split_dir)
        if not classes:
            raise UserError(f"{split_dir} has no class folders; expected {split}/<class>/<image> files")
        for name in classes:
            if not _has_images(split_dir / name, split_dir):
                raise UserError(f"class folder {split_dir / name} holds no images")
        found[split] = classes
    if len(found) == 2 and found["train"] != found["val"]:
        only_train = sorted(set(found["train"]) - set(found["val"]))
        only_val = sorted(set(found["val"]) - set(found["train"]))
        detail = "; ".join(
            part for part in (
                f"only in train/: {', '.join(only_train[:5])}" if only_train else "",
                f"only in val/: {', '.join(only_val[:5])}" if only_val else "",
            ) if part
        )
        raise UserError(f"train/ and val/ class folders differ ({detail})")
    classes = next(iter(found.values()))
    if num_classes is not None and len(classes) > num_classes:
        raise UserError(
            f"the dataset has {len(classes)} classes but --num-classes is {num_classes}; "
            f"pass --num-classes {len(classes)}"
        )
    return classes


def _has_images(class_dir: Path, split_dir: Path) -> bool:
    """Whether the class folder holds an image; the usual flat folder is answered from its first entries."""
    with os.scandir(class_dir) as entries:
        if any(is_image_file(entry.name) and entry.is_file() for entry in entries):
            return True
    return bool(walk_class(class_dir, split_dir).files)


class ImageFiles(Dataset):
    """Reads one image and augments it under its own seed; a broken file yields None.

    With ``tensors`` the image is decoded into a uint8 tensor and ``transform`` works on tensors (the
    training path); otherwise it is a PIL image (validation, the same pipeline classify.py uses).
    """

    def __init__(self, samples: list[tuple[str, int]], transform, tensors: bool = False):
        self.samples = samples
        self.transform = transform
        self.read = read_rgb_tensor if tensors else open_rgb

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, item: tuple[int, int]):
        index, seed = item
        path, label = self.samples[index]
        try:
            image = self.read(path)
        except (OSError, ValueError, Image.DecompressionBombError) as error:
            return None, label, f"{path} ({error.__class__.__name__}: {error})"
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
        torch.manual_seed(seed)
        random.seed(seed)
        out = self.transform(image)
        if isinstance(out, torch.Tensor):
            return out.permute(1, 2, 0)
        return torch.from_numpy(np.array(out, dtype=np.uint8))  # a writable copy: PIL's buffer is read-only


def collate_uint8(batch, normalize: bool = False):
    """Stack HWC uint8 images into an NCHW tensor (channels-last in memory); broken samples are dropped
    and reported.

    With ``normalize`` (CPU training) the workers also normalise, so the main process does not.
    """
    good = [(image, label) for image, label, _ in batch if image is not None]
    broken = [problem for _, _, problem in batch if problem is not None]
    if good:
        images = torch.stack([image for image, _ in good]).permute(0, 3, 1, 2)
        if normalize:  # (x - mean) / std as one contiguous multiply-add: several times faster on a CPU
            images = images.contiguous().float().mul_(_INV_STD).sub_(_MEAN_OVER_STD)
        labels = torch.tensor([label for _, label in good], dtype=torch.int64)
    else:
        images = torch.empty(0, dtype=torch.uint8)
        labels = torch.empty(0, dtype=torch.int64)
    return images, labels, broken


class FolderBatches:
    """Host batches from a DataLoader; warns once per broken image and counts them in ``skipped``."""

    supports_start_batch = True

    def __init__(self, loader: DataLoader, sampler: ShardSampler):
        self.loader = loader
        self.sampler = sampler
        self.skipped: set[str] = set()

    def __len__(self) -> int:
        return len(self.sampler) // self.loader.batch_size if self.loader.drop_last else len(self.loader)

    def set_epoch(self, epoch: int, start_batch: int = 0) -> None:
        self.sampler.set_epoch(epoch, start=start_batch * self.loader.batch_size)

    def __iter__(self):
        for images, labels, broken in self.loader:
            for problem in broken:
                if problem not in self.skipped:
                    self.skipped.add(problem)
                    print(f"warning: skipped unreadable image {problem}", file=sys.stderr, flush=True)
            if len(labels):
                yield images, labels


def train_transform(config: DataConfig):
    """torchvision's RandomResizedCrop, flip and AutoAugment, on uint8 CHW tensors (antialiased resize)."""
    steps = [
        v2.RandomResizedCrop(
            config.image_size, scale=tuple(config.crop_scale), ratio=(3 / 4, 4 / 3),
            interpolation=_INTERPOLATION[config.interpolation], antialias=True,
        )
    ]
    if config.hflip > 0:
        steps.append(v2.RandomHorizontalFlip(config.hflip))
    if config.augmentation == "autoaugment":
        steps.append(v2.AutoAugment(v2.AutoAugmentPolicy.IMAGENET))
    return v2.Compose(steps)


def val_transform(image_size: int, interpolation: str = "bilinear"):
    """Resize the short side to ``val_resize_size`` and take the centre crop (PIL in, PIL out)."""
    return transforms.Compose([
        transforms.Resize(val_resize_size(image_size), interpolation=_INTERPOLATION[interpolation]),
        transforms.CenterCrop(image_size),
    ])


_INV_STD = 1.0 / torch.tensor(STD_255).view(1, 3, 1, 1)
_MEAN_OVER_STD = torch.tensor(MEAN_255).view(1, 3, 1, 1) * _INV_STD


def _worker_init(_worker_id: int) -> None:
    # Each sample reseeds torch and random itself; numpy is seeded for any user transform.
    np.random.seed(torch.initial_seed() % 2**32)


def _loader(samples, transform, config: DataConfig, runtime: Runtime, train: bool) -> DeviceLoader:
    dataset = ImageFiles(samples, transform, tensors=train)
    sampler = ShardSampler(len(samples), runtime.rank, runtime.world_size, shuffle=train, seed=config.seed)
    workers = config.workers
    normalize_in_workers = not runtime.is_cuda and workers > 0
    loader = DataLoader(
        dataset,
        batch_size=config.batch_size,
        sampler=sampler,
        num_workers=workers,
        collate_fn=functools.partial(collate_uint8, normalize=normalize_in_workers),
        pin_memory=runtime.is_cuda,
        drop_last=train,
        persistent_workers=workers > 0,
        prefetch_factor=config.prefetch if workers > 0 else None,
        worker_init_fn=_worker_init if workers > 0 else None,
        generator=torch.Generator().manual_seed(config.seed),  # leaves the global RNG untouched
    )
    return DeviceLoader(FolderBatches(loader, sampler), runtime, num_samples=len(sampler),
                        normalized=normalize_in_workers)


def folder_loaders(
    config: DataConfig, runtime: Runtime, classes: list[str], *, want_train: bool, want_val: bool,
) -> tuple[DeviceLoader | None, DeviceLoader | None]:
    root = Path(config.data)
    train = val = None
    if want_train:
        samples = train_samples(root, classes, config.batch_size, runtime.world_size)
        train = _loader(samples, train_transform(config), config, runtime, train=True)
    if want_val:
        val = _loader(list_samples(root / "val", classes), val_transform(config.image_size, config.interpolation),
                      config, runtime, False)
    return train, val
