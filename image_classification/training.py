"""Training, validation and the run that ties them together (what ``main.py`` executes).

The loop keeps the host ahead of the device: losses and accuracy counts stay on the device and are
read once per ``--print-freq`` window; only validation synchronises per batch, to time its latency.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import random
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from . import checkpoint as ckpt
from .arguments import parse_args
from .data import get_loaders, resolve_backend
from .ema import ModelEma
from .errors import UserError
from .losses import classification_loss, correct_counts, mixup
from .models import build_model, default_image_size, load_weights
from .optim import build_optimizer, lr_at, set_lr
from .raport import ACC_META, DEFAULT, LOSS_META, PERF_META, TIME_META, VERBOSE, Raport
from .runtime import Runtime, make_runtime

LATENCY_PERCENTILES = (90, 95, 99, 100)


# ------------------------------------------------------------------------------------------------
# Set-up helpers
# ------------------------------------------------------------------------------------------------
def resolve_seed(seed: int | None, runtime: Runtime) -> int:
    """The run's base seed: the user's, or a fresh one shared by every rank (recorded in checkpoints)."""
    if seed is None:
        seed = random.SystemRandom().randrange(2**31)
        if runtime.distributed:
            shared = torch.tensor([seed], dtype=torch.int64, device=runtime.device)
            dist.broadcast(shared, src=0)
            seed = int(shared.item())
    return seed


def seed_everything(seed: int, rank: int) -> None:
    """Seed python, numpy and torch (CPU and CUDA) from the base seed and the global rank."""
    process_seed = seed + rank
    random.seed(process_seed)
    np.random.seed(process_seed % 2**32)
    torch.manual_seed(process_seed)


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


def make_scaler(args: argparse.Namespace, runtime: Runtime):
    """A loss scaler for fp16 autocast; None when no scaling is needed (fp32, bf16)."""
    if not runtime.needs_loss_scaling:
        return None
    growth_interval = 100 if args.dynamic_loss_scale else 2**31 - 1
    return torch.amp.GradScaler(
        runtime.device.type, init_scale=args.static_loss_scale, growth_factor=2.0, backoff_factor=0.5,
        growth_interval=growth_interval,
    )


class StopSignal:
    """Remembers a SIGTERM so the loop can stop at the next optimizer step and save where it is."""

    def __init__(self):
        self.received = False
        self._previous = None

    def __enter__(self):
        try:
            self._previous = signal.signal(signal.SIGTERM, self._handle)
        except ValueError:  # not the main thread
            self._previous = None
        return self

    def _handle(self, signum, frame):
        self.received = True
        print("Received SIGTERM", file=sys.stderr, flush=True)

    def __exit__(self, *exc):
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)

    def agreed(self, runtime: Runtime) -> bool:
        """True when any rank was signalled (a collective call in distributed runs)."""
        if not runtime.distributed:
            return self.received
        flag = torch.tensor([1.0 if self.received else 0.0], device=runtime.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())


def register_metrics(raport: Raport, prefixes: list[str], topk: int, training: bool) -> None:
    if training:
        raport.register("train.loss", "loss", LOSS_META)
        raport.register("train.total_ips", "perf", PERF_META)
        raport.register("train.compute_ips", "perf", PERF_META)
        raport.register("train.data_time", "perf", TIME_META, VERBOSE)
        raport.register("train.compute_time", "perf", TIME_META, VERBOSE)
        raport.register("train.lr", "lr", {})
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


# ------------------------------------------------------------------------------------------------
# Train and validate
# ------------------------------------------------------------------------------------------------
@dataclass
class TrainState:
    """What a checkpoint restores beyond the weights."""

    epoch: int = 0  # epochs finished
    batch: int = 0  # batches finished in the current epoch (a run stopped by SIGTERM)
    optimizer_steps: int = 0
    skipped_steps: int = 0  # fp16 steps skipped for inf/NaN gradients
    best_prec1: float = 0.0
    epochs_without_improvement: int = 0
    history: list = field(default_factory=list)


class Trainer:
    def __init__(self, args, runtime: Runtime, model: nn.Module, base_model: nn.Module, optimizer,
                 scaler, ema: ModelEma | None, raport: Raport, state: TrainState, accumulation: int):
        self.args, self.runtime = args, runtime
        self.model, self.base_model = model, base_model
        self.optimizer, self.scaler, self.ema = optimizer, scaler, ema
        self.raport, self.state, self.accumulation = raport, state, accumulation
        self.val_smoothing = args.label_smoothing if args.mixup == 0 else 0.0
        self.classes: list[str] = []

    # -- training -------------------------------------------------------------------------------
    def train_epoch(self, loader, epoch: int, stop: StopSignal, progress) -> int:
        """Train one epoch from ``state.batch``; return the batches done (fewer when stopped)."""
        args, runtime, raport = self.args, self.runtime, self.raport
        self.model.train()
        lr = lr_at(epoch, base_lr=args.lr, schedule=args.lr_schedule, warmup=args.warmup, epochs=args.epochs,
                   end_lr=args.end_lr)
        set_lr(self.optimizer, lr)
        length = self.epoch_length(loader)
        start = self.state.batch
        batches = _start_epoch(loader, epoch, start)
        loss_sum = torch.zeros((), device=runtime.device)
        window_images = window_steps = 0
        skipped = torch.zeros((), device=runtime.device)
        done = start
        end = time.perf_counter()
        for index in range(start, length):
            try:
                images, targets = next(batches)
            except StopIteration:
                break
            data_time = time.perf_counter() - end
            loss = self._train_step(images, targets, index, skipped)
            loss_sum += loss.detach()
            batch = targets.shape[0]
            window_images += batch
            window_steps += 1
            done = index + 1
            iteration_time = time.perf_counter() - end
            world_batch = batch * runtime.world_size
            raport.record("train.data_time", data_time)
            raport.record("train.compute_time", iteration_time - data_time)
            raport.record("train.total_ips", world_batch / max(iteration_time, 1e-9))
            raport.record("train.compute_ips", world_batch / max(iteration_time - data_time, 1e-9))
            raport.record("train.lr", lr)
            at_boundary = done % self.accumulation == 0
            if done % args.print_freq == 0 or done == length:
                self._log_train_window(loss_sum / window_steps, window_images, skipped, [epoch, done])
                loss_sum.zero_()
                window_images = window_steps = 0
                if at_boundary and stop.agreed(runtime):
                    break
            elif at_boundary and not runtime.distributed and stop.received:
                break
            progress.update(1)
            end = time.perf_counter()
        if window_steps:
            self._log_train_window(loss_sum / window_steps, window_images, skipped, [epoch, done])
        self.optimizer.zero_grad(set_to_none=True)  # a short --prof epoch may end mid-accumulation
        return done

    def epoch_length(self, loader) -> int:
        """Train batches per epoch: --prof caps it; it ends on an optimizer step when it can."""
        length = len(loader) if self.args.prof <= 0 else min(self.args.prof, len(loader))
        return length - length % self.accumulation if length >= self.accumulation else length

    def _train_step(self, images, targets, index: int, skipped: torch.Tensor) -> torch.Tensor:
        args, runtime = self.args, self.runtime
        target = targets
        if args.mixup > 0:
            lam = float(np.random.beta(args.mixup, args.mixup))
            permutation = torch.randperm(images.shape[0], device=images.device)
            images, target = mixup(images, targets, args.num_classes, lam, permutation)
        steps_now = (index + 1) % self.accumulation == 0
        sync = contextlib.nullcontext()
        if runtime.distributed and not steps_now:
            sync = self.model.no_sync()
        with sync:
            with runtime.autocast():
                logits = self.model(images)
            loss = classification_loss(logits, target, args.label_smoothing)
            scaled = loss / self.accumulation
            (self.scaler.scale(scaled) if self.scaler else scaled).backward()
        if steps_now:
            if self.scaler is not None:
                self.scaler.step(self.optimizer)
                skipped += sum(self.scaler._found_inf_per_device(self.optimizer).values())
                if self.args.dynamic_loss_scale:
                    self.scaler.update()
                else:
                    self.scaler.update(new_scale=self.args.static_loss_scale)
            else:
                self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            self.state.optimizer_steps += 1
            if self.ema is not None:
                self.ema.update(self.base_model, self.state.optimizer_steps)
        return loss

    def _log_train_window(self, loss: torch.Tensor, images: int, skipped: torch.Tensor, step) -> None:
        """Read the window's mean loss (one device sync per window) and log the window."""
        runtime = self.runtime
        if runtime.distributed:
            dist.all_reduce(loss)
            loss /= runtime.world_size
        self.raport.record("train.loss", float(loss.item()), images)
        scale = self.scaler.get_scale() if self.scaler is not None else 1.0
        self.raport.record("train.grad_scale", float(scale))
        self.state.skipped_steps += int(skipped.item())
        skipped.zero_()
        self.raport.log_window("train", step)

    # -- validation -----------------------------------------------------------------------------
    @torch.no_grad()
    def validate(self, model: nn.Module, loader, prefix: str, epoch: int, train_iteration: int, progress) -> float:
        """Validate over this rank's share; counts are summed over ranks, so every image counts once."""
        args, runtime, raport = self.args, self.runtime, self.raport
        model.eval()
        ks = (1, args.topk)
        totals = torch.zeros(4, dtype=torch.float64, device=runtime.device)  # loss sum, top1, topk, count
        length = len(loader) if args.prof <= 0 else min(args.prof, len(loader))
        loader.set_epoch(epoch)
        end = time.perf_counter()
        for index, (images, targets) in enumerate(loader):
            if index >= length:
                break
            data_time = time.perf_counter() - end
            compute_time, logits = self._timed_forward(model, images)
            loss = classification_loss(logits, targets, self.val_smoothing)
            batch = targets.shape[0]
            counts = correct_counts(logits, targets, ks).double()
            batch_totals = torch.stack([loss.double() * batch, counts[0], counts[1]])
            totals[:3] += batch_totals
            totals[3] += batch
            iteration_time = time.perf_counter() - end
            world_batch = batch * runtime.world_size
            local = batch_totals.tolist()
            raport.record(f"{prefix}.top1", 100.0 * local[1] / batch, batch, epoch=False)
            raport.record(f"{prefix}.top{args.topk}", 100.0 * local[2] / batch, batch, epoch=False)
            raport.record(f"{prefix}.loss", local[0] / batch, batch, epoch=False)
            raport.record(f"{prefix}.data_time", data_time)
            raport.record(f"{prefix}.compute_time", compute_time)
            raport.record(f"{prefix}.compute_latency", compute_time)
            for q in LATENCY_PERCENTILES:
                raport.record(f"{prefix}.compute_latency_at{q}", compute_time)
            raport.record(f"{prefix}.total_ips", world_batch / max(iteration_time, 1e-9))
            raport.record(f"{prefix}.compute_ips", world_batch / max(compute_time, 1e-9))
            if (index + 1) % args.print_freq == 0:
                raport.log_window(prefix, [epoch, train_iteration, index + 1])
            progress.update(1)
            end = time.perf_counter()
        if runtime.distributed:
            dist.all_reduce(totals)
        loss_sum, top1, topk, count = totals.tolist()
        if count == 0:
            return 0.0
        raport.log_window(prefix, [epoch, train_iteration, length])
        for name, value in (("top1", top1), (f"top{args.topk}", topk)):
            raport.record(f"{prefix}.{name}", 100.0 * value / count, count, window=False)
        raport.record(f"{prefix}.loss", loss_sum / count, count, window=False)
        return 100.0 * top1 / count

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


