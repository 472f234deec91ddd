"""What ``main.py`` executes: set up the run, drive the loop, and end the process as the job needs.

:func:`train` joins the process group (through :func:`make_runtime`), checks the workspace, lets
:func:`~image_classification.train.plan.resolve_run` settle everything, takes the workspace only once every check
has passed (a refused start leaves nothing behind), and hands the :class:`~image_classification.train.loop.Loop`
its collaborators.  A distributed process always ends through
:func:`_leave_distributed`, so a clean exit, a user error and a lost peer each end in one line.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import NoReturn

import torch.distributed as dist

from .arguments import parse_args
from .arguments.data import DataConfig
from .arguments.model import ModelConfig
from .arguments.optimisation import OptimConfig
from .arguments.precision import PrecisionConfig
from .arguments.run import RunSettings
from .arguments.values import from_args
from .data import get_loaders
from .data.layout import data_change_notice
from .deploy.inference import calibrate
from .deploy.aoti import compiled_for_this_run
from .deploy.onnx_runtime import OnnxModel, onnx_device, require_onnxruntime
from .errors import EXIT_PREEMPTED, PeerLost, UserError
from .models.archs import cpu_trains_faster_channels_last
from .models.quantized import CALIBRATION_BATCHES, calibrate as calibrate_ranges, is_calibrated, is_quantized
from .records.checkpoint import load_checkpoint
from .records.datafile import open_own
from .records.raport import Raport, shown_epoch_offset
from .records.workspace import Workspace
from .system.cli import report
from .system.distributed import lost_peer_reason
from .system.host_memory import keep_freed_memory
from .system.runtime import Runtime, make_runtime, out_of_memory_reason
from .system.signals import StopSignal, Stopped
from .train.engine import Engine
from .train.loop import Loop, RunControl, iter_from
from .train.validation import ValResult
from .train.metrics import register_metrics
from .train.plan import RunConfig, resolve_run
from .train.startup import preflight, workspace_notice, workspace_of


# ------------------------------------------------------------------------------------------------
# The run
# ------------------------------------------------------------------------------------------------
def main(argv: list[str] | None = None, defaults: dict | None = None, *, prog: str = "main.py") -> int:
    """Run main.py's job from its command line (``prog``: the command's name); returns the exit code."""
    return train(parse_args(argv, defaults, prog=prog))


def train(args: argparse.Namespace, classes: list[str] | None = None) -> int:
    """Run the job that parsed (and checked) arguments describe; returns the exit code.  ``classes``: the dataset's
    class folders where :func:`~image_classification.train.startup.preflight` has checked it and the workspace
    (None: the run checks them itself)."""
    with StopSignal() as signals:
        return _train(args, signals, classes)


def _train(args: argparse.Namespace, signals: StopSignal, classes: list[str] | None) -> int:
    precision = from_args(PrecisionConfig, args)  # the runtime's, before the plan (which needs the runtime) reads the rest
    runtime = make_runtime(precision.device, precision.amp, precision.amp_dtype, precision.memory_format,
                           precision.tf32, gpu_affinity=precision.gpu_affinity, dist_timeout=precision.dist_timeout,
                           cpu_channels_last=cpu_trains_faster_channels_last(from_args(ModelConfig, args).arch))
    if not runtime.is_cuda:
        keep_freed_memory()  # each step's activations stay in the heap, not faulted in afresh
    log = runtime.print
    log(workspace_notice(args))
    workspace = workspace_of(args)
    try:
        code = _run(args, runtime, workspace, signals, log, classes)
        if runtime.distributed and dist.is_initialized():
            with runtime.waiting_for_peers("finishing the run"):
                dist.barrier()  # every rank is done with every collective once past it
            _leave_distributed(workspace, code)
        return code
    except RuntimeError as error:
        memory = out_of_memory_reason(error)
        if memory is not None:
            full = UserError(f"out of memory on {runtime.device} ({memory}); lower -b/--batch-size (now "
                             f"{from_args(DataConfig, args).batch_size}), the image size or --num-classes")
            if runtime.distributed:
                _leave_distributed(workspace, report(full))
            raise full from None
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
    except Stopped as stop:  # a stop signal while the start-up read the dataset: nothing to save
        if runtime.distributed:
            print(stop, file=sys.stderr, flush=True)
            _leave_distributed(workspace, EXIT_PREEMPTED)
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


def _run(args: argparse.Namespace, runtime: Runtime, workspace: Workspace, signals: StopSignal, log,
         classes: list[str] | None) -> int:
    settings = from_args(RunSettings, args)
    # Every check of the set-up (flags, dataset, weights, the checkpoint against the flags) comes before the
    # workspace is created and locked: a run refused for any of them leaves nothing behind.
    if classes is None:
        classes = preflight(args, workspace=runtime.is_main)
    plan = resolve_run(args, runtime, workspace, classes, log)
    if plan is None:
        if settings.saves and runtime.is_main:
            _finish_last_save(from_args(OptimConfig, args).epochs, settings.gather_checkpoints, workspace, log)
        return 0
    config = plan.config
    train_loader, val_loader = get_loaders(plan.data, runtime, plan.classes, want_train=not config.run.evaluate,
                                           want_val=not config.run.training_only)
    raport: Raport | None = None  # opened below; the engine asks it where it stands only when it saves
    dataset = train_loader.fingerprint() if train_loader is not None else {}
    if dataset:  # how its JPEGs were decoded: a resume at another scale sees other pixels
        dataset["decode_scale"] = plan.data.decode_scale
    if is_quantized(plan.model) and not is_calibrated(plan.model) and not config.run.evaluate:
        calibrate_quantizers(plan.model, train_loader, runtime, log)  # before the EMA copies the model
    engine = Engine(config, runtime, plan.model, classes=plan.classes, raport_position=lambda: raport.position(),
                    dataset=dataset, log=log)
    if plan.resumed is not None:
        engine.load_state_dict(plan.resumed)
        changed = data_change_notice(plan.resumed.get("dataset"), dataset, engine.progress.batch)
        if changed:
            log(changed)
    evaluated = deployed_models(config, runtime, engine, log) if config.deploy.runtime != "torch" else None
    if runtime.is_main:
        _take_workspace(workspace, config.run.saves, config.run.evaluate, log)
    raport = open_raport(config, runtime, plan.resumed, workspace)
    raport.parameters({**plan.parameters, "raport_file": workspace.raport_file})
    raport.parameters({f"model.{k}": v for k, v in config.model.options().items()})
    if evaluated is not None:
        family = "onnx" if config.deploy.runtime == "onnxruntime" else config.deploy.runtime
        raport.parameters({f"{family}.{prefix}": model.description for prefix, model in evaluated.items()})
    prefixes = [] if config.run.training_only else ["val"] + (["val_ema"] if engine.ema else [])
    counted = tuple((train_loader or val_loader).pass_counts())
    register_metrics(raport, prefixes, config.run.topk, training=not config.run.evaluate, warmup=config.run.benchmark_warmup,
                     pass_counts=counted, tta=config.data.val_tta is not None)
    if config.run.benchmark_warmup:
        log(f"=> throughput and latency leave out the first {config.run.benchmark_warmup} iterations of training and of "
            "each validation (warm-up); *.wall_ips keeps the figure of every iteration")
    show_progress = runtime.is_main and sys.stdout.isatty()
    if show_progress:
        from tqdm import tqdm

        raport.echo = tqdm.write
    control = RunControl(runtime, signals, config.run.interval, engine.progress.iterations)
    loop = Loop(engine, raport, workspace, control, prefixes=prefixes, show_progress=show_progress, log=log,
                evaluated=evaluated)
    try:
        if config.run.evaluate:
            code = loop.evaluate(val_loader)
        else:
            code = loop.fit(train_loader, val_loader)
    finally:
        raport.end()
        raport.close()
    _print_summary(config, runtime, engine, loop, workspace, train_loader, val_loader)
    for note in loop.warmup_notes():
        log(note)
    log("Experiment ended")
    return code


def top1_summary(last: tuple[int, ValResult] | None, best: float, best_epoch: int, *, evaluation: bool,
                 best_file: str | None) -> str | None:
    """The summary's accuracy line: the last validation's top1 with its epoch (the weights the run ends with,
    which ``checkpoint:`` names), then the best with its epoch (``best_file`` holds it); an evaluation's one
    figure alone.  ``last``: (epochs trained, the validation's result), None when nothing was validated;
    ``best_epoch`` is 0-based, as checkpoints record it, and -1 before a finite validation.  Epochs are
    counted from 1, as everything a person reads counts them."""
    if last is None:
        return None
    epochs, result = last
    top1 = result.finite_top1
    tta = f"; with flip TTA: {result.tta_top1:.2f}%" if result.tta_top1 is not None else ""
    if evaluation:
        return f"val top1: {'none: its outputs were not finite' if top1 is None else f'{top1:.2f}%'}{tta}"
    text = f"val top1: last none (epoch {epochs}: its outputs were not finite)" if top1 is None else \
        f"val top1: last {top1:.2f}% (epoch {epochs})"
    if best_epoch >= 0:
        text += f", best {best:.2f}% (epoch {best_epoch + 1}{f', {best_file}' if best_file else ''})"
    return text + tta  # --val-tta's figure of the same validation, apart from the plain one


def calibrate_quantizers(model, loader, runtime: Runtime, log) -> None:
    """A fresh quantization-aware model's activation ranges, from its inputs over the first
    :data:`CALIBRATION_BATCHES` training batches (as the reference calibrates), said in one line."""
    def batches():
        for index, (images, _targets) in enumerate(iter_from(loader, 0, 0)):
            if index == CALIBRATION_BATCHES:
                return
            yield images

    with runtime.autocast():
        used = calibrate_ranges(model, batches())
    log(f"=> quantization-aware training: activation ranges calibrated on {used} training batches")


def deployed_models(config: RunConfig, runtime: Runtime, engine: Engine, log) -> dict:
    """What ``--evaluate --runtime onnxruntime|aoti`` validates: the engine's model (and EMA) exported through the
    ONNX cache, int8 where asked, run by ONNX Runtime on the run's device; or compiled into an AOTInductor
    package for the run's device.  Before the workspace is taken: an unreadable calibration set is refused with
    nothing written."""
    modules = {"val": engine.base_model, "val_ema": engine.ema.module if engine.ema else None}
    modules = {prefix: module for prefix, module in modules.items() if module is not None}
    size = config.data.preprocessing.image_size
    if config.deploy.runtime == "aoti":
        return {prefix: compiled_for_this_run(module, size, runtime.device, log) for prefix, module in modules.items()}
    require_onnxruntime("--runtime onnxruntime")
    device = onnx_device(runtime.device.type)
    quantization = calibrate(config.int8, config.data.preprocessing, log) if config.int8 is not None else None
    return {prefix: OnnxModel(module, size, log, quantization, device) for prefix, module in modules.items()}


def _finish_last_save(epochs: int, gather_checkpoints: int, workspace: Workspace, log) -> None:
    """A finished run (``--resume auto``: nothing to do) whose last save ended after the latest checkpoint (a kill,
    a full disk) gets the copies it owes, the best model among them, as a resumed run would."""
    try:
        latest = load_checkpoint(workspace.latest)
    except UserError:
        return  # none, or damaged: another checkpoint ended the run
    if not (latest.get("stopped_early") or int(latest["epoch"]) >= epochs):
        return  # behind the checkpoint that ended the run: its copies are not this run's last
    if workspace.owed_copies(latest, gather_checkpoints != 0):
        _take_workspace(workspace, True, False, log)
        workspace.write_owed_copies(workspace.latest, latest, gather_checkpoints, log)


def _take_workspace(workspace: Workspace, saving: bool, evaluate: bool, log) -> None:
    """Create the workspace; a run that may write checkpoints locks it and clears what a killed save left.

    An evaluation writes only a raport, to a file of its own (said here, and again at the end): the default
    name when free, else one beside it named by the time; so it takes no lock, and may run beside the
    training run whose workspace it reads."""
    workspace.prepare(saving)
    if evaluate:
        requested = workspace.raport
        raport = workspace.claim_evaluation_raport()
        if raport == requested:
            log(f"=> raport of this evaluation: {raport}")
        else:
            log(f"=> {requested} holds earlier records: this evaluation's raport is {raport}")
        return
    workspace.lock()
    for stale in workspace.remove_stale_temporaries():
        log(f"=> removed {stale.name}, left by an interrupted save")


def open_raport(config: RunConfig, runtime: Runtime, resumed: dict | None, workspace: Workspace) -> Raport:
    """The raport; a resumed run appends to it, cut back to where the checkpoint left it when the raport is
    the one that checkpoint's run wrote (its run id, in the raport's parameters).  Another run's raport is
    never cut: the resumed run appends after a separator record that names the checkpoint.  An evaluation
    writes the file of its own that :func:`_take_workspace` claimed."""
    offset, separator = None, None
    if resumed is not None and not config.run.evaluate:
        position = resumed.get("raport") or {}
        end = workspace.raport.stat().st_size if workspace.raport.is_file() else 0
        ours = position.get("file") == Path(config.run.raport_name).name and int(position.get("offset", -1)) >= 0 \
            and int(position["offset"]) <= end and _written_by(workspace.raport, position.get("run"))
        offset = int(position["offset"]) if ours else end
        if not ours and end:
            separator = {"resumed_from": str(config.run.resumed_from), "run_id": config.run.run_id,
                         "note": "this raport was written by another run; the records below continue the "
                                 "checkpoint's run"}
    purge = int(resumed.get("iterations", 0)) + 1 if resumed is not None else None  # what a killed run logged after
    raport = Raport(workspace.raport, enabled=runtime.is_main, resume_offset=offset, tensorboard=config.run.tensorboard,
                    tensorboard_purge_step=purge, run_id=config.run.run_id,
                    epoch_offset=shown_epoch_offset(config.run.evaluate))
    if separator is not None:
        raport.parameters(separator)
    return raport


def _written_by(path: Path, run_id: str | None) -> bool:
    """Whether the raport at ``path`` holds run ``run_id``'s parameters (a checkpoint from before run ids
    existed, None, is taken at its word, as it always was)."""
    if run_id is None:
        return True
    marker = f'"run_id": "{run_id}"'
    try:
        with open_own(path, "r", encoding="utf-8", errors="replace") as handle:
            return any(marker in line for line in handle if '"PARAMETER"' in line)
    except OSError:
        return False


def _print_summary(config: RunConfig, runtime: Runtime, engine: Engine, loop: Loop, workspace: Workspace,
                   train_loader, val_loader) -> None:
    if not runtime.is_main:
        return
    best_file = workspace.best.name if config.run.saves else None
    line = top1_summary(loop.last_validation, engine.progress.best_prec1, engine.progress.best_epoch,
                        evaluation=config.run.evaluate, best_file=best_file)
    if line:
        print(line, flush=True)
    progress = engine.progress
    if progress.skipped_steps:
        print(f"skipped optimizer steps with inf/NaN gradients: {progress.skipped_steps}", flush=True)
        if not progress.taken_steps and not config.run.evaluate:
            hint = ("the scale halves at each skipped step: a run of more steps gets past them"
                    if config.precision.loss_scale_adapts else
                    "the scale is fixed: lower --static-loss-scale, or add --dynamic-loss-scale")
            print(f"warning: no optimizer step was taken: all {progress.skipped_steps} had inf/NaN gradients at the "
                  f"fp16 loss scale {engine.grad_scale:g} ({hint}); the weights are the ones the run started from",
                  file=sys.stderr, flush=True)
    skipped = sum(loader.skipped for loader in (train_loader, val_loader) if loader is not None)
    if skipped:
        print(f"skipped unreadable images: {skipped}", flush=True)
    if config.run.saves:
        print(f"checkpoint: {workspace.latest}", flush=True)
    print(f"raport: {workspace.raport}", flush=True)
