"""What every data backend shares: its configuration, the sampler that orders and shards an epoch,
normalisation constants, sizes, and the move to the device."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterable, Iterator, Sequence
from typing import Protocol

import numpy as np
import torch
from torch.utils.data import Sampler

from ..arguments.data import DataConfig  # noqa: F401 - the backends' configuration, re-exported for them
from ..errors import UserError
from ..models.preprocessing import IMAGENET_MEAN_255 as MEAN_255, IMAGENET_STD_255 as STD_255
from ..seeding import SEED_MODULUS, WEIGHTS, mix_seed
from ..system.runtime import Runtime


class Loader(Protocol):
    """What the training loop receives from every backend: (images, targets) ready on the device.

    Images are float32, normalised, in the runtime's memory format; targets are int64 class ids.
    ``set_epoch`` is called before each pass and picks that epoch's order; with ``start_batch`` the
    pass begins that many batches in, without reading them (an exact mid-epoch resume).
    ``num_samples`` is how many images this process sees in one pass (validation counts every image
    exactly once overall); ``skipped`` how many unreadable images were left out so far; ``fingerprint()``
    which images the split holds (:func:`.packed.fingerprint`; empty for synthetic data), which a checkpoint
    records; ``pass_counts()`` what the backend counted in its latest pass, by name, that the raport records per
    epoch (``cpu_decoded`` for ``pytorch-gpu``: the JPEGs its device's decoder refused; none for the others),
    with the same names before any pass.
    """

    num_samples: int

    @property
    def skipped(self) -> int: ...

    def __len__(self) -> int: ...

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]: ...

    def set_epoch(self, epoch: int, start_batch: int = 0) -> None: ...

    def fingerprint(self) -> dict: ...

    def pass_counts(self) -> dict[str, int]: ...


class Unreadable:
    """The images a backend could not read: each named once on stderr, then left out of every pass."""

    def __init__(self):
        self.paths: set[str] = set()

    def add(self, path: str, reason: str = "") -> None:
        if path in self.paths:
            return
        self.paths.add(path)
        detail = f" ({reason})" if reason else ""
        print(f"warning: skipped unreadable image {path}{detail}", file=sys.stderr, flush=True)

    def __contains__(self, path: str) -> bool:
        return path in self.paths

    def __len__(self) -> int:
        return len(self.paths)


def normalized(images: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """A uint8 batch as float32 ``(x - mean) / std``: a subtraction then a division, each rounded once, the one
    formula of every backend (a multiply-add by 1/std would round differently)."""
    return images.float().sub_(mean).div_(std)


def channel_values(values: tuple[float, ...], device: torch.device) -> torch.Tensor:
    """Per-channel constants (mean, std) shaped to broadcast over an NCHW batch."""
    return torch.tensor(values, device=device).view(1, 3, 1, 1)


class SideStream:
    """Where a loader prepares its next batch: on CUDA a side stream, whose work the training loop's stream
    waits for before it reads the batch (and which then no longer recycles the batch's memory under it); on
    the CPU in line, with nothing to wait for."""

    def __init__(self, device: torch.device):
        self.device = device
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None

    def __enter__(self):
        self._context = torch.cuda.stream(self.stream) if self.stream is not None else contextlib.nullcontext()
        return self._context.__enter__()

    def __exit__(self, *exc):
        return self._context.__exit__(*exc)

    def done(self):
        """A mark of the work queued on the stream so far (an event; None on the CPU)."""
        return self.stream.record_event() if self.stream is not None else None

    def hand_over(self, tensors: Iterable[torch.Tensor], done=None) -> None:
        """Let the current stream use ``tensors``, made on the side stream (up to ``done``; by then, without)."""
        if self.stream is None:
            return
        current = torch.cuda.current_stream(self.device)
        if done is None:
            current.wait_stream(self.stream)
        else:
            current.wait_event(done)
        for tensor in tensors:
            tensor.record_stream(current)


class WrappingLoader:
    """A :class:`Loader` over another (``source``, its host batches): its length, skipped images, epoch and
    fingerprint are the source's."""

    def __init__(self, source):
        self.source = source

    def __len__(self) -> int:
        return len(self.source)

    @property
    def skipped(self) -> int:
        return self.source.skipped

    def set_epoch(self, epoch: int, start_batch: int = 0) -> None:
        self.source.set_epoch(epoch, start_batch)

    def fingerprint(self) -> dict:
        return self.source.fingerprint()

    def pass_counts(self) -> dict[str, int]:
        return {}


class DeviceLoader(WrappingLoader):
    """Moves host batches to the device, normalises them and applies the memory format.

    On CUDA the copy and normalisation of the next batch run on a side stream while the current one
    is used: one stream for the loader's life, so the memory the caching allocator keeps for it serves every
    pass (a new stream each pass would strand the last pass's cached blocks on a stream never used again).
    On CPU the work is done in line.  ``normalized=True`` skips normalisation for backends that already
    produce float, normalised batches.
    """

    def __init__(self, source, runtime: Runtime, num_samples: int, normalized: bool = False,
                 mean: tuple[float, ...] = MEAN_255, std: tuple[float, ...] = STD_255):
        super().__init__(source)
        self.runtime = runtime
        self.num_samples = num_samples
        self.normalized = normalized
        self.mean = channel_values(mean, runtime.device)
        self.std = channel_values(std, runtime.device)
        self.side = SideStream(runtime.device)

    def _prepare(self, images: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        device = self.runtime.device
        images = images.to(device, non_blocking=True)
        targets = targets.to(device, non_blocking=True).long().view(-1)
        if not self.normalized:
            images = normalized(images, self.mean, self.std)
        return images.contiguous(memory_format=self.runtime.memory_format), targets

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        if not self.runtime.is_cuda:
            for images, targets in self.source:
                yield self._prepare(images, targets)
            return
        yield from self._cuda_prefetch(iter(self.source))

    def _cuda_prefetch(self, batches: Iterable) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        side, pending = self.side, None
        for images, targets in batches:
            with side:
                ready = self._prepare(images, targets)
            if pending is not None:
                yield pending
            side.hand_over(ready)
            pending = ready
        if pending is not None:
            yield pending


def sample_seed(seed: int, epoch: int, position: int) -> int:
    """The seed of one sample's augmentation: a pure function of the run seed, epoch and position."""
    return mix_seed(0, seed, epoch, position)


def sample_seeds(seed: int, epoch: int, positions: np.ndarray) -> np.ndarray:
    """:func:`sample_seed` of every position of ``positions`` (non-negative, under 2**40), as int64, at once."""
    base = np.uint64(mix_seed(0, seed, epoch))  # under 2**63: adding position * weight stays under 2**64
    weight = np.uint64(WEIGHTS[2])
    return ((base + positions.astype(np.uint64) * weight) % np.uint64(SEED_MODULUS)).astype(np.int64)


RA_ROUND = 256  # torchvision's RASampler rounds an epoch down to whole multiples of 256 images


class RepeatedShare(Sequence):
    """One rank's positions of ``order`` with each index ``repeats`` times in a row, padded from its start
    to a multiple of ``world_size`` and dealt out round-robin (torchvision's ``RASampler``), computed
    position by position: it holds ``order`` alone, however large ``repeats`` is.

    The full list would be ``[i for i in order for _ in range(repeats)]``, ``length = len(order) * repeats``
    long, plus its first ``(-length) % world_size`` items again (no more than it holds); this rank's
    ``p``-th position is that list's item ``p * world_size + rank``.  ``limit`` cuts the share shorter.
    """

    def __init__(self, order: Sequence[int], repeats: int, rank: int, world_size: int, limit: int | None = None):
        self.order, self.repeats, self.rank, self.world_size = order, repeats, rank, world_size
        self.length = len(order) * repeats
        padded = self.length + min(-self.length % world_size, self.length)
        share = len(range(rank, padded, world_size))
        self.count = share if limit is None else min(share, limit)

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, position: int | slice) -> int | list[int]:
        if isinstance(position, slice):  # the same formula over an array: a pass's order in one step
            items = np.arange(*position.indices(self.count), dtype=np.int64) * self.world_size + self.rank
            items[items >= self.length] -= self.length
            return np.asarray(self.order, dtype=np.int64)[items // self.repeats].tolist()
        if position < 0:
            position += self.count
        if not 0 <= position < self.count:
            raise IndexError(position)
        item = position * self.world_size + self.rank
        if item >= self.length:  # the padding repeats the list's start
            item -= self.length
        return int(self.order[item // self.repeats])


class ShardSampler(Sampler):
    """Yields (index, sample seed) pairs of this rank's share of an epoch.

    Training shuffles with a generator seeded from (seed, epoch), trims the permutation to a multiple
    of the world size and deals it out round-robin.  Validation deals ``range(n)`` without shuffling
    or padding, so every image is seen by exactly one rank.

    ``repeats`` > 1 is repeated augmentation, as torchvision's ``RASampler`` (and timm's
    ``RepeatAugSampler``) deal it: each index of the permutation ``repeats`` times in a row, the list
    padded from its start to a multiple of the world size and dealt out round-robin, so the copies of an
    image go to different ranks; each rank then keeps only its first ``len(self)`` positions: an epoch
    as long as without repeats, rounded down to whole multiples of 256 images (all of them for a
    dataset under 256, as timm does).  Every copy is at its own position, so it has its own sample seed.
    """

    def __init__(self, size: int, rank: int, world_size: int, shuffle: bool, seed: int, repeats: int = 1):
        self.size, self.rank, self.world_size = size, rank, world_size
        self.shuffle, self.seed, self.epoch, self.start = shuffle, seed, 0, 0
        self.repeats = repeats

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        """Pick ``epoch``'s order; the next pass begins at this rank's ``start``-th sample."""
        self.epoch, self.start = epoch, start

    def _permutation(self) -> np.ndarray:
        """The epoch's shuffle, as an int64 array (a list of Python ints would take 36 bytes an image)."""
        generator = torch.Generator().manual_seed(mix_seed(self.epoch, self.seed))
        return torch.randperm(self.size, generator=generator).numpy()

    def _indices(self) -> Sequence[int]:
        if not self.shuffle:
            return range(self.rank, self.size, self.world_size)
        order = self._permutation()
        if self.repeats > 1:
            return self._repeated(order, len(self))
        usable = len(order) - len(order) % self.world_size
        return order[self.rank:usable:self.world_size]

    def _repeated(self, order: Sequence[int], limit: int | None = None) -> RepeatedShare:
        """This rank's share of ``order`` repeated and padded, its first ``limit`` positions (all without)."""
        return RepeatedShare(order, self.repeats, self.rank, self.world_size, limit)

    def __iter__(self):
        indices = self._indices()
        for position in range(self.start, len(indices)):
            yield int(indices[position]), sample_seed(self.seed, self.epoch, position * self.world_size + self.rank)

    def pass_order(self) -> tuple[np.ndarray, np.ndarray]:
        """What iterating yields, as two int64 arrays: the indices and their sample seeds."""
        indices = self._indices()
        positions = np.arange(self.start, len(indices), dtype=np.int64)
        chosen = np.asarray(indices[self.start:], dtype=np.int64)
        return chosen, sample_seeds(self.seed, self.epoch, positions * self.world_size + self.rank)

    def __len__(self) -> int:
        if not self.shuffle:
            return len(range(self.rank, self.size, self.world_size))
        if self.repeats > 1:
            if self.size >= RA_ROUND:
                return self.size // RA_ROUND * RA_ROUND // self.world_size
            return -(-self.size // self.world_size)
        return self.size // self.world_size


def train_sampler(size: int, config: DataConfig, runtime: Runtime) -> ShardSampler:
    """The training sampler of a backend, refusing an epoch without a whole batch (repeated augmentation
    rounds an epoch down to multiples of 256 images, which can leave a process less than one batch) or of
    a single image (more repeats than the epoch has positions)."""
    sampler = ShardSampler(size, runtime.rank, runtime.world_size, shuffle=True, seed=config.seed,
                           repeats=config.ra_reps)
    shown = len(sampler) * runtime.world_size
    if config.ra_reps > 1 and config.ra_reps >= shown:
        raise UserError(f"--ra-reps {config.ra_reps}: each image that many times in a row fills an epoch's "
                        f"{shown} images (over {runtime.world_size} process(es)) with one image; give fewer than "
                        f"{shown}")
    if config.ra_reps > 1 and len(sampler) < config.batch_size:  # without repeats open_split checked it
        raise UserError(f"--ra-reps {config.ra_reps}: an epoch gives each of the {runtime.world_size} process(es) "
                        f"{len(sampler)} of the {size} training images (whole multiples of 256 in all), fewer than "
                        f"one batch of {config.batch_size}; lower -b/--batch-size")
    return sampler