def _start_epoch(loader, epoch: int, start_batch: int):
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
# The run
# ------------------------------------------------------------------------------------------------
def model_options(args: argparse.Namespace) -> dict:
    options = {"num_classes": args.num_classes, "model_config": args.model_config,
               "last_bn_0_init": bool(args.last_bn_0_init)}
    if args.conv_init is not None:
        options["conv_init"] = args.conv_init
    return options


def read_resume_checkpoint(args: argparse.Namespace, log) -> dict | None:
    """The checkpoint named by --resume, read as data (None without --resume)."""
    if not args.resume:
        return None
    if not os.path.isfile(args.resume):
        raise UserError(f"--resume {args.resume}: no such checkpoint file")
    log(f"=> loading checkpoint '{args.resume}'")
    resumed = ckpt.load_checkpoint(args.resume)
    if resumed.get("arch", args.arch) != args.arch:
        raise UserError(f"{args.resume} holds a {resumed['arch']} checkpoint, not {args.arch}; pass --arch "
                        f"{resumed['arch']}")
    return resumed


def build(args: argparse.Namespace, runtime: Runtime, resumed: dict | None, log) -> nn.Module:
    """The model on the device, with the resumed or pretrained weights when asked."""
    model = build_model(args.arch, **model_options(args))
    if resumed is not None:
        load_weights(model, resumed["state_dict"], log=log)
        log(f"=> loaded checkpoint '{args.resume}' (epoch {resumed['epoch']})")
    elif args.pretrained_weights:
        # Fine-tuning may replace the head; evaluating a freshly initialised head would be meaningless.
        load_weights(model, args.pretrained_weights, allow_head_mismatch=not args.evaluate, log=log)
        log(f"=> loaded pretrained weights '{args.pretrained_weights}'")
    return model.to(runtime.device, memory_format=runtime.memory_format)


