"""The training engine: one object owns everything a checkpoint restores.

:class:`Engine` receives the run's frozen :class:`~image_classification.train.plan.RunConfig` and holds the model (and
its DDP / compiled wrapper), optimizer, loss scaler, EMA, the :class:`Progress` counters and the random generators of
every process. :meth:`Engine.state_dict` is the checkpoint, whatever wrote it (an epoch's end,
``--checkpoint-interval``, a SIGTERM): the same layout, defined here and nowhere else, and
:meth:`Engine.load_state_dict` restores it exactly.

Device-side bookkeeping: the loss sum stays on the device between print windows;
:meth:`Engine.read_window` reads it once per window and stops a diverged run.  That is the training
loop's only host-device synchronisation in FP32, TF32 and bf16.  fp16 adds one per optimizer step, as
torch's ``GradScaler.step`` does: whether the gradients hold inf or NaN is read on the host, and a step
that does is skipped whole: no weight, optimizer state, step count or EMA changes (see
:meth:`Engine._scaled_step` for why not on the device).
"""

from __future__ import annotations

import contextlib
import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import torch
import torch.distributed as dist
from torch import nn

from ..errors import TrainingDiverged, UserError
from ..records import checkpoint as ckpt
from ..system.runtime import Runtime
from .batch_augment import augment_batch
from .ema import ModelEma, torchvision_decay
from .losses import classification_loss
from .optim import build_optimizer, load_optimizer_state, set_lr
from .plan import RunConfig, reseed

MAX_OVERFLOW_RUN = 100  # fp16 steps skipped in a row before a run is declared diverged
LOSS_SCALE_GROWTH_INTERVAL = 100  # clean steps before a dynamic scale doubles (NVIDIA's recipes)


@dataclass
class Progress:
    """Where the run is: what a resume continues from."""

    epoch: int = 0  # epochs finished
    batch: int = 0  # batches finished in the current epoch (a mid-epoch checkpoint)
    optimizer_steps: int = 0  # taken and skipped
    skipped_steps: int = 0  # fp16 steps skipped for inf/NaN gradients
    iterations: int = 0  # train iterations over the whole run
    best_prec1: float = 0.0
    best_epoch: int = -1  # the epoch model_best holds; -1 before the first finite validation
    epochs_without_improvement: int = 0
    stopped_early: bool = False  # early stopping ended the run: it is finished, whatever --epochs says

    @property
    def taken_steps(self) -> int:
        """Optimizer steps that changed the weights: the EMA's step count."""
        return self.optimizer_steps - self.skipped_steps


@dataclass
class WindowReading:
    loss: float
    steps: int
    images: int
    flags: tuple[bool, ...] = ()  # each of read_window's ``flags``: set on any rank
    grad_scale: float = 1.0  # the fp16 loss scale at the window's end (1 without one)


