"""Set-up: everything a run decides before its first step, from the arguments and what it resumes.

:func:`resolve_run` is the only reader of the parsed arguments after :mod:`arguments`: each flag group's frozen
configuration comes from them (``from_args``), then the run settles what they leave open (the backend, the seed,
the class count, the preprocessing, the loss scale, gradient accumulation, the learning rate), each in one
function, finds the checkpoint to resume and checks it against the flags, builds the model with its weights, and
returns a :class:`Plan` whose :class:`RunConfig` is frozen: the groups' configurations, composed.  Nothing after it
reads ``args``; the raport records the configuration itself (:meth:`RunConfig.recorded`).
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import uuid
from dataclasses import dataclass, field, replace

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from ..arguments import DEFAULT_WORKERS, global_batch, resolve_lr
from ..arguments.data import DataConfig
from ..arguments.deployed import DeployConfig
from ..arguments.model import ModelConfig
from ..arguments.optimisation import OptimConfig
from ..arguments.precision import PrecisionConfig
from ..arguments.run import RunSettings
from ..arguments.values import from_args
from ..data import augmentation_notice, decoder_notice, default_backend_notice, resolve_backend
from ..deploy.quantization import Int8Request, int8_request
from ..errors import UserError
from ..models import build_model, default_image_size, load_weights
from ..models.preprocessing import Preprocessing, choose_preprocessing, orientation_notice, trained_as_stored
from ..models.quantized import SCHEME as QUANTIZATION_SCHEME
from ..models.quantized import check_quantizers, holds_quantizers, is_quantized, quantize_model, quantizers
from ..models.weights import checked_arch, extract_state_dict, read_weights, recorded_num_classes
from ..records import checkpoint as ckpt
from ..records.integrity import recorded_description
from ..records.workspace import Workspace
from ..seeding import mix_seed
from ..system import machine
from ..system.runtime import Runtime
from .optim import lr_at
from .resume import check_class_labels, check_progress, find_resume_checkpoint
from .startup import DEFAULT_NUM_CLASSES, check_backend, check_fresh_start, class_count_sources


@dataclass(frozen=True)
class RunConfig:
    """What the run does, resolved once from the arguments (and the resumed checkpoint): each flag group's
    configuration, with the values the run settled in it; read-only."""

    model: ModelConfig
    optim: OptimConfig
    data: DataConfig
    precision: PrecisionConfig = PrecisionConfig()
    run: RunSettings = RunSettings()
    deploy: DeployConfig = DeployConfig()
    int8: Int8Request | None = None  # --evaluate --runtime onnxruntime --quantize int8: the int8 model calibrated so

    @property
    def preprocessing(self) -> Preprocessing:
        return self.data.preprocessing

    def lr_at(self, epoch: int, fraction: float = 0.0) -> float:
        """The learning rate ``fraction`` of the way into 0-based ``epoch`` (only the triangular schedule moves
        within an epoch)."""
        optim = self.optim
        return lr_at(epoch + fraction, base_lr=optim.lr, schedule=optim.lr_schedule, warmup=optim.warmup,
                     epochs=optim.epochs, end_lr=optim.end_lr, peak_epoch=optim.peak_epoch)

    @property
    def lr_per_step(self) -> bool:
        """Whether the learning rate changes at every step rather than once an epoch."""
        return self.optim.lr_schedule == "triangular"

    def describe_model(self) -> dict:
        """What a checkpoint records about the model, so inference can rebuild and feed it."""
        described = {"arch": self.model.arch, "num_classes": self.model.num_classes,
                     "model_options": self.model.options(), "preprocessing": self.preprocessing.to_dict()}
        if self.model.quantize_aware:
            described["quantization"] = QUANTIZATION_SCHEME  # trained quantization-aware: export makes it int8
        return described

    def recorded(self) -> dict:
        """The configuration as the raport's PARAMETER record holds it: every group's fields under their flags'
        names (the values the run settled where it settled them), the preprocessing taken as one entry."""
        values = {}
        for group in (self.data, self.model, self.optim, self.precision, self.deploy, self.run):
            values.update(dataclasses.asdict(group))
        settled = self.preprocessing.to_dict()
        # the sizes and interpolation settled (a checkpoint's where no flag said), under their flags' names
        values.update({name: settled[name] for name in ("image_size", "interpolation", "train_crop_size")})
        values["preprocessing"] = settled
        return values


@dataclass
class Plan:
    """What :func:`resolve_run` settled: the frozen configuration and what the run starts from."""

    config: RunConfig
    model: nn.Module  # on its device, with the resumed or pretrained weights
    classes: list[str]  # the dataset's class folders, in label order (empty for synthetic data)
    resumed: dict | None = None  # the checkpoint the run continues
    parameters: dict = field(default_factory=dict)  # what the raport's PARAMETER record says

    @property
    def data(self) -> DataConfig:
        return self.config.data


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


def _recorded(resumed: dict | None, pretrained: dict | None, evaluate: bool) -> tuple[dict, str]:
    """What the weights we start from record about the model, and how to call them in messages."""
    if resumed is not None:
        return recorded_description(resumed), "the checkpoint"
    if pretrained is not None and evaluate:
        return recorded_description(pretrained), "the weights"
    return {}, ""


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


def resolve_preprocessing(data: DataConfig, arch: str, recorded: dict, source: str, training: bool, log
                          ) -> Preprocessing:
    """Crop sizes and interpolation: the flags, else what the checkpoint was trained with, else the arch's."""
    before = None
    if isinstance(recorded.get("preprocessing"), dict):
        before = Preprocessing.from_dict(recorded["preprocessing"], source)
    return choose_preprocessing(before, default_image_size(arch), source, lambda line: log(f"=> {line}"),
                                image_size=data.image_size, train_crop_size=data.train_crop_size,
                                val_crop_size=data.val_crop_size, val_resize_size=data.val_resize_size,
                                interpolation=data.interpolation, progressive_resize=data.progressive_resize,
                                training=training)


