"""The ``dali-cpu`` and ``dali-gpu`` backends: NVIDIA DALI decodes, crops and normalises the images.

This module is the only one that imports DALI, and it does so lazily, so the package works without it.
Each pass over a split builds a fresh pipeline whose file reader gets this rank's files already in
that epoch's order.  The order and the sharding come from the pytorch backend's :class:`ShardSampler`,
so both backends see the same images in the same order for a given seed; DALI's own reader never
shuffles.  Training drops the last partial batch; validation keeps it, and every validation image is
read by exactly one rank.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import torch

from ..errors import UserError
from ..runtime import Runtime
from .common import MEAN_255, STD_255, val_resize_size
from .folder import ShardSampler, list_samples, train_samples

_READER = "reader"
_INTERPOLATION = {"bilinear": "INTERP_LINEAR", "bicubic": "INTERP_CUBIC", "triangular": "INTERP_TRIANGULAR"}
# nvJPEG scratch memory reserved up front, as in the reference recipes, so it does not regrow per batch.
_GPU_DECODER_PADDING = {"device_memory_padding": 211_025_920, "host_memory_padding": 140_544_512}


def _import_dali():
    try:
        import nvidia.dali  # noqa: F401
        import nvidia.dali.plugin.pytorch  # noqa: F401
    except ImportError as error:
        raise UserError(
            f"the DALI data backends need NVIDIA DALI ({error}); install it with "
            "`pip install nvidia-dali-cuda120==2.4.0` or use --data-backend pytorch"
        ) from None


@dataclass(frozen=True)
class PipelineSpec:
    """Everything a pass's pipeline is built from, apart from its file list and seed."""

    train: bool
    image_size: int
    interpolation: str
    crop_scale: tuple[float, float]
    hflip: float
    batch_size: int
    num_threads: int
    device_id: int | None  # None: no GPU at all, every operator on the CPU
    gpu_decode: bool  # dali-gpu: nvJPEG ("mixed") decode and GPU resize
    channels_last: bool


def build_pipeline(spec: PipelineSpec, files: list[str], labels: list[int], seed: int):
    """A DALI pipeline yielding ("images", "labels") for ``files`` read in the given order."""
    from nvidia.dali import fn, pipeline_def, types

    decode_device = "mixed" if spec.gpu_decode else "cpu"
    resize_device = "gpu" if spec.gpu_decode else "cpu"
    decoder_options = _GPU_DECODER_PADDING if spec.gpu_decode else {}
    interp = getattr(types, _INTERPOLATION[spec.interpolation])
    size = spec.image_size

    @pipeline_def(
        batch_size=spec.batch_size, num_threads=spec.num_threads, device_id=spec.device_id, seed=seed
    )
    def pipeline():
        encoded, labels_ = fn.readers.file(
            files=files, labels=labels, random_shuffle=False, pad_last_batch=True, name=_READER
        )
        if spec.train:
            # Decoding only the random crop window is what makes CPU decoding fast.
            images = fn.decoders.image_random_crop(
                encoded, device=decode_device, output_type=types.RGB,
                random_area=list(spec.crop_scale), random_aspect_ratio=[3 / 4, 4 / 3], num_attempts=100,
                **decoder_options,
            )
            images = fn.resize(
                images, device=resize_device, size=[size, size], interp_type=interp, antialias=False
            )
        else:
            images = fn.decoders.image(encoded, device=decode_device, output_type=types.RGB, **decoder_options)
            images = fn.resize(
                images, device=resize_device, resize_shorter=val_resize_size(size), interp_type=interp,
                antialias=False,
            )
        if spec.device_id is not None:
            # With a GPU, the normalised float batch is made there: only uint8 crops cross the bus.
            images, labels_ = images.gpu(), labels_.gpu()
        mirror = fn.random.coin_flip(probability=spec.hflip) if spec.train and spec.hflip > 0 else 0
        images = fn.crop_mirror_normalize(
            images, dtype=types.FLOAT, crop=(size, size), mean=list(MEAN_255), std=list(STD_255),
            mirror=mirror, output_layout="HWC" if spec.channels_last else "CHW",
        )
        return images, labels_

    return pipeline()


def pass_seed(seed: int, epoch: int, rank: int) -> int:
    """DALI's seed for one rank's pass over one epoch: the crops and flips differ between epochs and ranks."""
    return (seed * 1_000_003 + epoch * 7_919 + rank * 104_729) % (2**31 - 1)


