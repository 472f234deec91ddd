"""The experiment raport, in DLLogger's format (DLLogger itself is not installable from PyPI).

The JSON file holds one record per line, ``DLLL {json}``, as DLLogger 1.1 writes them: every record has
``timestamp`` and ``elapsedtime`` (seconds, as strings) and a timezone-aware ``datetime``; PARAMETER
records come first, then one METADATA record per metric (``{"type": "METADATA", "metric": name,
"metadata": {...}}``), then LOG records whose ``step`` is ``[epoch, iteration]`` (train), ``[epoch,
iteration, val_iteration]`` (validation), ``[epoch]`` (end of epoch) or ``[]`` (run summary).  Every line is
strict JSON: a metric without a figure (nothing recorded, or a value that is not finite) is left out of its
record, never written as null or a bare NaN.  What standard output shows of a record is a ``console``'s
choice: a function of the record's step and figures (both levels) that gives a line or nothing, as the training
loop's one short line per window and per epoch; without one it mirrors DEFAULT-level records as DLLogger does,
``DLL {datetime} - {step} {name} : {value} {unit} ...``.  The records number epochs from 0, as the reference's
DLLogger does (and the tools that read its raports expect); standard output counts them from 1, as people do
and as every other line of a run does: the record ``[0, 10]`` prints as ``Epoch: 1 Iteration: 10``.  An
evaluation's step is the count of epochs its weights trained, printed as it is.

Aggregates: a throughput (``*_ips``) is recorded per iteration with its wall time as the weight, so a
window's, an epoch's and the run's value is images divided by wall time over every iteration in it;
times average per iteration; accuracy keeps the best epoch, loss the lowest epoch, lr the last value; a
count (``*.cpu_decoded``) adds up.

A resumed run appends to the raport it continues: the file is cut back to where it stood when the
checkpoint was written (:meth:`Raport.position`), so no record is repeated.  ``--tensorboard DIR``
mirrors the same metrics to TensorBoard event files.
"""

from __future__ import annotations

import json
import math
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Callable, TextIO

from ..errors import StorageError, UserError, write_failure
from .datafile import folder_problem, open_own, parse_json, refused_own_file

DEFAULT, VERBOSE = 0, 1
ConsoleFormat = Callable[[list, dict], str | None]  # a record's step and figures -> the line standard output shows
MAX_RECORD_BYTES = 16 << 20  # far more than a record's line takes (the PARAMETER record: a few KB)

PERF_META = {"unit": "images/s", "format": ":.2f"}
TIME_META = {"unit": "s", "format": ":.5f"}
LOSS_META = {"unit": None, "format": ":.5f"}
ACC_META = {"unit": "%", "format": ":.2f"}
COUNT_META = {"unit": "images", "format": ":.0f"}
LR_META = {"unit": None, "format": ":.6g"}
SIZE_META = {"unit": "px", "format": ":.0f"}


def _mean(pairs: list[tuple[float, float]]) -> float | None:
    total = sum(n for _, n in pairs)
    return sum(v * n for v, n in pairs) / total if total else None


def quantile_nearest(values: list[float], q: float) -> float | None:
    """numpy's ``method="nearest"`` quantile, without numpy."""
    if not values:
        return None
    ordered = sorted(values)
    index = int(round(q * (len(ordered) - 1)))  # round half to even, as numpy does
    return ordered[index]


