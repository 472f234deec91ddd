"""The ``pytorch-gpu`` backend: loader workers only read the images' bytes (:mod:`.encoded`); the training process
decodes each batch with nvJPEG (``torchvision.io.decode_jpeg`` on a list of JPEGs, on the device) and crops,
flips, resizes and normalises it there.

The draws are the ``pytorch`` backend's (:class:`.transforms.TrainTransform`, seeded from the seed, the epoch and
the position), so the crops are its boxes and the pixels differ by the decoder and the resize's rounding alone
(torchvision resizes uint8 images in float32 on a GPU).  Every function here takes the device as a parameter:
on the CPU the same code runs with torchvision's CPU decoder, which is the ``pytorch`` backend's, and gives its
batches bit for bit; main.py itself refuses the backend off CUDA, where the ``pytorch`` backend's workers
decode faster.  A JPEG nvJPEG refuses is decoded on the CPU, as the ``pytorch`` backend decodes it; one
neither decodes is left out and reported as that backend reports it.

A batch is prepared (decoded, cropped, stacked and normalised) in one background thread while the training
loop runs the step before: ``decode_jpeg`` on CUDA returns once the batch is decoded, and the thread is what
keeps the loop launching its kernels meanwhile.  On CUDA the thread queues its work on a side stream, which
the loop's stream waits for on the device: no host synchronisation in the loop (the thread itself waits for
its side stream before each decode: :func:`settle`).  ``--augmentation``'s policies draw from
torch's CPU generator, the training process's, so they run in the loop's thread, each image under the
generator state its worker's draws left.  The decode holds at most :data:`CHUNK_PIXELS` decoded pixels at once
(one image, where a single one is larger), and the thread prepares one batch ahead of the loop.
"""

from __future__ import annotations

import functools
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from PIL import Image

from ..errors import UserError
from ..preprocessing import val_resize_size
from ..runtime import Runtime
from .common import DataConfig, SideStream, WrappingLoader, channel_values, normalized
from .encoded import EncodedBatch, EncodedImages, collate_encoded
from .files import decode_rgb_tensor
from .layout import Split, open_split
from .transforms import Draw, TrainTransform, val_crop
from .workers import HostBatches, host_loader, split_sampler

BACKEND = "pytorch-gpu"
# Decoded pixels held at once: 64 Mpx, 192 MiB as RGB uint8 (a batch of 256 ImageNet photos, about 110,000
# pixels each on average, is one chunk of about 28 Mpx).
CHUNK_PIXELS = 1 << 26
# --augmentation policies that cannot follow each image's seed on a GPU: AugMix draws its mixing weights on
# the image's device, from the device's generator, after copying its parameters there and back.
DEVICE_DRAWN_AUGMENTATIONS = ("augmix",)


@functools.cache
def gpu_decoding_problem(device: torch.device | None = None) -> str | None:
    """Why torchvision cannot decode a batch of JPEGs on ``device`` (the current CUDA device when None), or
    None when it can: found by decoding a tiny JPEG there, once per process."""
    if not torch.cuda.is_available():
        return "no CUDA device"
    from torchvision.io import ImageReadMode, decode_jpeg, encode_jpeg

    device = device or torch.device("cuda", torch.cuda.current_device())
    tiny = encode_jpeg(torch.zeros(3, 8, 8, dtype=torch.uint8))
    try:
        decode_jpeg([tiny], mode=ImageReadMode.RGB, device=device)
    except Exception as error:  # an old torchvision's TypeError, one built without nvJPEG's RuntimeError, ...
        return f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else 'no GPU decoder'}"
    return None