class DaliLoader:
    """A :class:`Loader` over one split; each pass builds a pipeline over this rank's files for that epoch.

    ``set_epoch(epoch, start_batch)`` can skip the first batches of an epoch without decoding them: a
    mid-epoch resume sees exactly the images it had left, though with fresh crops.
    """

    supports_start_batch = True

    def __init__(self, samples: list[tuple[str, int]], spec: PipelineSpec, runtime: Runtime, seed: int):
        self.samples, self.spec, self.runtime, self.seed = samples, spec, runtime, seed
        self.sampler = ShardSampler(len(samples), runtime.rank, runtime.world_size, shuffle=spec.train, seed=seed)
        share = len(self.sampler)
        self.num_samples = share - share % spec.batch_size if spec.train else share
        self.epoch = 0

    def __len__(self) -> int:
        return -(-self.num_samples // self.spec.batch_size)

    def set_epoch(self, epoch: int, start_batch: int = 0) -> None:
        self.epoch = epoch
        self.sampler.set_epoch(epoch, start=start_batch * self.spec.batch_size)

    def _pass_files(self) -> tuple[list[str], list[int]]:
        """This rank's files for the current pass, in order; training keeps only whole batches."""
        order = [index for index, _ in self.sampler]
        order = order[: max(0, self.num_samples - self.sampler.start)]
        return [self.samples[i][0] for i in order], [self.samples[i][1] for i in order]

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy

        files, labels = self._pass_files()
        if not files:
            return
        pipeline = build_pipeline(self.spec, files, labels, pass_seed(self.seed, self.epoch, self.runtime.rank))
        memory_format = self.runtime.memory_format
        done = 0
        try:
            # The iterator runs the pipeline as soon as it is made, so decoding errors can start here.
            batches = DALIGenericIterator(
                pipeline, ["images", "labels"], reader_name=_READER, last_batch_policy=LastBatchPolicy.PARTIAL
            )
            for (batch,) in batches:
                images, targets = batch["images"], batch["labels"]
                if self.spec.channels_last:
                    images = images.permute(0, 3, 1, 2)  # NHWC storage seen as NCHW: channels_last strides
                done += 1
                yield images.contiguous(memory_format=memory_format), targets.view(-1).long()
        except RuntimeError as error:
            if "decoders." not in str(error):
                raise
            start = done * self.spec.batch_size
            # The error surfaces up to a prefetch queue later than the batch that failed.
            raise UserError(_undecodable_message(files[start:start + 4 * self.spec.batch_size])) from None


def _undecodable_message(candidates: list[str]) -> str:
    """Name the first file PIL cannot read either, among those the failing batch may hold."""
    from PIL import Image

    for path in candidates:
        try:
            with Image.open(path) as image:
                image.load()
        except Exception:  # any failure marks the culprit; the message is all we need
            return f"DALI could not decode {path}; remove it or use --data-backend pytorch, which skips unreadable images"
    return (
        f"DALI could not decode an image under {Path(candidates[0]).parent.parent if candidates else 'the dataset'}; "
        "check the dataset or use --data-backend pytorch, which skips unreadable images"
    )


def dali_loaders(
    args: argparse.Namespace, runtime: Runtime, image_size: int, classes: list[str], *,
    want_train: bool, want_val: bool,
) -> tuple[DaliLoader | None, DaliLoader | None]:
    """Train and val loaders for ``--data-backend dali-cpu`` or ``dali-gpu``."""
    backend = args.data_backend
    if args.augmentation is not None:
        raise UserError(f"--augmentation {args.augmentation} is not supported with DALI; use --data-backend pytorch")
    if backend == "dali-gpu" and not runtime.is_cuda:
        raise UserError("--data-backend dali-gpu needs a CUDA GPU; use --data-backend dali-cpu on this machine")
    _import_dali()

    device_id = None
    if runtime.is_cuda:
        device_id = runtime.device.index if runtime.device.index is not None else torch.cuda.current_device()
    spec = dict(
        image_size=image_size, interpolation=args.interpolation, crop_scale=tuple(args.crop_scale),
        hflip=args.hflip, batch_size=args.batch_size, num_threads=max(1, args.workers), device_id=device_id,
        gpu_decode=backend == "dali-gpu", channels_last=runtime.memory_format == torch.channels_last,
    )
    root = Path(args.data)
    train = val = None
    if want_train:
        samples = train_samples(root, classes, args.batch_size, runtime.world_size)
        train = DaliLoader(samples, PipelineSpec(train=True, **spec), runtime, args.seed)
    if want_val:
        val = DaliLoader(list_samples(root / "val", classes), PipelineSpec(train=False, **spec), runtime, args.seed)
    return train, val
