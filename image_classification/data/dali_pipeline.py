"""The DALI pipeline of the ``dali-cpu`` and ``dali-gpu`` backends (:mod:`.dali`): what it is built from
(:class:`PipelineSpec`) and its graph, one stage per function.

The feed (:mod:`.dali_feed`) hands it each batch's paths or bytes, labels and, for training, random states: the
pipeline reads the files (from a folder), finds each image's size in its header and applies the size rule (an
image past it is not decoded and comes out as a blank flagged unfit, which the loader drops), then decodes the
random crop window and resizes it (training, with ``--augmentation`` by DALI's ``auto_aug``) or decodes the window
that validation's centre crop keeps and resizes it to the pixels torchvision's ``Resize`` and ``CenterCrop`` of
the whole image give (validation), and flips and normalises.  Every random operator
takes its state from the feed, never from DALI's own generators.  The header's size and both windows are the
image's once turned by its EXIF orientation (``adjust_orientation``, said explicitly, as every backend turns:
:mod:`.orientation`), or as stored for weights recorded before (``exif_orientation`` False).  Only this module
and :mod:`.dali` import DALI, lazily.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

from ..models.image_size import MAX_IMAGE_PIXELS
from ..models.preprocessing import CROP_RATIO, val_resize_size
from .common import MEAN_255, STD_255
from .dali_feed import RANDOM_SLOTS, Feed

_INTERPOLATION = {"bilinear": "INTERP_LINEAR", "bicubic": "INTERP_CUBIC", "triangular": "INTERP_TRIANGULAR"}
# --augmentation on DALI: its auto_aug module has these policies (AugMix it has not).
DALI_AUGMENTATIONS = ("autoaugment", "randaugment", "trivialaugment")
# nvJPEG scratch memory reserved up front, as in the reference recipes, so it does not regrow per batch.
_GPU_DECODER_PADDING = {"device_memory_padding": 211_025_920, "host_memory_padding": 140_544_512}
# DALI's random operators that auto_aug calls; while a policy is built each takes the next state.
_RANDOM_OPERATORS = ("uniform", "coin_flip", "normal", "choice", "beta")
# Operators that left ``fn.experimental`` (DALI 1.40 on), which auto_aug still calls by their deprecated names.
_OUT_OF_EXPERIMENTAL = ("equalize", "filter")
# Validation decodes the centre crop's window with this many times the resize's scale on each side: the reach of
# the widest filter it resizes with (cubic: 2 source pixels per output pixel's width).
_WINDOW_MARGIN = 2


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
    encoded: bool = False  # the feed hands the images' bytes (shards), not their paths (a folder)
    crop_ratio: float = CROP_RATIO  # validation: the short side is image_size / crop_ratio
    augmentation: str | None = None  # training: one of DALI_AUGMENTATIONS
    randaugment_magnitude: int = 9
    randaugment_num_ops: int = 2
    mean: tuple[float, float, float] = MEAN_255  # on the 0-255 scale
    std: tuple[float, float, float] = STD_255
    exif_orientation: bool = True  # each image turned by its EXIF orientation tag (False: as stored)

    @property
    def decoder(self) -> dict:
        """The decoders' device and options."""
        where = {"device": "mixed", **_GPU_DECODER_PADDING} if self.gpu_decode else {"device": "cpu"}
        return {**where, "adjust_orientation": self.exif_orientation}

    @property
    def resize_device(self) -> str:
        return "gpu" if self.gpu_decode else "cpu"


class _RandomStates:
    """Hands each random operator of a pipeline, as it is defined, its own slot of the fed states."""

    def __init__(self, states):
        self.states, self.used = states, 0

    def __call__(self):
        if self.used == RANDOM_SLOTS:
            raise RuntimeError(f"more than {RANDOM_SLOTS} random operators in a pipeline: raise RANDOM_SLOTS")
        self.used += 1
        return self.states[self.used - 1]


@contextmanager
def _drawing_from(states: _RandomStates):
    """While DALI's auto_aug defines a policy, each ``fn.random`` operator it calls takes its state from
    ``states`` (auto_aug makes its own calls, with no way to pass one)."""
    from nvidia.dali.fn import random as dali_random

    originals = {name: getattr(dali_random, name) for name in _RANDOM_OPERATORS if hasattr(dali_random, name)}

    def drawing(operator):
        return lambda *args, **kwargs: operator(*args, **kwargs, _random_state=states())

    try:
        for name, operator in originals.items():
            setattr(dali_random, name, drawing(operator))
        yield
    finally:
        for name, operator in originals.items():
            setattr(dali_random, name, operator)


