"""The experiment raport, in DLLogger's format (DLLogger itself is not installable from PyPI).

The JSON file holds one record per line, ``DLLL {json}``: PARAMETER records, one METADATA record per
metric, then LOG records whose ``step`` is ``[epoch, iteration]`` (train), ``[epoch, iteration,
val_iteration]`` (validation), ``[epoch]`` (end of epoch) or ``[]`` (run summary).  Standard output
mirrors DEFAULT-level records as ``DLL {datetime} - {step} {name} : {value} {unit} ...``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Callable, TextIO

DEFAULT, VERBOSE = 0, 1

PERF_META = {"unit": "images/s", "format": ":.2f"}
TIME_META = {"unit": "s", "format": ":.5f"}
LOSS_META = {"unit": None, "format": ":.5f"}
ACC_META = {"unit": "%", "format": ":.2f"}


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

    ``kind`` picks the reductions, as the reference's meters do: ``perf`` averages everywhere;
    ``loss`` keeps the best (minimum) epoch for the run; ``acc`` the maximum; ``lr`` the last value;
    ``q<nn>`` is the nn-th percentile of every value recorded in the epoch or run.
    """

    name: str
    kind: str
    verbosity: int
    metadata: dict
    window: list = field(default_factory=list)
    epoch: list = field(default_factory=list)
    epoch_values: list = field(default_factory=list)
    run_values: list = field(default_factory=list)

    def record(self, value: float, n: float = 1.0, *, window: bool = True, epoch: bool = True) -> None:
        if window:
            self.window.append((value, n))
        if epoch:
            self.epoch.append((value, n))

    def _reduce(self, pairs: list) -> float | None:
        if not pairs:
            return None
        if self.kind == "lr":
            return pairs[-1][0]
        if self.kind.startswith("q"):
            return quantile_nearest([v for v, _ in pairs], int(self.kind[1:]) / 100)
        return _mean(pairs)

    def take_window(self) -> float | None:
        value, self.window = self._reduce(self.window), []
        return value

    def take_epoch(self) -> float | None:
        value = self._reduce(self.epoch)
        if self.kind.startswith("q"):
            self.run_values.extend(v for v, _ in self.epoch)
        elif value is not None:
            self.epoch_values.append(value)
        self.epoch, self.window = [], []
        return value

    def run_value(self) -> float | None:
        values = self.epoch_values
        if self.kind.startswith("q"):
            return quantile_nearest(self.run_values, int(self.kind[1:]) / 100)
        if not values:
            return None
        if self.kind == "loss":
            return min(values)  # the reference's MinMeter kept the maximum: the worst epoch
        if self.kind == "acc":
            return max(values)
        if self.kind == "lr":
            return values[-1]
        return sum(values) / len(values)


def format_step(step) -> str:
    if isinstance(step, str):
        return step
    if not step:
        return "Summary:"
    labels = ("Epoch", "Iteration", "Validation Iteration")
    return "".join(f"{label}: {value} " for label, value in zip(labels, step)).rstrip()


class Raport:
    """Writes records to the JSON-lines file and mirrors them on standard output.

    A raport for a process other than global rank 0 is disabled: every call is a no-op.
    """

    def __init__(self, path: str | os.PathLike | None, enabled: bool = True, stdout: TextIO | None = None,
                 echo: Callable[[str], None] | None = None):
        self.enabled = enabled
        self.start = time.time()
        self.metrics: dict[str, Metric] = {}
        self.stdout = stdout if stdout is not None else sys.stdout
        self.echo = echo
        self.file = open(path, "w", encoding="utf-8") if (enabled and path) else None

    # -- low level ------------------------------------------------------------------------------
    def _write(self, record: dict) -> None:
        if self.file is not None:
            self.file.write("DLLL " + json.dumps(record) + "\n")

    def _stamp(self) -> dict:
        now = time.time()
        return {
            "timestamp": str(now),
            "datetime": str(datetime.fromtimestamp(now)),
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
        if verbosity == DEFAULT:
            parts = [self._format_metric(name, value) for name, value in data.items()]
            stamp = datetime.now().strftime("%Y-%m-%dT%H:%M:%S.%f")
            self._print(f"DLL {stamp} - {format_step(step)} " + " ".join(parts))

    def _format_metric(self, name: str, value) -> str:
        metric = self.metrics.get(name)
        if metric is None or value is None or not isinstance(value, (int, float)):
            return f"{name} : {value}"
        spec = metric.metadata.get("format", "")
        text = ("{" + spec + "}").format(value) if spec else str(value)
        return f"{name} : {text} {metric.metadata.get('unit')}" if "unit" in metric.metadata else f"{name} : {text}"

    def flush(self) -> None:
        if self.file is not None:
            self.file.flush()

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None

    # -- parameters and metrics -------------------------------------------------------------------
    def parameters(self, values: dict) -> None:
        if not self.enabled:
            return
        self._write({**self._stamp(), "type": "LOG", "step": "PARAMETER", "data": values})

    def register(self, name: str, kind: str, metadata: dict, verbosity: int = DEFAULT) -> None:
        if name in self.metrics:
            return
        self.metrics[name] = Metric(name, kind, verbosity, metadata)
        if self.enabled:
            self._write({**self._stamp(), "type": "METADATA", "metric": name, "metadata": metadata})

    def record(self, name: str, value: float, n: float = 1.0, *, window: bool = True, epoch: bool = True) -> None:
        self.metrics[name].record(value, n, window=window, epoch=epoch)

    def _emit(self, step, values: dict[str, float | None]) -> None:
        for level in (DEFAULT, VERBOSE):
            data = {k: v for k, v in values.items() if self.metrics[k].verbosity == level}
            if data:
                self.log(step, data, level if len(step) > 1 else DEFAULT)

    def log_window(self, prefix: str, step: list) -> None:
        """Log and reset the window averages of metrics under ``prefix`` (``val`` covers ``val_ema``)."""
        values = {
            name: metric.take_window()
            for name, metric in self.metrics.items()
            if name.startswith(prefix) and metric.window
        }
        if values:
            self._emit(step, values)
            self.flush()

    def end_epoch(self, epoch: int) -> dict[str, float | None]:
        values = {name: metric.take_epoch() for name, metric in self.metrics.items()}
        self._emit([epoch], values)
        self.flush()
        return values

    def end(self) -> dict[str, float | None]:
        values = {name: metric.run_value() for name, metric in self.metrics.items()}
        self._emit([], values)
        self.flush()
        return values


def read_raport(path: str | os.PathLike) -> list[dict]:
    """Parse a raport file into its records (the ``DLLL `` prefix removed)."""
    records = []
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            if line.startswith("DLLL "):
                records.append(json.loads(line[5:]))
    return records
