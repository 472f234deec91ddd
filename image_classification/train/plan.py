"""Set-up: everything a run decides before its first step, from the arguments and what it resumes.

:func:`resolve_run` is the only reader of the parsed arguments after :mod:`arguments`: it finds the
checkpoint to resume, checks it against the flags, settles the seed, the class count, the preprocessing,
the loss scale and gradient accumulation, builds the model with its weights, and returns a :class:`Plan`
whose :class:`RunConfig` is frozen.  Nothing after it reads ``args``.
"""

from __future__ import annotations

import argparse
import math
import uuid
import os
import random
from dataclasses import dataclass, field, replace

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from ..arguments import (DEFAULT_LR_PEAK_EPOCH, DEFAULT_RAPORT_FILE, DEFAULT_WORKERS, LR_BASE, LR_BASE_BATCH,
                         REFERENCE_LR_PER_IMAGE, WARN_LR_FACTOR, CheckpointInterval, linear_scaled_lr, raport_file)
from ..data import DataConfig, decoder_notice, default_backend_notice, resolve_backend
from ..data.files import printable
from ..deploy.quantization import Int8Request, int8_request
from ..errors import UserError
from ..models import build_model, default_image_size, load_weights
from ..models.preprocessing import Preprocessing, choose_preprocessing, orientation_notice, trained_as_stored
from ..models.weights import checked_arch, recorded_num_classes
from ..records import checkpoint as ckpt
from ..records.integrity import recorded_description
from ..records.workspace import Workspace
from ..seeding import mix_seed
from ..system import machine
from ..system.runtime import MEMORY_FORMAT_NAMES, Runtime
from .optim import lr_at
from .startup import DEFAULT_NUM_CLASSES, check_backend, check_fresh_start, class_count_sources, dataset_classes

DEFAULT_LOSS_SCALE = 2.0**16  # where a dynamic fp16 loss scale starts unless told (torch's GradScaler default)


def choose_loss_scale(amp_dtype: torch.dtype | None, static_loss_scale: float | None,
                      dynamic_loss_scale: bool) -> tuple[float, bool, str | None]:
    """(initial scale, dynamic?, a notice or None) for ``--static-loss-scale`` / ``--dynamic-loss-scale``.

    fp16 gradients underflow without a loss scale, so ``--amp`` in fp16 always scales, dynamically
    unless the user fixes the scale: ``--static-loss-scale S`` alone keeps S; with ``--dynamic-loss-scale``
    S is only the start.  bf16 and fp32 runs take no scale at all, and a scale flag there is ignored aloud.
    """
    if amp_dtype != torch.float16:
        if static_loss_scale is None and not dynamic_loss_scale:
            return DEFAULT_LOSS_SCALE, True, None
        why = "without --amp" if amp_dtype is None else "under bf16 autocast, which needs no loss scaling"
        return DEFAULT_LOSS_SCALE, True, f"=> --static-loss-scale / --dynamic-loss-scale are ignored {why}"
    if static_loss_scale is not None and not dynamic_loss_scale:
        return static_loss_scale, False, (
            f"=> fp16 loss scale fixed at {static_loss_scale:g} (--static-loss-scale without "
            "--dynamic-loss-scale); steps whose gradients overflow are skipped, and the scale never adapts")
    return (DEFAULT_LOSS_SCALE if static_loss_scale is None else static_loss_scale), True, None


