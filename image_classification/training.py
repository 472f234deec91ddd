"""Training, validation and the run that ties them together (what ``main.py`` executes).

The loop keeps the host ahead of the device: losses and counters stay on the device and are read once
per ``--print-freq`` window (:meth:`Engine.read_window`); validation synchronises per batch, to time its
latency.  Every iteration is timed wall clock to wall clock, so a window's throughput includes the wait
for the device at the window's read, the logging and any checkpoint written in it.

What may stop a run, and what it then leaves behind:

* the end of ``--epochs`` / ``--run-epochs`` / early stopping: exit 0, checkpoints as asked;
* SIGTERM or SIGUSR1 (what SLURM sends before preemption): at the next optimizer step, a checkpoint of
  exactly that point is written and the run exits :data:`EXIT_PREEMPTED` (75) so a script can requeue it;
* a non-finite loss, weights or validation outputs: :class:`TrainingDiverged` (exit 3) within one print
  window, and no checkpoint or best model is written from such weights.
"""

from __future__ import annotations

import argparse
import math
import os
import random
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import torch
import torch.distributed as dist
from torch import nn

from . import checkpoint as ckpt
from .arguments import parse_args
from .cli import report
from .data import DataConfig, get_loaders, resolve_backend
from .distributed import lost_peer_reason
from .engine import CheckpointInterval, Engine, RunConfig, choose_loss_scale, reseed
from .errors import EXIT_PREEMPTED, PeerLost, TrainingDiverged, UserError
from .losses import classification_loss, correct_counts
from .models import build_model, default_image_size, load_weights
from .preprocessing import Preprocessing
from .raport import ACC_META, LOSS_META, LR_META, PERF_META, TIME_META, VERBOSE, Raport
from .runtime import Runtime, make_runtime
from .workspace import Workspace

LATENCY_PERCENTILES = (90, 95, 99, 100)
STOP_SIGNALS = ("SIGTERM", "SIGUSR1")


# ------------------------------------------------------------------------------------------------
# Stopping and interval checkpoints
# ------------------------------------------------------------------------------------------------
class StopSignal:
    """Remembers a SIGTERM or SIGUSR1 so the loop can save where it is and stop."""

    def __init__(self):
        self.received: str | None = None
        self._previous: dict = {}

    def __enter__(self):
        for name in STOP_SIGNALS:
            number = getattr(signal, name, None)
            if number is None:
                continue
            try:
                self._previous[number] = signal.signal(number, self._handle)
            except ValueError:  # not the main thread: leave the signals alone
                pass
        return self

    def _handle(self, signum, frame):
        self.received = signal.Signals(signum).name
        print(f"Received {self.received}", file=sys.stderr, flush=True)

    def __exit__(self, *exc):
        for number, previous in self._previous.items():
            signal.signal(number, previous)
        self._previous = {}


class RunControl:
    """Decides when to stop (a signal) and when an interval checkpoint is due, the same on every rank.

    Time and signals are local to a process, so in distributed runs ranks agree on them at print windows
    (one small all-reduce there); the decision is carried out at the next optimizer step.
    """

    def __init__(self, runtime: Runtime, signals: StopSignal, interval: CheckpointInterval | None, iterations: int):
        self.runtime, self.signals, self.interval = runtime, signals, interval
        self.stop_pending = False
        self.save_pending = False
        self._saved_at = (time.monotonic(), iterations)

    def _time_due(self) -> bool:
        return bool(self.interval and self.interval.seconds
                    and time.monotonic() - self._saved_at[0] >= self.interval.seconds)

    def local_flags(self) -> tuple[bool, bool]:
        """(a stop signal arrived, the interval's time is up), as this process sees them."""
        return self.signals.received is not None, self._time_due()

    def agree(self, flags: tuple[bool, ...]) -> None:
        """Take the flags every rank sees (:meth:`local_flags` reduced over ranks with "any")."""
        self.stop_pending |= flags[0]
        self.save_pending |= flags[1]

    def at_window(self) -> None:
        """Collect signals and the clock outside a print window (a collective call in distributed runs).

        Inside the loop the flags ride on the window's own all-reduce (:meth:`Engine.read_window`).
        """
        flags = self.local_flags()
        if self.runtime.distributed:
            device = self.runtime.device
            tensor = torch.stack([torch.full((), float(flag), device=device) for flag in flags])
            with self.runtime.waiting_for_peers("agreeing whether to stop"):
                dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
                flags = tuple(value > 0 for value in tensor.tolist())
        self.agree(flags)

    def at_step(self) -> None:
        """Between windows a single process can act on a signal or the clock at once."""
        if not self.runtime.distributed:
            self.stop_pending |= self.signals.received is not None
            self.save_pending |= self._time_due()

    def save_due(self, iterations: int) -> bool:
        if self.interval is None:
            return False
        if self.interval.iterations is not None:
            return iterations - self._saved_at[1] >= self.interval.iterations
        return self.save_pending

    def saved(self, iterations: int) -> None:
        self._saved_at = (time.monotonic(), iterations)
        self.save_pending = False