def save(trainer: Trainer, workspace: Path, filename: str, *, finished_epoch: bool, is_best: bool, gather: int,
         seed: int, log) -> None:
    state = trainer.state
    args = trainer.args
    payload = {
        "epoch": state.epoch,
        "batch": state.batch,
        "arch": args.arch,
        "model_options": model_options(args),
        "state_dict": trainer.base_model.state_dict(),
        "optimizer": trainer.optimizer.state_dict(),
        "scaler": trainer.scaler.state_dict() if trainer.scaler is not None else None,
        "best_prec1": state.best_prec1,
        "optimizer_steps": state.optimizer_steps,
        "skipped_steps": state.skipped_steps,
        "epochs_without_improvement": state.epochs_without_improvement,
        "seed": seed,
        "world_size": trainer.runtime.world_size,
        "rng": ckpt.rng_state(),
    }
    if trainer.classes:
        payload["classes"] = list(trainer.classes)  # classify.py prints these names
    if trainer.ema is not None:
        payload["state_dict_ema"] = trainer.ema.state_dict()
    latest = workspace / filename
    log(f"SAVING {latest}")
    ckpt.save_atomic(payload, latest)
    if finished_epoch and gather != 0:
        ckpt.copy_atomic(latest, workspace / ckpt.epoch_checkpoint_name(state.epoch - 1))
        ckpt.prune_epoch_checkpoints(workspace, gather)
    if is_best:
        ckpt.copy_atomic(latest, workspace / "model_best.pth.tar")


