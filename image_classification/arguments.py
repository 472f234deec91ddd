"""The command line of main.py, defined once.

Every flag of the reference README's ``main.py -h`` keeps its name and meaning; the later reference
flags and our own additions sit beside them in small groups.  ``launch.py`` feeds presets into
:func:`build_parser` through ``set_defaults`` so that explicit flags still win.

No torch here (nor in what this imports): ``-h`` and a mistyped flag answer before torch is loaded,
which takes seconds.
"""

from __future__ import annotations

import argparse
import math
import re
import reprlib
import sys
from dataclasses import dataclass
from typing import Sequence

from .cli import UserErrorParser, positive_float, positive_int
from .errors import UserError
from .gpu_affinity import MODES as GPU_AFFINITY_MODES
from .models import MODEL_CONFIGS, list_models
from .tool_arguments import add_int8_arguments, check_int8_flags

DATA_BACKENDS = ("pytorch", "synthetic", "dali-cpu", "dali-gpu")
DEFAULT_WORKERS = 5  # the reference's -j
DEFAULT_RAPORT_FILE = "experiment_raport.json"
BACKEND_ALIASES = {"syntetic": "synthetic"}  # the reference README's spelling
LR_SCHEDULES = ("step", "linear", "cosine")
OPTIMIZERS = ("sgd", "rmsprop", "adamw", "lamb", "lars")
INTERPOLATIONS = ("bilinear", "bicubic", "triangular")
AUGMENTATIONS = ("autoaugment", "randaugment", "trivialaugment", "augmix")
RANDAUGMENT_BINS = 31  # torchvision's num_magnitude_bins: a magnitude is 0 to 30