def check_device_decode_request(is_cuda: bool, augmentation: str | None, *, training: bool) -> None:
    """What refuses ``--data-backend pytorch-gpu`` before anything is built: an ``--augmentation`` that cannot
    run on the GPU as each image's seed says, a device other than CUDA, a torchvision without GPU decoding."""
    check_augmentation(augmentation, training=training)
    if not is_cuda:
        raise UserError(f"--data-backend {BACKEND} decodes JPEGs on a CUDA GPU, and this run has none; use "
                        "--data-backend pytorch, whose loader workers decode on the CPU")
    problem = gpu_decoding_problem()
    if problem is not None:
        import torchvision

        raise UserError(f"--data-backend {BACKEND} needs torchvision's GPU JPEG decoder (torchvision 0.19 or later "
                        f"built with nvJPEG), which torchvision {torchvision.__version__} here lacks ({problem}); "
                        "use --data-backend pytorch")


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
    for the stream first closes that.  The loader calls the decoder from its background thread, on its side
    stream: the wait holds that thread alone, never the training loop.  Where a torchvision orders its writes
    itself, the wait only costs what it waits for.  It waits on an event, which CUDA's sync debug mode
    (``torch.cuda.set_sync_debug_mode``, global to the process) leaves alone: the wait is meant, and off the
    loop's thread, where a user hunting the loop's synchronisations would take its warning for one."""
    if device.type == "cuda":
        torch.cuda.current_stream(device).record_event().synchronize()


def decode_jpegs(data: list[torch.Tensor], device: torch.device) -> list[torch.Tensor | None]:
    """Each JPEG of ``data`` decoded to a uint8 CHW RGB tensor on ``device``, in one call where all decode;
    None for each that the decoder refuses (a failure fails the whole call, which is then made image by image)."""
    from torchvision.io import ImageReadMode, decode_jpeg

    settle(device)
    try:
        return decode_jpeg(data, mode=ImageReadMode.RGB, device=device)
    except RuntimeError:
        return [_decode_one(one, device) for one in data]


def _decode_one(data: torch.Tensor, device: torch.device) -> torch.Tensor | None:
    from torchvision.io import ImageReadMode, decode_jpeg

    settle(device)
    try:
        return decode_jpeg([data], mode=ImageReadMode.RGB, device=device)[0]
    except RuntimeError:
        return None


def decoded_on_cpu(data: torch.Tensor, device: torch.device) -> torch.Tensor | str:
    """A JPEG the device's decoder refused, decoded as the ``pytorch`` backend decodes it (libjpeg-turbo, else
    PIL) and moved to ``device``; or why it cannot be, in that backend's words."""
    try:
        return decode_rgb_tensor(data.numpy().tobytes()).to(device)
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


def decoded_images(batch: EncodedBatch, device: torch.device,
                   limit: int = CHUNK_PIXELS) -> Iterator[tuple[int, torch.Tensor | str]]:
    """(position, image) for every image of ``batch`` in order, as a uint8 CHW tensor on ``device``, or the
    reason it cannot be decoded; a run of at most ``limit`` pixels is decoded at a time, and an image is held no
    longer than its run is."""
    jpeg_of = {position: k for k, position in enumerate(batch.encoded)}
    offsets, offset = {}, 0  # where the worker-decoded images start in batch.pixels
    for position, (height, width) in enumerate(batch.sizes):
        if position not in jpeg_of:
            offsets[position], offset = offset, offset + 3 * height * width
    for run in chunks(batch.sizes, limit):
        jpegs = [position for position in run if position in jpeg_of]
        decoded = dict(zip(jpegs, decode_jpegs([batch.jpeg(jpeg_of[p]) for p in jpegs], device))) if jpegs else {}
        for position in run:
            if position in jpeg_of:
                image = decoded.pop(position)
                yield position, image if image is not None else decoded_on_cpu(batch.jpeg(jpeg_of[position]), device)
            else:
                height, width = batch.sizes[position]
                pixels = batch.pixels[offsets[position]:offsets[position] + 3 * height * width]
                yield position, pixels.view(3, height, width).to(device)


def apply_policy(crops: list[torch.Tensor], states: torch.Tensor, policy) -> list[torch.Tensor]:
    """``policy`` (an ``--augmentation``) on each crop, drawing from torch's CPU generator in the state its
    worker's draws left (``states``, a row per crop), as the ``pytorch`` backend's workers apply it; the
    generator is put back afterwards."""
    saved = torch.default_generator.get_state()
    try:
        out = []
        for crop, state in zip(crops, states):
            torch.default_generator.set_state(state.clone())  # a row of its own: set_state misreads a view
            out.append(policy(crop))
        return out
    finally:
        torch.default_generator.set_state(saved)