# ------------------------------------------------------------------------------------------------
# Metrics
# ------------------------------------------------------------------------------------------------
def register_metrics(raport: Raport, prefixes: list[str], topk: int, training: bool) -> None:
    if training:
        raport.register("train.loss", "loss", LOSS_META)
        raport.register("train.total_ips", "perf", PERF_META)
        raport.register("train.compute_ips", "perf", PERF_META)
        raport.register("train.data_time", "perf", TIME_META, VERBOSE)
        raport.register("train.compute_time", "perf", TIME_META, VERBOSE)
        raport.register("train.lr", "lr", LR_META)
        raport.register("train.grad_scale", "perf", LOSS_META)
    for prefix in prefixes:
        raport.register(f"{prefix}.top1", "acc", ACC_META)
        raport.register(f"{prefix}.top{topk}", "acc", ACC_META)
        raport.register(f"{prefix}.loss", "loss", LOSS_META)
        raport.register(f"{prefix}.total_ips", "perf", PERF_META)
        raport.register(f"{prefix}.compute_ips", "perf", PERF_META)
        raport.register(f"{prefix}.data_time", "perf", TIME_META, VERBOSE)
        raport.register(f"{prefix}.compute_time", "perf", TIME_META, VERBOSE)
        raport.register(f"{prefix}.compute_latency", "perf", TIME_META)
        for q in LATENCY_PERCENTILES:
            raport.register(f"{prefix}.compute_latency_at{q}", f"q{q}", TIME_META, VERBOSE)


@dataclass
class ValResult:
    top1: float
    loss: float
    count: int
    not_finite: int  # images whose outputs held NaN or inf (counted as wrong)


