"""The command line of main.py, defined once.

Every flag of the reference README's ``main.py -h`` keeps its name and meaning; the later reference
flags and our own additions sit beside them in small groups.  ``launch.py`` feeds presets into
:func:`build_parser` through ``set_defaults`` so that explicit flags still win.
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from .errors import UserError
from .gpu_affinity import MODES as GPU_AFFINITY_MODES
from .models import MODEL_CONFIGS, list_models

DATA_BACKENDS = ("pytorch", "synthetic", "dali-cpu", "dali-gpu")
BACKEND_ALIASES = {"syntetic": "synthetic"}  # the reference README's spelling
LR_SCHEDULES = ("step", "linear", "cosine")
INTERPOLATIONS = ("bilinear", "bicubic", "triangular")


class UserErrorParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors become :class:`UserError` (one line, exit code 2)."""

    def error(self, message: str):  # type: ignore[override]
        raise UserError(f"{self.prog}: {message}")


def _str2bool(value: str) -> bool:
    lowered = value.lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {value!r}")


def positive_int(value: str) -> int:
    number = int(value)
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {number}")
    return number


def _probability(value: str) -> float:
    number = float(value)
    if not 0.0 <= number <= 1.0:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1, got {number}")
    return number


def _backend(value: str) -> str:
    value = BACKEND_ALIASES.get(value, value)
    if value not in DATA_BACKENDS:
        raise argparse.ArgumentTypeError(
            f"unknown data backend {value!r}; choose from {', '.join(DATA_BACKENDS)}"
        )
    return value