def restore(trainer: Trainer, resumed: dict, log) -> None:
    state = trainer.state
    state.epoch = int(resumed["epoch"])
    state.batch = int(resumed.get("batch", 0))
    state.best_prec1 = float(resumed.get("best_prec1", 0.0))
    state.optimizer_steps = int(resumed.get("optimizer_steps", 0))
    state.skipped_steps = int(resumed.get("skipped_steps", 0))
    state.epochs_without_improvement = int(resumed.get("epochs_without_improvement", 0))
    if "optimizer" in resumed and resumed["optimizer"] is not None:
        try:
            trainer.optimizer.load_state_dict(resumed["optimizer"])
        except (ValueError, KeyError) as error:
            raise UserError(f"the checkpoint's optimizer state does not fit --optimizer {trainer.args.optimizer} "
                            f"({error})") from None
    if trainer.scaler is not None and resumed.get("scaler"):
        trainer.scaler.load_state_dict(resumed["scaler"])
    if trainer.ema is not None:
        if resumed.get("state_dict_ema") is not None:
            trainer.ema.load_state_dict(resumed["state_dict_ema"])
        else:
            log("=> the checkpoint has no EMA weights; the EMA starts from the resumed weights")
    if resumed.get("rng") and resumed.get("world_size", 1) == trainer.runtime.world_size:
        ckpt.restore_rng_state(resumed["rng"])