# ------------------------------------------------------------------------------------------------
# Train and validate
# ------------------------------------------------------------------------------------------------
class Trainer:
    """The loops over batches; the state they change lives in the :class:`Engine`."""

    def __init__(self, engine: Engine, raport: Raport, workspace: Workspace, log):
        self.engine, self.raport, self.workspace, self.log = engine, raport, workspace, log
        self.config, self.runtime = engine.config, engine.runtime
        self.control: RunControl | None = None
        self._noted_short_epoch = False

    # -- training -------------------------------------------------------------------------------
    def epoch_plan(self, loader) -> tuple[int, int]:
        """(batches in a train epoch, micro-batches per optimizer step).

        ``--prof`` caps the epoch; an epoch ends on an optimizer step, so trailing micro-batches that
        cannot make one are left out; an epoch shorter than one accumulation steps once at its end.
        """
        config = self.config
        length = len(loader) if config.prof <= 0 else min(config.prof, len(loader))
        accumulation = config.accumulation
        if 0 < length < accumulation:
            if not self._noted_short_epoch:
                self.log(f"=> an epoch of {length} batches is shorter than one gradient accumulation of "
                         f"{accumulation}: the optimizer steps every {length} micro-batches")
                self._noted_short_epoch = True
            accumulation = length
        return length - length % accumulation, accumulation

    def train_epoch(self, loader, epoch: int, progress_bar) -> bool:
        """Train one epoch from ``progress.batch``; False when a stop signal ended it early."""
        engine, runtime, raport, control = self.engine, self.runtime, self.raport, self.control
        progress = engine.progress
        engine.base_model.train()
        engine.model.train()
        lr = engine.set_epoch_lr(epoch)
        length, accumulation = self.epoch_plan(loader)
        batches = iter_from(loader, epoch, progress.batch)
        print_freq = self.config.print_freq
        end = time.perf_counter()
        while progress.batch < length:
            try:
                images, targets = next(batches)
            except StopIteration:
                break
            data_time = time.perf_counter() - end
            step_now = (progress.batch + 1) % accumulation == 0
            engine.train_step(images, targets, accumulation=accumulation, step_now=step_now)
            progress.batch += 1
            window_ends = progress.batch % print_freq == 0 or progress.batch == length
            if window_ends:
                reading = engine.read_window(f"epoch {epoch}, iteration {progress.batch}", control.local_flags())
                control.agree(reading.flags)
            now = time.perf_counter()
            iteration_time, world_batch = now - end, targets.shape[0] * runtime.world_size
            compute_time = max(iteration_time - data_time, 1e-9)
            raport.record("train.data_time", data_time)
            raport.record("train.compute_time", compute_time)
            raport.record("train.total_ips", world_batch / max(iteration_time, 1e-9), max(iteration_time, 1e-9))
            raport.record("train.compute_ips", world_batch / compute_time, compute_time)
            end = now  # wall clock to wall clock: logging and saving below count in the next iteration
            if window_ends:
                raport.record("train.lr", lr)
                raport.record("train.loss", reading.loss, reading.images)
                raport.record("train.grad_scale", engine.grad_scale)
                raport.log_window("train", [epoch, progress.batch], global_step=progress.iterations)
            progress_bar.update(1)
            if not step_now:
                continue
            control.at_step()
            if progress.batch < length and control.stop_pending:
                self.save(finished_epoch=False, reason="stop")
                return False
            if progress.batch < length and control.save_due(progress.iterations):
                self.save(finished_epoch=False, reason="interval")
        leftover = engine.read_window(f"epoch {epoch}, iteration {progress.batch}")  # a loader that ended early
        if leftover is not None:
            raport.record("train.loss", leftover.loss, leftover.images)
            raport.log_window("train", [epoch, progress.batch], global_step=progress.iterations)
        engine.discard_gradients()
        return True

    # -- validation -----------------------------------------------------------------------------
    @torch.no_grad()
    def validate(self, model: nn.Module, loader, prefix: str, epoch: int, progress_bar) -> ValResult:
        """Validate over this rank's share; counts are summed over ranks, so every image counts once."""
        config, runtime, raport = self.config, self.runtime, self.raport
        train_iteration = self.engine.progress.batch
        model.eval()
        ks = (1, config.topk)
        totals = torch.zeros(5, dtype=torch.float64, device=runtime.device)  # loss, top1, topk, count, bad
        length = len(loader) if config.prof <= 0 else min(config.prof, len(loader))
        batches = iter_from(loader, epoch, 0)
        end = time.perf_counter()
        for index in range(length):
            try:
                images, targets = next(batches)
            except StopIteration:
                break
            data_time = time.perf_counter() - end
            compute_time, logits = self._timed_forward(model, images)
            loss = classification_loss(logits, targets, config.val_smoothing)
            batch = targets.shape[0]
            counts = correct_counts(logits, targets, ks).double()
            not_finite = (~torch.isfinite(logits).all(dim=1)).sum().double()
            batch_totals = torch.stack([loss.double() * batch, counts[0], counts[1],
                                        torch.tensor(float(batch), dtype=torch.float64, device=loss.device),
                                        not_finite])
            totals += batch_totals
            local = batch_totals.tolist()
            now = time.perf_counter()
            iteration_time, world_batch = max(now - end, 1e-9), batch * runtime.world_size
            end = now
            raport.record(f"{prefix}.top1", 100.0 * local[1] / batch, batch, epoch=False)
            raport.record(f"{prefix}.top{config.topk}", 100.0 * local[2] / batch, batch, epoch=False)
            raport.record(f"{prefix}.loss", local[0] / batch, batch, epoch=False)
            raport.record(f"{prefix}.data_time", data_time)
            raport.record(f"{prefix}.compute_time", compute_time)
            raport.record(f"{prefix}.compute_latency", compute_time)
            for q in LATENCY_PERCENTILES:
                raport.record(f"{prefix}.compute_latency_at{q}", compute_time)
            raport.record(f"{prefix}.total_ips", world_batch / iteration_time, iteration_time)
            raport.record(f"{prefix}.compute_ips", world_batch / max(compute_time, 1e-9), max(compute_time, 1e-9))
            if (index + 1) % config.print_freq == 0:
                raport.log_window(prefix, [epoch, train_iteration, index + 1])
            progress_bar.update(1)
        with runtime.waiting_for_peers(f"summing {prefix} over the processes"):
            if runtime.distributed:
                dist.all_reduce(totals)
            loss_sum, top1, topk, count, bad = totals.tolist()
        if count == 0:
            return ValResult(0.0, math.nan, 0, 0)
        raport.log_window(prefix, [epoch, train_iteration, length])
        for name, value in (("top1", top1), (f"top{config.topk}", topk)):
            raport.record(f"{prefix}.{name}", 100.0 * value / count, count, window=False)
        raport.record(f"{prefix}.loss", loss_sum / count, count, window=False)
        return ValResult(100.0 * top1 / count, loss_sum / count, int(count), int(bad))

    def _timed_forward(self, model, images) -> tuple[float, torch.Tensor]:
        runtime = self.runtime
        if runtime.is_cuda:
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            with runtime.autocast():
                logits = model(images)
            stop.record()
            stop.synchronize()
            return start.elapsed_time(stop) / 1000.0, logits
        begin = time.perf_counter()
        with runtime.autocast():
            logits = model(images)
        return time.perf_counter() - begin, logits

    # -- checkpoints --------------------------------------------------------------------------------
    def save(self, *, finished_epoch: bool, reason: str, is_best: bool = False) -> None:
        """Write the engine's checkpoint (every rank takes part; rank 0 writes). Never non-finite weights."""
        config, engine = self.config, self.engine
        if not config.save_checkpoints:
            return
        progress = engine.progress
        if not engine.weights_finite():
            raise TrainingDiverged(f"training diverged in epoch {progress.epoch}: the weights hold NaN or inf "
                                   "values; no checkpoint was written from them")
        state = engine.state_dict()
        if self.control is not None:
            self.control.saved(progress.iterations)
        if not self.runtime.is_main:
            return
        latest = self.workspace.latest
        where = f"epoch {progress.epoch}" if finished_epoch else \
            f"epoch {progress.epoch}, batch {progress.batch} ({reason})"
        self.log(f"SAVING {latest} ({where})")
        ckpt.save_checkpoint(state, latest)
        if finished_epoch and config.gather_checkpoints != 0:
            ckpt.copy_atomic(latest, self.workspace.path / ckpt.epoch_checkpoint_name(progress.epoch - 1))
            ckpt.prune_epoch_checkpoints(self.workspace.path, config.gather_checkpoints)
        if is_best:
            ckpt.copy_atomic(latest, self.workspace.best)