@dataclass(frozen=True)
class RunConfig:
    """What the run does, resolved once from the arguments (and the resumed checkpoint); read-only."""

    # model
    arch: str
    num_classes: int
    model_options: tuple  # (name, value) pairs given to build_model
    preprocessing: Preprocessing
    jit: str = "no"
    compile: bool = False
    # optimisation
    optimizer: str = "sgd"
    lr: float = 0.1
    lr_schedule: str = "step"
    lr_peak_epoch: int = DEFAULT_LR_PEAK_EPOCH  # the triangular schedule's peak
    warmup: int = 0
    end_lr: float = 0.0
    epochs: int = 90
    momentum: float = 0.9
    weight_decay: float = 1e-4
    nesterov: bool = False
    bn_weight_decay: bool = False
    norm_weight_decay: float | None = None  # None: 0, or weight_decay with bn_weight_decay
    bias_weight_decay: float | None = None  # None: biases decay as their layer's other parameters
    rmsprop_alpha: float = 0.9
    rmsprop_eps: float = 1e-3
    batch_size: int = 256
    accumulation: int = 1
    label_smoothing: float = 0.0
    mixup: float = 0.0
    cutmix: float = 0.0
    mixup_switch_prob: float = 0.5  # with both: the chance that a batch is cut and pasted rather than blended
    random_erase: float = 0.0
    ema_decay: float | None = None
    ema_style: str = "reference"  # "reference" (--use-ema) or "torchvision" (--model-ema)
    ema_steps: int = 1  # optimizer steps per EMA update
    ema_warmup: bool = False  # timm's warm-up (--model-ema-warmup) instead of the style's own
    loss_scale: float = DEFAULT_LOSS_SCALE  # fp16 only: the scale, or where a dynamic one starts
    dynamic_loss_scale: bool = True
    # the run
    seed: int = 0
    run_epochs: int = -1
    early_stopping_patience: int = -1
    prof: int = -1
    benchmark_warmup: int = 0  # iterations left out of the throughput and latency figures (each phase's first)
    print_freq: int = 10
    topk: int = 5
    val_tta: str | None = None  # "flip": validation also reports the logits of each image and its mirror averaged
    evaluate: bool = False
    runtime: str = "torch"  # what --evaluate validates: PyTorch's model, or ONNX Runtime's export of it
    int8: Int8Request | None = None  # with onnxruntime: the int8 model calibrated so
    # what it writes
    run_id: str = ""  # names the run in its raport and checkpoints; kept across resumes
    resumed_from: str | None = None  # the checkpoint this run continues
    raport_file: str = DEFAULT_RAPORT_FILE
    save_checkpoints: bool = True
    gather_checkpoints: int = 0
    checkpoint_interval: CheckpointInterval | None = None
    tensorboard: str | None = None

    def lr_at(self, epoch: int, fraction: float = 0.0) -> float:
        """The learning rate ``fraction`` of the way into 0-based ``epoch`` (only the triangular schedule moves
        within an epoch)."""
        return lr_at(epoch + fraction, base_lr=self.lr, schedule=self.lr_schedule, warmup=self.warmup,
                     epochs=self.epochs, end_lr=self.end_lr, peak_epoch=self.lr_peak_epoch)

    @property
    def lr_per_step(self) -> bool:
        """Whether the learning rate changes at every step rather than once an epoch."""
        return self.lr_schedule == "triangular"

    def describe_model(self) -> dict:
        """What a checkpoint records about the model, so inference can rebuild and feed it."""
        return {"arch": self.arch, "num_classes": self.num_classes, "model_options": dict(self.model_options),
                "preprocessing": self.preprocessing.to_dict()}


@dataclass
class Plan:
    """What :func:`resolve_run` settled: the frozen configuration and what the run starts from."""

    config: RunConfig
    data: DataConfig
    model: nn.Module  # on its device, with the resumed or pretrained weights
    classes: list[str]  # the dataset's class folders, in label order (empty for synthetic data)
    resumed: dict | None = None  # the checkpoint the run continues
    parameters: dict = field(default_factory=dict)  # what the raport's PARAMETER record says


def resolve_seed(seed: int | None, runtime: Runtime) -> int:
    """The run's base seed: the user's, or a fresh one shared by every rank (recorded in checkpoints)."""
    if seed is None:
        seed = random.SystemRandom().randrange(2**31)
        if runtime.distributed:
            shared = torch.tensor([seed], dtype=torch.int64, device=runtime.device)
            with runtime.waiting_for_peers("sharing the seed"):
                dist.broadcast(shared, src=0)
                seed = int(shared.item())
    return seed


def grad_accumulation_steps(optimizer_batch_size: int, batch_size: int, world_size: int) -> int:
    """Micro-batches per optimizer step (the reference's BSM); the global batch must divide evenly."""
    if optimizer_batch_size < 0:
        return 1
    per_step = batch_size * world_size
    if optimizer_batch_size < per_step or optimizer_batch_size % per_step:
        raise UserError(
            f"--optimizer-batch-size {optimizer_batch_size} must be a multiple of world size x batch size "
            f"= {world_size} x {batch_size} = {per_step}"
        )
    return optimizer_batch_size // per_step


