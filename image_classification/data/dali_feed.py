"""What a DALI pipeline of :mod:`.dali` is fed: the samples of the pass under way, a batch per call, as paths (a
folder) or as their bytes read ahead by a thread pool (the shards of a packed set), with their labels and, for
training, each sample's random states, computed from its seed (so that a resumed run draws what an uninterrupted
one does)."""

from __future__ import annotations

import os
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor

from .layout import Split

# Random states the feed hands with each training sample: one per random operator of the pipeline (the crop,
# the flip and at most three in an auto_aug policy).
RANDOM_SLOTS = 8


def random_states(seeds: list[int], slots: int):
    """DALI random states, ``slots`` per sample seed: a (len(seeds), slots, 7) uint32 array.

    A state is Philox's: a 64-bit key (the sample's seed), a 128-bit counter and a phase, in the 25 bytes
    DALI reads.  Slot k starts its counter at k * 2**48, so no two operators of a sample draw the same
    numbers.  DALI takes a batch's state from its first sample and gives the sample in slot i of the batch
    its own stream (counter sequence i * 65537); batches begin at whole multiples of the batch size in
    every run, resumed or not, so each sample meets the same state wherever the run began.
    """
    import numpy as np

    keys = np.array(seeds, dtype=np.uint64)
    states = np.zeros((len(seeds), slots, 7), dtype=np.uint32)
    states[:, :, 0] = (keys & np.uint64(0xFFFF_FFFF)).astype(np.uint32)[:, None]
    states[:, :, 1] = (keys >> np.uint64(32)).astype(np.uint32)[:, None]
    states[:, :, 3] = np.arange(slots, dtype=np.uint32) << 16  # the counter's bits 48 and up
    return states


class Feed:
    """A pipeline's external source: the samples of the pass under way, in order, a batch per call, with
    their labels and, for training, the random states of each (:func:`random_states`).

    From a folder it hands out paths: DALI's file reader reads them in the pipeline's threads.  From shards
    it hands out the images' bytes, read ahead (``ahead`` batches) by its own pool of ``threads`` with one
    ``os.pread`` each; the call, on the training loop's thread, only collects reads already under way.
    Reading here, one file or sample at a time, would put the I/O and the GIL on that thread.  Raising
    StopIteration at the end is what ends a pass for DALI's iterator.
    """

    def __init__(self, batch_size: int, random_slots: int = 0, samples: Split | None = None, *,
                 encoded: bool = False, threads: int = 1, ahead: int = 4):
        import numpy as np

        self.batch_size, self.random_slots, self.samples = batch_size, random_slots, samples
        self.encoded, self.ahead = encoded, ahead  # random_slots: RANDOM_SLOTS for training, none for validation
        self.indices = self.seeds = np.empty(0, dtype=np.int64)
        self.position = 0  # samples handed to the pipeline so far (it reads ahead of the batches delivered)
        self.submitted = 0  # samples whose reads were started
        self.pending: deque[list[Future]] = deque()  # the reads of the next batches, a list per batch
        self.pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="shard-read") if encoded else None

    def start(self, indices, seeds) -> None:
        """Hand out the samples ``indices`` (with their sample seeds) from the next call on."""
        self._forget_reads()
        self.indices, self.seeds, self.position, self.submitted = indices, seeds, 0, 0
        self._read_ahead()

    def stop(self) -> None:
        """Hand out nothing more this pass."""
        self._forget_reads()
        self.indices, self.seeds = self.indices[:self.position], self.seeds[:self.position]

    def _forget_reads(self) -> None:
        for future in (future for batch in self.pending for future in batch):
            future.cancel()
        self.pending.clear()
        self.submitted = self.position

    def _read_ahead(self) -> None:
        while self.pool is not None and len(self.pending) < self.ahead and self.submitted < len(self.indices):
            batch = self.indices[self.submitted:self.submitted + self.batch_size]
            self.pending.append([self.pool.submit(self.samples.read, int(index)) for index in batch])
            self.submitted += len(batch)

    @staticmethod
    def _bytes(read: Future):
        """A read's bytes as DALI takes them; none where it failed, which DALI then refuses to decode, and the
        loader finds the sample and leaves it out."""
        import numpy as np

        try:
            return np.frombuffer(read.result(), dtype=np.uint8)
        except OSError:
            return np.empty(0, dtype=np.uint8)

    def __call__(self):
        import numpy as np

        if self.position >= len(self.indices):
            raise StopIteration
        start, end = self.position, self.position + self.batch_size
        batch = [int(index) for index in self.indices[start:end]]
        if self.encoded:
            data = [self._bytes(read) for read in self.pending.popleft()]
        else:  # fn.io.file.read takes a path as its bytes; fsencode keeps names that are not UTF-8 intact.
            data = [np.frombuffer(os.fsencode(self.samples.path(index)), dtype=np.uint8) for index in batch]
        labels = [np.array([self.samples.label(index)], dtype=np.int32) for index in batch]
        self.position += len(batch)
        self._read_ahead()
        if not self.random_slots:
            return data, labels
        return data, labels, list(random_states(self.seeds[start:end], self.random_slots))
