"""The dataset DIR and the ``data`` group: where the images come from, how they are loaded and augmented."""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass

from ..errors import UserError
from ..models.preprocessing import DECODE_SCALES, SIZE_STEP, Preprocessing, ResizeSchedule
from ..system.cli import positive_int, whole_number
from .values import add_group, flag, float32, from_args, probability, raise_first

DATA_BACKENDS = ("pytorch", "pytorch-gpu", "synthetic", "dali-cpu", "dali-gpu")
BACKEND_ALIASES = {"syntetic": "synthetic"}  # the reference README's spelling
DEFAULT_WORKERS = 5  # the reference's -j
INTERPOLATIONS = ("bilinear", "bicubic", "triangular")
AUGMENTATIONS = ("autoaugment", "randaugment", "trivialaugment", "augmix")
RANDAUGMENT_BINS = 31  # torchvision's num_magnitude_bins: a magnitude is 0 to 30
MIN_IMAGE_SIZE = 32  # a ResNet reduces its input 32-fold
DEFAULT_IMAGE_SIZE = 224  # a configuration made without a run's plan, sized by no flag
VAL_TTA = ("flip",)


def _backend(value: str) -> str:
    value = BACKEND_ALIASES.get(value, value)
    if value not in DATA_BACKENDS:
        raise argparse.ArgumentTypeError(
            f"unknown data backend {value!r}; choose from {', '.join(DATA_BACKENDS)}"
        )
    return value


@dataclass(frozen=True)
class DataConfig:
    """The dataset DIR and the ``data`` group: where the images come from, how they are loaded and augmented.  With
    what the run settles (the backend taken, the workers this process may use, the ``preprocessing`` the flags or
    the weights give, the seed, the class count, a synthetic epoch's length) it is the data backends' whole
    configuration: they read the sizes, interpolation and normalisation from ``preprocessing`` alone."""

    data: str | None = flag("data", metavar="DIR", nargs="?", help="path to dataset (holds train/ and "
                            "val/); may be left out with --data-backend synthetic")
    data_backend: str | None = flag("--data-backend", metavar="BACKEND", type=_backend,
                                    help="data backend: pytorch | pytorch-gpu (decodes and augments on the "
                                    "GPU) | synthetic (alias syntetic) | dali-cpu | dali-gpu (default: "
                                    "dali-cpu where NVIDIA DALI is installed; else, on CUDA, pytorch-gpu "
                                    "where torchvision decodes JPEGs there; else pytorch)")
    image_size: int | None = flag("--image-size", metavar="S", type=positive_int,
                                  help="training and validation crop size, at least 32 (default: the "
                                  "checkpoint's, else the architecture's, 224)")
    batch_size: int = flag("-b", "--batch-size", default=256, metavar="N", type=positive_int,
                           help="mini-batch size (default: 256) per gpu")
    workers: int = flag("-j", "--workers", default=DEFAULT_WORKERS, metavar="N", type=whole_number,
                        help="number of data loading workers; 0 loads in the main process (default: 5)")
    prefetch: int = flag("--prefetch", default=2, metavar="N", type=positive_int,
                         help="batches each pytorch-backend worker loads ahead (default: 2)")
    train_crop_size: int | None = flag("--train-crop-size", metavar="S", type=positive_int,
                                       help="training crop size when it differs from the validation one "
                                       "(FixRes; torchvision's recipe trains at 176) (default: "
                                       "--image-size)")
    val_resize_size: int | None = flag("--val-resize-size", metavar="S", type=positive_int,
                                       help="validation: the short side before the centre crop (default: "
                                       "the checkpoint's, else the crop / 0.875, 256 for 224)")
    val_crop_size: int | None = flag("--val-crop-size", metavar="S", type=positive_int,
                                     help="validation crop size, recorded as the model's image size for "
                                     "classify.py and export (default: --image-size)")
    progressive_resize: tuple[int, int, int, int] | None = flag(
        "--progressive-resize", metavar=("MIN", "MAX", "START", "END"), type=whole_number, nargs=4,
        help=f"progressive resizing of the training crops (FFCV's min_res max_res start_ramp end_ramp): MIN px up to "
        f"epoch START, MAX px from epoch END on (epochs counted from 0; END before --epochs), in between the line "
        f"from one to the other rounded to a multiple of {SIZE_STEP} px; validation keeps its own size (default: off, "
        "one size: the checkpoint's schedule when it records one)")
    val_tta: str | None = flag("--val-tta", choices=VAL_TTA, help="test-time augmentation of validation: "
                               "flip averages the logits of each image and its mirror, reported beside the "
                               "plain figures as <val>.tta_top1 ... (default: none)")
    interpolation: str | None = flag("--interpolation", choices=INTERPOLATIONS,
                                     help="resize interpolation (default: the checkpoint's, else bilinear)")
    decode_scale: str = flag("--decode-scale", default="auto", choices=DECODE_SCALES,
                             help="auto: decode each JPEG at the smallest of libjpeg's scales (1/2, 1/4, "
                             "1/8) at which its training crop (its validation resize) keeps at least the "
                             "output's pixels, never upsampling more; full: decode every pixel, the "
                             "batches of earlier versions (pytorch backend, classify.py; DALI decodes the "
                             "crop window either way) (default: auto)")
    augmentation: str | None = flag("--augmentation", choices=AUGMENTATIONS,
                                    help="extra training augmentation, torchvision's AutoAugment (ImageNet "
                                    "policy), RandAugment, TrivialAugmentWide or AugMix (default: none)")
    randaugment_magnitude: int | None = flag("--randaugment-magnitude", metavar="M", type=whole_number,
                                             help="--augmentation randaugment: magnitude of each "
                                             "operation, 0 to 30 (default: 9)")
    randaugment_num_ops: int | None = flag("--randaugment-num-ops", metavar="N", type=positive_int,
                                           help="--augmentation randaugment: operations applied to each "
                                           "image (default: 2)")
    random_erase: float = flag("--random-erase", default=0.0, metavar="P", type=probability,
                               help="probability of erasing a random rectangle of each training image "
                               "(torchvision's RandomErasing, after normalisation) (default: 0, off)")
    ra_reps: int = flag("--ra-reps", default=1, metavar="N", type=positive_int,
                        help="repeated augmentation: each epoch shows every image N times, in different "
                        "augmentations and to different processes, in an epoch as long as without "
                        "(default: 1, off)")
    crop_scale: tuple[float, float] = flag("--crop-scale", default=(0.08, 1.0), metavar=("MIN", "MAX"),
                                           type=float32, nargs=2, help="area range of the random-resized "
                                           "crop, as fractions of the image (default: 0.08 1.0)")
    hflip: float = flag("--hflip", default=0.5, metavar="P", type=probability,
                        help="probability of a horizontal flip in training; 0 turns flips off (default: "
                        "0.5)")

    preprocessing: Preprocessing | None = None  # the crops, resize, interpolation and normalisation taken
    seed: int = 0
    num_classes: int | None = None
    synthetic_length: int = 0  # batches per synthetic epoch; 0 for the default

    def __post_init__(self):
        if self.preprocessing is None:  # made without a run's plan (a script, a test): what the size flags say
            schedule = ResizeSchedule(*self.progressive_resize) if self.progressive_resize else None
            object.__setattr__(self, "preprocessing", Preprocessing(
                self.val_crop_size or self.image_size or DEFAULT_IMAGE_SIZE, self.interpolation or "bilinear",
                train_crop_size=self.train_crop_size or self.image_size, train_schedule=schedule))

    @property
    def backend(self) -> str:
        """The data backend (resolved by the run's plan: ``--data-backend``, else the fastest installed)."""
        return self.data_backend or "pytorch"

    @property
    def randaugment(self) -> tuple[int, int]:
        """--augmentation randaugment's magnitude and operations per image (torchvision's defaults: 9, 2)."""
        magnitude = 9 if self.randaugment_magnitude is None else self.randaugment_magnitude
        return magnitude, 2 if self.randaugment_num_ops is None else self.randaugment_num_ops