def main(argv: list[str] | None = None, defaults: dict | None = None) -> int:
    """Run main.py's job from its command line; returns the exit code."""
    args = parse_args(argv, defaults)
    return run(args)


def run(args: argparse.Namespace) -> int:
    runtime = make_runtime(args.device, args.amp, args.amp_dtype, args.memory_format, args.tf32)
    log = runtime.print
    try:
        return _run(args, runtime, log)
    finally:
        if runtime.distributed and dist.is_initialized():
            dist.destroy_process_group()


def _run(args: argparse.Namespace, runtime: Runtime, log) -> int:
    if args.gpu_affinity != "none":
        from .gpu_affinity import set_affinity

        set_affinity(runtime.local_rank, mode=args.gpu_affinity)
    if args.static_loss_scale != 1.0 and not args.amp:
        log("Warning: if --amp is not used, static_loss_scale will be ignored.")
    args.data_backend = resolve_backend(args.data_backend)
    image_size = args.image_size or default_image_size(args.arch)
    accumulation = grad_accumulation_steps(args.optimizer_batch_size, args.batch_size, runtime.world_size)
    if accumulation > 1:
        log(f"BSM: {accumulation}")

    resumed = read_resume_checkpoint(args, log)
    seed = resolve_seed(args.seed if resumed is None else resumed.get("seed", args.seed), runtime)
    args.seed = seed
    log(f"Using seed = {seed}")
    seed_everything(seed, runtime.rank)
    model = build(args, runtime, resumed, log)

    train_loader, val_loader, classes = get_loaders(
        args, runtime, image_size, want_train=not args.evaluate, want_val=not args.training_only
    )

    base_model = model
    ema = ModelEma(base_model, args.use_ema) if args.use_ema else None
    optimizer = build_optimizer(
        base_model, name=args.optimizer, lr=args.lr, momentum=args.momentum, weight_decay=args.weight_decay,
        nesterov=args.nesterov, bn_weight_decay=args.bn_weight_decay, rmsprop_alpha=args.rmsprop_alpha,
        rmsprop_eps=args.rmsprop_eps, log=log,
    )
    scaler = make_scaler(args, runtime)
    if args.jit == "script":
        model = torch.jit.script(model)
    if args.compile:
        model = torch.compile(model)
    if runtime.distributed:
        device_ids = [runtime.device.index] if runtime.is_cuda else None
        model = nn.parallel.DistributedDataParallel(model, device_ids=device_ids)

    workspace = Path(args.workspace)
    if runtime.is_main:
        workspace.mkdir(parents=True, exist_ok=True)
    raport = Raport(workspace / args.raport_file, enabled=runtime.is_main)
    state = TrainState()
    trainer = Trainer(args, runtime, model, base_model, optimizer, scaler, ema, raport, state, accumulation)
    if resumed is not None:
        restore(trainer, resumed, log)
    trainer.classes = classes

    raport.parameters({**vars(args), "world_size": runtime.world_size, "device": str(runtime.device),
                       "amp_dtype": str(runtime.amp_dtype), "image_size": image_size})
    raport.parameters({f"model.{k}": v for k, v in model_options(args).items()})
    prefixes = [] if args.training_only else ["val"] + (["val_ema"] if ema else [])
    register_metrics(raport, prefixes, args.topk, training=not args.evaluate)

    show_progress = runtime.is_main and sys.stdout.isatty()
    if show_progress:
        from tqdm import tqdm

        raport.echo = tqdm.write
    try:
        if args.evaluate:
            _evaluate_once(trainer, val_loader, prefixes, state.epoch, show_progress)
        else:
            _train_loop(trainer, train_loader, val_loader, prefixes, workspace, seed, show_progress, log)
    finally:
        summary = raport.end()
        raport.close()
    _print_summary(args, runtime, trainer, summary, workspace, train_loader, val_loader)
    log("Experiment ended")
    return 0