def iter_from(loader, epoch: int, start_batch: int):
    """Iterator over ``loader``'s epoch, positioned after ``start_batch`` batches."""
    if start_batch and getattr(loader, "supports_start_batch", False):
        loader.set_epoch(epoch, start_batch=start_batch)
        return iter(loader)
    loader.set_epoch(epoch)
    batches = iter(loader)
    for _ in range(start_batch):
        next(batches, None)
    return batches


class _NoProgress:
    def update(self, n: int = 1) -> None:
        pass

    def close(self) -> None:
        pass


def progress_bar(total: int, description: str, enabled: bool):
    if not enabled or total <= 0:
        return _NoProgress()
    from tqdm import tqdm

    return tqdm(total=total, desc=description, leave=False, dynamic_ncols=True, file=sys.stdout)


# ------------------------------------------------------------------------------------------------
# Set-up: what the run resolves once
# ------------------------------------------------------------------------------------------------
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
    """(path, checkpoint) that --resume names; ``auto``: the newest valid one in the workspace, or none."""
    if not args.resume:
        return None, None
    if args.resume != "auto":
        if not os.path.isfile(args.resume):
            raise UserError(f"--resume {args.resume}: no such checkpoint file")
        log(f"=> loading checkpoint '{args.resume}'")
        return args.resume, ckpt.load_checkpoint(args.resume)
    chosen = None
    if runtime.is_main:
        for candidate in workspace.resume_candidates():
            try:
                ckpt.load_checkpoint(candidate)
            except UserError as error:
                log(f"=> cannot resume from {candidate}: {error}; trying an older checkpoint")
                continue
            chosen = str(candidate)
            break
    chosen = _broadcast_choice(chosen, runtime)
    if chosen is None:
        log(f"=> --resume auto: no checkpoint in {workspace.path}; starting from scratch")
        return None, None
    log(f"=> --resume auto: loading checkpoint '{chosen}'")
    return chosen, ckpt.load_checkpoint(chosen)


