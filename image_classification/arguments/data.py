"""The dataset DIR and the ``data`` group: where the images come from, how they are loaded and augmented."""

from __future__ import annotations

import argparse
import math

from ..errors import UserError
from ..models.preprocessing import DECODE_SCALES, SIZE_STEP, ResizeSchedule
from ..system.cli import positive_int, whole_number
from .values import float32, probability, raise_first

DATA_BACKENDS = ("pytorch", "pytorch-gpu", "synthetic", "dali-cpu", "dali-gpu")
BACKEND_ALIASES = {"syntetic": "synthetic"}  # the reference README's spelling
DEFAULT_WORKERS = 5  # the reference's -j
INTERPOLATIONS = ("bilinear", "bicubic", "triangular")
AUGMENTATIONS = ("autoaugment", "randaugment", "trivialaugment", "augmix")
RANDAUGMENT_BINS = 31  # torchvision's num_magnitude_bins: a magnitude is 0 to 30
MIN_IMAGE_SIZE = 32  # a ResNet reduces its input 32-fold
VAL_TTA = ("flip",)


def _backend(value: str) -> str:
    value = BACKEND_ALIASES.get(value, value)
    if value not in DATA_BACKENDS:
        raise argparse.ArgumentTypeError(
            f"unknown data backend {value!r}; choose from {', '.join(DATA_BACKENDS)}"
        )
    return value


def add_data_arguments(parser: argparse.ArgumentParser) -> None:
    """The positional DIR, and the ``data`` group."""
    parser.add_argument(
        "data", metavar="DIR", nargs="?", default=None,
        help="path to dataset (holds train/ and val/); may be left out with --data-backend synthetic",
    )

    data = parser.add_argument_group("data")
    data.add_argument(
        "--data-backend", metavar="BACKEND", type=_backend, default=None,
        help="data backend: pytorch | pytorch-gpu (decodes and augments on the GPU) | synthetic (alias syntetic) "
        "| dali-cpu | dali-gpu (default: dali-cpu where NVIDIA DALI is installed; else, on CUDA, "
        "pytorch-gpu where torchvision decodes JPEGs there; else pytorch)",
    )
    data.add_argument("-j", "--workers", metavar="N", type=whole_number, default=DEFAULT_WORKERS,
                      help="number of data loading workers; 0 loads in the main process (default: 5)")
    data.add_argument("--prefetch", metavar="N", type=positive_int, default=2,
                      help="batches each pytorch-backend worker loads ahead (default: 2)")
    data.add_argument("--image-size", metavar="S", type=positive_int, default=None,
                      help="training and validation crop size, at least 32 (default: the checkpoint's, else "
                      "the architecture's, 224)")
    data.add_argument("--train-crop-size", metavar="S", type=positive_int, default=None,
                      help="training crop size when it differs from the validation one (FixRes; torchvision's "
                      "recipe trains at 176) (default: --image-size)")
    data.add_argument("--val-resize-size", metavar="S", type=positive_int, default=None,
                      help="validation: the short side before the centre crop (default: the checkpoint's, "
                      "else the crop / 0.875, 256 for 224)")
    data.add_argument("--val-crop-size", metavar="S", type=positive_int, default=None,
                      help="validation crop size, recorded as the model's image size for classify.py and "
                      "export (default: --image-size)")
    data.add_argument("--progressive-resize", metavar=("MIN", "MAX", "START", "END"), type=whole_number, nargs=4,
                      default=None,
                      help="progressive resizing of the training crops (FFCV's min_res max_res start_ramp end_ramp): "
                      f"MIN px up to epoch START, MAX px from epoch END on (epochs counted from 0), in between the "
                      f"line from one to the other rounded to a multiple of {SIZE_STEP} px; validation keeps its "
                      "own size (default: off, one size: the checkpoint's schedule when it records one)")
    data.add_argument("--val-tta", choices=VAL_TTA, default=None,
                      help="test-time augmentation of validation: flip averages the logits of each image and its "
                      "mirror, reported beside the plain figures as <val>.tta_top1 ... (default: none)")
    data.add_argument("--interpolation", choices=INTERPOLATIONS, default=None,
                      help="resize interpolation (default: the checkpoint's, else bilinear)")
    data.add_argument("--decode-scale", choices=DECODE_SCALES, default="auto",
                      help="auto: decode each JPEG at the smallest of libjpeg's scales (1/2, 1/4, 1/8) at which its "
                      "training crop (its validation resize) keeps at least the output's pixels, never upsampling "
                      "more; full: decode every pixel, the batches of earlier versions (pytorch backend, "
                      "classify.py; DALI decodes the crop window either way) (default: auto)")
    data.add_argument("--augmentation", choices=AUGMENTATIONS, default=None,
                      help="extra training augmentation, torchvision's AutoAugment (ImageNet policy), RandAugment, "
                      "TrivialAugmentWide or AugMix (default: none)")
    data.add_argument("--randaugment-magnitude", metavar="M", type=whole_number, default=None,
                      help="--augmentation randaugment: magnitude of each operation, 0 to 30 (default: 9)")
    data.add_argument("--randaugment-num-ops", metavar="N", type=positive_int, default=None,
                      help="--augmentation randaugment: operations applied to each image (default: 2)")
    data.add_argument("--random-erase", metavar="P", type=probability, default=0.0,
                      help="probability of erasing a random rectangle of each training image (torchvision's "
                      "RandomErasing, after normalisation) (default: 0, off)")
    data.add_argument("--ra-reps", metavar="N", type=positive_int, default=1,
                      help="repeated augmentation: each epoch shows every image N times, in different "
                      "augmentations and to different processes, in an epoch as long as without (default: 1, off)")
    data.add_argument("--crop-scale", metavar=("MIN", "MAX"), type=float32, nargs=2, default=(0.08, 1.0),
                      help="area range of the random-resized crop, as fractions of the image (default: 0.08 1.0)")
    data.add_argument("--hflip", metavar="P", type=probability, default=0.5,
                      help="probability of a horizontal flip in training; 0 turns flips off (default: 0.5)")


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