def data_config(args: argparse.Namespace, image_size: int | None = None, **resolved) -> DataConfig:
    """The data configuration that main.py's parsed flags describe, made without a run's plan (a benchmark, a test):
    its preprocessing the size flags' (``image_size``: crops of that side instead), ``resolved`` the fields given."""
    if image_size is not None and "preprocessing" not in resolved:
        resolved["preprocessing"] = Preprocessing(image_size, args.interpolation or "bilinear")
    for name in ("seed", "num_classes"):  # what a run settles, where the flags give it
        if getattr(args, name, None) is not None:
            resolved.setdefault(name, getattr(args, name))
    return from_args(DataConfig, args, **resolved)


def add_data_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``data`` group, the dataset DIR first."""
    add_group(parser, "data", DataConfig)


def check_data_values(args: argparse.Namespace) -> None:
    """The data flags' ranges that argparse's types do not cover. Raises :class:`UserError`."""
    low, high = args.crop_scale
    if not (math.isfinite(low) and math.isfinite(high) and 0.0 < low <= high <= 1.0):
        raise UserError(f"--crop-scale needs 0 < MIN <= MAX <= 1, got {low} {high}")
    raise_first((
        (args.workers < 0, f"-j/--workers must be 0 or more, got {args.workers}"),
        *((value is not None and value < MIN_IMAGE_SIZE,
           f"{flag} must be at least {MIN_IMAGE_SIZE} (the network reduces its input 32-fold), got {value}")
          for flag, value in (("--image-size", args.image_size), ("--train-crop-size", args.train_crop_size),
                              ("--val-resize-size", args.val_resize_size), ("--val-crop-size", args.val_crop_size))),
        (args.progressive_resize is not None and ResizeSchedule.problem(args.progressive_resize) is not None,
         f"--progressive-resize {' '.join(map(str, args.progressive_resize or ()))}: "
         f"{ResizeSchedule.problem(args.progressive_resize or [])}"),
        (args.randaugment_magnitude is not None and not 0 <= args.randaugment_magnitude < RANDAUGMENT_BINS,
         f"--randaugment-magnitude must be 0 to {RANDAUGMENT_BINS - 1}, got {args.randaugment_magnitude}"),
    ))


def check_data_combinations(args: argparse.Namespace, *, require_data: bool) -> None:
    """DIR unless the data is synthetic; a flag that only tunes another comes with it. Raises :class:`UserError`."""
    if require_data and args.data is None and args.data_backend != "synthetic":
        raise UserError("the dataset directory DIR is required unless --data-backend synthetic is used")
    if args.progressive_resize is not None:
        shown = " ".join(map(str, args.progressive_resize))
        if args.train_crop_size is not None:
            raise UserError(f"--progressive-resize {shown} sets the training crop of every epoch; leave out "
                            "--train-crop-size")
        problem = ResizeSchedule.problem(args.progressive_resize, args.epochs)
        if problem is not None:
            raise UserError(f"--progressive-resize {shown}: {problem}")
    randaugment = args.randaugment_magnitude is not None or args.randaugment_num_ops is not None
    if randaugment and args.augmentation != "randaugment":
        raise UserError("--randaugment-magnitude and --randaugment-num-ops need --augmentation randaugment")