def resolve_lr(lr: float | None, global_batch: int, *, optimizer: str, warmup: int) -> tuple[float, str | None]:
    """(learning rate, a start-up line or None): ``--lr`` as given, or the linear scaling rule's without it.

    The line says where a rate not given came from, or warns where an SGD rate given is far above the
    reference's per image (more than :data:`WARN_LR_FACTOR` times its 0.001) with no warm-up: such a run may
    lose its first epoch, or diverge."""
    if lr is None:
        lr = linear_scaled_lr(global_batch)
        return lr, (f"=> learning rate {lr:g}: {LR_BASE:g} per {LR_BASE_BATCH} images of the global batch of "
                    f"{global_batch} (the linear scaling rule; --lr sets another)")
    per_image = lr / global_batch
    if optimizer != "sgd" or warmup > 0 or per_image <= WARN_LR_FACTOR * REFERENCE_LR_PER_IMAGE:
        return lr, None
    return lr, (f"=> --lr {lr:g} is {per_image:.2g} per image of the global batch of {global_batch}, "
                f"{per_image / REFERENCE_LR_PER_IMAGE:.1f}x the reference's {REFERENCE_LR_PER_IMAGE:g}, with no "
                f"--warmup: the first epoch may diverge; leave --lr out for {linear_scaled_lr(global_batch):g} "
                f"({LR_BASE:g} per {LR_BASE_BATCH} images), or add --warmup E (epoch e < E trains at (e + 1) / E of "
                "the rate)")


def model_options(args: argparse.Namespace) -> dict:
    options = {"model_config": args.model_config, "last_bn_0_init": bool(args.last_bn_0_init)}
    if args.conv_init is not None:
        options["conv_init"] = args.conv_init
    return options


def _broadcast_choice(value, runtime: Runtime):
    """Rank 0's ``value`` on every rank (a collective in distributed runs)."""
    if not runtime.distributed:
        return value
    box = [value]
    with runtime.waiting_for_peers("waiting for rank 0's choice of checkpoint"):
        dist.broadcast_object_list(box, src=0)
    return box[0]


def find_resume_checkpoint(args: argparse.Namespace, workspace: Workspace, runtime: Runtime, log
                           ) -> tuple[str | None, dict | None]:
    """(path, checkpoint) that --resume names; ``auto``: the valid one of the workspace furthest along, or none.
    With ``--pretrained-weights`` too (a fine-tune that is requeued), what ``auto`` found is said beside the
    weights: they start the run, a checkpoint continues it."""
    if not args.resume:
        return None, None
    if args.resume != "auto":
        if not os.path.isfile(args.resume):
            raise UserError(f"--resume {args.resume}: no such checkpoint file")
        log(f"=> loading checkpoint '{args.resume}'")
        return args.resume, ckpt.load_checkpoint(args.resume)
    chosen, state = furthest_checkpoint(workspace.resume_candidates(), log) if runtime.is_main else (None, None)
    chosen = _broadcast_choice(chosen, runtime)
    weights = args.pretrained_weights
    if chosen is None:
        start = f"the pretrained weights '{weights}'" if weights else "scratch"
        log(f"=> --resume auto: no checkpoint in {workspace.path}; starting from {start}")
        return None, None
    beside = f" (the run continues from it; --pretrained-weights '{weights}' only started it)" if weights else ""
    log(f"=> --resume auto: loading checkpoint '{chosen}'{beside}")
    return chosen, state if state is not None else ckpt.load_checkpoint(chosen)


def recorded_progress(state: dict) -> tuple[int, int]:
    """How far a checkpoint's run got: (epochs finished, batches of the next one)."""
    return state["epoch"], state.get("batch", 0)


def furthest_checkpoint(candidates: list, log) -> tuple[str | None, dict | None]:
    """(path, checkpoint) of the one among ``candidates`` (in the order that wins a tie) whose recorded progress is
    furthest along, its hash verified; a damaged one is named in a line and passed over.  A per-epoch file is
    read only when its name promises more than the best one read so far (the last epoch's comes first)."""
    chosen, state = None, None
    for candidate in candidates:
        index = ckpt.epoch_checkpoint_index(candidate.name)
        if state is not None and index is not None and (index + 1, 0) <= recorded_progress(state):
            continue
        try:
            loaded = ckpt.load_checkpoint(candidate)
            check_progress(loaded, str(candidate))
        except UserError as error:
            log(f"=> cannot resume from {candidate}: {error}; trying the other checkpoints")
            continue
        if state is None or recorded_progress(loaded) > recorded_progress(state):
            chosen, state = str(candidate), loaded
    return chosen, state