def _str2bool(value: str) -> bool:
    lowered = value.lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {value!r}")


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
    data.add_argument("-j", "--workers", metavar="N", type=int, default=DEFAULT_WORKERS,
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
    data.add_argument("--interpolation", choices=INTERPOLATIONS, default=None,
                      help="resize interpolation (default: the checkpoint's, else bilinear)")
    data.add_argument("--augmentation", choices=AUGMENTATIONS, default=None,
                      help="extra training augmentation, torchvision's AutoAugment (ImageNet policy), RandAugment, "
                      "TrivialAugmentWide or AugMix (default: none)")
    data.add_argument("--randaugment-magnitude", metavar="M", type=int, default=None,
                      help="--augmentation randaugment: magnitude of each operation, 0 to 30 (default: 9)")
    data.add_argument("--randaugment-num-ops", metavar="N", type=positive_int, default=None,
                      help="--augmentation randaugment: operations applied to each image (default: 2)")
    data.add_argument("--random-erase", metavar="P", type=_probability, default=0.0,
                      help="probability of erasing a random rectangle of each training image (torchvision's "
                      "RandomErasing, after normalisation) (default: 0, off)")
    data.add_argument("--ra-reps", metavar="N", type=positive_int, default=1,
                      help="repeated augmentation: each epoch shows every image N times, in different "
                      "augmentations and to different processes, in an epoch as long as without (default: 1, off)")
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
                       type=positive_int, default=None,
                       help="number of classes (default: the checkpoint's, else the dataset's class folders, "
                       "else 1000)")
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
    optim.add_argument("--optimizer", choices=OPTIMIZERS, default="sgd",
                       help="optimizer: sgd | rmsprop | adamw | lamb | lars; AdamW and LAMB use betas 0.9, 0.999 and "
                       "take no --momentum (default: sgd)")
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
    optim.add_argument("--cutmix", metavar="ALPHA", type=float, default=0.0,
                       help="cutmix alpha: paste a box of another image, the labels mixed by its area (default: 0, off)")
    optim.add_argument("--mixup-switch-prob", metavar="P", type=_probability, default=None,
                       help="with both --mixup and --cutmix, the probability that a batch is mixed by CutMix rather "
                       "than MixUp (default: 0.5)")
    optim.add_argument("--momentum", metavar="M", type=float, default=0.9, help="momentum (default: 0.9)")
    optim.add_argument("--weight-decay", "--wd", metavar="W", type=float, default=1e-4,
                       help="weight decay (default: 1e-4)")
    optim.add_argument("--bn-weight-decay", action="store_true",
                       help="use weight_decay on batch normalization learnable parameters, (default: false)")
    optim.add_argument("--norm-weight-decay", metavar="W", type=float, default=None,
                       help="weight decay of the normalisation layers' parameters (default: 0, or --weight-decay "
                       "with --bn-weight-decay)")
    optim.add_argument("--bias-weight-decay", metavar="W", type=float, default=None,
                       help="weight decay of every bias, normalisation layers' included (default: as the layer's "
                       "other parameters)")
    optim.add_argument("--nesterov", action="store_true", help="use nesterov momentum, (default: false)")
    optim.add_argument("--rmsprop-alpha", metavar="A", type=float, default=0.9,
                       help="RMSprop smoothing constant (default: 0.9)")
    optim.add_argument("--rmsprop-eps", metavar="EPS", type=float, default=1e-3,
                       help="RMSprop epsilon (default: 1e-3)")
    optim.add_argument("--use-ema", metavar="DECAY", type=float, default=None,
                       help="keep an exponential moving average of the weights with this decay, "
                       "validated as val_ema: the reference's EMA, updated every optimizer step with a warm-up "
                       "of min(DECAY, (1 + step) / (10 + step)) (default: off)")
    optim.add_argument("--model-ema", action="store_true",
                       help="torchvision's EMA instead: --model-ema-decay adjusted to the batch and the update "
                       "interval, restarted from the weights during --warmup epochs (default: off)")
    optim.add_argument("--model-ema-decay", metavar="DECAY", type=float, default=None,
                       help="torchvision's --model-ema-decay, before it is adjusted to the batch and the interval; "
                       "implies --model-ema (default: 0.99998)")
    optim.add_argument("--model-ema-steps", metavar="N", type=positive_int, default=None,
                       help="update torchvision's EMA every N optimizer steps (default: 32)")
    optim.add_argument("--model-ema-warmup", action="store_true",
                       help="timm's EMA warm-up, min(DECAY, 1 - (1 + n)^(-2/3)) after n updates, for --use-ema or "
                       "--model-ema (default: off)")

    precision = parser.add_argument_group("precision and device")
    precision.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                           help="where to run; auto takes CUDA when present (default: auto)")
    precision.add_argument("--amp", action="store_true",
                           help="Run model AMP (automatic mixed precision) mode: fp16 with loss scaling on "
                           "CUDA, bf16 on CPU")
    precision.add_argument("--amp-dtype", choices=("float16", "bfloat16"), default=None,
                           help="autocast type under --amp (default: float16 on CUDA, bfloat16 on CPU)")
    precision.add_argument("--static-loss-scale", metavar="S", type=float, default=None,
                           help="Static loss scale, positive power of 2 values can improve amp convergence. "
                           "Alone it fixes the fp16 scale at S (default: none: fp16 --amp scales "
                           "dynamically from 65536)")
    precision.add_argument("--dynamic-loss-scale", action="store_true",
                           help="Use dynamic loss scaling, starting at --static-loss-scale: doubled after 100 "
                           "steps without overflow, halved on overflow. If supplied, this argument supersedes "
                           "--static-loss-scale.")
    precision.add_argument("--tf32", action=argparse.BooleanOptionalAction, default=True,
                           help="allow TF32 matmuls and convolutions on CUDA; --no-tf32 makes FP32 really "
                           "FP32 (default: on)")
    precision.add_argument("--memory-format", choices=("nchw", "nhwc"), default="nchw",
                           help="memory layout, nchw or nhwc (default: nchw)")
    precision.add_argument("--gpu-affinity", choices=GPU_AFFINITY_MODES, default="none",
                           help="pin each process to the CPU cores near its GPU (default: none)")
    precision.add_argument("--dist-timeout", metavar="SECONDS", type=positive_float, default=300.0,
                           help="a process that waits longer than this for the others of a distributed run "
                           "(one is gone or hung) stops with one line and exit code 5; raise it when saving "
                           "a checkpoint takes longer; from 1 second to a year (default: 300)")

    deployed = parser.add_argument_group("evaluation of the deployed model (with --evaluate)")
    deployed.add_argument("--runtime", choices=("torch", "onnxruntime"), default="torch",
                          help="onnxruntime: validate the model exported to ONNX (cached as classify.py caches "
                          "it) and run by ONNX Runtime, through the same validation loop and raport as PyTorch's; "
                          "on the CPU, or on CUDA with onnxruntime-gpu (default: torch)")
    add_int8_arguments(deployed, "with --runtime onnxruntime, validate")

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
    run.add_argument("--topk", metavar="K", type=positive_int, default=None,
                     help="the second accuracy reported, top-K, at most the class count (default: 5, or the "
                     "class count when smaller)")
    run.add_argument("--resume", metavar="PATH", default=None,
                     help="path to latest checkpoint; 'auto': the newest valid checkpoint in --workspace, or a "
                     "fresh start when there is none (default: none)")
    run.add_argument("--workspace", metavar="DIR", default="./",
                     help="where checkpoints and raports go (default: ./; --evaluate --resume F: F's folder)")
    run.add_argument("--checkpoint-filename", "--checkpoint", metavar="NAME", default="checkpoint.pth.tar",
                     help="name of the latest checkpoint in the workspace (default: checkpoint.pth.tar)")
    run.add_argument("--overwrite", action="store_true",
                     help="let a new run (no --resume) replace the run whose checkpoints or --raport-file the "
                     "workspace holds (default: refuse, naming --resume auto, --raport-file and --workspace)")
    run.add_argument("--no-checkpoints", dest="save_checkpoints", action="store_false",
                     help="do not store any checkpoints, useful for benchmarking")
    run.add_argument("--checkpoint-interval", metavar="N|Nm", default=None,
                     help="also write the latest checkpoint in the middle of an epoch, every N iterations or "
                     "every N minutes (Nm); a killed run loses at most that much (default: at epoch ends only)")
    run.add_argument("--gather-checkpoints", metavar="N", type=int, nargs="?", const=-1, default=0,
                     help="also keep per-epoch checkpoints: alone, all of them; with N, the last N "
                     "(default: only the latest and the best are kept)")
    run.add_argument("--raport-file", metavar="FILE", default=None,
                     help="file in which to store JSON experiment raport, inside the workspace "
                     "(default: experiment_raport.json)")
    run.add_argument("--tensorboard", metavar="DIR", default=None,
                     help="also write the raport's metrics as TensorBoard event files into DIR (default: off)")
    return parser