def _recorded(resumed: dict | None, pretrained: dict | None, evaluate: bool) -> tuple[dict, str]:
    """What the weights we start from record about the model, and how to call them in messages."""
    from .integrity import recorded_description

    if resumed is not None:
        return recorded_description(resumed), "the checkpoint"
    if pretrained is not None and evaluate:
        return recorded_description(pretrained), "the weights"
    return {}, ""


def _head_classes(weights: dict | None) -> int | None:
    from .models.weights import extract_state_dict

    if weights is None:
        return None
    try:
        head = extract_state_dict(weights).get("fc.bias")
    except UserError:
        return None
    return int(head.shape[0]) if head is not None and head.dim() == 1 else None


def _dataset_classes(args: argparse.Namespace, backend: str) -> list[str]:
    if backend == "synthetic":
        return []
    from .data.folder import check_dataset

    return check_dataset(args.data, sys.maxsize, want_train=not args.evaluate, want_val=not args.training_only)


def resolve_num_classes(args, recorded: dict, weights: dict | None, classes: list[str], log) -> int:
    """--num-classes, else the checkpoint's (or evaluated weights'), else the dataset's folders, else 1000."""
    known = recorded.get("num_classes") or (recorded.get("model_options") or {}).get("num_classes")
    if known is None and weights is not None:
        known = _head_classes(weights)
    if args.num_classes is not None:
        number = args.num_classes
    elif known is not None:
        number = int(known)
    elif classes:
        number = len(classes)
        log(f"=> {number} classes: the dataset's class folders")
    else:
        number = 1000
    if classes and len(classes) > number:
        raise UserError(f"the dataset has {len(classes)} classes but the model has {number}; pass --num-classes "
                        f"{len(classes)}")
    return number


def resolve_preprocessing(args, recorded: dict, source: str, log) -> Preprocessing:
    """Image size and interpolation: the flags, else what the checkpoint was trained with, else the arch's."""
    before = None
    if isinstance(recorded.get("preprocessing"), dict):
        before = Preprocessing.from_dict(recorded["preprocessing"], source)
    size = args.image_size or (before.image_size if before else default_image_size(args.arch))
    interpolation = args.interpolation or (before.interpolation if before else "bilinear")
    chosen = Preprocessing(size, interpolation) if before is None else \
        Preprocessing(size, interpolation, before.crop_ratio, before.mean, before.std)
    if before is not None:
        for flag, ours, theirs in (("--image-size", size, before.image_size),
                                   ("--interpolation", interpolation, before.interpolation)):
            if ours != theirs:
                log(f"=> {flag} {ours} overrides the {theirs} that {source} was trained with")
    return chosen


def resolve_topk(args, num_classes: int) -> int:
    if args.topk is None:
        return min(5, num_classes)
    if args.topk > num_classes:
        raise UserError(f"--topk {args.topk} exceeds the number of classes, {num_classes}")
    return args.topk


def build_config(args: argparse.Namespace, runtime: Runtime, *, seed: int, num_classes: int,
                 preprocessing: Preprocessing, topk: int, accumulation: int,
                 loss_scale: tuple[float, bool, str | None]) -> RunConfig:
    interval = CheckpointInterval.parse(args.checkpoint_interval) if args.checkpoint_interval else None
    return RunConfig(
        arch=args.arch, num_classes=num_classes, model_options=tuple(model_options(args).items()),
        preprocessing=preprocessing, jit=args.jit, compile=args.compile,
        optimizer=args.optimizer, lr=args.lr, lr_schedule=args.lr_schedule, warmup=args.warmup, end_lr=args.end_lr,
        epochs=args.epochs, momentum=args.momentum, weight_decay=args.weight_decay, nesterov=args.nesterov,
        bn_weight_decay=args.bn_weight_decay, rmsprop_alpha=args.rmsprop_alpha, rmsprop_eps=args.rmsprop_eps,
        batch_size=args.batch_size, accumulation=accumulation, label_smoothing=args.label_smoothing,
        mixup=args.mixup, ema_decay=args.use_ema, loss_scale=loss_scale[0], dynamic_loss_scale=loss_scale[1],
        seed=seed, run_epochs=args.run_epochs,
        early_stopping_patience=args.early_stopping_patience, prof=args.prof, print_freq=args.print_freq,
        topk=topk, evaluate=args.evaluate, training_only=args.training_only, workspace=Path(args.workspace),
        checkpoint_filename=args.checkpoint_filename, raport_file=args.raport_file,
        save_checkpoints=args.save_checkpoints and not args.evaluate, gather_checkpoints=args.gather_checkpoints,
        checkpoint_interval=interval, tensorboard=args.tensorboard,
    )