@dataclass
class Metric:
    """One metric's window, epoch and run aggregates.

    ``kind`` picks the reductions: ``perf`` is a weighted mean everywhere (the run's over every
    iteration, not a mean of epoch means); ``loss`` keeps the best (minimum) epoch for the run; ``acc``
    the maximum; ``lr`` and ``last`` the last value; ``sum`` adds up what the epoch and the run recorded; ``q<nn>`` is
    the nn-th percentile of every value recorded in the epoch or run.  A ``running`` metric's window value covers
    everything recorded since the epoch began
    (a validation's accuracy so far), not only what came since the last window.
    """

    name: str
    kind: str
    verbosity: int
    metadata: dict
    running: bool = False
    window: list = field(default_factory=list)
    unread: int = 0  # window records since the last window was taken
    epoch: list = field(default_factory=list)
    epoch_values: list = field(default_factory=list)  # (value, weight) per finished epoch
    run_values: list = field(default_factory=list)

    def record(self, value: float, n: float = 1.0, *, window: bool = True, epoch: bool = True) -> None:
        if window:
            self.window.append((value, n))
            self.unread += 1
        if epoch:
            self.epoch.append((value, n))

    def _reduce(self, pairs: list) -> float | None:
        if not pairs:
            return None
        if self.kind in ("lr", "last"):
            return pairs[-1][0]
        if self.kind == "sum":
            return sum(v for v, _ in pairs)
        if self.kind.startswith("q"):
            return quantile_nearest([v for v, _ in pairs], int(self.kind[1:]) / 100)
        return _mean(pairs)

    def take_window(self) -> float | None:
        value, self.unread = self._reduce(self.window), 0
        if not self.running:
            self.window = []
        return value

    def take_epoch(self) -> float | None:
        value = self._reduce(self.epoch)
        if self.kind.startswith("q"):
            self.run_values.extend(v for v, _ in self.epoch)
        elif value is not None:
            self.epoch_values.append((value, sum(n for _, n in self.epoch)))
        self.epoch, self.window, self.unread = [], [], 0
        return value

    def run_value(self) -> float | None:
        if self.kind.startswith("q"):
            return quantile_nearest(self.run_values, int(self.kind[1:]) / 100)
        values = [v for v, _ in self.epoch_values]
        if not values:
            return None
        if self.kind == "loss":
            return min(values)  # the reference's MinMeter kept the maximum: the worst epoch
        if self.kind == "acc":
            return max(values)
        if self.kind in ("lr", "last"):
            return values[-1]
        if self.kind == "sum":
            return sum(values)
        return _mean(self.epoch_values)


def _figure(value) -> bool:
    """Whether ``value`` is something to log: not None, and finite where it is a number."""
    return value is not None and not (isinstance(value, float) and not math.isfinite(value))


def _strict_json(record: dict) -> str:
    """``record`` as strict JSON: a float that is not finite (json.dumps writes a bare NaN) becomes null."""
    try:
        return json.dumps(record, allow_nan=False)
    except ValueError:
        def finite(value):
            if isinstance(value, float) and not math.isfinite(value):
                return None
            if isinstance(value, dict):
                return {key: finite(item) for key, item in value.items()}
            if isinstance(value, (list, tuple)):
                return [finite(item) for item in value]
            return value
        return json.dumps(finite(record), allow_nan=False)


def shown_epoch_offset(evaluate: bool) -> int:
    """What a record's epoch gains where a person reads it (see the module docstring): 1 for a training's records,
    whose ``[0]`` is epoch 1, 0 for an evaluation's, whose step is the count of epochs its weights trained."""
    return 0 if evaluate else 1


def raport_epoch_offset(records: list[dict]) -> int:
    """:func:`shown_epoch_offset` of the run whose ``records`` these are: an evaluation's PARAMETER record says
    ``evaluate``."""
    evaluate = any(record.get("step") == "PARAMETER" and isinstance(record.get("data"), dict)
                   and record["data"].get("evaluate") is True for record in records if isinstance(record, dict))
    return shown_epoch_offset(evaluate)


def format_step(step, epoch_offset: int = 1) -> str:
    """A record's step as standard output shows it; ``epoch_offset`` is added to its epoch (see the module
    docstring: 1 for a training's records, 0 for an evaluation's)."""
    if isinstance(step, str):
        return step
    if not step:
        return "Summary:"
    labels = ("Epoch", "Iteration", "Validation Iteration")
    shown = [step[0] + epoch_offset, *step[1:]]
    return "".join(f"{label}: {value} " for label, value in zip(labels, shown)).rstrip()