def build_parser(prog: str = "main.py") -> argparse.ArgumentParser:
    """Return the parser for training, evaluation and benchmarking runs."""
    parser = UserErrorParser(prog=prog, description="PyTorch ImageNet Training")
    parser.add_argument(
        "data", metavar="DIR", nargs="?", default=None,
        help="path to dataset (holds train/ and val/); may be left out with --data-backend synthetic",
    )

    data = parser.add_argument_group("data")
    data.add_argument(
        "--data-backend", metavar="BACKEND", type=_backend, default=None,
        help="data backend: pytorch | synthetic (alias syntetic) | dali-cpu | dali-gpu "
        "(default: dali-cpu when NVIDIA DALI is installed, else pytorch)",
    )
    data.add_argument("-j", "--workers", metavar="N", type=int, default=5,
                      help="number of data loading workers; 0 loads in the main process (default: 5)")
    data.add_argument("--prefetch", metavar="N", type=positive_int, default=2,
                      help="batches each pytorch-backend worker loads ahead (default: 2)")
    data.add_argument("--image-size", metavar="S", type=positive_int, default=None,
                      help="training and validation crop size (default: the architecture's, 224)")
    data.add_argument("--interpolation", choices=INTERPOLATIONS, default="bilinear",
                      help="resize interpolation (default: bilinear)")
    data.add_argument("--augmentation", choices=("autoaugment",), default=None,
                      help="extra training augmentation (default: none)")
    data.add_argument("--crop-scale", metavar=("MIN", "MAX"), type=float, nargs=2, default=(0.08, 1.0),
                      help="area range of the random-resized crop, as fractions of the image (default: 0.08 1.0)")
    data.add_argument("--hflip", metavar="P", type=_probability, default=0.5,
                      help="probability of a horizontal flip in training; 0 turns flips off (default: 0.5)")

    model = parser.add_argument_group("model")
    model.add_argument("--arch", "-a", metavar="ARCH", default="resnet50", choices=list_models(),
                       help="model architecture: " + " | ".join(list_models()) + " (default: resnet50)")
    model.add_argument("--model-config", "-c", metavar="CONF", default="classic", choices=list(MODEL_CONFIGS),
                       help="model configs: " + " | ".join(MODEL_CONFIGS) + " (default: classic)")
    model.add_argument("--num-classes", "--num_classes", metavar="N", dest="num_classes",
                       type=positive_int, default=1000, help="number of classes in the dataset (default: 1000)")
    model.add_argument("--conv_init", choices=("fan_in", "fan_out"), default=None,
                       help="kaiming init mode of the convolutions (default: the model config's)")
    model.add_argument("--last_bn_0_init", metavar="BOOL", type=_str2bool, nargs="?", const=True, default=False,
                       help="zero-initialise the last BatchNorm of every residual block (default: false)")
    model.add_argument("--pretrained-weights", "--pretrained-from-file", metavar="PATH",
                       dest="pretrained_weights", default=None,
                       help="load model weights from here (NGC, torchvision or our files); "
                       "a head of another size is replaced to fit --num-classes (default: none)")
    model.add_argument("--jit", choices=("no", "script"), default="no",
                       help="script the model with TorchScript (default: no)")
    model.add_argument("--compile", action="store_true",
                       help="compile the model with torch.compile (default: false)")

    optim = parser.add_argument_group("optimisation")
    optim.add_argument("--epochs", metavar="N", type=positive_int, default=90,
                       help="number of total epochs to run; the length of the LR schedule (default: 90)")
    optim.add_argument("--run-epochs", metavar="N", type=int, default=-1,
                       help="run only N epochs, used for checkpointing runs (default: -1, all)")
    optim.add_argument("--early-stopping-patience", metavar="N", type=int, default=-1,
                       help="stop after N epochs in a row without a new best top1 (default: -1, never)")
    optim.add_argument("-b", "--batch-size", metavar="N", type=positive_int, default=256,
                       help="mini-batch size (default: 256) per gpu")
    optim.add_argument("--optimizer-batch-size", metavar="N", type=int, default=-1,
                       help="size of a total batch size, for simulating bigger batches using gradient "
                       "accumulation; a multiple of world size x batch size (default: -1, off)")
    optim.add_argument("--optimizer", choices=("sgd", "rmsprop"), default="sgd", help="optimizer (default: sgd)")
    optim.add_argument("--lr", "--learning-rate", metavar="LR", type=float, default=0.1,
                       help="initial learning rate (default: 0.1)")
    optim.add_argument("--lr-schedule", metavar="SCHEDULE", choices=LR_SCHEDULES, default="step",
                       help="type of LR schedule: step, linear, cosine (default: step)")
    optim.add_argument("--end-lr", metavar="LR", type=float, default=0.0,
                       help="final learning rate of the cosine schedule (default: 0)")
    optim.add_argument("--warmup", metavar="E", type=int, default=0,
                       help="number of warmup epochs (default: 0)")
    optim.add_argument("--label-smoothing", metavar="S", type=float, default=0.0,
                       help="label smoothing (default: 0)")
    optim.add_argument("--mixup", metavar="ALPHA", type=float, default=0.0, help="mixup alpha (default: 0, off)")
    optim.add_argument("--momentum", metavar="M", type=float, default=0.9, help="momentum (default: 0.9)")
    optim.add_argument("--weight-decay", "--wd", metavar="W", type=float, default=1e-4,
                       help="weight decay (default: 1e-4)")
    optim.add_argument("--bn-weight-decay", action="store_true",
                       help="use weight_decay on batch normalization learnable parameters, (default: false)")
    optim.add_argument("--nesterov", action="store_true", help="use nesterov momentum, (default: false)")
    optim.add_argument("--rmsprop-alpha", metavar="A", type=float, default=0.9,
                       help="RMSprop smoothing constant (default: 0.9)")
    optim.add_argument("--rmsprop-eps", metavar="EPS", type=float, default=1e-3,
                       help="RMSprop epsilon (default: 1e-3)")
    optim.add_argument("--use-ema", metavar="DECAY", type=float, default=None,
                       help="keep an exponential moving average of the weights with this decay, "
                       "validated as val_ema (default: off)")

    precision = parser.add_argument_group("precision and device")
    precision.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                           help="where to run; auto takes CUDA when present (default: auto)")
    precision.add_argument("--amp", action="store_true",
                           help="Run model AMP (automatic mixed precision) mode: fp16 with loss scaling on "
                           "CUDA, bf16 on CPU")
    precision.add_argument("--amp-dtype", choices=("float16", "bfloat16"), default=None,
                           help="autocast type under --amp (default: float16 on CUDA, bfloat16 on CPU)")
    precision.add_argument("--static-loss-scale", metavar="S", type=float, default=1.0,
                           help="Static loss scale, positive power of 2 values can improve amp convergence. "
                           "(default: 1)")
    precision.add_argument("--dynamic-loss-scale", action="store_true",
                           help="Use dynamic loss scaling, starting at --static-loss-scale. If supplied, "
                           "this argument supersedes --static-loss-scale.")
    precision.add_argument("--tf32", action=argparse.BooleanOptionalAction, default=True,
                           help="allow TF32 matmuls and convolutions on CUDA; --no-tf32 makes FP32 really "
                           "FP32 (default: on)")
    precision.add_argument("--memory-format", choices=("nchw", "nhwc"), default="nchw",
                           help="memory layout, nchw or nhwc (default: nchw)")
    precision.add_argument("--gpu-affinity", choices=GPU_AFFINITY_MODES, default="none",
                           help="pin each process to the CPU cores near its GPU (default: none)")

    run = parser.add_argument_group("run, checkpoints and logging")
    run.add_argument("--seed", metavar="SEED", type=int, default=None,
                     help="random seed; every RNG is seeded from it and the global rank (default: a random one, "
                     "recorded in checkpoints)")
    run.add_argument("--print-freq", "-p", metavar="N", type=positive_int, default=10,
                     help="print frequency (default: 10)")
    run.add_argument("--prof", metavar="N", type=int, default=-1,
                     help="Run only N iterations of training and of validation per epoch (default: -1, all)")
    run.add_argument("--evaluate", action="store_true", help="evaluate checkpoint/model")
    run.add_argument("--training-only", action="store_true", help="do not evaluate")
    run.add_argument("--topk", metavar="K", type=positive_int, default=5,
                     help="the second accuracy reported, top-K (default: 5)")
    run.add_argument("--resume", metavar="PATH", default=None,
                     help="path to latest checkpoint (default: none)")
    run.add_argument("--workspace", metavar="DIR", default="./",
                     help="path to directory where checkpoints will be stored (default: ./)")
    run.add_argument("--checkpoint-filename", metavar="NAME", default="checkpoint.pth.tar",
                     help="name of the latest checkpoint in the workspace (default: checkpoint.pth.tar)")
    run.add_argument("--no-checkpoints", dest="save_checkpoints", action="store_false",
                     help="do not store any checkpoints, useful for benchmarking")
    run.add_argument("--gather-checkpoints", metavar="N", type=int, nargs="?", const=-1, default=0,
                     help="also keep per-epoch checkpoints: alone, all of them; with N, the last N "
                     "(default: only the latest and the best are kept)")
    run.add_argument("--raport-file", metavar="FILE", default="experiment_raport.json",
                     help="file in which to store JSON experiment raport, inside the workspace "
                     "(default: experiment_raport.json)")
    return parser