def parse_args(argv: Sequence[str] | None = None, defaults: dict | None = None, *,
               require_data: bool = True, prog: str = "main.py") -> argparse.Namespace:
    """Parse ``argv`` (``sys.argv[1:]`` when None), with ``defaults`` (a preset) applied under explicit flags.

    A preset's values go through exactly the checks a typed flag does: each is written as the flag it
    stands for and parsed, so ``batch_size: 0`` fails like ``-b 0`` does, naming the key.
    ``require_data=False`` accepts a missing DIR (``launch.py --dry-run`` prints a command without one).
    ``prog``: the command's name in usage and errors (``ic-train`` when installed).
    """
    parser = build_parser(prog)
    argv = list(sys.argv[1:] if argv is None else argv)
    preset_argv: list[str] = []
    for key, value in (defaults or {}).items():
        tokens = preset_tokens(parser, key, value)
        try:
            check_values(parser.parse_args(_bare_gather_flag(tokens)))
        except UserError as error:
            reason = str(error).split(": ", 1)[-1] if str(error).startswith(parser.prog) else str(error)
            raise UserError(f"preset value {key}: {shown(value)} is not valid: {reason[:200]}") from None
        preset_argv += tokens
    args = parser.parse_args(_bare_gather_flag(preset_argv + argv))
    validate_args(args, require_data=require_data)
    return args


_SHOWN = reprlib.Repr()  # reads only what it shows: a few items, two levels deep
_SHOWN.maxlevel, _SHOWN.maxstring, _SHOWN.maxother = 2, 40, 40
_SHOWN.maxlist = _SHOWN.maxtuple = _SHOWN.maxdict = _SHOWN.maxset = 4


def shown(value, limit: int = 100) -> str:
    """``value`` for a one-line message, cut short: a preset's value may be huge or hold itself (YAML
    aliases), and a full repr of it would take minutes and gigabytes."""
    text = _SHOWN.repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _action_for(parser: argparse.ArgumentParser, dest: str) -> argparse.Action | None:
    return next((a for a in parser._actions if a.dest == dest and a.option_strings), None)


def flag_tokens(action: argparse.Action, value) -> list[str]:
    """The command-line tokens that set ``action``'s dest to ``value`` (none for a switch left off)."""
    flag = next((s for s in action.option_strings if s.startswith("--")), action.option_strings[0])
    if isinstance(action, argparse.BooleanOptionalAction):
        return [flag if value else "--no-" + flag[2:]]
    if action.nargs == 0:  # store_true / store_false
        return [flag] if value == action.const else []
    if isinstance(value, (list, tuple)):
        return [flag, *map(str, value)]
    if isinstance(value, bool):
        return [f"{flag}={str(value).lower()}"]
    return [f"{flag}={value}"]