def check_tensorboard(log_dir: str | os.PathLike) -> None:
    """Refuse a ``--tensorboard`` folder that cannot be written, with the start's other checks: before the
    workspace is made or locked, so that the refusal leaves nothing behind."""
    problem = folder_problem(log_dir)
    if problem is not None:
        raise UserError(f"--tensorboard {log_dir} {problem}")


def _quiet_writer_threads() -> None:
    """Leave out the traceback of TensorBoard's writer thread when its write fails: TensorBoard raises the same
    error again in the main thread's next call, where :class:`TensorBoardMirror` turns it into one line."""
    previous = threading.excepthook
    if getattr(previous, "quiet_tensorboard", False):
        return

    def hook(args) -> None:
        if type(args.thread).__name__ == "_AsyncWriterThread" and issubclass(args.exc_type, OSError):
            return
        previous(args)

    hook.quiet_tensorboard = True
    threading.excepthook = hook


class TensorBoardMirror:
    """Writes the raport's metrics as TensorBoard scalars (``torch.utils.tensorboard``, rank 0 only).

    Train windows and epoch aggregates (under ``epoch/``) are plotted against the run's iteration, one
    step axis for every tag, so that a resumed run at iteration T can hide what a killed one wrote after
    T (``purge_step``) instead of showing those steps twice. The run's parameters are written once as
    hyperparameters with the summary.  A write that fails (a full disk, storage gone read-only) is one
    line (:func:`~image_classification.errors.write_failure`), and the mirror writes nothing more.
    """

    def __init__(self, log_dir: str | os.PathLike, purge_step: int | None = None):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as error:  # the tensorboard package is missing
            raise UserError(f"--tensorboard needs the tensorboard package ({error}); "
                            "pip install tensorboard") from None
        check_tensorboard(log_dir)
        self.log_dir, self.failed = log_dir, False
        self.parameters: dict = {}
        _quiet_writer_threads()
        self.writer = self._written(lambda: SummaryWriter(log_dir=str(log_dir), purge_step=purge_step))

    def _written(self, write: Callable):
        """``write()``'s result; an OSError of it, or of TensorBoard's writer thread before it, as one line.
        Nothing once a write has failed."""
        if self.failed:
            return None
        try:
            return write()
        except OSError as error:
            self.failed = True
            raise write_failure(f"--tensorboard {self.log_dir}", error) from None

    def window(self, values: dict, global_step: int) -> None:
        def write() -> None:
            for name, value in values.items():
                if isinstance(value, (int, float)) and _figure(value):
                    self.writer.add_scalar(name, value, global_step)
        self._written(write)

    def epoch(self, values: dict, global_step: int) -> None:
        def write() -> None:
            for name, value in values.items():
                if isinstance(value, (int, float)) and _figure(value):
                    self.writer.add_scalar(f"epoch/{name}", value, global_step)
            self.writer.flush()
        self._written(write)

    def end(self, summary: dict) -> None:
        hparams = {k: v if isinstance(v, (int, float, str, bool)) else str(v) for k, v in self.parameters.items()}
        metrics = {f"summary/{k}": v for k, v in summary.items() if isinstance(v, (int, float)) and _figure(v)}

        def write() -> None:
            if metrics:
                self.writer.add_hparams(hparams, metrics, run_name=".")
            self.writer.close()
        self._written(write)