def _recorded(resumed: dict | None, pretrained: dict | None, evaluate: bool) -> tuple[dict, str]:
    """What the weights we start from record about the model, and how to call them in messages."""
    if resumed is not None:
        return recorded_description(resumed), "the checkpoint"
    if pretrained is not None and evaluate:
        return recorded_description(pretrained), "the weights"
    return {}, ""


def data_config(args: argparse.Namespace, image_size: int, **overrides) -> DataConfig:
    """The data backends' configuration that main.py's flags describe; ``overrides`` replace fields."""
    fields = dict(
        data=getattr(args, "data", None), backend=args.data_backend, image_size=image_size,
        batch_size=args.batch_size, workers=args.workers, prefetch=args.prefetch,
        crop_scale=tuple(args.crop_scale), hflip=args.hflip, interpolation=args.interpolation or "bilinear",
        augmentation=args.augmentation, ra_reps=args.ra_reps, seed=args.seed if args.seed is not None else 0,
        num_classes=args.num_classes, synthetic_length=max(0, args.prof),
        decode_scale=args.decode_scale,
    )
    if args.randaugment_magnitude is not None:
        fields["randaugment_magnitude"] = args.randaugment_magnitude
    if args.randaugment_num_ops is not None:
        fields["randaugment_num_ops"] = args.randaugment_num_ops
    fields.update(overrides)
    return DataConfig(**fields)


def resolve_num_classes(args, weights: dict | None, classes: list[str], log) -> int:
    """The class count, from the first of :func:`class_count_sources` that knows it; ``weights``: the checkpoint
    or weights that source reads, ``classes``: the dataset's class folders."""
    number = source = None
    for source in class_count_sources(args):
        if source == "--num-classes":
            number = args.num_classes
        elif source in ("checkpoint", "weights"):
            number = recorded_num_classes(weights)
        elif source == "dataset":
            number = len(classes) or None
        else:
            number = DEFAULT_NUM_CLASSES
        if number is not None:
            break
    number = int(number if number is not None else DEFAULT_NUM_CLASSES)
    if source == "dataset":
        log(f"=> {number} classes: the dataset's class folders")
    if classes and len(classes) > number:
        raise UserError(f"the dataset has {len(classes)} classes but the model has {number}; pass --num-classes "
                        f"{len(classes)}")
    if classes and len(classes) < number:
        whose = "--num-classes" if args.num_classes is not None else "the weights"
        log(f"=> {whose}: a {number}-class head for the dataset's {len(classes)} class folders; outputs beyond "
            f"them are never right{'' if args.evaluate else ' and take part in the loss'}")
    return number


def resolve_preprocessing(args, recorded: dict, source: str, log) -> Preprocessing:
    """Crop sizes and interpolation: the flags, else what the checkpoint was trained with, else the arch's."""
    before = None
    if isinstance(recorded.get("preprocessing"), dict):
        before = Preprocessing.from_dict(recorded["preprocessing"], source)
    return choose_preprocessing(before, default_image_size(args.arch), source, lambda line: log(f"=> {line}"),
                                image_size=args.image_size, train_crop_size=args.train_crop_size,
                                val_crop_size=args.val_crop_size, val_resize_size=args.val_resize_size,
                                interpolation=args.interpolation, progressive_resize=args.progressive_resize,
                                training=not args.evaluate)


def class_label_changes(recorded: list[str], classes: list[str]) -> list[str]:
    """What changed between the class names a checkpoint records, in label order, and the dataset's: each class
    at another label ("class_01 from label 1 to 0"), each new one at a label the checkpoint trained ("class_zz
    (new) at class_02's label 2"), then each recorded class gone; [] when every label the two share names the
    same class (classes added after the last one, or the last ones removed, move nothing)."""
    if all(then == now for then, now in zip(recorded, classes)):
        return []
    before, changes = {name: label for label, name in enumerate(recorded)}, []
    for label, name in enumerate(classes):
        if name in before and before[name] != label:
            changes.append(f"{printable(name)} from label {before[name]} to {label}")
        elif name not in before and label < len(recorded):
            changes.append(f"{printable(name)} (new) at {printable(recorded[label])}'s label {label}")
    now = set(classes)
    return changes + [f"{printable(name)} is gone" for name in recorded if name not in now]