def preset_tokens(parser: argparse.ArgumentParser, key: str, value) -> list[str]:
    """The tokens that set ``key`` (an argparse dest) to a preset's ``value``, its type checked; [] for None."""
    action = _action_for(parser, key)
    if action is None or key == "help":
        raise UserError(f"unknown configuration key: {key}")
    if value is None:
        return []
    if isinstance(action, argparse.BooleanOptionalAction) or action.nargs == 0:
        _require(key, value, bool)
    elif action.nargs == 2:
        if not isinstance(value, (list, tuple)) or len(value) != 2:
            raise UserError(f"preset value {key}: {shown(value)} is not valid: expected a list of two numbers")
        for item in value:
            _require(key, item, (int, float), scalar=True)
    elif not (isinstance(value, bool) and action.type is _str2bool):
        _require(key, value, (str, int, float), scalar=True)
    return flag_tokens(action, value)


def _require(key: str, value, kinds, scalar: bool = False) -> None:
    wrong = not isinstance(value, kinds) or (scalar and isinstance(value, bool))
    if wrong:
        expected = "true or false" if kinds is bool else "a single value"
        raise UserError(f"preset value {key}: {shown(value)} is not valid: expected {expected}")


def _bare_gather_flag(argv: list[str]) -> list[str]:
    """``--gather-checkpoints`` followed by a non-number (say DIR) means keep all: don't eat DIR."""
    out = []
    for index, token in enumerate(argv):
        following = argv[index + 1] if index + 1 < len(argv) else None
        if token == "--gather-checkpoints" and (following is None or not following.lstrip("-").isdigit()):
            token = "--gather-checkpoints=-1"
        out.append(token)
    return out


def raport_file(args: argparse.Namespace) -> str:
    """The raport's name: ``--raport-file`` as given, else the default.  The flag's default is None, so that a
    name the user typed, the default's included, can be told from none (an evaluation refuses a typed name
    that exists, and picks a new one beside the default)."""
    return DEFAULT_RAPORT_FILE if args.raport_file is None else args.raport_file


@dataclass(frozen=True)
class CheckpointInterval:
    """``--checkpoint-interval``: every ``iterations`` train iterations, or every ``seconds`` of wall time."""

    iterations: int | None = None
    seconds: float | None = None

    @classmethod
    def parse(cls, text: str) -> "CheckpointInterval":
        match = re.fullmatch(r"\s*(\d+)(?:\.(\d+))?\s*([smh]?)\s*", str(text))
        if not match:
            raise ValueError(f"expected N (iterations) or Nm / Ns / Nh (minutes, seconds, hours), got {shown(text)}")
        whole, fraction, unit = match.group(1), match.group(2) or "", match.group(3)
        if not int(whole) and not fraction.strip("0"):
            raise ValueError(f"must be positive, got {shown(text)}")
        if not unit:
            if fraction.strip("0"):
                raise ValueError(f"a number of iterations is a whole number, got {shown(text)}")
            return cls(iterations=int(whole))  # read as an integer: a float would round a long count
        seconds = float(f"{whole}.{fraction or 0}") * {"s": 1, "m": 60, "h": 3600}[unit]
        if seconds > MAX_WAIT_S:
            raise ValueError(f"is a time of at most a year ({MAX_WAIT_S // 3600:,}h), got {shown(text)}")
        return cls(seconds=seconds)

    def __str__(self) -> str:
        if self.iterations is not None:
            return f"every {self.iterations} iterations"
        return f"every {self.seconds / 60:g} minutes"


MIN_IMAGE_SIZE = 32  # a ResNet reduces its input 32-fold
# The longest wait a flag may ask for, in seconds: far beyond any run, and far within what Python's clocks,
# threading's waits (TIMEOUT_MAX, about 292 years on Linux) and timedelta (the process group's timeout) hold.
MAX_WAIT_S = 365 * 24 * 3600
# Every float flag ends up in float32 tensors (the optimizers' steps, the loss scale): a larger value overflows
# there, in some optimizers as a crash, in others as weights that go non-finite, so it is a flag error.
FLOAT32_MAX = 3.4028234663852886e38  # torch.finfo(torch.float32).max, written out: the parser imports no torch
MIN_MIXUP = 1e-3