def build_model_for(config: RunConfig, runtime: Runtime, resumed: dict | None, resume_path: str | None, pretrained,
                    args, log) -> nn.Module:
    """The model on the device, with the resumed or pretrained weights when asked."""
    model = build_model(config.arch, num_classes=config.num_classes, **dict(config.model_options))
    if resumed is not None:
        load_weights(model, resumed["state_dict"], log=log, label=resume_path)
        log(f"=> loaded checkpoint (epoch {resumed['epoch']}, batch {resumed.get('batch', 0)})")
    elif pretrained is not None:
        # Fine-tuning may replace the head; evaluating a freshly initialised head would be meaningless.
        load_weights(model, pretrained, allow_head_mismatch=not config.evaluate, log=log,
                     label=args.pretrained_weights)
        log(f"=> loaded pretrained weights '{args.pretrained_weights}'")
    return model.to(runtime.device, memory_format=runtime.memory_format)


# ------------------------------------------------------------------------------------------------
# The run
# ------------------------------------------------------------------------------------------------
def main(argv: list[str] | None = None, defaults: dict | None = None) -> int:
    """Run main.py's job from its command line; returns the exit code."""
    args = parse_args(argv, defaults)
    return run(args)


def run(args: argparse.Namespace) -> int:
    runtime = make_runtime(args.device, args.amp, args.amp_dtype, args.memory_format, args.tf32,
                           gpu_affinity=args.gpu_affinity, dist_timeout=args.dist_timeout)
    log = runtime.print
    workspace = Workspace(args.workspace, args.checkpoint_filename, args.raport_file)
    try:
        code = _run(args, runtime, workspace, log)
        if runtime.distributed and dist.is_initialized():
            with runtime.waiting_for_peers("finishing the run"):
                dist.barrier()  # every rank is done with every collective once past it
            _leave_distributed(workspace, code)
        return code
    except RuntimeError as error:
        reason = lost_peer_reason(error) if runtime.distributed else None
        if reason is None:
            raise
        # the launcher names the process that failed; a traceback here would only repeat it
        lost = PeerLost(f"rank {runtime.rank} stops: another process of the job is gone ({reason})")
        _leave_distributed(workspace, report(lost))
    except UserError as error:
        if runtime.distributed:
            _leave_distributed(workspace, report(error))
        raise
    finally:
        workspace.unlock()