@contextmanager
def _current_operator_names():
    """While DALI's auto_aug defines a policy, its calls of ``fn.experimental.equalize`` and ``.filter`` reach
    the same operators under their current names, which DALI does not warn about (it deprecates the old ones
    and shows that warning whatever the warning filters say).  A DALI that lacks a current name keeps the old."""
    from nvidia.dali import fn

    originals = {name: getattr(fn.experimental, name) for name in _OUT_OF_EXPERIMENTAL
                 if hasattr(fn, name) and hasattr(fn.experimental, name)}
    try:
        for name in originals:
            setattr(fn.experimental, name, getattr(fn, name))
        yield
    finally:
        for name, operator in originals.items():
            setattr(fn.experimental, name, operator)


def build_pipeline(spec: PipelineSpec, feed: Feed, seed: int):
    """A DALI pipeline yielding ("images", "labels", "fits") for the samples ``feed`` hands it, in that order."""
    from nvidia.dali import fn, pipeline_def, types

    @pipeline_def(
        batch_size=spec.batch_size, num_threads=spec.num_threads, device_id=spec.device_id, seed=seed,
        enable_conditionals=True,  # the size rule's branch; auto_aug picks each sample's operations with `if`
    )
    def pipeline():
        encoded, labels, draw = _fed(spec, feed)
        shape = fn.peek_image_shape(encoded, adjust_orientation=spec.exif_orientation)  # the decoded image's
        height, width = fn.cast(shape[0], dtype=types.INT64), fn.cast(shape[1], dtype=types.INT64)
        fits = height * width <= MAX_IMAGE_PIXELS
        if not spec.train:
            fits = fits & _resize_fits(height, width, val_resize_size(spec.image_size, spec.crop_ratio))
        # An image past the size rule is not decoded at all: the branch splits the batch.
        if fits:
            images = _train_crops(encoded, spec, draw) if spec.train else _val_crop(encoded, spec, height, width)
        else:
            images = fn.constant(idata=0, shape=[spec.image_size] * 2 + [3], dtype=types.UINT8, layout="HWC")
            if spec.gpu_decode:
                images = images.gpu()
        if spec.device_id is not None:
            # With a GPU, the normalised float batch is made there: only uint8 crops cross the bus.
            images, labels = images.gpu(), labels.gpu()
        return _normalised(images, spec, draw), labels, fits

    return pipeline()


def _fed(spec: PipelineSpec, feed: Feed):
    """(the encoded images, their labels, the random states' dispenser) from the feed.  From shards the feed hands
    the images' bytes.  From a folder it hands paths, read by the pipeline's thread pool, a file per task: a
    plain read rather than DALI's default mmap, faster for files this small, and a file truncated while mapped
    would be a SIGBUS, not an error to skip.  (A per-sample parallel external source would read in worker
    processes instead, but it wants a stateless callback, each pass's order being state, and its own
    processes, spawned, never forked after CUDA is up, copying every file through shared memory.)"""
    from nvidia.dali import fn, types

    draw = None
    if spec.train:
        fed, labels, states = fn.external_source(source=feed, num_outputs=3, batch=True,
                                                 dtype=[types.UINT8, types.INT32, types.UINT32])
        draw = _RandomStates(states)
    else:
        fed, labels = fn.external_source(source=feed, num_outputs=2, batch=True, dtype=[types.UINT8, types.INT32])
    encoded = fed if spec.encoded else fn.io.file.read(fed, dont_use_mmap=True)
    return encoded, labels, draw


def _train_crops(encoded, spec: PipelineSpec, draw: _RandomStates):
    """The random crop window decoded (what makes CPU decoding fast), resized, then ``--augmentation``."""
    from nvidia.dali import fn, types

    size = spec.image_size
    images = fn.decoders.image_random_crop(
        encoded, output_type=types.RGB, random_area=list(spec.crop_scale), random_aspect_ratio=[3 / 4, 4 / 3],
        num_attempts=100, _random_state=draw(), **spec.decoder,
    )
    images = fn.resize(images, device=spec.resize_device, size=[size, size],
                       interp_type=getattr(types, _INTERPOLATION[spec.interpolation]), antialias=False)
    if spec.augmentation is not None:
        with _drawing_from(draw), _current_operator_names():
            images = _auto_augment(images, spec)
    return images