def check_class_labels(weights: dict | None, classes: list[str], source: str | None, allowed: bool, log) -> None:
    """Refuse weights (a checkpoint resumed or evaluated) whose recorded classes sit at other labels than the
    dataset's class folders give them: every image of such a class would train, or be scored on, another class's
    output.  One line naming the classes that moved; ``allowed`` (``--allow-class-changes``) goes on, said."""
    recorded = recorded_description(weights).get("classes") if weights is not None else None
    if not classes or not isinstance(recorded, list) or not all(isinstance(name, str) for name in recorded):
        return
    changes = class_label_changes(recorded, classes)
    if not changes:
        return
    shown = ", ".join(changes[:6]) + (f" and {len(changes) - 6} more" if len(changes) > 6 else "")
    moved = f"the class folders do not give the labels {source} was trained with: {shown}"
    if allowed:
        log(f"=> --allow-class-changes: {moved}; each label now stands for the class the folders give it")
        return
    raise UserError(f"{moved}; every image of those classes would train, or be scored on, another class's "
                    "output: restore the class folders' names, or pass --allow-class-changes to go "
                    "on with the labels they give now")


def resolve_topk(args, num_classes: int) -> int:
    if args.topk is None:
        return min(5, num_classes)
    if args.topk > num_classes:
        raise UserError(f"--topk {args.topk} exceeds the number of classes, {num_classes}")
    return args.topk


TORCHVISION_EMA_DECAY, TORCHVISION_EMA_STEPS = 0.99998, 32  # torchvision train.py's defaults


def ema_options(args: argparse.Namespace) -> dict:
    """RunConfig's EMA fields: --use-ema's (the reference's) or --model-ema's (torchvision's), or off."""
    if args.model_ema or args.model_ema_decay is not None:
        decay = TORCHVISION_EMA_DECAY if args.model_ema_decay is None else args.model_ema_decay
        return {"ema_decay": decay, "ema_style": "torchvision", "ema_warmup": args.model_ema_warmup,
                "ema_steps": args.model_ema_steps or TORCHVISION_EMA_STEPS}
    return {"ema_decay": args.use_ema, "ema_warmup": args.model_ema_warmup}


def build_config(args: argparse.Namespace, *, seed: int, num_classes: int, preprocessing: Preprocessing,
                 topk: int, accumulation: int, loss_scale: tuple[float, bool, str | None], lr: float) -> RunConfig:
    interval = CheckpointInterval.parse(args.checkpoint_interval) if args.checkpoint_interval else None
    return RunConfig(
        arch=args.arch, num_classes=num_classes, model_options=tuple(model_options(args).items()),
        preprocessing=preprocessing, jit=args.jit, compile=args.compile,
        optimizer=args.optimizer, lr=lr, lr_schedule=args.lr_schedule, warmup=args.warmup, end_lr=args.end_lr,
        lr_peak_epoch=DEFAULT_LR_PEAK_EPOCH if args.lr_peak_epoch is None else args.lr_peak_epoch,
        epochs=args.epochs, momentum=args.momentum, weight_decay=args.weight_decay, nesterov=args.nesterov,
        bn_weight_decay=args.bn_weight_decay, norm_weight_decay=args.norm_weight_decay,
        bias_weight_decay=args.bias_weight_decay, rmsprop_alpha=args.rmsprop_alpha, rmsprop_eps=args.rmsprop_eps,
        batch_size=args.batch_size, accumulation=accumulation, label_smoothing=args.label_smoothing,
        mixup=args.mixup, **ema_options(args), loss_scale=loss_scale[0], dynamic_loss_scale=loss_scale[1],
        cutmix=args.cutmix, random_erase=args.random_erase,
        mixup_switch_prob=0.5 if args.mixup_switch_prob is None else args.mixup_switch_prob,
        seed=seed, run_epochs=args.run_epochs,
        early_stopping_patience=args.early_stopping_patience, prof=args.prof,
        benchmark_warmup=args.benchmark_warmup, print_freq=args.print_freq,
        topk=topk, val_tta=args.val_tta, evaluate=args.evaluate, runtime=args.runtime, int8=int8_request(args), raport_file=raport_file(args),
        save_checkpoints=args.save_checkpoints and not args.evaluate, gather_checkpoints=args.gather_checkpoints,
        checkpoint_interval=interval, tensorboard=args.tensorboard,
    )


