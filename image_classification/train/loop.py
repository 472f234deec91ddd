"""The training loop: epochs of steps, validation, checkpoints, and when to stop.

The loop keeps the host ahead of the device: losses and counters stay on the device and are read once
per ``--print-freq`` window (:meth:`Engine.read_window`), stop and save requests riding on the same
read; validation synchronises per batch, to time its latency.  Every iteration is timed wall clock to
wall clock, so a window's throughput includes the wait for the device at the window's read, the
logging and any checkpoint written in it.  ``--benchmark-warmup N`` leaves the first N iterations of
training (per process) and of each validation pass out of the throughput and latency of epochs and of
the summary (cuDNN's autotuning and the allocator's growth are not the model's speed); their windows are
still logged, and ``*.wall_ips`` keeps the figure of every iteration.

What may stop a run, and what it then leaves behind:

* the end of ``--epochs`` / ``--run-epochs`` / early stopping: exit 0, checkpoints as asked;
* SIGTERM or SIGUSR1 (what SLURM sends before preemption): at the next optimizer step, a checkpoint of
  exactly that point is written and the run exits :data:`EXIT_PREEMPTED` (75) so a script can requeue it;
* a non-finite training loss or weights, or fp16 steps skipped for inf/NaN gradients many times in a row:
  :class:`TrainingDiverged` (exit 3) within one print window, and no checkpoint or best model is written
  from such weights.  Validation outputs that are not finite while the weights are (fp16's range overflowed
  by BatchNorm statistics that do not fit the weights yet) make that validation count for nothing, said
  in one line, and training goes on; under ``--evaluate``, where the validation is the whole job, they
  end it with exit 3.

:class:`Loop` changes no state of its own: the run's position and everything a checkpoint restores
live in the :class:`Engine`, which it drives.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Callable

import torch
import torch.distributed as dist
from torch import nn

from ..arguments import CheckpointInterval
from ..data import Loader
from ..deploy.tta import flip_tta
from ..errors import EXIT_PREEMPTED, TrainingDiverged
from ..records import checkpoint as ckpt
from ..records.raport import Raport
from ..records.workspace import Workspace
from ..system.runtime import Runtime
from ..system.signals import StopSignal
from .engine import Engine
from .metrics import Console, Warmup, record_iteration
from .progress import pass_length, progress_bar
from .validation import ValResult, batch_sums, figure_names, finite_sums, named, slots, window_figures



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


class Loop:
    """Epochs over the loaders: :meth:`fit` trains and validates, :meth:`evaluate` validates once.

    ``prefixes`` are the validations each epoch runs (``val``, and ``val_ema`` with an EMA; none with
    ``--training-only``); ``show_progress`` draws progress bars under the log lines.  ``evaluated``: what each
    prefix validates instead of the engine's models (``--runtime onnxruntime``: callables on the device
    batch returning logits), counted, timed and reported by the same validation.
    """

    def __init__(self, engine: Engine, raport: Raport, workspace: Workspace, control: RunControl, *,
                 prefixes: list[str], show_progress: bool = False, log=print,
                 evaluated: dict[str, Callable[[torch.Tensor], torch.Tensor]] | None = None):
        self.engine, self.raport, self.workspace, self.control = engine, raport, workspace, control
        self.prefixes, self.show_progress, self.log = prefixes, show_progress, log
        self.evaluated = evaluated
        self.config, self.runtime = engine.config, engine.runtime
        self._noted_short_epoch = False
        self._train_size: int | None = None  # the crop side this process trained at last
        self.train_warmup = Warmup(self.config.run.benchmark_warmup)  # once per process: cuDNN tunes its first steps
        self.val_iterations: dict[str, tuple[int, int]] = {}  # per prefix, over every pass: (iterations, measured)
        self.last_validation: tuple[int, ValResult] | None = None  # (epochs trained, ``val``'s result), the latest
        self.console = Console(self.config.optim.epochs, self.config.run.topk,
                               loss_scaling=self.runtime.needs_loss_scaling,
                               crop_schedule=self.config.data.preprocessing.train_schedule is not None,
                               evaluation=self.config.run.evaluate)
        raport.console = self.console  # standard output shows the loop's lines of its records

    def warmup_notes(self) -> list[str]:
        """A line for each phase that ran iterations but measured none after the warm-up: its throughput
        and latency are missing from the summary, not a number made of warm-up."""
        phases = {"train": (self.train_warmup.seen, self.train_warmup.measured), **self.val_iterations}
        return [f"{prefix}: no throughput or latency figure: all {seen} iterations were warm-up "
                f"(--benchmark-warmup {self.config.run.benchmark_warmup}); run more (--prof) or lower the warm-up"
                for prefix, (seen, measured) in phases.items() if seen and not measured]

    def _models(self) -> dict[str, Callable[[torch.Tensor], torch.Tensor]]:
        if self.evaluated is not None:
            return self.evaluated
        engine = self.engine
        return {"val": engine.model, "val_ema": engine.ema.module if engine.ema else None}

    def fit(self, train_loader, val_loader) -> int:
        """Train from the engine's position to the last epoch of this run; the exit code."""
        engine, config, raport, log, control = self.engine, self.config, self.raport, self.log, self.control
        progress = engine.progress
        start_epoch = progress.epoch
        end_epoch = config.optim.epochs if config.optim.run_epochs < 0 else min(start_epoch + config.optim.run_epochs, config.optim.epochs)
        where = f", batch {progress.batch}" if progress.batch else ""
        if config.run.saves and self.runtime.is_main:
            self.workspace.write_owed_copies(config.run.resumed_from, dataclasses.asdict(progress),
                                             config.run.gather_checkpoints, log)
        control.at_window()
        if control.stop_pending:  # a signal during start-up: nothing trained, nothing to save
            log(f"Stopped by {control.signals.received or 'another process'} before the first step; --resume "
                f"continues from {'the checkpoint' if progress.iterations else 'the start'} (exit code "
                f"{EXIT_PREEMPTED})")
            return EXIT_PREEMPTED
        # What is said counts epochs from 1, as people do (`epoch + 1`); records carry the index (raport.py).
        log(f"RUNNING EPOCHS FROM {start_epoch + 1}{where} TO {end_epoch}")
        if config.run.interval is not None and config.run.saves:
            log(f"=> mid-epoch checkpoints {config.run.interval}")
        for epoch in range(start_epoch, end_epoch):
            bar = progress_bar(self.epoch_plan(train_loader)[0], f"epoch {epoch + 1}", self.show_progress, log,
                               progress.batch)
            completed = self.train_epoch(train_loader, epoch, bar)
            bar.close()
            self._record_pass_counts(train_loader, "train")
            if not completed:
                raport.end_epoch(epoch, progress.iterations)
                log(f"Stopped by {control.signals.received or 'another process'} after {progress.batch} batches "
                    f"of epoch {epoch + 1}; --resume continues from there (exit code {EXIT_PREEMPTED})")
                return EXIT_PREEMPTED
            results = self._validate_all(val_loader, epoch, f"after epoch {epoch + 1}")
            val = results.get("val")
            self.last_validation = (epoch + 1, val) if val is not None else self.last_validation
            engine.end_epoch(val.finite_top1 if val is not None else None)  # the best epoch's save: model_best too
            raport.end_epoch(epoch, progress.iterations)
            self.save(finished_epoch=True, reason="epoch")
            if progress.stopped_early:
                log(f"Early stopping: no better top1 for {progress.epochs_without_improvement} epochs")
                break
            control.at_window()
            if control.stop_pending and epoch + 1 < end_epoch:
                log(f"Stopped by {control.signals.received or 'another process'} at the end of epoch {epoch + 1}; "
                    f"--resume continues from there (exit code {EXIT_PREEMPTED})")
                return EXIT_PREEMPTED
        return 0

    def evaluate(self, val_loader) -> int:
        """Validate the engine's model (and EMA) once, as ``--evaluate`` does; the exit code."""
        epoch = self.engine.progress.epoch
        results = self._validate_all(val_loader, epoch, "evaluation")
        self.last_validation = (epoch, results["val"]) if "val" in results else None
        self.raport.end_epoch(epoch, self.engine.progress.iterations)
        return 0

    def _validate_all(self, val_loader, epoch: int, where: str) -> dict[str, ValResult]:
        results, models = {}, self._models()
        for prefix in self.prefixes:
            label = prefix if self.config.run.evaluate else f"{prefix} {epoch + 1}"
            bar = progress_bar(pass_length(val_loader, self.config.run.prof), label, self.show_progress, self.log)
            results[prefix] = self.validate(models[prefix], val_loader, prefix, epoch, bar)
            bar.close()
            self._record_pass_counts(val_loader, prefix)
            if results[prefix].count and not results[prefix].finite:
                self._not_finite_validation(results[prefix], prefix, where)
        return results

    def _not_finite_validation(self, result: ValResult, prefix: str, where: str) -> None:
        """Outputs that are NaN or inf give no accuracy.  Weights that are not finite end the run; finite ones
        whose outputs overflow (fp16's largest value is 65,504: BatchNorm's running statistics, a momentum
        average of a few steps, need not fit weights that move fast early on) let training go on, said in one
        line.  An evaluation has nothing to go on to: it ends."""
        engine = self.engine
        images = f"{result.not_finite or result.count} of {result.count} {prefix} images"
        fp16 = self.runtime.needs_loss_scaling and self.evaluated is None  # autocast in fp16
        if self.config.run.evaluate:
            advice = "; --amp-dtype bfloat16, or leaving out --amp, evaluates without fp16's range" if fp16 else ""
            raise TrainingDiverged(f"{where}: the model's outputs are NaN or inf for {images} (loss {result.loss}); "
                                   f"no accuracy is reported{advice}")
        if not engine.weights_finite():
            raise TrainingDiverged(f"training diverged {where}: the weights hold NaN or inf values ({prefix}'s "
                                   f"outputs are NaN or inf for {images}); no checkpoint was written from them")
        why = (f"they overflowed fp16 (largest value 65,504): BatchNorm's running statistics after "
               f"{engine.progress.iterations} training iterations do not fit the weights yet; bf16 or FP32 "
               "evaluation avoids it") if fp16 else (
               f"BatchNorm's running statistics after {engine.progress.iterations} training iterations may not fit "
               "the weights yet")
        self.log(f"=> {where}: the outputs are NaN or inf for {images} although the weights are finite ({why}); "
                 "this validation gives no accuracy and no best model, and training goes on")

    def _record_pass_counts(self, loader, prefix: str) -> None:
        """Record what ``loader`` counted in the pass just made (:meth:`..data.Loader.pass_counts`), summed over
        the processes (one small all-reduce where there are several; nothing where the backend counts nothing)."""
        counts = loader.pass_counts()
        if not counts:
            return
        values = list(counts.values())
        if self.runtime.distributed:
            summed = torch.tensor(values, dtype=torch.float64, device=self.runtime.device)
            with self.runtime.waiting_for_peers(f"summing {prefix}'s data counts over the processes"):
                dist.all_reduce(summed)
                values = summed.tolist()
        for name, value in zip(counts, values):
            self.raport.record(f"{prefix}.{name}", value, window=False)

    # -- training -------------------------------------------------------------------------------
    def epoch_plan(self, loader) -> tuple[int, int]:
        """(batches in a train epoch, micro-batches per optimizer step).

        ``--prof`` caps the epoch; an epoch ends on an optimizer step, so trailing micro-batches that
        cannot make one are left out; an epoch shorter than one accumulation steps once at its end.
        """
        config = self.config
        length = len(loader) if config.run.prof <= 0 else min(config.run.prof, len(loader))
        accumulation = config.optim.accumulation
        if 0 < length < accumulation:
            if not self._noted_short_epoch:
                batches = f"{length} batch{'es' if length > 1 else ''}"
                self.log(f"=> an epoch of {batches} is shorter than one gradient accumulation of {accumulation}: "
                         f"the optimizer steps every {batches}")
                self._noted_short_epoch = True
            accumulation = length
        return length - length % accumulation, accumulation

    def train_epoch(self, loader, epoch: int, progress_bar) -> bool:
        """Train one epoch from ``progress.batch``; False when a stop signal ended it early."""
        engine, runtime, raport, control = self.engine, self.runtime, self.raport, self.control
        progress = engine.progress
        engine.base_model.train()
        engine.model.train()
        length, accumulation = self.epoch_plan(loader)
        self.console.lengths["train"] = length
        lr = engine.set_lr(epoch, progress.batch / length if length else 0.0)
        new_size = self._note_train_size(epoch)
        batches = iter_from(loader, epoch, progress.batch)
        print_freq = self.config.run.print_freq
        end = time.perf_counter()
        while progress.batch < length:
            try:
                images, targets = next(batches)
            except StopIteration:
                break
            data_time = time.perf_counter() - end
            step_now = (progress.batch + 1) % accumulation == 0
            if self.config.lr_per_step:
                lr = engine.set_lr(epoch, progress.batch / length)
            compiled = compile_count() if new_size and self.config.model.compile else None
            engine.train_step(images, targets, accumulation=accumulation, step_now=step_now)
            if compiled is not None:
                self._note_recompile(compiled, images.shape[-1], time.perf_counter() - end - data_time)
                new_size = False
            window_ends = progress.batch % print_freq == 0 or progress.batch == length
            if window_ends:
                reading = engine.read_window(f"epoch {epoch + 1}, iteration {progress.batch}", control.local_flags())
                control.agree(reading.flags)
            measured = self.train_warmup.next()
            if self.train_warmup.seen == self.train_warmup.length:  # its last iteration (never for none)
                runtime.synchronize()  # measuring starts once the device, not only the host, is past the warm-up
            now = time.perf_counter()
            record_iteration(raport, "train", data_time=data_time, iteration_time=now - end,
                             images=targets.shape[0] * runtime.world_size, measured=measured)
            end = now  # wall clock to wall clock: logging and saving below count in the next iteration
            if window_ends:
                raport.record("train.lr", lr)
                raport.record("train.loss", reading.loss, reading.images)
                raport.record("train.grad_scale", reading.grad_scale)
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
        leftover = engine.read_window(f"epoch {epoch + 1}, iteration {progress.batch}")  # a loader that ended early
        if leftover is not None:
            raport.record("train.loss", leftover.loss, leftover.images)
            raport.log_window("train", [epoch, progress.batch], global_step=progress.iterations)
        engine.discard_gradients()
        return True

    def _note_train_size(self, epoch: int) -> bool:
        """Record ``epoch``'s training crop side for its epoch line, and say when a schedule changes it; whether
        this process meets the size for the first time (its first epoch, or a change)."""
        size = self.config.data.preprocessing.train_size_at(epoch)
        self.raport.record("train.image_size", size, window=False)
        schedule = self.config.data.preprocessing.train_schedule
        first = self._train_size is None
        if schedule is not None and size != self._train_size:
            before = "" if first else f" (from {self._train_size} px)"
            self.log(f"=> epoch {epoch + 1}: training crops of {size} px{before}, --progressive-resize "
                     f"{' '.join(map(str, schedule.as_flag()))}")
        changed = not first and size != self._train_size
        self._train_size = size
        return changed

    def _note_recompile(self, before: int, size: int, seconds: float) -> None:
        """Say what the first step at a new crop size cost under --compile: torch.compile traces a new input
        shape again (with dynamic shapes, once for every later size too)."""
        after = compile_count()
        if after > before:
            self.log(f"=> --compile: {size} px crops are a new input shape: the model was compiled again "
                     f"({after - before} graph(s), {seconds:.1f} s in this step)")
        else:
            self.log(f"=> --compile: {size} px crops ran on the graph already compiled (dynamic shapes): no "
                     "recompilation")

    # -- validation -----------------------------------------------------------------------------
    @torch.no_grad()
    def validate(self, model: Callable[[torch.Tensor], torch.Tensor], loader, prefix: str, epoch: int,
                 progress_bar) -> ValResult:
        """Validate over this rank's share; counts are summed over ranks, so every image counts once.

        Records carry the step ``[epoch, training iteration, validation iteration]``: the training
        iteration is how far the epoch trained (its length after a whole epoch, 0 under ``--evaluate``).
        """
        config, runtime, raport = self.config, self.runtime, self.raport
        train_iteration = self.engine.progress.batch
        if isinstance(model, nn.Module):
            model.eval()
        ks, tta = (1, config.run.topk), config.data.val_tta is not None
        totals = torch.zeros(len(slots(tta)), dtype=torch.float64, device=runtime.device)
        length = len(loader) if config.run.prof <= 0 else min(config.run.prof, len(loader))
        self.console.lengths[prefix] = length
        batches = iter_from(loader, epoch, 0)
        warmup = Warmup(config.run.benchmark_warmup)  # each pass: its first batches of a shape tune cuDNN again
        figures = figure_names(prefix, config.run.topk, tta)  # a window's: the pass so far
        finite_so_far = True  # once an output is NaN or inf, the pass has no accuracy, nor its windows
        end = time.perf_counter()
        for index in range(length):
            try:
                images, targets = next(batches)
            except StopIteration:
                break
            data_time = time.perf_counter() - end
            compute_time, logits, averaged = self._timed_forward(model, images)
            batch_totals = batch_sums(logits, averaged, targets, ks)
            totals += batch_totals
            local = named(batch_totals, tta)
            now = time.perf_counter()
            record_iteration(raport, prefix, data_time=data_time, iteration_time=now - end,
                             images=targets.shape[0] * runtime.world_size, measured=warmup.next(),
                             latency=compute_time)
            end = now
            if finite_so_far and not finite_sums(local):
                finite_so_far = False
                raport.drop_window(figures)
            if finite_so_far and not runtime.distributed:  # one rank's share so far is no figure of the pass
                for name, value in window_figures(prefix, config.run.topk, local).items():
                    raport.record(name, value, int(local["count"]), epoch=False)
            if (index + 1) % config.run.print_freq == 0 and index + 1 < length:  # the pass's last window: below
                raport.log_window(prefix, [epoch, train_iteration, index + 1])
            progress_bar.update(1)
        with runtime.waiting_for_peers(f"summing {prefix} over the processes"):
            if runtime.distributed:
                dist.all_reduce(totals)
            sums = named(totals, tta)
        seen, measured = self.val_iterations.get(prefix, (0, 0))
        self.val_iterations[prefix] = (seen + warmup.seen, measured + warmup.measured)
        if sums["count"] == 0:
            return ValResult(0.0, math.nan, 0, 0)
        raport.drop_window(figures)  # the last window gives the pass's figures over every rank, as the epoch's
        for name, value in window_figures(prefix, config.run.topk, sums).items():
            raport.record(name, value, int(sums["count"]), epoch=False)
        raport.log_window(prefix, [epoch, train_iteration, length])
        return self._pass_result(prefix, epoch, sums)

    def _pass_result(self, prefix: str, epoch: int, sums: dict[str, float]) -> ValResult:
        """The pass's result from its sums over every rank, its epoch records written: none of accuracy where an
        output was not finite, and no --val-tta figure where a mirror image's output was not."""
        raport, topk, count = self.raport, self.config.run.topk, sums["count"]
        result = ValResult(100.0 * sums["top1"] / count, sums["loss"] / count, int(count), int(sums["bad"]))
        if not result.finite:  # no accuracy from NaN or inf outputs, even counted as wrong
            raport.record(f"{prefix}.not_finite", sums["bad"], window=False)
            return result
        tta_ok = "tta_bad" in sums and not sums["tta_bad"] and math.isfinite(sums["tta_loss"])
        if "tta_bad" in sums and not tta_ok:  # the mirror images' outputs alone are not finite
            self.log(f"=> {prefix} of epoch {epoch + 1}: the outputs on the mirror images are NaN or inf for "
                     f"{int(sums['tta_bad'])} of {int(count)} images: no --val-tta figure")
        for name, value in window_figures(prefix, topk, sums).items():
            if tta_ok or ".tta_" not in name:
                raport.record(name, value, int(count), window=False)
        if tta_ok:
            result = dataclasses.replace(result, tta_top1=100.0 * sums["tta_top1"] / count)
        return result

    def _timed_forward(self, model, images) -> tuple[float, torch.Tensor, torch.Tensor | None]:
        """(compute time, logits, the logits averaged with the mirror images' under --val-tta flip, else None);
        the time covers both passes."""
        runtime = self.runtime
        tta = self.config.data.val_tta is not None
        if runtime.is_cuda:
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            with runtime.autocast():
                logits = model(images)
                averaged = flip_tta(model, images, logits) if tta else None
            stop.record()
            stop.synchronize()
            return start.elapsed_time(stop) / 1000.0, logits, averaged
        begin = time.perf_counter()
        with runtime.autocast():
            logits = model(images)
            averaged = flip_tta(model, images, logits) if tta else None
        return time.perf_counter() - begin, logits, averaged

    # -- checkpoints --------------------------------------------------------------------------------
    def save(self, *, finished_epoch: bool, reason: str) -> None:
        """Write the engine's checkpoint (every rank takes part; rank 0 writes). Never non-finite weights."""
        config, engine = self.config, self.engine
        if not config.run.saves:
            return
        progress = engine.progress
        if not engine.weights_finite():
            raise TrainingDiverged(f"training diverged ({ckpt.position_text(progress.epoch, progress.batch)}): the "
                                   "weights hold NaN or inf values; no checkpoint was written from them")
        state = engine.state_dict()
        self.control.saved(progress.iterations)
        if not self.runtime.is_main:
            return
        latest = self.workspace.latest
        where = ckpt.position_text(progress.epoch, 0 if finished_epoch else progress.batch)
        where += "" if finished_epoch else f" ({reason})"
        self.log(f"SAVING {latest} ({where})")
        # The latest checkpoint first, its copies (the per-epoch file, the best model) after it: a copy that
        # cannot be written never holds back the run's progress, and one a save left unwritten (a kill, a
        # full disk) is written first by the resumed run (write_owed_copies).
        ckpt.save_checkpoint(state, latest)
        self.workspace.write_copies(self.workspace.copies(state, config.run.gather_checkpoints != 0),
                                    config.run.gather_checkpoints if finished_epoch else 0)


def compile_count() -> int:
    """How many frames torch.compile has compiled in this process so far."""
    from torch._dynamo.utils import counters

    return int(sum(counters["stats"].get(name, 0) for name in ("unique_graphs",)))


def iter_from(loader: Loader, epoch: int, start_batch: int):
    """Iterator over ``loader``'s epoch, positioned after ``start_batch`` batches."""
    loader.set_epoch(epoch, start_batch)
    return iter(loader)