def fine_tune_notice(pretrained: dict, preprocessing: Preprocessing, weights: str) -> str | None:
    """The line of a fine-tune whose training crops are not the size its weights were trained at (a record of
    32 px weights trained on at 224 px), or None (same size, or weights that record none)."""
    record = recorded_description(pretrained).get("preprocessing")
    try:
        trained = Preprocessing.from_dict(record) if isinstance(record, dict) else None
    except UserError:
        return None
    if trained is None or trained.train_size == preprocessing.train_size:
        return None
    return (f"=> {weights} were trained on {trained.train_size} px crops; this fine-tune trains on "
            f"{preprocessing.train_size} px crops (--image-size or --train-crop-size sets another)")


def schedule_notices(config: RunConfig, resumed: dict | None) -> list[str]:
    """What a person would not foresee of the run's schedule: a warm-up as long as the run (its rate never
    reaches --lr), and a resume with another --epochs than its checkpoint's run (the schedule stretched or
    shrunk: the rate the next epoch starts at, against where the checkpoint's schedule had it)."""
    optim, notes = config.optim, []
    if optim.warmup >= optim.epochs:
        notes.append(f"=> --warmup {optim.warmup} is as long as --epochs {optim.epochs}: every epoch warms up, and "
                     f"the rate never reaches --lr {optim.lr:g} (a shorter --warmup reaches it)")
    epochs = resumed.get("epochs") if resumed is not None else None
    if isinstance(epochs, int) and not isinstance(epochs, bool) and epochs != optim.epochs:
        start = int(resumed["epoch"])
        before = replace(config, optim=replace(optim, epochs=epochs)).lr_at(start)
        notes.append(f"=> --epochs {optim.epochs}, where the checkpoint's run had {epochs}: the {optim.lr_schedule} "
                     f"schedule now spans {optim.epochs} epochs, and epoch {start + 1} starts at lr "
                     f"{config.lr_at(start):.6g} (at {before:.6g} in the {epochs}-epoch schedule)")
    return notes


def resolve_topk(topk: int | None, num_classes: int) -> int:
    if topk is None:
        return min(5, num_classes)
    if topk > num_classes:
        raise UserError(f"--topk {topk} exceeds the number of classes, {num_classes}")
    return topk


def settle_quantization(asked: bool, start: dict | None, where: str | None, resuming: bool, log) -> bool:
    """Whether the run's model is quantization-aware: ``asked`` (--quantize-aware, quant_main.py), or weights
    ``start`` (the resumed checkpoint, or the pretrained weights) that were trained so.  A resume or an evaluation
    that asks for it of weights trained without it is refused: their model has no activation ranges."""
    held = start is not None and holds_quantizers(extract_state_dict(start))
    if asked and start is not None and not held and resuming:
        raise UserError(f"{where} was not trained quantization-aware (it holds no activation ranges); to fine-tune "
                        f"it with quantization-aware training, start a new run from it with --pretrained-from-file "
                        f"{where}")
    if held and not asked:
        log(f"=> {where} was trained quantization-aware: the model stays fake-quantized")
    return asked or held