def build_model_for(config: RunConfig, runtime: Runtime, resumed: dict | None, resume_path: str | None, pretrained,
                    args, log) -> nn.Module:
    """The model on the device, with the resumed or pretrained weights when asked."""
    model = build_model(config.arch, num_classes=config.num_classes, **dict(config.model_options))
    if resumed is not None:
        load_weights(model, resumed["state_dict"], log=log, label=resume_path)
        log(f"=> loaded checkpoint ({ckpt.position_text(resumed['epoch'], resumed.get('batch', 0))})")
    elif pretrained is not None:
        # Fine-tuning may replace the head; evaluating a freshly initialised head would be meaningless.
        load_weights(model, pretrained, allow_head_mismatch=not config.evaluate, log=log,
                     label=args.pretrained_weights)
        log(f"=> loaded pretrained weights '{args.pretrained_weights}'")
    return model.to(runtime.device, memory_format=runtime.memory_format)




def reseed(seed: int, rank: int, epoch: int = 0, iterations: int = 0) -> None:
    """Seed python, numpy and torch (CPU and CUDA) from the run seed, the global rank and the position."""
    process_seed = mix_seed(seed + rank, epoch, iterations)
    random.seed(process_seed)
    np.random.seed(process_seed % 2**32)
    torch.manual_seed(process_seed)


PROGRESS_COUNTS = ("epoch", "batch", "optimizer_steps", "skipped_steps", "iterations", "epochs_without_improvement",
                   "ema_updates")


def check_progress(state: dict, path: str) -> None:
    """A checkpoint's position and seed, held to the flags' rules: a crafted or damaged value whose hash
    still matches is one line, not a traceback later."""
    def whole(value, low: int, high: int) -> bool:
        return isinstance(value, int) and not isinstance(value, bool) and low <= value < high

    for name in PROGRESS_COUNTS:
        if not whole(state.get(name, 0), 0, 2**62):
            raise UserError(f"{path} records {name} = {str(state.get(name))[:40]}, not a count; it cannot be resumed")
    for name, low in (("seed", 0), ("world_size", 1), ("batch_size", 1)):
        if state.get(name) is not None and not whole(state[name], low, 2**63):
            raise UserError(f"{path} records {name} = {str(state[name])[:40]}, out of range; it cannot be resumed")
    best = state.get("best_prec1", 0.0)
    if not (isinstance(best, (int, float)) and math.isfinite(best)):
        raise UserError(f"{path} records best_prec1 = {str(best)[:40]}, not a number; it cannot be resumed")


