"""The ``optimisation`` group: the schedule, the optimizer, the loss's regularisers and the weights' EMA."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from ..errors import UserError
from ..system.cli import positive_int, whole_number
from .values import add_group, flag, float32, probability, raise_first

LR_SCHEDULES = ("step", "linear", "cosine", "triangular")
LR_SCHEDULE_ALIASES = {"cyclic": "triangular"}  # FFCV's name for its one-cycle triangle
OPTIMIZERS = ("sgd", "rmsprop", "adamw", "lamb", "lars")
MIN_MIXUP = 1e-3
DEFAULT_LR_PEAK_EPOCH = 2  # FFCV's lr_peak_epoch
# The linear scaling rule of a run without --lr (Goyal et al. 2017; timm's --lr-base and --lr-base-size): LR_BASE
# per LR_BASE_BATCH images of the global batch, so 0.1 at -b 256 on one process, the reference's default.
LR_BASE, LR_BASE_BATCH = 0.1, 256
# The reference's recipes train at 0.001 per image of the global batch (0.256 per 256), always after a warm-up
# (8 epochs); an SGD run without one above WARN_LR_FACTOR times that is told so at start-up.
REFERENCE_LR_PER_IMAGE, WARN_LR_FACTOR = 0.001, 2.0


def _lr_schedule(value: str) -> str:
    value = LR_SCHEDULE_ALIASES.get(value, value)
    if value not in LR_SCHEDULES:
        raise argparse.ArgumentTypeError(f"invalid choice: {value!r} (choose from {', '.join(LR_SCHEDULES)})")
    return value


@dataclass(frozen=True)
class EmaChoice:
    """The weights' EMA a run keeps: its decay (None: none), style (``reference``, --use-ema: every optimizer step
    with its warm-up; ``torchvision``, --model-ema: every ``steps`` steps, the decay adjusted to the batch) and
    whether timm's warm-up replaces the style's own."""

    decay: float | None = None
    style: str = "reference"
    steps: int = 1
    warmup: bool = False


TORCHVISION_EMA_DECAY, TORCHVISION_EMA_STEPS = 0.99998, 32  # torchvision train.py's defaults


@dataclass(frozen=True)
class OptimConfig:
    """The ``optimisation`` group: the schedule, the optimizer, the loss's regularisers and the weights' EMA; ``lr``
    as :func:`resolve_lr` settles it for the run, and ``accumulation``, the micro-batches of an optimizer step."""

    epochs: int = flag("--epochs", default=90, metavar="N", type=positive_int,
                       help="number of total epochs to run; the length of the LR schedule (default: 90)")
    run_epochs: int = flag("--run-epochs", default=-1, metavar="N", type=whole_number,
                           help="run only N epochs, used for checkpointing runs (default: -1, all)")
    early_stopping_patience: int = flag("--early-stopping-patience", default=-1, metavar="N",
                                        type=whole_number, help="stop after N validated epochs in a row "
                                        "without a new best top1; an epoch whose validation gives no "
                                        "figure (outputs not finite) does not count (default: -1, never)")
    optimizer_batch_size: int = flag("--optimizer-batch-size", default=-1, metavar="N", type=whole_number,
                                     help="size of a total batch size, for simulating bigger batches using "
                                     "gradient accumulation; a multiple of world size x batch size "
                                     "(default: -1, off)")
    optimizer: str = flag("--optimizer", default="sgd", choices=OPTIMIZERS,
                          help="optimizer: sgd | rmsprop | adamw | lamb | lars; AdamW and LAMB use betas "
                          "0.9, 0.999 and take no --momentum (default: sgd)")
    lr: float | None = flag("--lr", "--learning-rate", metavar="LR", type=float32,
                            help=f"initial learning rate (default: {LR_BASE:g} x the global batch / {LR_BASE_BATCH}, "
                            f"the linear scaling rule: {LR_BASE:g} at -b {LR_BASE_BATCH} on one process)")
    lr_batch: int | None = flag("--lr-batch", metavar="N", type=positive_int,
                                help="the global batch --lr is stated for: the run scales it linearly to "
                                "its own global batch (processes x -b, or --optimizer-batch-size), as "
                                "FFCV's recipes state theirs (default: none, --lr as given)")
    lr_schedule: str = flag("--lr-schedule", default="step", metavar="SCHEDULE", type=_lr_schedule,
                            help="type of LR schedule: step, linear, cosine, or triangular (alias cyclic: "
                            "FFCV's, set at every step: from 1e-4 x LR up to LR at --lr-peak-epoch, then "
                            "down to 0 at the end) (default: step)")
    lr_peak_epoch: int | None = flag("--lr-peak-epoch", metavar="E", type=whole_number,
                                     help="--lr-schedule triangular: the epoch at whose start the LR peaks "
                                     "(default: 2, FFCV's)")
    end_lr: float = flag("--end-lr", default=0.0, metavar="LR", type=float32,
                         help="final learning rate of the cosine schedule (default: 0)")
    warmup: int = flag("--warmup", default=0, metavar="E", type=whole_number,
                       help="number of warmup epochs (default: 0)")
    label_smoothing: float = flag("--label-smoothing", default=0.0, metavar="S", type=float32,
                                  help="label smoothing (default: 0)")
    mixup: float = flag("--mixup", default=0.0, metavar="ALPHA", type=float32,
                        help="mixup alpha (default: 0, off)")
    cutmix: float = flag("--cutmix", default=0.0, metavar="ALPHA", type=float32,
                         help="cutmix alpha: paste a box of another image, the labels mixed by its area "
                         "(default: 0, off)")
    mixup_switch_prob: float | None = flag("--mixup-switch-prob", metavar="P", type=probability,
                                           help="with both --mixup and --cutmix, the probability that a "
                                           "batch is mixed by CutMix rather than MixUp (default: 0.5)")
    momentum: float = flag("--momentum", default=0.9, metavar="M", type=float32,
                           help="momentum (default: 0.9)")
    weight_decay: float = flag("--weight-decay", "--wd", default=1e-4, metavar="W", type=float32,
                               help="weight decay (default: 1e-4)")
    bn_weight_decay: bool = flag("--bn-weight-decay", action="store_true",
                                 help="use weight_decay on batch normalization learnable parameters, "
                                 "(default: false)")
    norm_weight_decay: float | None = flag("--norm-weight-decay", metavar="W", type=float32,
                                           help="weight decay of the normalisation layers' parameters "
                                           "(default: 0, or --weight-decay with --bn-weight-decay)")
    bias_weight_decay: float | None = flag("--bias-weight-decay", metavar="W", type=float32,
                                           help="weight decay of every bias, normalisation layers' "
                                           "included (default: as the layer's other parameters)")
    nesterov: bool = flag("--nesterov", action="store_true", help="use nesterov momentum, (default: false)")
    rmsprop_alpha: float = flag("--rmsprop-alpha", default=0.9, metavar="A", type=float32,
                                help="RMSprop smoothing constant (default: 0.9)")
    rmsprop_eps: float = flag("--rmsprop-eps", default=1e-3, metavar="EPS", type=float32,
                              help="RMSprop epsilon (default: 1e-3)")
    use_ema: float | None = flag("--use-ema", metavar="DECAY", type=float32,
                                 help="keep an exponential moving average of the weights with this decay, "
                                 "validated as val_ema: the reference's EMA, updated every optimizer step "
                                 "with a warm-up of min(DECAY, (1 + step) / (10 + step)) (default: off)")
    model_ema: bool = flag("--model-ema", action="store_true", help="torchvision's EMA instead: "
                           "--model-ema-decay adjusted to the batch and the update interval, restarted "
                           "from the weights during --warmup epochs (default: off)")
    model_ema_decay: float | None = flag("--model-ema-decay", metavar="DECAY", type=float32,
                                         help="torchvision's --model-ema-decay, before it is adjusted to "
                                         "the batch and the interval; implies --model-ema (default: "
                                         "0.99998)")
    model_ema_steps: int | None = flag("--model-ema-steps", metavar="N", type=positive_int,
                                       help="update torchvision's EMA every N optimizer steps (default: "
                                       "32)")
    model_ema_warmup: bool = flag("--model-ema-warmup", action="store_true",
                                  help="timm's EMA warm-up, min(DECAY, 1 - (1 + n)^(-2/3)) after n "
                                  "updates, for --use-ema or --model-ema (default: off)")

    accumulation: int = 1  # micro-batches per optimizer step (the reference's BSM), from --optimizer-batch-size

    @property
    def peak_epoch(self) -> int:
        """The triangular schedule's peak: ``--lr-peak-epoch``, else FFCV's."""
        return DEFAULT_LR_PEAK_EPOCH if self.lr_peak_epoch is None else self.lr_peak_epoch

    @property
    def switch_prob(self) -> float:
        """With both MixUp and CutMix, the chance that a batch is cut and pasted rather than blended."""
        return 0.5 if self.mixup_switch_prob is None else self.mixup_switch_prob

    @property
    def ema(self) -> EmaChoice:
        """--use-ema's EMA (the reference's) or --model-ema's (torchvision's), or none."""
        if self.model_ema or self.model_ema_decay is not None:
            decay = TORCHVISION_EMA_DECAY if self.model_ema_decay is None else self.model_ema_decay
            steps = self.model_ema_steps or TORCHVISION_EMA_STEPS
            return EmaChoice(decay, "torchvision", steps, self.model_ema_warmup)
        return EmaChoice(self.use_ema, "reference", 1, self.model_ema_warmup)


def add_optimisation_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``optimisation`` group."""
    add_group(parser, "optimisation", OptimConfig)


