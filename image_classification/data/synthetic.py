"""The ``synthetic`` backend: one random, already normalised batch made on the device, served N times.

It measures the model alone.  An epoch is ``--prof`` batches when set, else
:data:`DEFAULT_EPOCH_LENGTH` batches (the reference's synthetic epoch never ended).
"""

from __future__ import annotations

from typing import Callable, Iterator

import torch

from ..seeding import mix_seed
from ..system.runtime import Runtime
from .common import DataConfig

DEFAULT_EPOCH_LENGTH = 100


class SyntheticLoader:
    """``size_at``: the image side of each epoch (training under ``--progressive-resize``); the batch is made
    again, from the same seed, when it changes."""

    def __init__(self, batch_size: int, image_size: int, num_classes: int, length: int, runtime: Runtime,
                 seed: int, size_at: Callable[[int], int] | None = None):
        self.batch_size, self.num_classes, self.runtime, self.seed = batch_size, num_classes, runtime, seed
        self.size_at = size_at
        self._make(image_size)
        self.length = length
        self.num_samples = batch_size * length
        self.skipped = 0  # made on the device: nothing is ever unreadable
        self._start = 0

    def __len__(self) -> int:
        return self.length

    def _make(self, image_size: int) -> None:
        runtime = self.runtime
        generator = torch.Generator(device=runtime.device).manual_seed(self.seed)
        shape = (self.batch_size, 3, image_size, image_size)
        self.images = torch.randn(shape, generator=generator, device=runtime.device).contiguous(
            memory_format=runtime.memory_format
        )
        self.targets = torch.randint(0, self.num_classes, (self.batch_size,), generator=generator,
                                     device=runtime.device)

    def set_epoch(self, epoch: int, start_batch: int = 0) -> None:
        self._start = start_batch
        if self.size_at is not None and self.size_at(epoch) != self.images.shape[-1]:
            self._make(self.size_at(epoch))

    def fingerprint(self) -> dict:
        return {}  # made up anew by every run: nothing to tell apart

    def pass_counts(self) -> dict[str, int]:
        return {}

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for _ in range(self._start, self.length):
            yield self.images, self.targets


def synthetic_loaders(config: DataConfig, runtime: Runtime, *, want_train: bool,
                      want_val: bool) -> tuple[SyntheticLoader | None, SyntheticLoader | None]:
    length = config.synthetic_length or DEFAULT_EPOCH_LENGTH
    make = lambda offset, size, size_at=None: SyntheticLoader(  # noqa: E731
        config.batch_size, size, config.num_classes or 1000, length, runtime,
        mix_seed(config.seed + runtime.rank + offset), size_at,
    )
    size_at = config.preprocessing.train_size_at if config.preprocessing.train_schedule is not None else None
    return (make(0, config.preprocessing.train_size_at(0), size_at) if want_train else None), \
        (make(1, config.preprocessing.image_size) if want_val else None)
