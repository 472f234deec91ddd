"""The ``pytorch-gpu`` backend: loader workers only read the images' bytes (:mod:`.encoded`); the training process
decodes each batch on the device (:func:`.decoders.device_decoder`: nvJPEG, through TorchCodec or
torchvision), turns each image by the EXIF orientation its worker read from its bytes (:mod:`.orientation`;
never by the decoder's own reading of the tag) and crops, flips, augments, resizes and normalises it there.

The draws are the ``pytorch`` backend's (:class:`.transforms.TrainTransform`, seeded from the seed, the epoch and
the position), so the crops are its boxes and the pixels differ by the decoder and the resize's rounding alone
(torchvision resizes uint8 images in float32 on a GPU).  Every function here takes the device as a parameter:
on the CPU the same code runs with the CPU's decoder, which is the ``pytorch`` backend's, and gives its
batches bit for bit; main.py itself refuses the backend off CUDA, where the ``pytorch`` backend's workers
decode faster.  A JPEG the device's decoder refuses, or gives at another size than its header's, is decoded on
the CPU, as the ``pytorch`` backend decodes it, and counted (:class:`DecodeFallbacks`: the first refusal said
once on stderr, the count per pass recorded in the raport as ``{phase}.cpu_decoded``); one neither decodes is
left out and reported as that backend reports it.  The device running out of memory is not a refusal: torch's
CUDA cache, which the decoder's own allocations cannot use, is emptied and the decode retried once, said once;
a second time the error ends the run.

A batch is prepared (decoded, cropped, augmented, stacked and normalised) in one background thread while the
training loop runs the step before: the decode returns once the batch is decoded, and the thread is what keeps
the loop launching its kernels meanwhile.  The thread is on the runtime's device from its start
(:func:`decode_thread`) and queues its work on a side stream, which the loop's stream waits for on the device:
no host synchronisation in the loop (the thread itself waits for its side stream before each decode:
:func:`settle`).  ``--augmentation``'s policies draw nothing here: each image's operations and magnitudes are
drawn in the loader workers, under the image's seed, where the crop and flip left its generator
(:class:`.transforms.PolicyDraws`), and applied in the thread, which touches no generator; the constants
torchvision builds for them on the device (an affine matrix, a blur kernel) are built on the host and copied
without waiting (:class:`NonBlockingConstants`).  The decode holds at most :data:`CHUNK_PIXELS` decoded pixels
at once (one image, where a single one is larger), and the thread prepares one batch ahead of the loop.
"""

from __future__ import annotations

import functools
import re
import sys
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from PIL import Image
from torch.overrides import TorchFunctionMode

from ..errors import UserError
from ..models.preprocessing import val_resize_size
from ..system import machine
from ..system.runtime import Runtime
from .common import DataConfig, SideStream, WrappingLoader, channel_values, normalized
from .decoders import device_decoder, device_problem
from .encoded import EncodedBatch, EncodedImages, collate_encoded
from .files import decode_rgb_tensor
from .layout import Split, open_split
from .orientation import turn_tensor, turned_size
from .transforms import Draw, PolicyDraws, TrainTransform, val_crop
from .workers import HostBatches, host_loader, split_sampler

BACKEND = "pytorch-gpu"
# Decoded pixels held at once: 64 Mpx, 192 MiB as RGB uint8 (a batch of 256 ImageNet photos, about 110,000
# pixels each on average, is one chunk of about 28 Mpx), or a single larger image, up to the size rule's
# 89,478,485 px (models.image_size.MAX_IMAGE_PIXELS: 256 MiB).  The device holds more at its peak, while an image is
# resized: torchvision resizes uint8 images in float32 there (4 bytes a value), so a crop's float32 copy stands
# beside the decoded run, and in validation the whole image's float32 copy and its float32 resized image (which
# keeps to the same rule).  For the largest image the rule admits: 256 MiB decoded and 1 GiB more in training;
# in validation 1 GiB more for a JPEG (65,535 px a side at most, so its resize is small), up to 2 GiB more for
# an image of another format that the resize enlarges to the rule's limit (255 x 348,000 px to 256 x 349,364).
# Measured on the CPU by tests/test_device_decode.py; the batches come on top (docs/data.md).
CHUNK_PIXELS = 1 << 26
# --augmentation policies that cannot follow each image's seed on a GPU: AugMix draws its mixing weights on
# the image's device, from the device's generator, after copying its parameters there and back.
DEVICE_DRAWN_AUGMENTATIONS = ("augmix",)
# How a decoder says the device ran out of memory: torch's allocator ("CUDA out of memory", which torchvision's
# decoder passes on as a plain RuntimeError), CUDA's own ("out of memory"), nvJPEG's allocator failure
# (NVJPEG_STATUS_ALLOCATOR_FAILURE, status 5 in torchvision's "Failed to ...: 5").
OUT_OF_MEMORY = re.compile(r"out of memory|ALLOCATOR_FAILURE|Failed to [^:\n]*: 5\b", re.IGNORECASE)