class Raport:
    """Writes records to the JSON-lines file and mirrors them on standard output (and TensorBoard).

    A raport for a process other than global rank 0 is disabled: every call is a no-op. ``resume_offset``
    reopens an existing raport for appending, cut back to that byte offset first.  ``epoch_offset``: what
    standard output adds to a step's epoch (:func:`format_step`).  ``console``: the line standard output shows
    for a record's step and figures, or None for none (see the module docstring); without it, DLLogger's lines.
    """

    def __init__(self, path: str | os.PathLike | None, enabled: bool = True, stdout: TextIO | None = None,
                 echo: Callable[[str], None] | None = None, resume_offset: int | None = None,
                 tensorboard: str | os.PathLike | None = None, tensorboard_purge_step: int | None = None,
                 run_id: str | None = None, epoch_offset: int = 1, console: ConsoleFormat | None = None):
        self.enabled = enabled
        self.console = console
        self.epoch_offset = epoch_offset
        self.run_id = run_id  # the run this raport belongs to, recorded in its checkpoints
        self.path = Path(path) if path else None
        self.start = time.time()
        self.metrics: dict[str, Metric] = {}
        self.stdout = stdout if stdout is not None else sys.stdout
        self.echo = echo
        self.file = None
        self.mirror = None
        if enabled and path:
            self.file = self._open(self.path, resume_offset)
        if enabled and tensorboard:
            self.mirror = TensorBoardMirror(tensorboard, tensorboard_purge_step)

    @staticmethod
    def _open(path: Path, resume_offset: int | None) -> TextIO:
        try:
            if resume_offset is not None and path.is_file() and path.stat().st_size >= resume_offset:
                handle = open_own(path, "r+", encoding="utf-8")
                handle.seek(resume_offset)
                handle.truncate()
                return handle
            return open_own(path, "a" if resume_offset is not None else "w", encoding="utf-8")
        except OSError as error:
            problem = refused_own_file(path, error)
            if problem is not None:  # a link or a FIFO put there after the workspace's check
                raise UserError(f"the raport {path} {problem}; remove it") from None
            raise StorageError(f"could not open the raport {path}: {error.strerror or error}") from None

    # -- low level ------------------------------------------------------------------------------
    def _write(self, record: dict) -> None:
        if self.file is not None:
            try:
                self.file.write("DLLL " + _strict_json(record) + "\n")
            except OSError as error:
                raise StorageError(f"could not write the raport {self.path}: {error.strerror or error}") from None

    def _stamp(self) -> dict:
        now = time.time()
        return {
            "timestamp": str(now),
            "datetime": str(datetime.fromtimestamp(now).astimezone()),
            "elapsedtime": str(now - self.start),
        }

    def _print(self, line: str) -> None:
        if self.echo is not None:
            self.echo(line)
        else:
            print(line, file=self.stdout, flush=True)

    def log(self, step, data: dict, verbosity: int = DEFAULT) -> None:
        if not self.enabled:
            return
        self._write({**self._stamp(), "type": "LOG", "step": step, "data": data})
        if verbosity == DEFAULT and self.console is None:
            parts = [self._format_metric(name, value) for name, value in data.items()]
            stamp = datetime.now().strftime("%Y-%m-%dT%H:%M:%S.%f")
            self._print(f"DLL {stamp} - {format_step(step, self.epoch_offset)} " + " ".join(parts))

    def _format_metric(self, name: str, value) -> str:
        metric = self.metrics.get(name)
        if metric is None or value is None or not isinstance(value, (int, float)):
            return f"{name} : {value}"
        spec = metric.metadata.get("format", "")
        text = ("{" + spec + "}").format(value) if spec else str(value)
        unit = metric.metadata.get("unit")
        return f"{name} : {text} {unit}" if unit else f"{name} : {text}"

    def flush(self) -> None:
        if self.file is not None:
            try:
                self.file.flush()
            except OSError as error:
                raise StorageError(f"could not write the raport {self.path}: {error.strerror or error}") from None

    def position(self) -> dict:
        """Where the raport stands (flushed): a checkpoint records it, so a resume appends from there."""
        if self.file is None:
            return {"file": str(self.path.name) if self.path else "", "offset": -1, "run": self.run_id}
        self.flush()
        return {"file": self.path.name, "offset": self.file.tell(), "run": self.run_id}

    def close(self) -> None:
        if self.file is not None:
            try:
                self.file.close()
            except OSError:
                pass
            self.file = None

    # -- parameters and metrics -------------------------------------------------------------------
    def parameters(self, values: dict) -> None:
        if not self.enabled:
            return
        self._write({**self._stamp(), "type": "LOG", "step": "PARAMETER", "data": values})
        if self.mirror is not None:
            self.mirror.parameters.update(values)

    def register(self, name: str, kind: str, metadata: dict, verbosity: int = DEFAULT, *,
                 running: bool = False) -> None:
        if name in self.metrics:
            return
        self.metrics[name] = Metric(name, kind, verbosity, metadata, running)
        if self.enabled:
            self._write({**self._stamp(), "type": "METADATA", "metric": name, "metadata": metadata})

    def record(self, name: str, value: float, n: float = 1.0, *, window: bool = True, epoch: bool = True) -> None:
        self.metrics[name].record(value, n, window=window, epoch=epoch)

    def drop_window(self, names) -> None:
        """Forget what the window of each metric in ``names`` holds, unlogged (a validation whose figure so far
        stopped being one)."""
        for name in names:
            metric = self.metrics[name]
            metric.window, metric.unread = [], 0

    def _emit(self, step, values: dict[str, float | None]) -> None:
        """Log ``values`` at ``step``; a metric with no figure (None, or a value that is not finite) is left out,
        not logged as null or as a bare NaN, which strict JSON readers refuse."""
        for level in (DEFAULT, VERBOSE):
            data = {k: v for k, v in values.items() if _figure(v) and self.metrics[k].verbosity == level}
            if data:
                self.log(step, data, level if len(step) > 1 else DEFAULT)
        if self.console is not None and self.enabled:
            line = self.console(step, {k: v for k, v in values.items() if _figure(v)})
            if line:
                self._print(line)

    def log_window(self, prefix: str, step: list, global_step: int | None = None) -> None:
        """Log and reset the window averages of metrics under ``prefix`` (``val`` covers ``val_ema``)."""
        values = {
            name: metric.take_window()
            for name, metric in self.metrics.items()
            if name.startswith(prefix) and metric.unread
        }
        if values:
            self._emit(step, values)
            self.flush()
            if self.mirror is not None and global_step is not None and self.enabled:
                self.mirror.window(values, global_step)

    def end_epoch(self, epoch: int, global_step: int | None = None) -> dict[str, float | None]:
        """Log the epoch's aggregates; ``global_step`` (the run's iteration) places them in TensorBoard."""
        values = {name: metric.take_epoch() for name, metric in self.metrics.items()}
        self._emit([epoch], values)
        self.flush()
        if self.mirror is not None and self.enabled:
            self.mirror.epoch(values, epoch if global_step is None else global_step)
        return values

    def end(self) -> dict[str, float | None]:
        """The run summary; not written when nothing was recorded (a run that failed before its first epoch)."""
        values = {name: metric.run_value() for name, metric in self.metrics.items()}
        if all(value is None for value in values.values()):
            self.flush()
            return values
        self._emit([], values)
        self.flush()
        if self.mirror is not None and self.enabled:
            self.mirror.end(values)
            self.mirror = None
        return values


def read_raport(path: str | os.PathLike) -> list[dict]:
    """Parse a raport file into its records (the ``DLLL `` prefix removed), each line's JSON under
    :func:`.datafile.parse_json`'s bounds (NaN and infinities accepted: raports of earlier versions hold them); a
    line that breaks them raises a ValueError (:class:`.datafile.DataFileError`)."""
    records = []
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            if line.startswith("DLLL "):
                records.append(parse_json(line[5:], MAX_RECORD_BYTES, allow_nonfinite=True))
    return records


def epoch_records(path: str | os.PathLike) -> dict[int, dict]:
    """The figures a raport records for each epoch (its ``LOG`` records of one step, merged), by the raport's
    0-based epoch index."""
    epochs: dict[int, dict] = {}
    for record in read_raport(path):
        step = record.get("step")
        if record.get("type") == "LOG" and isinstance(step, list) and len(step) == 1:
            epochs.setdefault(step[0], {}).update(record["data"])
    return epochs