def linear_scaled_lr(global_batch: int, base: float = LR_BASE, base_batch: int = LR_BASE_BATCH) -> float:
    """The linear scaling rule: ``base`` per ``base_batch`` images, at ``global_batch`` (rounded to 12 digits, so
    that a rate that scales to itself stays as typed); by default the learning rate of a run without ``--lr``
    (:data:`LR_BASE` per :data:`LR_BASE_BATCH`)."""
    return float(f"{base * global_batch / base_batch:.12g}")


def global_batch(batch_size: int, world_size: int, optimizer_batch_size: int = -1) -> int:
    """The images of one optimizer step: ``--optimizer-batch-size`` where positive (gradient accumulation
    reaches it), else every process's ``-b``."""
    return optimizer_batch_size if optimizer_batch_size > 0 else batch_size * world_size


def resolve_lr(lr: float | None, lr_batch: int | None, batch: int, *, optimizer: str, warmup: int
               ) -> tuple[float, str | None]:
    """(learning rate, a start-up line or None) of a run whose optimizer steps take ``batch`` images
    (:func:`global_batch`):
    ``--lr`` as given; scaled linearly from ``--lr-batch`` to ``batch``; without ``--lr`` the linear scaling rule's
    :data:`LR_BASE` per :data:`LR_BASE_BATCH`.  The one place a rate is scaled (``launch.py``'s presets state theirs
    with ``lr_batch``).

    The line says where a rate not given as is came from, or warns where an SGD rate is far above the reference's
    per image (more than :data:`WARN_LR_FACTOR` times its 0.001) with no warm-up: such a run may lose its first
    epoch, or diverge."""
    if lr is None:
        lr = linear_scaled_lr(batch)
        return lr, (f"=> learning rate {lr:g}: {LR_BASE:g} per {LR_BASE_BATCH} images of the global batch of "
                    f"{batch} (the linear scaling rule; --lr sets another)")
    if lr_batch is not None:
        scaled = linear_scaled_lr(batch, lr, lr_batch)
        return scaled, (f"=> learning rate {scaled:g}: --lr {lr:g} for a global batch of {lr_batch} (--lr-batch), "
                        f"scaled to this run's {batch}")
    per_image = lr / batch
    if optimizer != "sgd" or warmup > 0 or per_image <= WARN_LR_FACTOR * REFERENCE_LR_PER_IMAGE:
        return lr, None
    return lr, (f"=> --lr {lr:g} is {per_image:.2g} per image of the global batch of {batch}, "
                f"{per_image / REFERENCE_LR_PER_IMAGE:.1f}x the reference's {REFERENCE_LR_PER_IMAGE:g}, with no "
                f"--warmup: the first epoch may diverge; leave --lr out for {linear_scaled_lr(batch):g} "
                f"({LR_BASE:g} per {LR_BASE_BATCH} images), or add --warmup E (epoch e < E trains at (e + 1) / E of "
                "the rate)")