@functools.cache
def gpu_decoding_problem(device: torch.device | None = None) -> str | None:
    """Why no decoder decodes a batch of JPEGs on ``device`` (the current CUDA device when None) as the CPU does,
    or None when one does: found by decoding small JPEGs there, once per process."""
    if not machine.cuda_available():
        return "no CUDA device"
    return device_problem(device or torch.device("cuda", torch.cuda.current_device()))


def check_device_decode_request(is_cuda: bool, augmentation: str | None, *, training: bool) -> None:
    """What refuses ``--data-backend pytorch-gpu`` before anything is built: an ``--augmentation`` that cannot
    run on the GPU as each image's seed says, a device other than CUDA, no GPU JPEG decoder."""
    check_augmentation(augmentation, training=training)
    if not is_cuda:
        raise UserError(f"--data-backend {BACKEND} decodes JPEGs on a CUDA GPU, and this run has none; use "
                        "--data-backend pytorch, whose loader workers decode on the CPU")
    problem = gpu_decoding_problem()
    if problem is not None:
        import torchvision

        raise UserError(f"--data-backend {BACKEND} needs a GPU JPEG decoder (torchvision 0.19 or later built with "
                        "nvJPEG, or torchcodec 0.16 or later), which this installation lacks (torchvision "
                        f"{torchvision.__version__}; {problem}); use --data-backend pytorch")


def check_augmentation(augmentation: str | None, *, training: bool) -> None:
    if training and augmentation in DEVICE_DRAWN_AUGMENTATIONS:
        raise UserError(f"--augmentation {augmentation} is not supported with --data-backend {BACKEND}: "
                        "torchvision's AugMix draws its mixing weights on the GPU, apart from each image's seed, "
                        "and waits for the GPU on every image; use --data-backend pytorch")


def settle(device: torch.device) -> None:
    """Wait (in the calling thread) for the work queued on ``device``'s current stream; nothing on the CPU.

    torchvision's CUDA decoder (its batched form, since 0.19) allocates its output tensors on the caller's
    current stream, then writes them from a private stream of its own that does not wait for the caller's.  The caching
    allocator hands a block freed on a stream straight to that stream's next allocation, so a block whose last
    readers are still queued (the previous batch's decoded images, read by its crops and resizes) can be given
    to the decoder and overwritten before those kernels run: crops of the wrong pixels, with no error.  Waiting
    for the stream first closes that, for TorchCodec's decoder as well.  The loader calls the decoder from its
    background thread, on its side stream: the wait holds that thread alone, never the training loop.  Where a
    decoder orders its writes itself, the wait only costs what it waits for.  It waits on an event, which CUDA's
    sync debug mode (``torch.cuda.set_sync_debug_mode``, global to the process) leaves alone: the wait is meant,
    and off the loop's thread, where a user hunting the loop's synchronisations would take its warning for one."""
    if device.type == "cuda":
        torch.cuda.current_stream(device).record_event().synchronize()


def out_of_memory(error: BaseException) -> bool:
    return isinstance(error, torch.OutOfMemoryError) or bool(OUT_OF_MEMORY.search(str(error)))


def _first_line(error: BaseException) -> str:
    return f"{type(error).__name__}: {str(error).strip().splitlines()[0] if str(error).strip() else 'no message'}"