def resolve_run(args: argparse.Namespace, runtime: Runtime, workspace: Workspace, log) -> Plan | None:
    """Everything the run decides before its first step (see the module docstring); None when a
    ``--resume auto`` run finds its work already done."""
    loss_scale = choose_loss_scale(runtime.amp_dtype, args.static_loss_scale, args.dynamic_loss_scale)
    if loss_scale[2]:
        log(loss_scale[2])
    backend = resolve_backend(args.data_backend, runtime.is_cuda)
    if args.data_backend is None:  # otherwise only the raport would say which
        log(default_backend_notice(backend, runtime.is_cuda))
    # What cannot work at all (this machine, the dataset) is said before what an earlier run left in the
    # workspace: the user fixes the first, then meets the second, never the other way round.
    check_backend(backend, runtime.is_cuda, args.augmentation, training=not args.evaluate)
    decoder = decoder_notice(backend, runtime.device, args.decode_scale)
    if decoder is not None:
        log(decoder)
    classes = dataset_classes(args, backend)
    check_fresh_start(args, workspace, log)
    resume_path, resumed = find_resume_checkpoint(args, workspace, runtime, log)
    if resumed is not None:
        check_progress(resumed, resume_path)
    if resumed is not None:
        checked_arch(resumed, args.arch, resume_path)
    if resumed is not None and not args.evaluate and resumed.get("stopped_early"):
        if args.resume == "auto":
            log(f"=> {resume_path} is a run that early stopping ended: nothing to do")
            return None
        log(f"=> {resume_path} is a run that early stopping ended; training on from it, as asked")
    elif resumed is not None and not args.evaluate and int(resumed["epoch"]) >= args.epochs:
        if args.resume == "auto":
            log(f"=> {resume_path} already finished all {args.epochs} epochs: nothing to do")
            return None
        raise UserError(f"the checkpoint already ran {resumed['epoch']} of --epochs {args.epochs}; raise --epochs "
                        "to train further, or add --evaluate to validate it")
    pretrained = None
    if resumed is None and args.pretrained_weights:
        pretrained = ckpt.load_checkpoint_file(args.pretrained_weights)
        checked_arch(pretrained, args.arch, args.pretrained_weights)  # before their keys are compared one by one

    seed = resolve_seed(resumed.get("seed", args.seed) if resumed is not None else args.seed, runtime)
    log(f"Using seed = {seed}")
    reseed(seed, runtime.rank)
    recorded, source = _recorded(resumed, pretrained, args.evaluate)
    described = resumed if resumed is not None else (pretrained if args.evaluate else None)
    check_class_labels(described, classes, resume_path or args.pretrained_weights, args.allow_class_changes, log)
    num_classes = resolve_num_classes(args, described, classes, log)
    preprocessing = resolve_preprocessing(args, recorded, source, log)
    if pretrained is not None and not args.evaluate and trained_as_stored(recorded_description(pretrained)):
        log(f"=> {orientation_notice(args.pretrained_weights, trains_anew=True)}")
    schedule = preprocessing.train_schedule
    smallest = schedule.min_size if schedule is not None else preprocessing.train_size  # the smallest training crop
    if not args.evaluate and args.batch_size == 1 and smallest <= 32:
        raise UserError(f"-b 1 cannot train at {smallest} px: the last feature map is one pixel, and "
                        "BatchNorm cannot normalise a single value; use -b 2 or more, or larger training crops")
    accumulation = grad_accumulation_steps(args.optimizer_batch_size, args.batch_size, runtime.world_size)
    if accumulation > 1:
        log(f"=> gradient accumulation: {accumulation} micro-batches of {args.batch_size} per optimizer step")
    lr, lr_note = resolve_lr(args.lr, args.batch_size * runtime.world_size * accumulation, optimizer=args.optimizer,
                             warmup=args.warmup)
    if lr_note and not args.evaluate and (args.lr is None or resumed is None):
        log(lr_note)
    config = build_config(args, seed=seed, num_classes=num_classes, preprocessing=preprocessing,
                          topk=resolve_topk(args, num_classes), accumulation=accumulation, loss_scale=loss_scale, lr=lr)
    recorded_run = (resumed.get("raport") or {}).get("run") if resumed is not None else None
    config = replace(config, run_id=recorded_run or uuid.uuid4().hex[:16], resumed_from=resume_path)
    model = build_model_for(config, runtime, resumed, resume_path, pretrained, args, log)
    workers = min(args.workers, machine.cores())
    if workers < args.workers and args.workers != DEFAULT_WORKERS:  # the reference's default says nothing
        log(f"=> -j {args.workers} is more than the {workers} cores this process may use: {workers} loader workers")
    data = data_config(args, preprocessing.image_size, train_crop_size=preprocessing.train_crop_size,
                       train_schedule=preprocessing.train_schedule,
                       backend=backend, seed=seed, num_classes=num_classes,
                       interpolation=preprocessing.interpolation, workers=workers,
                       crop_ratio=preprocessing.crop_ratio, mean=preprocessing.mean, std=preprocessing.std,
                       exif_orientation=preprocessing.exif_orientation)
    parameters = {**vars(args), "data_backend": backend, "seed": seed, "num_classes": num_classes, "lr": lr,
                  "topk": config.topk, "world_size": runtime.world_size, "device": str(runtime.device),
                  "memory_format": MEMORY_FORMAT_NAMES[runtime.memory_format],
                  "amp_dtype": str(runtime.amp_dtype), "image_size": preprocessing.image_size,
                  "train_crop_size": preprocessing.train_size, "val_resize_size": preprocessing.resize_size,
                  "progressive_resize": preprocessing.train_schedule.as_flag() if preprocessing.train_schedule
                  else None,
                  "val_crop_size": preprocessing.image_size,
                  "interpolation": preprocessing.interpolation, "run_id": config.run_id}
    return Plan(config, data, model, classes, resumed, parameters)