def parse_args(argv: Sequence[str] | None = None, defaults: dict | None = None) -> argparse.Namespace:
    """Parse ``argv`` (``sys.argv[1:]`` when None), with ``defaults`` applied under explicit flags."""
    parser = build_parser()
    argv = _bare_gather_flag(list(sys.argv[1:] if argv is None else argv))
    if defaults:
        known = {action.dest for action in parser._actions}
        unknown = sorted(set(defaults) - known)
        if unknown:
            raise UserError(f"unknown configuration key(s): {', '.join(unknown)}")
        parser.set_defaults(**defaults)
    args = parser.parse_args(argv)
    validate_args(args)
    return args


def _bare_gather_flag(argv: list[str]) -> list[str]:
    """``--gather-checkpoints`` followed by a non-number (say DIR) means keep all: don't eat DIR."""
    out = []
    for index, token in enumerate(argv):
        following = argv[index + 1] if index + 1 < len(argv) else None
        if token == "--gather-checkpoints" and (following is None or not following.lstrip("-").isdigit()):
            token = "--gather-checkpoints=-1"
        out.append(token)
    return out


def validate_args(args: argparse.Namespace) -> None:
    """Check what argparse cannot: combinations and ranges. Raises :class:`UserError`."""
    if args.data_backend is not None:
        args.data_backend = _backend(args.data_backend)
    if args.data is None and args.data_backend != "synthetic":
        raise UserError("the dataset directory DIR is required unless --data-backend synthetic is used")
    low, high = args.crop_scale
    if not 0.0 < low <= high <= 1.0:
        raise UserError(f"--crop-scale needs 0 < MIN <= MAX <= 1, got {low} {high}")
    if args.workers < 0:
        raise UserError(f"-j/--workers must be 0 or more, got {args.workers}")
    if args.evaluate and args.training_only:
        raise UserError("--evaluate and --training-only exclude each other")
    if args.warmup < 0:
        raise UserError(f"--warmup must be 0 or more, got {args.warmup}")
    if args.label_smoothing < 0 or args.label_smoothing >= 1:
        raise UserError(f"--label-smoothing must be in [0, 1), got {args.label_smoothing}")
    if args.mixup < 0:
        raise UserError(f"--mixup must be 0 or more, got {args.mixup}")
    if args.use_ema is not None and not 0.0 < args.use_ema < 1.0:
        raise UserError(f"--use-ema needs a decay between 0 and 1, got {args.use_ema}")
    if args.static_loss_scale <= 0:
        raise UserError(f"--static-loss-scale must be positive, got {args.static_loss_scale}")
    if args.resume and args.pretrained_weights:
        raise UserError("--resume and --pretrained-weights exclude each other: a checkpoint already holds weights")