def check_optimisation_values(args: argparse.Namespace) -> None:
    """The optimisation flags' ranges that argparse's types do not cover. Raises :class:`UserError`."""
    raise_first((
        (args.lr is not None and args.lr < 0, f"--lr must be 0 or more, got {args.lr}"),
        (args.end_lr < 0, f"--end-lr must be 0 or more, got {args.end_lr}"),
        (not 0.0 <= args.momentum < 1.0, f"--momentum must be in [0, 1), got {args.momentum}"),
        (args.weight_decay < 0, f"--weight-decay must be 0 or more, got {args.weight_decay}"),
        (not 0.0 <= args.rmsprop_alpha < 1.0, f"--rmsprop-alpha must be in [0, 1), got {args.rmsprop_alpha}"),
        (args.rmsprop_eps <= 0, f"--rmsprop-eps must be positive, got {args.rmsprop_eps}"),
        (args.warmup < 0, f"--warmup must be 0 or more, got {args.warmup}"),
        (args.lr_peak_epoch is not None and args.lr_peak_epoch < 0,
         f"--lr-peak-epoch must be 0 or more, got {args.lr_peak_epoch}"),
        (not 0 <= args.label_smoothing < 1, f"--label-smoothing must be in [0, 1), got {args.label_smoothing}"),
        (args.mixup != 0 and not args.mixup >= MIN_MIXUP,
         f"--mixup must be 0 (off) or at least {MIN_MIXUP} (a smaller alpha draws NaN weights), got {args.mixup}"),
        (args.cutmix != 0 and not args.cutmix >= MIN_MIXUP,
         f"--cutmix must be 0 (off) or at least {MIN_MIXUP} (a smaller alpha draws NaN weights), got {args.cutmix}"),
        (args.use_ema is not None and not 0.0 < args.use_ema < 1.0,
         f"--use-ema needs a decay between 0 and 1, got {args.use_ema}"),
        (args.model_ema_decay is not None and not 0.0 < args.model_ema_decay < 1.0,
         f"--model-ema-decay needs a decay between 0 and 1, got {args.model_ema_decay}"),
        (args.norm_weight_decay is not None and args.norm_weight_decay < 0,
         f"--norm-weight-decay must be 0 or more, got {args.norm_weight_decay}"),
        (args.bias_weight_decay is not None and args.bias_weight_decay < 0,
         f"--bias-weight-decay must be 0 or more, got {args.bias_weight_decay}"),
        (args.optimizer_batch_size == 0 or args.optimizer_batch_size < -1,
         f"--optimizer-batch-size must be -1 (off) or positive, got {args.optimizer_batch_size}"),
    ))