class Engine:
    """Model, optimizer, scaler, EMA, progress and RNG of one process; see the module docstring."""

    def __init__(self, config: RunConfig, runtime: Runtime, model: nn.Module, *, classes: Sequence[str] = (),
                 raport_position: Callable[[], dict] | None = None, dataset: dict | None = None, log=print):
        """``classes``: the class names a checkpoint records; ``raport_position``: where the raport stands
        (``{"file", "offset"}``), recorded so that a resume cuts the raport back to the same point;
        ``dataset``: which training images the run reads (``Loader.fingerprint()``), recorded so that a resume
        can say they changed."""
        self.config, self.runtime, self.log = config, runtime, log
        self.base_model = model
        self.optimizer = build_optimizer(
            model, name=config.optim.optimizer, lr=config.optim.lr, momentum=config.optim.momentum,
            weight_decay=config.optim.weight_decay, nesterov=config.optim.nesterov, bn_weight_decay=config.optim.bn_weight_decay,
            norm_weight_decay=config.optim.norm_weight_decay, bias_weight_decay=config.optim.bias_weight_decay,
            rmsprop_alpha=config.optim.rmsprop_alpha, rmsprop_eps=config.optim.rmsprop_eps,
            loss_scaling=runtime.needs_loss_scaling,
            log=(lambda *_: None) if config.run.evaluate else log,  # --evaluate never steps: no word about decay
        )
        self.scaler = self._make_scaler()
        self.ema = self._make_ema(model) if config.optim.ema.decay else None
        self.model = self._wrap(model)
        self.progress = Progress()
        self.classes = list(classes)
        self.raport_position = raport_position
        self.dataset = dict(dataset or {})
        self._loss_sum = torch.zeros((), device=runtime.device)
        self._window_steps = self._window_images = 0
        self._overflow_run = self._overflow_longest = 0  # fp16 steps skipped in a row: now, and at most this window

    def _make_scaler(self):
        """A loss scaler for fp16 autocast; None when no scaling is needed (fp32, bf16)."""
        if not self.runtime.needs_loss_scaling:
            return None
        growth_interval = LOSS_SCALE_GROWTH_INTERVAL if self.config.precision.loss_scale_adapts else 2**31 - 1
        return torch.amp.GradScaler(self.runtime.device.type, init_scale=self.config.precision.loss_scale,
                                    growth_factor=2.0, backoff_factor=0.5, growth_interval=growth_interval)

    def _make_ema(self, model: nn.Module) -> ModelEma:
        """--use-ema's EMA (the reference's: every step, its warm-up) or --model-ema's (torchvision's)."""
        config = self.config
        warmup = "timm" if config.optim.ema.warmup else ("reference" if config.optim.ema.style == "reference" else "none")
        if config.optim.ema.style == "reference":
            return ModelEma(model, config.optim.ema.decay, warmup=warmup)
        images = self.runtime.world_size * config.data.batch_size * config.optim.accumulation
        decay = torchvision_decay(config.optim.ema.decay, images_per_step=images, steps=config.optim.ema.steps,
                                  epochs=config.optim.epochs)
        if not config.run.evaluate:
            restart = f"; restarted from the weights in the {config.optim.warmup} warm-up epochs" if config.optim.warmup else ""
            self.log(f"=> EMA every {config.optim.ema.steps} optimizer steps of {images} images: decay "
                     f"{config.optim.ema.decay:g} over {config.optim.epochs} epochs is {decay:.6g} per update{restart}")
        return ModelEma(model, decay, every=config.optim.ema.steps, warmup=warmup, restart_epochs=config.optim.warmup)

    def _wrap(self, model: nn.Module) -> nn.Module:
        if self.config.model.jit == "script":
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always", FutureWarning)
                warnings.simplefilter("always", DeprecationWarning)
                model = torch.jit.script(model)
            said = False
            for warning in caught:  # torch deprecates TorchScript (a FutureWarning in 2.14, a DeprecationWarning in
                # 2.11): one line, not a warning per scripted module
                deprecation = issubclass(warning.category, (FutureWarning, DeprecationWarning)) and \
                    "torch.jit" in str(warning.message)
                if not deprecation:
                    warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)
                elif not said:
                    self.log(f"=> --jit script: {str(warning.message).splitlines()[0]}")
                    said = True
        if self.config.model.compile:
            model = torch.compile(model)
        if self.runtime.distributed:
            device_ids = [self.runtime.device.index] if self.runtime.is_cuda else None
            # gradient_as_bucket_view: the gradients live in the all-reduce buckets, no copy in or out.
            # broadcast_buffers (the default, kept): rank 0's BatchNorm statistics reach every rank at each
            # training forward (a few hundred kB), so every rank validates the model the checkpoint holds.
            # static_graph stays off: its gains (no unused-parameter search, reentrant checkpointing) do
            # not apply to these models, which use every parameter every step, and it has had gaps with
            # no_sync() accumulation and torch.compile.
            model = nn.parallel.DistributedDataParallel(model, device_ids=device_ids, gradient_as_bucket_view=True)
        return model

    # -- training ---------------------------------------------------------------------------------
    def set_lr(self, epoch: int, fraction: float = 0.0) -> float:
        """Set and return the learning rate ``fraction`` of the way into ``epoch``."""
        lr = self.config.lr_at(epoch, fraction)
        set_lr(self.optimizer, lr)
        return lr

    def train_step(self, images: torch.Tensor, targets: torch.Tensor, *, accumulation: int,
                   step_now: bool) -> None:
        """Forward and backward one micro-batch; with ``step_now``, take the optimizer step."""
        config = self.config
        batch = targets.shape[0]
        if batch == 1:  # what skipped unreadable images can leave: BatchNorm cannot normalise one sample
            images, targets = torch.cat([images, images]), torch.cat([targets, targets])
        images, target = augment_batch(images, targets, num_classes=config.model.num_classes, mixup_alpha=config.optim.mixup,
                                       cutmix_alpha=config.optim.cutmix, switch_prob=config.optim.switch_prob,
                                       erase_prob=config.data.random_erase)
        sync = contextlib.nullcontext()
        if self.runtime.distributed and not step_now:
            sync = self.model.no_sync()  # accumulation steps skip the gradient all-reduce
        with sync:
            with self.runtime.autocast():
                logits = self.model(images)
            loss = classification_loss(logits, target, config.optim.label_smoothing)
            scaled = loss / accumulation
            (self.scaler.scale(scaled) if self.scaler is not None else scaled).backward()
        if step_now:
            self._optimizer_step()
        self._loss_sum += loss.detach()
        self._window_steps += 1
        self._window_images += batch
        self.progress.batch += 1
        self.progress.iterations += 1

    def _optimizer_step(self) -> None:
        if self.scaler is not None:
            taken = self._scaled_step()
        else:
            self.optimizer.step()
            taken = True
        self.optimizer.zero_grad(set_to_none=True)
        self.progress.optimizer_steps += 1
        if taken and self.ema is not None:
            self.ema.update(self.base_model, self.progress.taken_steps, self.progress.epoch)

    def _scaled_step(self) -> bool:
        """fp16: unscale the gradients and take the step unless they hold inf or NaN; whether it was taken.

        A skipped step is as if it had not happened (the loss scale aside): the optimizer is not called,
        so no weight, momentum, moment or step count changes, and the EMA is not updated.  The decision
        reads the scaler's inf flag on the host, once per step.  Skipping on the device instead would take
        torch's fused kernels, whose SGD mishandles a skipped first step (see
        :func:`~image_classification.train.optim.make_optimizer`), or a select over every weight and state
        tensor, with the EMA's update count moved to the device as well.
        """
        scaler, progress = self.scaler, self.progress
        scaler.unscale_(self.optimizer)
        skipped = any(flag.item() for flag in scaler._found_inf_per_device(self.optimizer).values())
        if skipped:
            progress.skipped_steps += 1
            self._overflow_run += 1
            self._overflow_longest = max(self._overflow_longest, self._overflow_run)
        else:
            self.optimizer.step()
            self._overflow_run = 0
        if self.config.precision.loss_scale_adapts:
            scaler.update()  # halved after a skipped step, doubled after LOSS_SCALE_GROWTH_INTERVAL taken ones
        else:
            scaler.update(new_scale=self.config.precision.loss_scale)
        return not skipped

    def end_epoch(self, val_top1: float | None) -> bool:
        """Close the epoch being trained; True when ``val_top1`` (None: not validated, or not finite) makes
        its weights the best so far.  The first finite validation is always the best, even at 0%.  An epoch
        without a figure is neither an improvement nor the lack of one: early stopping does not count it."""
        progress = self.progress
        epoch = progress.epoch
        progress.epoch, progress.batch = epoch + 1, 0
        is_best = val_top1 is not None and (val_top1 > progress.best_prec1 or progress.best_epoch < 0)
        if is_best:
            progress.best_prec1, progress.best_epoch = val_top1, epoch
            progress.epochs_without_improvement = 0
        elif val_top1 is not None:
            progress.epochs_without_improvement += 1
        patience = self.config.optim.early_stopping_patience
        progress.stopped_early = 0 < patience <= progress.epochs_without_improvement
        return is_best

    def discard_gradients(self) -> None:
        """Drop a partial accumulation (a --prof epoch may end between optimizer steps)."""
        self.optimizer.zero_grad(set_to_none=True)

    def read_window(self, where: str, flags: tuple[bool, ...] = ()) -> WindowReading | None:
        """The print window's mean loss (averaged over ranks), read with one device synchronisation.

        ``flags`` (a process's stop and save requests) travel in the same all-reduce and come back in the
        reading as "set on any rank", so a window costs one collective and one host read.  Raises
        :class:`TrainingDiverged` when the loss is not finite or fp16 steps have been skipped
        :data:`MAX_OVERFLOW_RUN` times in a row; ``where`` names the place for the message.
        """
        if not self._window_steps:
            return None
        device = self.runtime.device
        shared = torch.stack([self._loss_sum.float() / self._window_steps,
                              *(torch.full((), float(flag), device=device) for flag in flags)])
        with self.runtime.waiting_for_peers(f"reading the print window at {where}"):
            if self.runtime.distributed:
                dist.all_reduce(shared)
            if self.scaler is not None:  # the same on every rank; read with the rest
                shared = torch.cat([shared, self.scaler._get_scale_async().float().view(1)])
            values = shared.tolist()
        loss = values[0] / self.runtime.world_size
        grad_scale = values.pop() if self.scaler is not None else 1.0
        reading = WindowReading(loss, self._window_steps, self._window_images, tuple(value > 0 for value in values[1:]),
                                grad_scale)
        longest, self._overflow_longest = self._overflow_longest, 0
        self._loss_sum.zero_()
        self._window_steps = self._window_images = 0
        if not math.isfinite(loss):
            raise TrainingDiverged(f"training diverged at {where}: the training loss became {loss}; no checkpoint "
                                   "was written from these weights (lower --lr, or resume an earlier checkpoint)")
        if longest >= MAX_OVERFLOW_RUN:
            skipped = f"the fp16 loss scaler skipped {longest} optimizer steps in a row for inf/NaN gradients"
            if self.config.precision.loss_scale_adapts:
                why = f"the gradients stopped being finite: {skipped} (loss scale now {grad_scale:g})"
            else:  # a fixed scale never comes down: the scale itself is the likelier cause
                why = (f"{skipped} at the fixed loss scale {grad_scale:g} (--static-loss-scale without "
                       "--dynamic-loss-scale: lower it, or add --dynamic-loss-scale)")
            raise TrainingDiverged(f"training diverged at {where}: {why}; no checkpoint was written from these weights")
        return reading

    @property
    def grad_scale(self) -> float:
        return float(self.scaler.get_scale()) if self.scaler is not None else 1.0

    def weights_finite(self) -> bool:
        """Whether every weight, BatchNorm statistic and EMA value is a finite number."""
        tensors = [t for t in self.base_model.state_dict().values() if t.is_floating_point()]
        if self.ema is not None:
            tensors += [t for t in self.ema.state_dict().values() if t.is_floating_point()]
        flags = torch.stack([torch.isfinite(t).all() for t in tensors])
        return bool(flags.all().item())

    # -- checkpoint ---------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """The checkpoint: model, optimizer, scaler, EMA, progress, every rank's RNG, the run's description.

        A collective call in distributed runs (every rank's RNG state is gathered); only rank 0 needs the
        result.
        """
        rng = [ckpt.rng_state()]
        if self.runtime.distributed:
            rng = [None] * self.runtime.world_size
            with self.runtime.waiting_for_peers("gathering the processes' random states for a checkpoint"):
                dist.all_gather_object(rng, ckpt.rng_state())
        state = {
            **asdict(self.progress),
            **self.config.describe_model(),
            "state_dict": self.base_model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scaler": self.scaler.state_dict() if self.scaler is not None else None,
            "seed": self.config.run.seed,
            "world_size": self.runtime.world_size,
            "batch_size": self.config.data.batch_size,
            "epochs": self.config.optim.epochs,  # the schedule's length: a resume with another says so
            "rng": rng,
        }
        if self.classes:
            state["classes"] = list(self.classes)  # classify.py prints these names
        if self.dataset:
            state["dataset"] = dict(self.dataset)
        if self.ema is not None:
            state["state_dict_ema"] = self.ema.state_dict()
            state["ema_updates"] = self.ema.updates
        if self.raport_position is not None:
            state["raport"] = self.raport_position()
        return state

    def load_state_dict(self, state: dict) -> None:
        """Restore a checkpoint written by :meth:`state_dict` (or by an earlier version of this toolkit).

        The weights are loaded when the model is built; this restores everything else. A checkpoint written
        by another number of processes continues at the same point of the epoch, with every process's random
        streams started afresh from the seed (said in one line).
        """
        progress = self.progress
        for name in ("epoch", "batch", "optimizer_steps", "skipped_steps", "iterations",
                     "epochs_without_improvement"):
            setattr(progress, name, int(state.get(name, 0)))
        progress.best_prec1 = float(state.get("best_prec1", 0.0))
        progress.stopped_early = bool(state.get("stopped_early", False))
        progress.best_epoch = int(state.get("best_epoch", 0 if progress.best_prec1 > 0 else -1))
        if state.get("optimizer") is not None:
            try:
                load_optimizer_state(self.optimizer, state["optimizer"])
            except (ValueError, KeyError) as error:
                raise UserError(f"the checkpoint's optimizer state does not fit --optimizer "
                                f"{self.config.optim.optimizer} ({error})") from None
        if self.scaler is not None and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
        if self.ema is not None:
            if state.get("state_dict_ema") is not None:
                self.ema.load_state_dict(state["state_dict_ema"])
                # a checkpoint written before the count was recorded: every update so far counts
                self.ema.updates = int(state.get("ema_updates", progress.taken_steps // self.ema.every))
            else:
                self.log("=> the checkpoint has no EMA weights; the EMA starts from the resumed weights")
        self._restore_rng_and_position(state)

    def _restore_rng_and_position(self, state: dict) -> None:
        runtime, progress = self.runtime, self.progress
        written_by = int(state.get("world_size", 1))
        old_batch = int(state.get("batch_size", self.config.data.batch_size))
        rng = state.get("rng")
        if isinstance(rng, dict):  # format 1: rank 0's generators only
            rng = [rng] if written_by == 1 else None
        same_shape = written_by == runtime.world_size and old_batch == self.config.data.batch_size
        if same_shape and rng and len(rng) == runtime.world_size:
            try:
                ckpt.restore_rng_state(rng[runtime.rank])
            except (AttributeError, TypeError, ValueError, KeyError, IndexError, RuntimeError) as error:
                raise UserError(f"the checkpoint's random generator state is malformed ({type(error).__name__}); "
                                "it cannot be resumed exactly") from None
            return
        reseed(self.config.run.seed, runtime.rank, progress.epoch, progress.iterations)
        if progress.batch:
            seen = progress.batch * written_by * old_batch  # images of this epoch the earlier run trained on
            per_batch = runtime.world_size * self.config.data.batch_size
            progress.batch = -(-seen // per_batch)
            self.log(f"=> the checkpoint was written by {written_by} process(es) with -b {old_batch} after {seen} "
                     f"images of epoch {progress.epoch + 1}; this run ({runtime.world_size} x -b "
                     f"{self.config.data.batch_size}) continues at its batch {progress.batch}, skipping "
                     f"{progress.batch * per_batch - seen} more images; random streams restart from the seed")
        elif written_by != runtime.world_size or not rng:
            self.log(f"=> the checkpoint was written by {written_by} process(es), this run has "
                     f"{runtime.world_size}: every process's random streams restart from the seed, so the run "
                     "will not repeat a run of the original size bitwise")