def _leave_distributed(workspace: Workspace, code: int) -> NoReturn:
    """End a process of a distributed run at once, its last words said.

    Tearing gloo down (destroy_process_group, C++ destructors at interpreter exit) while a peer exits
    or is gone can abort the process ("terminate called without an active exception"), which would
    turn a clean exit or a one-line error into a SIGABRT that the launcher then reports.
    """
    workspace.unlock()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _run(args: argparse.Namespace, runtime: Runtime, workspace: Workspace, log) -> int:
    loss_scale = choose_loss_scale(runtime.amp_dtype, args.static_loss_scale, args.dynamic_loss_scale)
    if loss_scale[2]:
        log(loss_scale[2])
    saving = args.save_checkpoints and not args.evaluate
    if runtime.is_main:
        workspace.prepare(saving)
        workspace.lock()
        for stale in workspace.remove_stale_temporaries():
            log(f"=> removed {stale.name}, left by an interrupted save")
    backend = resolve_backend(args.data_backend)

    resume_path, resumed = find_resume_checkpoint(args, workspace, runtime, log)
    if resumed is not None and resumed.get("arch", args.arch) != args.arch:
        raise UserError(f"{resume_path} holds a {resumed['arch']} checkpoint, not {args.arch}; pass --arch "
                        f"{resumed['arch']}")
    if resumed is not None and not args.evaluate and int(resumed["epoch"]) >= args.epochs:
        if args.resume == "auto":
            log(f"=> {resume_path} already finished all {args.epochs} epochs: nothing to do")
            return 0
        raise UserError(f"the checkpoint already ran {resumed['epoch']} of --epochs {args.epochs}; raise --epochs "
                        "to train further, or add --evaluate to validate it")
    pretrained = None
    if resumed is None and args.pretrained_weights:
        from .models import load_checkpoint_file

        pretrained = load_checkpoint_file(args.pretrained_weights)

    seed = resolve_seed(resumed.get("seed", args.seed) if resumed is not None else args.seed, runtime)
    log(f"Using seed = {seed}")
    reseed(seed, runtime.rank)
    classes = _dataset_classes(args, backend)
    recorded, source = _recorded(resumed, pretrained, args.evaluate)
    described = resumed if resumed is not None else (pretrained if args.evaluate else None)
    num_classes = resolve_num_classes(args, recorded, described, classes, log)
    preprocessing = resolve_preprocessing(args, recorded, source, log)
    if not args.evaluate and args.batch_size == 1 and preprocessing.image_size <= 32:
        raise UserError(f"-b 1 cannot train at {preprocessing.image_size} px: the last feature map is one pixel, and "
                        "BatchNorm cannot normalise a single value; use -b 2 or more, or a larger --image-size")
    accumulation = grad_accumulation_steps(args.optimizer_batch_size, args.batch_size, runtime.world_size)
    if accumulation > 1:
        log(f"=> gradient accumulation: {accumulation} micro-batches of {args.batch_size} per optimizer step")
    config = build_config(args, runtime, seed=seed, num_classes=num_classes, preprocessing=preprocessing,
                          topk=resolve_topk(args, num_classes), accumulation=accumulation,
                          loss_scale=loss_scale)

    model = build_model_for(config, runtime, resumed, resume_path, pretrained, args, log)
    data_config = DataConfig.from_args(args, preprocessing.image_size, backend=backend, seed=seed,
                                       num_classes=num_classes, interpolation=preprocessing.interpolation)
    train_loader, val_loader, classes = get_loaders(
        data_config, runtime,
        want_train=not args.evaluate, want_val=not args.training_only,
    )
    engine = Engine(config, runtime, model, log=log)
    engine.classes = classes
    if resumed is not None:
        engine.load_state_dict(resumed)

    raport = open_raport(config, runtime, resumed, workspace)
    engine.raport_position = raport.position
    trainer = Trainer(engine, raport, workspace, log)
    raport.parameters({**vars(args), "data_backend": backend, "seed": seed, "num_classes": num_classes,
                       "topk": config.topk, "world_size": runtime.world_size, "device": str(runtime.device),
                       "amp_dtype": str(runtime.amp_dtype), "image_size": preprocessing.image_size,
                       "interpolation": preprocessing.interpolation})
    raport.parameters({f"model.{k}": v for k, v in config.model_options})
    prefixes = [] if args.training_only else ["val"] + (["val_ema"] if engine.ema else [])
    register_metrics(raport, prefixes, config.topk, training=not args.evaluate)

    show_progress = runtime.is_main and sys.stdout.isatty()
    if show_progress:
        from tqdm import tqdm

        raport.echo = tqdm.write
    code = 0
    try:
        if args.evaluate:
            _evaluate_once(trainer, val_loader, prefixes, show_progress)
        else:
            code = _train_loop(trainer, train_loader, val_loader, prefixes, show_progress, log)
    finally:
        summary = raport.end()
        raport.close()
    _print_summary(config, runtime, engine, summary, workspace, train_loader, val_loader)
    log("Experiment ended")
    return code


def open_raport(config: RunConfig, runtime: Runtime, resumed: dict | None, workspace: Workspace) -> Raport:
    """The raport; a resumed run appends to it, cut back to where the checkpoint left it."""
    offset = None
    if resumed is not None:
        position = resumed.get("raport") or {}
        same_file = position.get("file") == Path(config.raport_file).name
        offset = int(position["offset"]) if same_file and int(position.get("offset", -1)) >= 0 else \
            (workspace.raport.stat().st_size if workspace.raport.is_file() else 0)
    return Raport(workspace.raport, enabled=runtime.is_main, resume_offset=offset, tensorboard=config.tensorboard)


def _check_validation(result: ValResult, prefix: str, where: str) -> None:
    if result.not_finite or (result.count and not math.isfinite(result.loss)):
        raise TrainingDiverged(f"{where}: the model's outputs are NaN or inf for {result.not_finite} of "
                               f"{result.count} {prefix} images (loss {result.loss}); its accuracy means nothing")