def check_values(args: argparse.Namespace) -> None:
    """Check each value on its own: ranges argparse's types do not cover. Raises :class:`UserError`."""
    floats = ("lr", "end_lr", "momentum", "weight_decay", "label_smoothing", "mixup", "cutmix", "rmsprop_alpha",
              "rmsprop_eps", "use_ema", "static_loss_scale", "hflip", "norm_weight_decay", "bias_weight_decay",
              "model_ema_decay")
    for name in floats:
        value = getattr(args, name)
        if value is not None and not (math.isfinite(value) and abs(value) <= FLOAT32_MAX):
            raise UserError(f"--{name.replace('_', '-')} must be a finite number that float32 can hold (at most "
                            f"{FLOAT32_MAX:.4g} in size), got {value}")
    low, high = args.crop_scale
    if not (math.isfinite(low) and math.isfinite(high) and 0.0 < low <= high <= 1.0):
        raise UserError(f"--crop-scale needs 0 < MIN <= MAX <= 1, got {low} {high}")
    checks = (
        (args.workers < 0, f"-j/--workers must be 0 or more, got {args.workers}"),
        *((value is not None and value < MIN_IMAGE_SIZE,
           f"{flag} must be at least {MIN_IMAGE_SIZE} (the network reduces its input 32-fold), got {value}")
          for flag, value in (("--image-size", args.image_size), ("--train-crop-size", args.train_crop_size),
                              ("--val-resize-size", args.val_resize_size), ("--val-crop-size", args.val_crop_size))),
        (args.seed is not None and not 0 <= args.seed < 2**63,
         f"--seed must be 0 to 2**63 - 1 (checkpoints record it, and a resume refuses any other), got {args.seed}"),
        (args.lr < 0, f"--lr must be 0 or more, got {args.lr}"),
        (args.end_lr < 0, f"--end-lr must be 0 or more, got {args.end_lr}"),
        (not 0.0 <= args.momentum < 1.0, f"--momentum must be in [0, 1), got {args.momentum}"),
        (args.weight_decay < 0, f"--weight-decay must be 0 or more, got {args.weight_decay}"),
        (not 0.0 <= args.rmsprop_alpha < 1.0, f"--rmsprop-alpha must be in [0, 1), got {args.rmsprop_alpha}"),
        (args.rmsprop_eps <= 0, f"--rmsprop-eps must be positive, got {args.rmsprop_eps}"),
        (args.warmup < 0, f"--warmup must be 0 or more, got {args.warmup}"),
        (not 0 <= args.label_smoothing < 1, f"--label-smoothing must be in [0, 1), got {args.label_smoothing}"),
        (args.mixup != 0 and not args.mixup >= MIN_MIXUP,
         f"--mixup must be 0 (off) or at least {MIN_MIXUP} (a smaller alpha draws NaN weights), got {args.mixup}"),
        (args.cutmix != 0 and not args.cutmix >= MIN_MIXUP,
         f"--cutmix must be 0 (off) or at least {MIN_MIXUP} (a smaller alpha draws NaN weights), got {args.cutmix}"),
        (args.randaugment_magnitude is not None and not 0 <= args.randaugment_magnitude < RANDAUGMENT_BINS,
         f"--randaugment-magnitude must be 0 to {RANDAUGMENT_BINS - 1}, got {args.randaugment_magnitude}"),
        (args.use_ema is not None and not 0.0 < args.use_ema < 1.0,
         f"--use-ema needs a decay between 0 and 1, got {args.use_ema}"),
        (args.model_ema_decay is not None and not 0.0 < args.model_ema_decay < 1.0,
         f"--model-ema-decay needs a decay between 0 and 1, got {args.model_ema_decay}"),
        (args.norm_weight_decay is not None and args.norm_weight_decay < 0,
         f"--norm-weight-decay must be 0 or more, got {args.norm_weight_decay}"),
        (args.bias_weight_decay is not None and args.bias_weight_decay < 0,
         f"--bias-weight-decay must be 0 or more, got {args.bias_weight_decay}"),
        (args.static_loss_scale is not None and args.static_loss_scale <= 0,
         f"--static-loss-scale must be positive, got {args.static_loss_scale}"),
        (args.optimizer_batch_size == 0 or args.optimizer_batch_size < -1,
         f"--optimizer-batch-size must be -1 (off) or positive, got {args.optimizer_batch_size}"),
        (args.gather_checkpoints < -1,
         f"--gather-checkpoints must be -1 (all), 0 (none) or a count, got {args.gather_checkpoints}"),
        (args.dist_timeout > MAX_WAIT_S,
         f"--dist-timeout must be at most a year ({MAX_WAIT_S:,} seconds), got {args.dist_timeout:g}"),
        (args.dist_timeout < 1,  # shorter, the processes' own start-up or the first save times out
         f"--dist-timeout must be at least 1 second, got {args.dist_timeout:g}"),
    )
    for failed, message in checks:
        if failed:
            raise UserError(message)
    if args.checkpoint_interval is not None:
        try:
            CheckpointInterval.parse(args.checkpoint_interval)
        except ValueError as error:
            raise UserError(f"--checkpoint-interval {error}") from None