@dataclass
class Prepared:
    """A batch as the background thread leaves it: its crops (or, without a policy to apply, the finished
    batch), targets, generator states, the images it could not decode as (sample index, reason), and the mark
    of its work on the side stream."""

    crops: list[torch.Tensor]
    targets: torch.Tensor
    states: torch.Tensor | None
    broken: list[tuple[int, str]]
    images: torch.Tensor | None = None
    done: object = None


class DeviceDecodedLoader(WrappingLoader):
    """A :class:`.common.Loader` over one split: host batches of encoded images from the workers, decoded and
    cropped on the runtime's device (``crop``: a decoded image and its draw to a uint8 crop), a batch ahead of
    the loop, in a background thread."""

    AHEAD = 1  # batches prepared beyond the one the loop is given

    def __init__(self, host: HostBatches, samples: Split, runtime: Runtime, config: DataConfig,
                 crop: Callable[[torch.Tensor, Draw | None], torch.Tensor], policy=None, *, num_samples: int):
        super().__init__(host)
        self.samples, self.runtime = samples, runtime
        self.crop, self.policy, self.num_samples = crop, policy, num_samples
        self.mean = channel_values(config.mean, runtime.device)
        self.std = channel_values(config.std, runtime.device)
        self.side = SideStream(runtime.device)
        self._pool: ThreadPoolExecutor | None = None

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="decode")
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
            for position, image in decoded_images(batch, device):
                if isinstance(image, str):
                    broken.append((batch.indices[position], image))
                    continue
                crops.append(self.crop(image, batch.draws[position] if batch.draws else None))
                kept.append(position)
            labels = labels[kept]
            targets = (labels.pin_memory() if device.type == "cuda" else labels).to(device, non_blocking=True)
            states = batch.states[kept] if batch.states is not None else None
            prepared = Prepared(crops, targets, states, broken)
            if self.policy is None and crops:
                prepared.images, prepared.crops = self._finish(crops), []
            prepared.done = self.side.done()
        return prepared

    def _finish(self, crops: list[torch.Tensor]) -> torch.Tensor:
        images = normalized(torch.stack(crops), self.mean, self.std)
        return images.contiguous(memory_format=self.runtime.memory_format)

    def _deliver(self, prepared: Prepared) -> Iterable[tuple[torch.Tensor, torch.Tensor]]:
        """Runs in the loop's thread: reports what could not be decoded, applies the policy, hands the batch over."""
        for index, reason in prepared.broken:
            self.source.unreadable.add(self.samples.name(index), reason)
        if not len(prepared.targets):
            return
        self.side.hand_over([prepared.targets, *prepared.crops,
                             *([prepared.images] if prepared.images is not None else [])], prepared.done)
        images = prepared.images
        if images is None:
            images = self._finish(apply_policy(prepared.crops, prepared.states, self.policy))
        yield images, prepared.targets


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
        train = _loader(samples, EncodedImages(samples, transform), config, runtime, True, transform.crop,
                        transform.augmentation)
    if want_val:
        samples = open_split(root, "val", classes)
        crop = functools.partial(_val_crop, config=config)
        resize = val_resize_size(config.image_size, config.crop_ratio)
        val = _loader(samples, EncodedImages(samples, None, resize), config, runtime, False, crop)
    return train, val


def _val_crop(image: torch.Tensor, _draw: None, config: DataConfig) -> torch.Tensor:
    return val_crop(image, config.image_size, config.interpolation, config.crop_ratio)


def _loader(samples: Split, dataset: EncodedImages, config: DataConfig, runtime: Runtime, train: bool, crop,
            policy=None) -> DeviceDecodedLoader:
    sampler = split_sampler(len(samples), config, runtime, train)
    host = HostBatches(host_loader(dataset, sampler, collate_encoded, config, train=train), sampler)
    return DeviceDecodedLoader(host, samples, runtime, config, crop, policy, num_samples=len(sampler))
