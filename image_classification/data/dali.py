"""The ``dali-cpu`` and ``dali-gpu`` backends: NVIDIA DALI decodes, crops and normalises the images.

This module and its pipeline's (:mod:`.dali_pipeline`) are the only ones that import DALI, and they do so
lazily, so the package works without it.  Each split's pipeline is built once per run (its decoders' buffers are large and slow to allocate), the
training one once per crop size under ``--progressive-resize`` (a schedule's sizes never come back), and
fed through an external source: every pass hands it this rank's samples in that epoch's order.  From a
folder it hands their paths and DALI's own threads read the files (``fn.io.file.read``); from the shards of
a packed set it hands their bytes, read ahead by the feed's thread pool (``os.pread`` on the open shards).
Either way the reads run in parallel and off Python's main thread, which only slices arrays.  The order
and the sharding come from the shared :class:`ShardSampler`, so both backends see the same images in the
same order for a given seed, from a folder or from its shards.  Training drops the last partial
batch; validation keeps it, and every validation image is read by exactly one rank.  A file DALI cannot
read (a dangling link) or decode is reported once and left out, as the pytorch backend does (the pipeline
is rebuilt then: DALI's state after an error is not reusable); so is an image past the size rule of
``models.image_size.MAX_IMAGE_PIXELS`` (in validation, for its resize as well), which the pipeline finds from its header
and never decodes.

The training pipeline's random operators (the crop, the flip, ``--augmentation``) do not draw from their own
generators, whose state depends on how many samples the pipeline has made since it was built: with every
batch the feed hands them random states computed from each sample's seed (the sampler's, a pure function of
the run's seed, the epoch and the position in it), so a resumed run, from an epoch boundary or mid-epoch,
draws exactly what an uninterrupted one does.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Callable, Iterator

import torch

from ..errors import UserError
from ..models.image_size import ImageTooLarge
from ..models.preprocessing import val_resize_size
from ..system.runtime import Runtime
from .common import DataConfig, ShardSampler, Unreadable, train_sampler
from .dali_feed import RANDOM_SLOTS, Feed
from .dali_pipeline import DALI_AUGMENTATIONS, PipelineSpec, build_pipeline
from .files import size_problem
from .layout import Split, open_split
from .packed import PackedSplit

# Words in DALI's error when a file could not be read (a dangling link), its header parsed or its data
# decoded: those are skipped.
_FILE_ERRORS = ("io.file.read", "decoders.", "Decod", "peek_image_shape")


def _import_dali():
    try:
        import nvidia.dali  # noqa: F401
        import nvidia.dali.plugin.pytorch  # noqa: F401
    except ImportError as error:
        raise UserError(
            f"the DALI data backends need NVIDIA DALI ({error}); install it with "
            "`pip install nvidia-dali-cuda130==2.4.0` or use --data-backend pytorch"
        ) from None
    from nvidia.dali import backend

    schema = backend.GetSchema("decoders__ImageRandomCrop")
    if not getattr(schema, "HasRandomStateArg", lambda: False)():  # DALI 2: random states as inputs
        raise UserError(
            f"the DALI data backends need NVIDIA DALI 2 (found {nvidia.dali.__version__}), whose random "
            "operators take their state from the pipeline's inputs, for exact resumes; install it with "
            "`pip install nvidia-dali-cuda130==2.4.0` or use --data-backend pytorch"
        )


class DaliLoader:
    """A :class:`Loader` over one split, with one pipeline that every pass feeds this rank's samples for
    that epoch.

    ``set_epoch(epoch, start_batch)`` can skip the first batches of an epoch without decoding them: a
    mid-epoch resume sees exactly the images it had left, in the crops it would have seen.
    """

    def __init__(self, samples: Split, spec: PipelineSpec, runtime: Runtime, seed: int,
                 sampler: ShardSampler | None = None, size_at: Callable[[int], int] | None = None):
        """``size_at``: the crop side of each epoch (training under ``--progressive-resize``), which
        ``set_epoch`` puts in the spec; a pass at a new size builds the pipeline for it."""
        self.samples, self.spec, self.runtime, self.seed = samples, spec, runtime, seed
        self.size_at = size_at
        self.sampler = sampler or ShardSampler(len(samples), runtime.rank, runtime.world_size, shuffle=spec.train,
                                               seed=seed)
        share = len(self.sampler)
        self.num_samples = share - share % spec.batch_size if spec.train else share
        self.epoch = 0
        self.unreadable = Unreadable()  # images DALI could not read or decode, left out of every later pass
        self.broken: set[int] = set()  # their sample indices
        self.feed = Feed(spec.batch_size, RANDOM_SLOTS if spec.train else 0, samples, encoded=spec.encoded,
                         threads=spec.num_threads)
        # validation resizes each image whole to this short side, under the size rule too
        self.resize = None if spec.train else val_resize_size(spec.image_size, spec.crop_ratio)
        self.builds = 0  # pipelines built so far: one per run (per crop size), plus one after each unreadable image
        self._batches = None  # the DALI iterator over the pipeline, once built
        self._built_size: int | None = None  # the crop size of the pipeline behind _batches
        self._in_pass = False  # a pass was started and not read to its end

    def __len__(self) -> int:
        return -(-self.num_samples // self.spec.batch_size)

    @property
    def skipped(self) -> int:
        """How many unreadable images have been left out so far."""
        return len(self.unreadable)

    def set_epoch(self, epoch: int, start_batch: int = 0) -> None:
        self.epoch = epoch
        self.sampler.set_epoch(epoch, start=start_batch * self.spec.batch_size)
        if self.size_at is not None:
            self.spec = replace(self.spec, image_size=self.size_at(epoch))

    def fingerprint(self) -> dict:
        return self.samples.fingerprint()

    def pass_counts(self) -> dict[str, int]:
        return {}

    def _leave_out(self, index: int, reason: str) -> None:
        self.broken.add(index)
        self.unreadable.add(self.samples.name(index), reason)

    def _size_problem(self, index: int) -> str | None:
        """How sample ``index``, which the pipeline found past the size rule, breaks it (from its header, the
        same words as the pytorch backend's); None when its bytes cannot be read again."""
        try:
            return size_problem(self.samples.read(index), self.resize)
        except OSError:
            return None

    def _pass_order(self):
        """This rank's samples for the current pass, in order, with their sample seeds (two int64 arrays);
        training keeps only whole batches.  The samples known to be unreadable are left out."""
        import numpy as np

        indices, seeds = self.sampler.pass_order()
        keep = max(0, self.num_samples - self.sampler.start)
        indices, seeds = indices[:keep], seeds[:keep]
        known = self.samples.known_unreadable
        if known:  # those of this pass, found in one sorted intersection rather than a scan of the pass for each
            for index in np.intersect1d(np.fromiter(known, dtype=np.int64, count=len(known)), indices).tolist():
                if index not in self.broken:
                    self._leave_out(index, f"OSError: unreadable when it was packed: {known[index]}")
        if self.broken:
            usable = ~np.isin(indices, np.fromiter(self.broken, dtype=np.int64))
            indices, seeds = indices[usable], seeds[usable]
        return indices, seeds

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """The pass's batches.  An image DALI cannot read or decode is found, reported once and left out, and
        the pass goes on from the batch it stopped at, as the pytorch backend skips what PIL cannot read."""
        import numpy as np

        indices, seeds = self._pass_order()
        done = 0  # samples already delivered in batches
        while done < len(indices):
            try:
                for images, targets, fits in self._run(indices[done:], seeds[done:]):
                    fed, done = indices[done:done + len(targets)], done + len(targets)
                    if not all_fit(fits):  # images past the size rule: blanks, left out here
                        for index in (index for index, fit in zip(fed.tolist(), fits.tolist()) if not fit):
                            self._leave_out(index, self._size_problem(index)
                                            or f"{ImageTooLarge.__name__}: {ImageTooLarge()}")
                        keep = fits.to(images.device)
                        images = images[keep].contiguous(memory_format=self.runtime.memory_format)
                        targets = targets[keep.to(targets.device)]
                    if len(targets):
                        yield images, targets
                return
            except RuntimeError as error:
                self._batches = None  # DALI's state after an error is not reusable: build it again
                self._in_pass = False
                if not any(sign in str(error) for sign in _FILE_ERRORS):
                    raise
                # The error surfaces up to a prefetch queue later than the batch that failed.
                window = indices[done:done + 4 * self.spec.batch_size].tolist()
                problems = {index: self.samples.problem(index) for index in window}
                broken = {index: problem for index, problem in problems.items() if problem is not None}
                if not broken:
                    raise UserError(_undecodable_message([self.samples.name(index) for index in window])) from None
                for index, problem in broken.items():
                    self._leave_out(index, problem)
                rest = ~np.isin(indices[done:], np.fromiter(broken, dtype=np.int64))
                indices = np.concatenate([indices[:done], indices[done:][rest]])
                seeds = np.concatenate([seeds[:done], seeds[done:][rest]])

    def _run(self, indices, seeds) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """The batches of ``indices``, in order, from the split's pipeline (built on first use), each with the
        flags of the images that kept to the size rule."""
        if self._in_pass:  # the last pass was left part-way (--prof, an early stop): empty the queue
            self.feed.stop()
            for _ in self._batches:
                pass
            self._in_pass = False
        if self._batches is not None and self._built_size != self.spec.image_size:
            self._batches = None  # the pipeline of the last size is not needed again: its sizes never come back
        self.feed.start(indices, seeds)
        if self._batches is None:
            self._batches = self._build()  # reads the first batches at once: decoding errors can start here
        else:
            self._batches.reset()
        self._in_pass = True
        memory_format = self.runtime.memory_format
        for (batch,) in self._batches:
            images, targets = batch["images"], batch["labels"]
            if self.spec.channels_last:
                images = images.permute(0, 3, 1, 2)  # NHWC storage seen as NCHW: channels_last strides
            yield images.contiguous(memory_format=memory_format), targets.view(-1).long(), batch["fits"].view(-1)
        self._in_pass = False

    def _build(self):
        from nvidia.dali.plugin.pytorch import DALIGenericIterator

        # Every random operator draws from the fed states; DALI's own seed (31 bits) is fixed all the same.
        pipeline = build_pipeline(self.spec, self.feed, self.seed % (2**31 - 1))
        self.builds += 1
        self._built_size = self.spec.image_size
        # No reader to ask for the pass's length: the iterator runs until the feed raises StopIteration.
        return DALIGenericIterator(pipeline, ["images", "labels", "fits"])


def all_fit(fits: torch.Tensor) -> bool:
    """Whether every image of a batch kept to the size rule.  ``fits``, the pipeline's flags from the images'
    headers, is a CPU output on every DALI backend (only images and labels go to the GPU): reading it waits for
    the pipeline's batch, never for the GPU."""
    return bool(fits.all())


def _undecodable_message(candidates: list[str]) -> str:
    """DALI failed on an image PIL reads: say where, and the way around it."""
    where = candidates[0] if candidates else "the dataset"
    return (f"DALI could not decode an image among the batches from {where} on; check the dataset or use "
            "--data-backend pytorch, which skips unreadable images")


def check_dali_request(backend: str, is_cuda: bool, augmentation: str | None, *, training: bool) -> None:
    """What refuses ``backend`` (``dali-cpu`` or ``dali-gpu``) here before anything is built: an
    ``--augmentation`` DALI lacks (``training``: for a training loader), no CUDA for ``dali-gpu``, no DALI 2."""
    if training and augmentation is not None and augmentation not in DALI_AUGMENTATIONS:
        raise UserError(f"--augmentation {augmentation} is not supported with DALI (it has "
                        f"{', '.join(DALI_AUGMENTATIONS)}); use --data-backend pytorch")
    if backend == "dali-gpu" and not is_cuda:
        raise UserError("--data-backend dali-gpu needs a CUDA GPU; use --data-backend dali-cpu on this machine")
    _import_dali()


def dali_loaders(
    config: DataConfig, runtime: Runtime, classes: list[str], *, want_train: bool, want_val: bool,
) -> tuple[DaliLoader | None, DaliLoader | None]:
    """Train and val loaders for ``--data-backend dali-cpu`` or ``dali-gpu``."""
    backend = config.backend
    check_dali_request(backend, runtime.is_cuda, config.augmentation, training=want_train)

    device_id = None
    if runtime.is_cuda:
        device_id = runtime.device.index if runtime.device.index is not None else torch.cuda.current_device()
    spec = dict(
        image_size=config.preprocessing.image_size, interpolation=config.preprocessing.interpolation, crop_scale=tuple(config.crop_scale),
        hflip=config.hflip, batch_size=config.batch_size, num_threads=max(1, config.workers), device_id=device_id,
        gpu_decode=backend == "dali-gpu", channels_last=runtime.memory_format == torch.channels_last,
        crop_ratio=config.preprocessing.crop_ratio, mean=tuple(config.preprocessing.mean), std=tuple(config.preprocessing.std),
        augmentation=config.augmentation, randaugment_magnitude=config.randaugment[0],
        randaugment_num_ops=config.randaugment[1], exif_orientation=config.preprocessing.exif_orientation,
    )
    root = Path(config.data)
    train = val = None
    if want_train:
        samples = open_split(root, "train", classes, batch_size=config.batch_size, world_size=runtime.world_size)
        train_spec = PipelineSpec(train=True, encoded=isinstance(samples, PackedSplit),
                                  **{**spec, "image_size": config.preprocessing.train_size})
        train = DaliLoader(samples, train_spec, runtime, config.seed,
                           sampler=train_sampler(len(samples), config, runtime),
                           size_at=config.preprocessing.train_size_at if config.preprocessing.train_schedule is not None else None)
    if want_val:
        samples = open_split(root, "val", classes)
        val = DaliLoader(samples, PipelineSpec(train=False, encoded=isinstance(samples, PackedSplit), **spec),
                         runtime, config.seed)
    return train, val