class DecodeFallbacks:
    """What the device's decoder did not decode in a loader's passes: ``count``, the JPEGs of the current pass it
    refused (decoded on the CPU instead); the first refusal, and the first time the device ran out of memory,
    each said once on stderr."""

    def __init__(self, phase: str):
        self.phase, self.count = phase, 0
        self._said: set[str] = set()

    def _say_once(self, kind: str, line: str) -> None:
        if kind not in self._said:
            self._said.add(kind)
            print(f"warning: --data-backend {BACKEND} ({self.phase}): {line}", file=sys.stderr, flush=True)

    def refused(self, error: BaseException, images: int) -> None:
        self._say_once("refused", f"the device's JPEG decoder refused a run of {images} JPEGs ({_first_line(error)});"
                       " they are decoded one by one, and each it refuses again on the CPU, as --data-backend "
                       f"pytorch decodes it: counted per epoch as {self.phase}.cpu_decoded in the raport "
                       "(said once)")

    def out_of_memory(self, error: BaseException) -> None:
        self._say_once("memory", f"the device ran out of memory decoding JPEGs ({_first_line(error)}); torch's CUDA "
                       "cache was emptied and the decode retried (said once; a second time ends the run)")


def _decode(data: list[torch.Tensor], device: torch.device, fallbacks: DecodeFallbacks | None) -> list[torch.Tensor]:
    """``data`` decoded on ``device``; out of memory, once more after emptying torch's CUDA cache (the decoder's
    own allocations, nvJPEG's, cannot use the blocks torch keeps)."""
    settle(device)
    try:
        return device_decoder(device).decode_batch(data, device)
    except RuntimeError as error:
        if not out_of_memory(error):
            raise
        if fallbacks is not None:
            fallbacks.out_of_memory(error)
        torch.cuda.empty_cache()
    settle(device)
    return device_decoder(device).decode_batch(data, device)


def decode_jpegs(data: list[torch.Tensor], device: torch.device,
                 fallbacks: DecodeFallbacks | None = None) -> list[torch.Tensor | None]:
    """Each JPEG of ``data`` decoded to a uint8 CHW RGB tensor on ``device``, in one call where all decode;
    None for each that the decoder refuses (a failure fails the whole call, which is then made image by image).
    Running out of memory is not a refusal: it goes through (see :func:`_decode`)."""
    try:
        return _decode(data, device, fallbacks)
    except RuntimeError as error:
        if out_of_memory(error):
            raise
        if fallbacks is not None:
            fallbacks.refused(error, len(data))
        return [_decode_one(one, device, fallbacks) for one in data]


def _decode_one(data: torch.Tensor, device: torch.device, fallbacks: DecodeFallbacks | None) -> torch.Tensor | None:
    try:
        return _decode([data], device, fallbacks)[0]
    except RuntimeError as error:
        if out_of_memory(error):
            raise
        return None


def to_device(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor on ``device``: on CUDA through pinned memory, without waiting for the device."""
    if device.type != "cuda":
        return tensor.to(device)
    return tensor.pin_memory().to(device, non_blocking=True)


def decoded_on_cpu(data: torch.Tensor, device: torch.device, orientation: int = 1) -> torch.Tensor | str:
    """A JPEG the device's decoder refused, decoded as the ``pytorch`` backend decodes it (the CPU's decoder,
    else PIL), turned by ``orientation`` and moved to ``device``; or why it cannot be, in that backend's
    words."""
    try:
        image = decode_rgb_tensor(data.numpy().tobytes(), turn=False)  # turned as the worker read the tag
        return to_device(turn_tensor(image, orientation), device)
    except (OSError, ValueError, Image.DecompressionBombError) as error:
        return f"{error.__class__.__name__}: {error}"


def chunks(sizes: list[tuple[int, int]], limit: int = CHUNK_PIXELS) -> Iterator[list[int]]:
    """The positions of a batch's images in order, in runs of at most ``limit`` pixels (an image larger than
    that alone)."""
    run, pixels = [], 0
    for position, (height, width) in enumerate(sizes):
        if run and pixels + height * width > limit:
            yield run
            run, pixels = [], 0
        run.append(position)
        pixels += height * width
    if run:
        yield run


def decoded_images(batch: EncodedBatch, device: torch.device, fallbacks: DecodeFallbacks | None = None,
                   limit: int = CHUNK_PIXELS) -> Iterator[tuple[int, torch.Tensor | str]]:
    """(position, image) for every image of ``batch`` in order, as a uint8 CHW tensor on ``device``, turned by
    its EXIF orientation where the worker read one, or the reason it cannot be decoded; a run of at most
    ``limit`` pixels is decoded at a time, and an image is held no longer than its run is.  Each JPEG the
    device's decoder refuses is counted in ``fallbacks``."""
    jpeg_of = {position: k for k, position in enumerate(batch.encoded)}
    orientations = batch.orientations or [1] * len(batch.encoded)
    offsets, offset = {}, 0  # where the worker-decoded images start in batch.pixels
    for position, (height, width) in enumerate(batch.sizes):
        if position not in jpeg_of:
            offsets[position], offset = offset, offset + 3 * height * width
    for run in chunks(batch.sizes, limit):
        jpegs = [position for position in run if position in jpeg_of]
        decoded = dict(zip(jpegs, decode_jpegs([batch.jpeg(jpeg_of[p]) for p in jpegs], device, fallbacks))) \
            if jpegs else {}
        for position in run:
            if position not in jpeg_of:
                height, width = batch.sizes[position]
                pixels = batch.pixels[offsets[position]:offsets[position] + 3 * height * width]
                yield position, to_device(pixels.view(3, height, width), device)
                continue
            image, k = decoded.pop(position), jpeg_of[position]
            height, width = batch.sizes[position]
            if image is not None and tuple(image.shape[-2:]) != turned_size(width, height, orientations[k])[::-1]:
                image = None  # not at its header's size (turned by the decoder's own reading of a tag): refused
            if image is None:
                if fallbacks is not None:
                    fallbacks.count += 1
                yield position, decoded_on_cpu(batch.jpeg(k), device, orientations[k])
                continue
            yield position, turn_tensor(image, orientations[k])