def _val_crop(encoded, spec: PipelineSpec, height, width):
    """The centre crop of the image resized as torchvision's Resize does (:func:`_val_resized_size`, antialiased
    when it shrinks), made from the window of the image that the crop keeps: only that window is decoded (DALI's
    ROI decoding), with :data:`_WINDOW_MARGIN` times the resize's scale and a pixel more on each side for the
    filter's reach, and the crop's extent in the image's coordinates is resized to the crop's size: the positions
    and filter of the whole image's resize, so the pixels are its pixels (the suite holds them within a grey level).
    """
    from nvidia.dali import fn, types
    from nvidia.dali import math as dmath

    size = spec.image_size
    out_h, out_w = _val_resized_size(height, width, val_resize_size(size, spec.crop_ratio))
    window, roi_start, roi_end = [], [], []
    for side, out in ((height, out_h), (width, out_w)):
        side = fn.cast(side, dtype=types.FLOAT)
        scale = side / fn.cast(out, dtype=types.FLOAT)
        start = fn.cast(_centre(out, size), dtype=types.FLOAT) * scale  # the crop's extent, in the image's pixels
        end = start + size * scale
        margin = dmath.ceil(_WINDOW_MARGIN * dmath.max(scale, 1.0)) + 1
        first, last = dmath.max(dmath.floor(start - margin), 0.0), dmath.min(dmath.ceil(end + margin), side)
        window.append((first, last))  # whole pixels, inside the image: its edge is the whole resize's edge too
        roi_start.append(start - first)
        roi_end.append(end - first)
    (top, bottom), (left, right) = window
    images = fn.decoders.image_slice(encoded, fn.stack(left, top), fn.stack(right - left, bottom - top),
                                     normalized_anchor=False, normalized_shape=False, output_type=types.RGB,
                                     **spec.decoder)  # anchor and shape in (x, y) order, DALI's default axes
    return fn.resize(images, device=spec.resize_device, size=[size, size], roi_start=fn.stack(*roi_start),
                     roi_end=fn.stack(*roi_end), interp_type=getattr(types, _INTERPOLATION[spec.interpolation]),
                     antialias=True)


def _normalised(images, spec: PipelineSpec, draw: _RandomStates | None):
    """The crops (training: flipped at random), normalised to float, in the batch's layout."""
    from nvidia.dali import fn, types

    mirror = 0
    if spec.train and spec.hflip > 0:
        mirror = fn.random.coin_flip(probability=spec.hflip, _random_state=draw())
    return fn.crop_mirror_normalize(
        images, dtype=types.FLOAT, mean=list(spec.mean), std=list(spec.std), mirror=mirror,
        output_layout="HWC" if spec.channels_last else "CHW",
    )


def _val_resized_size(height, width, short: int):
    """(out_h, out_w) of a ``height`` x ``width`` image resized as torchvision's Resize on a PIL image does: the
    short side to ``short``, the long side truncated (not rounded) to keep the aspect."""
    from nvidia.dali import fn, types

    portrait = fn.cast(height > width, dtype=types.INT64)
    out_h = portrait * (short * height // width) + (1 - portrait) * short
    out_w = (1 - portrait) * (short * width // height) + portrait * short
    return out_h, out_w


def _resize_fits(height, width, short: int):
    """The size rule for the resize of a ``height`` x ``width`` image to a ``short`` px short side, as
    :func:`models.image_size.check_size` applies it: ``short * (short * long // shorter)`` pixels at most
    ``MAX_IMAGE_PIXELS``, that is ``short * long < (MAX_IMAGE_PIXELS // short + 1) * shorter`` (no division;
    a side of 0 counts as 1, as there)."""
    from nvidia.dali import fn, types

    portrait = fn.cast(height > width, dtype=types.INT64)
    long = portrait * height + (1 - portrait) * width
    shorter = portrait * width + (1 - portrait) * height
    shorter = shorter + fn.cast(shorter == 0, dtype=types.INT64)
    return short * long < (MAX_IMAGE_PIXELS // short + 1) * shorter


def _auto_augment(images, spec: PipelineSpec):
    """``--augmentation`` by DALI's auto_aug, on the uint8 crops: translations relative to the image as
    torchvision's, black fill as torchvision's default."""
    from nvidia.dali.auto_aug import auto_augment, rand_augment, trivial_augment

    shape = [spec.image_size, spec.image_size]
    if spec.augmentation == "autoaugment":
        return auto_augment.auto_augment(images, policy_name="image_net", shape=shape, fill_value=0)
    if spec.augmentation == "randaugment":
        return rand_augment.rand_augment(images, n=spec.randaugment_num_ops, m=spec.randaugment_magnitude,
                                         shape=shape, fill_value=0)
    return trivial_augment.trivial_augment_wide(images, shape=shape, fill_value=0)


def _centre(length, crop: int):
    """The offset of torchvision's CenterCrop of ``crop`` in ``length``: ``round((length - crop) / 2)``, halves to
    even."""
    spare = length - crop
    half = spare // 2
    odd = spare - 2 * half
    return half + odd * (half - 2 * (half // 2))  # k + 0.5 rounds to k when k is even, to k + 1 when odd