def check_optimisation_combinations(args: argparse.Namespace) -> None:
    """Optimisation flags that need another or contradict each other. Raises :class:`UserError`."""
    if args.lr_schedule == "triangular":
        if args.warmup:
            raise UserError(f"--lr-schedule triangular climbs to its peak itself (--lr-peak-epoch); leave out "
                            f"--warmup {args.warmup} (or give --warmup 0)")
        peak = DEFAULT_LR_PEAK_EPOCH if args.lr_peak_epoch is None else args.lr_peak_epoch
        if peak >= args.epochs:
            raise UserError(f"--lr-peak-epoch {peak} leaves --epochs {args.epochs} no epoch to come down in: give a "
                            f"peak below {args.epochs}")
    elif args.lr_peak_epoch is not None:
        raise UserError("--lr-peak-epoch places the peak of --lr-schedule triangular: it needs that schedule")
    if args.lr_batch is not None and args.lr is None:
        raise UserError(f"--lr-batch {args.lr_batch} says which global batch --lr is stated for: it needs --lr "
                        f"(without both, the rate is {LR_BASE:g} per {LR_BASE_BATCH} images of the global batch)")
    if args.nesterov and (args.optimizer != "sgd" or args.momentum <= 0):
        raise UserError("--nesterov needs --optimizer sgd with a positive --momentum")
    if args.mixup_switch_prob is not None and not (args.mixup > 0 and args.cutmix > 0):
        raise UserError("--mixup-switch-prob chooses between MixUp and CutMix: it needs both --mixup and --cutmix")
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