_CONSTANT_BUILDERS = (torch.tensor, torch.as_tensor)


class NonBlockingConstants(TorchFunctionMode):
    """While active (in the calling thread alone), a tensor built from Python values for a device
    (``torch.tensor(values, device=...)``: torchvision's affine and rotation matrices, its sharpness kernel) is
    built on the host and copied there without waiting: through pinned memory on CUDA, where the direct build
    is a blocking copy that waits for everything queued on the stream.  The values are the same."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        device = kwargs.get("device")
        if func in _CONSTANT_BUILDERS and device is not None and args and not isinstance(args[0], torch.Tensor):
            device = torch.device(device)
            if device.type != "cpu":
                return to_device(func(*args, **{**kwargs, "device": "cpu"}), device)
        return func(*args, **kwargs)


def decode_thread(device: torch.device) -> ThreadPoolExecutor:
    """The loader's background thread, on ``device`` from its start.  A new thread's current CUDA device is 0, and
    leaving a stream's context makes the device it found current again: on any other device, a context on GPU 0
    (about 0.5 GiB there) for every process of a job."""
    on_device = device.type == "cuda"
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="decode",
                              initializer=torch.cuda.set_device if on_device else None,
                              initargs=(device,) if on_device else ())


@dataclass
class Prepared:
    """A batch as the background thread leaves it: its images (None when none could be decoded), targets, the
    images it could not decode as (sample index, reason), and the mark of its work on the side stream."""

    images: torch.Tensor | None
    targets: torch.Tensor
    broken: list[tuple[int, str]]
    done: object = None


class DeviceDecodedLoader(WrappingLoader):
    """A :class:`.common.Loader` over one split: host batches of encoded images from the workers, decoded and
    cropped on the runtime's device (``crop``: a decoded image and its draw to a uint8 crop), augmented
    (``policy``: the operations the workers drew), a batch ahead of the loop, in a background thread.
    ``phase`` (train, val) names it in messages."""

    AHEAD = 1  # batches prepared beyond the one the loop is given

    def __init__(self, host: HostBatches, samples: Split, runtime: Runtime, config: DataConfig,
                 crop: Callable[[torch.Tensor, Draw | None], torch.Tensor], policy: PolicyDraws | None = None, *,
                 num_samples: int, phase: str = "train"):
        super().__init__(host)
        self.samples, self.runtime = samples, runtime
        self.crop, self.policy, self.num_samples = crop, policy, num_samples
        self.mean = channel_values(config.preprocessing.mean, runtime.device)
        self.std = channel_values(config.preprocessing.std, runtime.device)
        self.side = SideStream(runtime.device)
        self.fallbacks = DecodeFallbacks(phase)
        device_decoder(runtime.device)  # chosen now: its probes read pixels back, which a pass never does
        self._pool: ThreadPoolExecutor | None = None

    def pass_counts(self) -> dict[str, int]:
        return {"cpu_decoded": self.fallbacks.count}

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        if self._pool is None:
            self._pool = decode_thread(self.runtime.device)
        self.fallbacks.count = 0
        pending: deque[Future] = deque()
        try:
            for batch, labels in self.source:
                pending.append(self._pool.submit(self._prepare, batch, labels))
                if len(pending) > self.AHEAD:
                    yield from self._deliver(pending.popleft().result())
            while pending:
                yield from self._deliver(pending.popleft().result())
        finally:  # a pass left part-way: what was not started is not prepared
            for future in pending:
                future.cancel()

    def _prepare(self, batch: EncodedBatch, labels: torch.Tensor) -> Prepared:
        """Runs in the background thread, on the side stream."""
        device = self.runtime.device
        with self.side:
            crops, kept, broken = [], [], []
            for position, image in decoded_images(batch, device, self.fallbacks):
                if isinstance(image, str):
                    broken.append((batch.indices[position], image))
                    continue
                crop = self.crop(image, batch.draws[position] if batch.draws else None)
                if self.policy is not None:
                    with NonBlockingConstants():
                        crop = self.policy.apply(crop, batch.augmentations[position])
                crops.append(crop)
                kept.append(position)
            targets = to_device(labels[kept], device)
            images = self._finish(crops) if crops else None
            return Prepared(images, targets, broken, self.side.done())

    def _finish(self, crops: list[torch.Tensor]) -> torch.Tensor:
        images = normalized(torch.stack(crops), self.mean, self.std)
        return images.contiguous(memory_format=self.runtime.memory_format)

    def _deliver(self, prepared: Prepared) -> Iterable[tuple[torch.Tensor, torch.Tensor]]:
        """Runs in the loop's thread: reports what could not be decoded, hands the batch over."""
        for index, reason in prepared.broken:
            self.source.unreadable.add(self.samples.name(index), reason)
        if prepared.images is None:
            return
        self.side.hand_over([prepared.targets, prepared.images], prepared.done)
        yield prepared.images, prepared.targets