def build_model_for(config: RunConfig, runtime: Runtime, resumed: dict | None, resume_path: str | None, pretrained,
                    log) -> nn.Module:
    """The model on the device, with the resumed or pretrained weights when asked; quantization-aware where
    the run is (quantized before weights that hold activation ranges are loaded, after FP32 ones)."""
    model = build_model(config.model.arch, num_classes=config.model.num_classes, **config.model.options())
    start = resumed if resumed is not None else pretrained
    quantize = config.model.quantize_aware
    if quantize and start is not None and holds_quantizers(extract_state_dict(start)):
        quantize_model(model)  # the activation ranges load with the weights
    if resumed is not None:
        load_weights(model, resumed["state_dict"], log=log, label=resume_path, resuming=not config.run.evaluate)
        log(f"=> loaded checkpoint ({ckpt.position_text(resumed['epoch'], resumed.get('batch', 0))})")
    elif pretrained is not None:
        # Fine-tuning may replace the head; evaluating a freshly initialised head would be meaningless.
        weights = config.model.pretrained_weights
        load_weights(model, pretrained, allow_head_mismatch=not config.run.evaluate, log=log, label=weights)
        log(f"=> loaded pretrained weights '{weights}'")
    if quantize:
        if is_quantized(model):
            check_quantizers(model, resume_path or config.model.pretrained_weights)
        else:
            quantize_model(model)
            log(f"=> quantization-aware training: {len(quantizers(model))} convolution and linear layers with "
                "int8 weights and uint8 inputs")
    return model.to(runtime.device, memory_format=runtime.memory_format)


def reseed(seed: int, rank: int, epoch: int = 0, iterations: int = 0) -> None:
    """Seed python, numpy and torch (CPU and CUDA) from the run seed, the global rank and the position."""
    process_seed = mix_seed(seed + rank, epoch, iterations)
    random.seed(process_seed)
    np.random.seed(process_seed % 2**32)
    torch.manual_seed(process_seed)


def resolve_backend_of(data: DataConfig, runtime: Runtime, training: bool, log) -> str:
    """The data backend (the one place it is decided: ``--data-backend``, else the fastest installed), refused in
    one line where this machine cannot run it, and the decoder it takes said."""
    backend = resolve_backend(data.data_backend, runtime.is_cuda)
    if data.data_backend is None:  # otherwise only the raport would say which
        log(default_backend_notice(backend, runtime.is_cuda))
    check_backend(backend, runtime.is_cuda, data.augmentation, training=training)
    augmentation = augmentation_notice(backend, data.augmentation) if training else None
    if augmentation is not None:
        log(augmentation)
    decoder = decoder_notice(backend, runtime.device, data.decode_scale)
    if decoder is not None:
        log(decoder)
    return backend


def starting_point(args: argparse.Namespace, workspace: Workspace, runtime: Runtime, log
                   ) -> tuple[str | None, dict | None, dict | None] | None:
    """(the checkpoint's path, the checkpoint, the pretrained weights) the run starts from, each checked; None when a
    ``--resume auto`` run finds its work already done."""
    resume_path, resumed = find_resume_checkpoint(args.resume, args.pretrained_weights, workspace, runtime, log)
    if resumed is not None:
        check_progress(resumed, resume_path)
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
        pretrained = read_weights(args.pretrained_weights)
        checked_arch(pretrained, args.arch, args.pretrained_weights)  # before their keys are compared one by one
    return resume_path, resumed, pretrained


def settle_optimisation(optim: OptimConfig, data: DataConfig, runtime: Runtime, *, quiet: bool, log) -> OptimConfig:
    """The optimisation group with what the run settles: gradient accumulation, and the learning rate
    (:func:`resolve_lr`, the one place a rate is scaled), each said where a person would not foresee it."""
    accumulation = grad_accumulation_steps(optim.optimizer_batch_size, data.batch_size, runtime.world_size)
    if accumulation > 1:
        log(f"=> gradient accumulation: {accumulation} micro-batches of {data.batch_size} per optimizer step")
    batch = global_batch(data.batch_size, runtime.world_size, optim.optimizer_batch_size)
    lr, note = resolve_lr(optim.lr, optim.lr_batch, batch, optimizer=optim.optimizer, warmup=optim.warmup)
    if note and not quiet:
        log(note)
    return replace(optim, lr=lr, accumulation=accumulation)