def _evaluate_once(trainer: Trainer, val_loader, prefixes, epoch: int, show_progress: bool) -> None:
    models = {"val": trainer.model, "val_ema": trainer.ema.module if trainer.ema else None}
    for prefix in prefixes:
        bar = progress_bar(len(val_loader), prefix, show_progress)
        trainer.validate(models[prefix], val_loader, prefix, epoch, 0, bar)
        bar.close()
    trainer.raport.end_epoch(epoch)


def _train_loop(trainer: Trainer, train_loader, val_loader, prefixes, workspace: Path, seed: int,
                show_progress: bool, log) -> None:
    args, runtime, state, raport = trainer.args, trainer.runtime, trainer.state, trainer.raport
    start_epoch = state.epoch
    if start_epoch >= args.epochs:
        raise UserError(f"the checkpoint already ran {start_epoch} of --epochs {args.epochs}; raise --epochs to "
                        "train further, or add --evaluate to validate it")
    end_epoch = args.epochs if args.run_epochs < 0 else min(start_epoch + args.run_epochs, args.epochs)
    log(f"RUNNING EPOCHS FROM {start_epoch} TO {end_epoch}")
    saving = args.save_checkpoints and runtime.is_main
    with StopSignal() as stop:
        for epoch in range(start_epoch, end_epoch):
            bar = progress_bar(len(train_loader), f"epoch {epoch}", show_progress)
            done = trainer.train_epoch(train_loader, epoch, stop, bar)
            bar.close()
            interrupted = stop.received and done < trainer.epoch_length(train_loader)
            if interrupted:
                state.batch = done
                raport.end_epoch(epoch)
                if saving:
                    save(trainer, workspace, args.checkpoint_filename, finished_epoch=False, is_best=False,
                         gather=args.gather_checkpoints, seed=seed, log=log)
                log(f"Stopped by SIGTERM after {done} batches of epoch {epoch}; --resume continues from there")
                return
            state.epoch, state.batch = epoch + 1, 0
            prec1 = 0.0
            models = {"val": trainer.model, "val_ema": trainer.ema.module if trainer.ema else None}
            for prefix in prefixes:
                vbar = progress_bar(len(val_loader), f"{prefix} {epoch}", show_progress)
                top1 = trainer.validate(models[prefix], val_loader, prefix, epoch, done, vbar)
                vbar.close()
                if prefix == "val":
                    prec1 = top1
            is_best = bool(prefixes) and prec1 > state.best_prec1
            if is_best:
                state.best_prec1 = prec1
                state.epochs_without_improvement = 0
            else:
                state.epochs_without_improvement += 1
            raport.end_epoch(epoch)
            if saving:
                save(trainer, workspace, args.checkpoint_filename, finished_epoch=True, is_best=is_best,
                     gather=args.gather_checkpoints, seed=seed, log=log)
            if 0 < args.early_stopping_patience <= state.epochs_without_improvement:
                log(f"Early stopping: no better top1 for {state.epochs_without_improvement} epochs")
                break
            if stop.received:
                log("Stopped by SIGTERM at the end of an epoch")
                break


def _print_summary(args, runtime: Runtime, trainer: Trainer, summary: dict, workspace: Path, train_loader,
                   val_loader) -> None:
    if not runtime.is_main:
        return
    top1 = summary.get("val.top1")
    if top1 is not None and not math.isnan(top1):
        print(f"val top1: {top1:.2f}% (best {max(trainer.state.best_prec1, top1):.2f}%)", flush=True)
    if trainer.state.skipped_steps:
        print(f"skipped optimizer steps with inf/NaN gradients: {trainer.state.skipped_steps}", flush=True)
    skipped = sum(getattr(loader, "skipped", 0) for loader in (train_loader, val_loader) if loader is not None)
    if skipped:
        print(f"skipped unreadable images: {skipped}", flush=True)
    if args.save_checkpoints and not args.evaluate:
        print(f"checkpoint: {workspace / args.checkpoint_filename}", flush=True)
    print(f"raport: {workspace / args.raport_file}", flush=True)