def _evaluate_once(trainer: Trainer, val_loader, prefixes, show_progress: bool) -> None:
    engine = trainer.engine
    models = {"val": engine.model, "val_ema": engine.ema.module if engine.ema else None}
    epoch = engine.progress.epoch
    for prefix in prefixes:
        bar = progress_bar(len(val_loader), prefix, show_progress)
        result = trainer.validate(models[prefix], val_loader, prefix, epoch, bar)
        bar.close()
        _check_validation(result, prefix, "evaluation")
    trainer.raport.end_epoch(epoch)


def _train_loop(trainer: Trainer, train_loader, val_loader, prefixes, show_progress: bool, log) -> int:
    engine, config, runtime, raport = trainer.engine, trainer.config, trainer.runtime, trainer.raport
    progress = engine.progress
    start_epoch = progress.epoch
    end_epoch = config.epochs if config.run_epochs < 0 else min(start_epoch + config.run_epochs, config.epochs)
    where = f", batch {progress.batch}" if progress.batch else ""
    log(f"RUNNING EPOCHS FROM {start_epoch}{where} TO {end_epoch}")
    if config.checkpoint_interval is not None and config.save_checkpoints:
        log(f"=> mid-epoch checkpoints {config.checkpoint_interval}")
    with StopSignal() as signals:
        trainer.control = RunControl(runtime, signals, config.checkpoint_interval, progress.iterations)
        for epoch in range(start_epoch, end_epoch):
            bar = progress_bar(len(train_loader), f"epoch {epoch}", show_progress)
            completed = trainer.train_epoch(train_loader, epoch, bar)
            bar.close()
            if not completed:
                raport.end_epoch(epoch)
                log(f"Stopped by {signals.received or 'another process'} after {progress.batch} batches of epoch {epoch}; "
                    f"--resume continues from there (exit code {EXIT_PREEMPTED})")
                return EXIT_PREEMPTED
            progress.epoch, progress.batch = epoch + 1, 0
            results = {}
            models = {"val": engine.model, "val_ema": engine.ema.module if engine.ema else None}
            for prefix in prefixes:
                vbar = progress_bar(len(val_loader), f"{prefix} {epoch}", show_progress)
                results[prefix] = trainer.validate(models[prefix], val_loader, prefix, epoch, vbar)
                vbar.close()
                _check_validation(results[prefix], prefix, f"after epoch {epoch}")
            val = results.get("val")
            # The first finite validation always gives a best model, even at 0% top1; later ones must beat it.
            is_best = val is not None and math.isfinite(val.loss) and (
                val.top1 > progress.best_prec1 or progress.best_epoch < 0)
            if is_best:
                progress.best_prec1, progress.best_epoch = val.top1, epoch
                progress.epochs_without_improvement = 0
            else:
                progress.epochs_without_improvement += 1
            raport.end_epoch(epoch)
            trainer.save(finished_epoch=True, reason="epoch", is_best=is_best)
            if 0 < config.early_stopping_patience <= progress.epochs_without_improvement:
                log(f"Early stopping: no better top1 for {progress.epochs_without_improvement} epochs")
                break
            trainer.control.at_window()
            if trainer.control.stop_pending and epoch + 1 < end_epoch:
                log(f"Stopped by {signals.received or 'another process'} at the end of epoch {epoch}; --resume continues from there "
                    f"(exit code {EXIT_PREEMPTED})")
                return EXIT_PREEMPTED
    return 0


def _print_summary(config: RunConfig, runtime: Runtime, engine: Engine, summary: dict, workspace: Workspace,
                   train_loader, val_loader) -> None:
    if not runtime.is_main:
        return
    top1 = summary.get("val.top1")
    if top1 is not None and not math.isnan(top1):
        print(f"val top1: {top1:.2f}% (best {max(engine.progress.best_prec1, top1):.2f}%)", flush=True)
    if engine.progress.skipped_steps:
        print(f"skipped optimizer steps with inf/NaN gradients: {engine.progress.skipped_steps}", flush=True)
    skipped = sum(getattr(loader, "skipped", 0) for loader in (train_loader, val_loader) if loader is not None)
    if skipped:
        print(f"skipped unreadable images: {skipped}", flush=True)
    if config.save_checkpoints:
        print(f"checkpoint: {workspace.latest}", flush=True)
    print(f"raport: {workspace.raport}", flush=True)