def settle_data(data: DataConfig, backend: str, preprocessing: Preprocessing, *, seed: int, num_classes: int,
                prof: int, training: bool, log) -> DataConfig:
    """The data group with what the run settles: the backend, the preprocessing, the workers this process may
    use, the seed and class count its loaders draw with, a synthetic epoch's length."""
    schedule = preprocessing.train_schedule
    smallest = schedule.min_size if schedule is not None else preprocessing.train_size  # the smallest training crop
    if training and data.batch_size == 1 and smallest <= 32:
        raise UserError(f"-b 1 cannot train at {smallest} px: the last feature map is one pixel, and "
                        "BatchNorm cannot normalise a single value; use -b 2 or more, or larger training crops")
    workers = min(data.workers, machine.cores())
    if workers < data.workers and data.workers != DEFAULT_WORKERS:  # the reference's default says nothing
        log(f"=> -j {data.workers} is more than the {workers} cores this process may use: {workers} loader workers")
    return replace(data, data_backend=backend, preprocessing=preprocessing, workers=workers, seed=seed,
                   num_classes=num_classes, synthetic_length=max(0, prof))


def resolve_run(args: argparse.Namespace, runtime: Runtime, workspace: Workspace, classes: list[str], log
                ) -> Plan | None:
    """Everything the run decides before its first step (see the module docstring), after
    :func:`~.startup.preflight` checked the dataset (its ``classes``) and the workspace; None when a ``--resume
    auto`` run finds its work already done."""
    precision, run = from_args(PrecisionConfig, args), from_args(RunSettings, args)
    scale, adapts, note = precision.choose_loss_scale(runtime.amp_dtype_name)
    if note:
        log(note)
    data = from_args(DataConfig, args)
    backend = resolve_backend_of(data, runtime, not run.evaluate, log)
    # what cannot work at all (this machine, the dataset) is said before what an earlier run left in the workspace
    check_fresh_start(args, workspace, log)
    start = starting_point(args, workspace, runtime, log)
    if start is None:
        return None
    resume_path, resumed, pretrained = start
    seed = resolve_seed(resumed.get("seed", run.seed) if resumed is not None else run.seed, runtime)
    log(f"Using seed = {seed}")
    reseed(seed, runtime.rank)
    recorded, source = _recorded(resumed, pretrained, run.evaluate)
    described = resumed if resumed is not None else (pretrained if run.evaluate else None)
    check_class_labels(described, classes, resume_path or args.pretrained_weights, run.allow_class_changes, log)
    num_classes = resolve_num_classes(args, described, classes, log)
    preprocessing = resolve_preprocessing(data, args.arch, recorded, source, not run.evaluate, log)
    if pretrained is not None and not run.evaluate:
        if trained_as_stored(recorded_description(pretrained)):
            log(f"=> {orientation_notice(args.pretrained_weights, trains_anew=True)}")
        notice = fine_tune_notice(pretrained, preprocessing, args.pretrained_weights)
        if notice:
            log(notice)
    data = settle_data(data, backend, preprocessing, seed=seed, num_classes=num_classes, prof=run.prof,
                       training=not run.evaluate, log=log)
    optim = settle_optimisation(from_args(OptimConfig, args), data, runtime, log=log,
                                quiet=run.evaluate or (args.lr is not None and resumed is not None))
    recorded_run = (resumed.get("raport") or {}).get("run") if resumed is not None else None
    run = replace(run, seed=seed, topk=resolve_topk(run.topk, num_classes), resumed_from=resume_path,
                  run_id=recorded_run or uuid.uuid4().hex[:16])
    deploy = from_args(DeployConfig, args)
    quantize = settle_quantization(args.quantize_aware, resumed if resumed is not None else pretrained,
                                   resume_path or args.pretrained_weights, resumed is not None or run.evaluate, log)
    config = RunConfig(from_args(ModelConfig, args, num_classes=num_classes, quantize_aware=quantize), optim, data,
                       replace(precision, loss_scale=scale, loss_scale_adapts=adapts), run, deploy, int8_request(deploy))
    for notice in schedule_notices(config, resumed) if not run.evaluate else ():
        log(notice)
    model = build_model_for(config, runtime, resumed, resume_path, pretrained, log)
    return Plan(config, model, classes, resumed, {**config.recorded(), **runtime.describe()})
