"""What the backends whose images are read by torch DataLoader workers share (``pytorch``, ``pytorch-gpu``):
the loader itself, its workers' set-up, batch tensors in shared memory, the training sampler that hands the
workers each epoch's crop size with its samples, and the host batches with the images the workers could not
read, each warned about once."""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler, get_worker_info

from ..system.runtime import Runtime
from ..system.signals import ignore_in_worker
from .common import DataConfig, ShardSampler, Unreadable, train_sampler


def shared_tensor(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """An empty tensor for a batch; in a worker it lives in shared memory, so sending it is not a copy."""
    if get_worker_info() is None:
        return torch.empty(shape, dtype=dtype)
    storage = torch.empty(0, dtype=dtype)._typed_storage()._new_shared(int(np.prod(shape)))
    return torch.empty(0, dtype=dtype).new(storage).resize_(shape)  # as torch's default_collate does


def _worker_init(_worker_id: int) -> None:
    # Each sample reseeds torch and random itself; numpy is seeded for any user transform.
    np.random.seed(torch.initial_seed() % 2**32)
    ignore_in_worker()


def host_loader(dataset: Dataset, sampler: ShardSampler, collate, config: DataConfig, *, train: bool,
                pin_memory: bool = False) -> DataLoader:
    """The DataLoader of a split: ``config.workers`` processes (none: the training process reads), each batch
    made by ``collate``; training drops the last partial batch."""
    workers = config.workers
    return DataLoader(
        dataset,
        batch_size=config.batch_size,
        sampler=sampler,
        num_workers=workers,
        collate_fn=collate,
        pin_memory=pin_memory,
        drop_last=train,
        persistent_workers=workers > 0,
        prefetch_factor=config.prefetch if workers > 0 else None,
        worker_init_fn=_worker_init if workers > 0 else None,
        generator=torch.Generator().manual_seed(config.seed),  # leaves the global RNG untouched
    )


class SizedSampler(Sampler):
    """A training sampler's ``(index, seed)`` samples with the epoch's crop side added, ``(index, seed, size)``:
    the size travels to the workers with the indices, so persistent workers follow ``--progressive-resize``
    from the epoch's first sample on, with no restart and no state of their own."""

    def __init__(self, sampler: ShardSampler, size_at: Callable[[int], int]):
        self.sampler, self.size_at = sampler, size_at
        self.size = size_at(0)

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        self.sampler.set_epoch(epoch, start)
        self.size = self.size_at(epoch)

    def __len__(self) -> int:
        return len(self.sampler)

    def __iter__(self):
        size = self.size
        for index, seed in self.sampler:
            yield index, seed, size


def split_sampler(size: int, config: DataConfig, runtime: Runtime, train: bool) -> ShardSampler | SizedSampler:
    """This rank's sampler of a split: shuffled and dealt for training (:func:`.common.train_sampler`), each
    sample with its epoch's crop size (:class:`SizedSampler`); dealt in order for validation."""
    if train:
        return SizedSampler(train_sampler(size, config, runtime), config.preprocessing.train_size_at)
    return ShardSampler(size, runtime.rank, runtime.world_size, shuffle=False, seed=config.seed)


class HostBatches:
    """Host batches ``(images, labels)`` from a DataLoader whose collate returns ``(images, labels, broken)``:
    the broken images its workers report are warned about once, and a batch left with no image is not handed
    on."""

    def __init__(self, loader: DataLoader, sampler: ShardSampler | SizedSampler):
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