def validate_args(args: argparse.Namespace, *, require_data: bool = True) -> None:
    """Check values and their combinations. Raises :class:`UserError`."""
    check_values(args)
    if require_data and args.data is None and args.data_backend != "synthetic":
        raise UserError("the dataset directory DIR is required unless --data-backend synthetic is used")
    if args.evaluate and args.training_only:
        raise UserError("--evaluate and --training-only exclude each other")
    if args.nesterov and (args.optimizer != "sgd" or args.momentum <= 0):
        raise UserError("--nesterov needs --optimizer sgd with a positive --momentum")
    _check_augmentation_flags(args)
    check_optimisation_combinations(args)
    if args.resume and args.pretrained_weights:
        raise UserError("--resume and --pretrained-weights exclude each other: a checkpoint already holds weights")
    _check_runtime_flags(args)
    if args.compile:
        from .runtime import compile_unsupported

        if reason := compile_unsupported():
            raise UserError(f"--compile: {reason} (or leave --compile out)")


def _check_runtime_flags(args: argparse.Namespace) -> None:
    """--runtime onnxruntime validates the exported graph as it is: only with --evaluate, and with nothing that
    changes how PyTorch would run the model."""
    check_int8_flags(args, needs_runtime=True)
    if args.runtime != "onnxruntime":
        return
    if not args.evaluate:
        raise UserError("--runtime onnxruntime validates an exported model: it needs --evaluate")
    changes = [flag for flag, given in (("--amp", args.amp), ("--jit script", args.jit != "no"),
                                        ("--compile", args.compile)) if given]
    if changes:
        raise UserError(f"--runtime onnxruntime runs the exported graph as it is (FP32, or int8 with --quantize "
                        f"int8); leave out {changes[0]}")


def _check_augmentation_flags(args: argparse.Namespace) -> None:
    """A flag that only tunes another must come with it: alone it would do nothing, silently."""
    randaugment = args.randaugment_magnitude is not None or args.randaugment_num_ops is not None
    if randaugment and args.augmentation != "randaugment":
        raise UserError("--randaugment-magnitude and --randaugment-num-ops need --augmentation randaugment")
    if args.mixup_switch_prob is not None and not (args.mixup > 0 and args.cutmix > 0):
        raise UserError("--mixup-switch-prob chooses between MixUp and CutMix: it needs both --mixup and --cutmix")


def check_optimisation_combinations(args: argparse.Namespace) -> None:
    """Weight-decay and EMA flags that contradict each other. Raises :class:`UserError`."""
    if args.bn_weight_decay and args.norm_weight_decay is not None:
        raise UserError("--bn-weight-decay and --norm-weight-decay both set the BatchNorm decay: give one "
                        "(--bn-weight-decay is --norm-weight-decay equal to --weight-decay)")
    torchvision_ema = args.model_ema or args.model_ema_decay is not None
    if args.use_ema is not None and torchvision_ema:
        raise UserError("--use-ema and --model-ema / --model-ema-decay are two EMAs: give one (--use-ema DECAY: the "
                        "reference's, every step; --model-ema-decay: torchvision's, every --model-ema-steps)")
    if args.model_ema_steps is not None and not torchvision_ema:
        raise UserError("--model-ema-steps needs --model-ema or --model-ema-decay (--use-ema updates at every "
                        "optimizer step)")
    if args.model_ema_warmup and args.use_ema is None and not torchvision_ema:
        raise UserError("--model-ema-warmup needs an EMA: --use-ema DECAY or --model-ema")