def device_decode_loaders(
    config: DataConfig, runtime: Runtime, classes: list[str], *, want_train: bool, want_val: bool,
) -> tuple[DeviceDecodedLoader | None, DeviceDecodedLoader | None]:
    """Train and val loaders for ``--data-backend pytorch-gpu``, on ``runtime``'s device, whichever it is."""
    check_augmentation(config.augmentation, training=want_train)
    root = Path(config.data)
    train = val = None
    if want_train:
        samples = open_split(root, "train", classes, batch_size=config.batch_size, world_size=runtime.world_size)
        transform = TrainTransform(config)
        policy = PolicyDraws(transform.augmentation) if transform.augmentation is not None else None
        dataset = EncodedImages(samples, transform, policy=policy, turn=config.preprocessing.exif_orientation)
        train = _loader(samples, dataset, config, runtime, True, transform.crop, policy)
    if want_val:
        samples = open_split(root, "val", classes)
        crop = functools.partial(_val_crop, config=config)
        resize = val_resize_size(config.preprocessing.image_size, config.preprocessing.crop_ratio)
        dataset = EncodedImages(samples, None, resize, turn=config.preprocessing.exif_orientation)
        val = _loader(samples, dataset, config, runtime, False, crop)
    return train, val


def _val_crop(image: torch.Tensor, _draw: None, config: DataConfig) -> torch.Tensor:
    return val_crop(image, config.preprocessing.image_size, config.preprocessing.interpolation, config.preprocessing.crop_ratio)


def _loader(samples: Split, dataset: EncodedImages, config: DataConfig, runtime: Runtime, train: bool, crop,
            policy=None) -> DeviceDecodedLoader:
    sampler = split_sampler(len(samples), config, runtime, train)
    host = HostBatches(host_loader(dataset, sampler, collate_encoded, config, train=train), sampler)
    return DeviceDecodedLoader(host, samples, runtime, config, crop, policy, num_samples=len(sampler),
                               phase="train" if train else "val")
