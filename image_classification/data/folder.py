"""The ``pytorch`` backend: an ImageFolder read with PIL, augmented with torchvision, batched as uint8.

Every sample's augmentation is seeded from (seed, epoch, position in the epoch), so a batch is the
same whatever the number of workers, and an epoch can be replayed exactly after a resume.
"""

from __future__ import annotations

import argparse
import functools
import os
import random
import sys
from pathlib import Path
from typing import Iterator

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset, Sampler
from torchvision import transforms
from torchvision.datasets.folder import IMG_EXTENSIONS

from ..errors import UserError
from ..runtime import Runtime
from .common import MEAN_255, STD_255, DeviceLoader, val_resize_size

_INTERPOLATION = {
    "bilinear": transforms.InterpolationMode.BILINEAR,
    "bicubic": transforms.InterpolationMode.BICUBIC,
    # PIL's bilinear filter is a triangle filter, which is what DALI calls INTERP_TRIANGULAR.
    "triangular": transforms.InterpolationMode.BILINEAR,
}


def is_image_file(name: str) -> bool:
    return name.lower().endswith(IMG_EXTENSIONS)


def _class_folders(split_dir: Path) -> list[str]:
    return sorted(entry.name for entry in os.scandir(split_dir) if entry.is_dir())


def list_samples(split_dir: Path, classes: list[str]) -> list[tuple[str, int]]:
    """(path, label) for every image under ``split_dir/<class>/``, in a stable order."""
    samples = []
    for label, name in enumerate(classes):
        class_dir = split_dir / name
        if not class_dir.is_dir():
            continue
        for root, _, files in sorted(os.walk(class_dir, followlinks=True)):
            samples.extend((os.path.join(root, f), label) for f in sorted(files) if is_image_file(f))
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


def check_dataset(data_dir: str, num_classes: int, *, want_train: bool, want_val: bool) -> list[str]:
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
        classes = _class_folders(split_dir)
        if not classes:
            raise UserError(f"{split_dir} has no class folders; expected {split}/<class>/<image> files")
        for name in classes:
            if not any(True for _ in _iter_images(split_dir / name)):
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
    if len(classes) > num_classes:
        raise UserError(
            f"the dataset has {len(classes)} classes but --num-classes is {num_classes}; "
            f"pass --num-classes {len(classes)}"
        )
    return classes


def _iter_images(folder: Path) -> Iterator[str]:
    for root, _, files in os.walk(folder, followlinks=True):
        for name in files:
            if is_image_file(name):
                yield os.path.join(root, name)


def sample_seed(seed: int, epoch: int, position: int) -> int:
    """The seed of one sample's augmentation: a pure function of the run seed, epoch and position."""
    return (seed * 1_000_003 + epoch * 7_919 + position * 104_729) % (2**63 - 1)


class ShardSampler(Sampler):
    """Yields (index, sample seed) pairs of this rank's share of an epoch.

    Training shuffles with a generator seeded from (seed, epoch), trims the permutation to a multiple
    of the world size and deals it out round-robin.  Validation deals ``range(n)`` without shuffling
    or padding, so every image is seen by exactly one rank.
    """

    def __init__(self, size: int, rank: int, world_size: int, shuffle: bool, seed: int):
        self.size, self.rank, self.world_size = size, rank, world_size
        self.shuffle, self.seed, self.epoch, self.start = shuffle, seed, 0, 0

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        """Pick ``epoch``'s order; the next pass begins at this rank's ``start``-th sample."""
        self.epoch, self.start = epoch, start

    def _indices(self) -> list[int]:
        if not self.shuffle:
            return list(range(self.rank, self.size, self.world_size))
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        order = torch.randperm(self.size, generator=generator).tolist()
        usable = len(order) - len(order) % self.world_size
        return order[self.rank:usable:self.world_size]

    def __iter__(self):
        indices = self._indices()
        for position in range(self.start, len(indices)):
            yield indices[position], sample_seed(self.seed, self.epoch, position * self.world_size + self.rank)

    def __len__(self) -> int:
        if not self.shuffle:
            return len(range(self.rank, self.size, self.world_size))
        return self.size // self.world_size


class ImageFiles(Dataset):
    """Reads one image with PIL and augments it under its own seed; a broken file yields None."""

    def __init__(self, samples: list[tuple[str, int]], transform):
        self.samples = samples
        self.transform = transform

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, item: tuple[int, int]):
        index, seed = item
        path, label = self.samples[index]
        try:
            with open(path, "rb") as handle:
                image = Image.open(handle)
                image = image.convert("RGB")
        except (OSError, ValueError, Image.DecompressionBombError) as error:
            return None, label, f"{path} ({error.__class__.__name__}: {error})"
        torch.manual_seed(seed)
        random.seed(seed)
        image = self.transform(image)
        return np.asarray(image, dtype=np.uint8), label, None


def collate_uint8(batch, normalize: bool = False):
    """Stack HWC uint8 arrays into an NCHW tensor; broken samples are dropped and reported.

    With ``normalize`` (CPU training) the workers also normalise, so the main process does not.
    """
    good = [(image, label) for image, label, _ in batch if image is not None]
    broken = [problem for _, _, problem in batch if problem is not None]
    if good:
        images = torch.from_numpy(np.stack([image for image, _ in good])).permute(0, 3, 1, 2)
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


def train_transform(args: argparse.Namespace, image_size: int):
    steps = [
        transforms.RandomResizedCrop(
            image_size, scale=tuple(args.crop_scale), ratio=(3 / 4, 4 / 3),
            interpolation=_INTERPOLATION[args.interpolation],
        )
    ]
    if args.hflip > 0:
        steps.append(transforms.RandomHorizontalFlip(args.hflip))
    if args.augmentation == "autoaugment":
        steps.append(transforms.AutoAugment(transforms.AutoAugmentPolicy.IMAGENET))
    return transforms.Compose(steps)


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


def _loader(samples, transform, args, runtime: Runtime, train: bool) -> DeviceLoader:
    sampler = ShardSampler(len(samples), runtime.rank, runtime.world_size, shuffle=train, seed=args.seed)
    workers = args.workers
    normalize_in_workers = not runtime.is_cuda and workers > 0
    loader = DataLoader(
        ImageFiles(samples, transform),
        batch_size=args.batch_size,
        sampler=sampler,
        num_workers=workers,
        collate_fn=functools.partial(collate_uint8, normalize=normalize_in_workers),
        pin_memory=runtime.is_cuda,
        drop_last=train,
        persistent_workers=workers > 0,
        prefetch_factor=args.prefetch if workers > 0 else None,
        worker_init_fn=_worker_init if workers > 0 else None,
        generator=torch.Generator().manual_seed(args.seed),  # leaves the global RNG untouched
    )
    return DeviceLoader(FolderBatches(loader, sampler), runtime, num_samples=len(sampler),
                        normalized=normalize_in_workers)


def folder_loaders(
    args: argparse.Namespace, runtime: Runtime, image_size: int, classes: list[str], *,
    want_train: bool, want_val: bool,
) -> tuple[DeviceLoader | None, DeviceLoader | None]:
    root = Path(args.data)
    train = val = None
    if want_train:
        samples = train_samples(root, classes, args.batch_size, runtime.world_size)
        train = _loader(samples, train_transform(args, image_size), args, runtime, train=True)
    if want_val:
        val = _loader(list_samples(root / "val", classes), val_transform(image_size, args.interpolation), args,
                      runtime, False)
    return train, val
