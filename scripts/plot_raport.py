"""Plot experiment raports: loss, accuracy and throughput per epoch, several runs overlaid.

    python scripts/plot_raport.py ws/run1/raport.json ws/run2/raport.json -o plots

Writes one PNG per metric into the output folder: ``train_loss.png``, ``val_loss.png``, ``val_top1.png``,
``val_top5.png`` (``val_top{k}`` for a run with ``--topk k``) and ``throughput.png`` (``train.total_ips``).
The values are the raport's end-of-epoch records (``step`` ``[epoch]``), the x axis their epochs counted from 1,
as the run's lines count them (the record ``[0]`` is epoch 1; an evaluation's step, the count of epochs its
weights trained, is shown as it is).
Each run is one line, labelled with its file name, or with its folder when the file names are the same.
A metric that no run has (a ``--training-only`` run has no val metrics) gets no PNG.  The loss charts use a
log scale, said in the axis label: the first epoch's loss is often many times the later ones, and on a
linear scale it would flatten them into a line (a chart holding a value of 0 or below stays linear).  Needs
matplotlib and no display.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from image_classification.errors import UserError  # noqa: E402
from image_classification.records.raport import raport_epoch_offset, read_raport  # noqa: E402
from image_classification.system.cli import run as cli_run  # noqa: E402
from image_classification.system.cli import UserErrorParser  # noqa: E402

Series = tuple[list[int], list[float]]  # epochs, values


@dataclass(frozen=True)
class Plot:
    """One PNG: a raport metric against the epoch; ``log``: on a log scale where every value allows it."""

    metric: str
    file_name: str
    title: str
    y_label: str
    log: bool = False


def plots_for(metrics: set[str]) -> list[Plot]:
    """The PNGs to draw: the fixed ones, and one per val top-k accuracy the raports hold."""
    topk = sorted(int(m[len("val.top"):]) for m in metrics if re.fullmatch(r"val\.top\d+", m))
    return [
        Plot("train.loss", "train_loss.png", "training loss", "loss", log=True),
        Plot("val.loss", "val_loss.png", "validation loss", "loss", log=True),
        *(Plot(f"val.top{k}", f"val_top{k}.png", f"validation top-{k} accuracy", "%")
          for k in topk or [1, 5]),
        Plot("train.total_ips", "throughput.png", "training throughput", "images/s"),
    ]


@dataclass
class Run:
    """One raport's end-of-epoch values: metric -> {epoch, counted from 1: value}."""

    label: str
    per_epoch: dict[str, dict[int, float]]

    def series(self, metric: str) -> Series:
        values = self.per_epoch.get(metric, {})
        epochs = sorted(values)
        return epochs, [values[epoch] for epoch in epochs]


def per_epoch_values(records: Sequence) -> tuple[dict[str, dict[int, float]], list[str]]:
    """The numbers of the LOG records whose step is ``[epoch]``; a later record of an epoch wins.

    Also what was left out, one phrase per kind: a record that is not a JSON object, an end-of-epoch
    record whose epoch is not a whole number or whose data is not an object, a value that is not finite
    (``Infinity``, ``NaN``: nothing to draw, and an infinite one would break the axis).
    """
    values: dict[str, dict[int, float]] = {}
    not_objects = bad_epochs = not_finite = 0
    for record in records:
        if not isinstance(record, dict):
            not_objects += 1
            continue
        step = record.get("step")
        if record.get("type") != "LOG" or not (isinstance(step, list) and len(step) == 1):
            continue
        epoch, data = step[0], record.get("data")
        if not isinstance(epoch, int) or isinstance(epoch, bool) or not isinstance(data, dict):
            bad_epochs += 1
            continue
        for metric, value in data.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                if math.isfinite(value):
                    values.setdefault(metric, {})[epoch] = float(value)
                else:
                    not_finite += 1
    left_out = [(not_objects, "records that are not JSON objects"),
                (bad_epochs, "end-of-epoch records that do not hold an epoch number and an object of values"),
                (not_finite, "values that are not finite numbers")]
    return values, [f"{kind} ({count})" for count, kind in left_out if count]


def load(path: Path) -> list[dict]:
    """A raport's records; a file that is not one is a :class:`UserError`."""
    try:
        records = read_raport(path)
    except OSError as error:
        raise UserError(f"cannot read {path}: {error.strerror}") from None
    except UnicodeDecodeError:
        raise UserError(f"{path} is not a raport: it is not a text file") from None
    except ValueError as error:  # JSON, or image_classification.records.datafile's bounds on it
        raise UserError(f"{path} is not a raport: a 'DLLL ' line {error}") from None
    if not records:
        raise UserError(f"{path} is not a raport: it has no 'DLLL {{json}}' lines")
    return records


def run_labels(paths: Sequence[Path]) -> list[str]:
    """File names without .json when they differ, else the folders holding them, else the paths as given."""
    names, folders = [p.stem for p in paths], [p.resolve().parent.name for p in paths]
    for labels in (names, folders):
        if len(set(labels)) == len(labels):
            return labels
    return [str(p) for p in paths]  # as given: distinct unless a file is named twice


def chart(runs: Sequence[Run], plot: Plot):
    """The matplotlib figure of ``plot``: one line per run that has its metric."""
    from matplotlib.figure import Figure  # no pyplot: no display, no global figure state
    from matplotlib.ticker import MaxNLocator

    figure = Figure(figsize=(7, 4.2))
    axis = figure.subplots()
    drawn = []
    for run in runs:
        epochs, values = run.series(plot.metric)
        if epochs:
            axis.plot(epochs, values, marker="o", label=run.label)
            drawn += values
    log = plot.log and bool(drawn) and min(drawn) > 0  # a log axis would drop a value of 0 or below
    if log:
        axis.set_yscale("log")
    axis.set_title(f"{plot.title} ({plot.metric})")
    axis.set_xlabel("epoch")
    axis.set_ylabel(f"{plot.y_label} (log scale)" if log else plot.y_label)
    axis.xaxis.set_major_locator(MaxNLocator(integer=True))
    axis.grid(True, which="both" if log else "major", alpha=0.3)
    axis.legend()
    figure.tight_layout()
    return figure


def draw(runs: Sequence[Run], plot: Plot, path: Path) -> dict[str, Series]:
    """Draw ``plot`` for the runs that have its metric into ``path``; return what was drawn, read back from
    the lines."""
    figure = chart(runs, plot)
    figure.savefig(path, dpi=100)
    return {line.get_label(): ([int(x) for x in line.get_xdata()], [float(y) for y in line.get_ydata()])
            for line in figure.axes[0].get_lines()}


def plot_raports(paths: Sequence[Path], out_dir: Path) -> dict[str, dict[str, Series]]:
    """Write the PNGs of the raports at ``paths`` into ``out_dir``: {file name: {run label: series}}."""
    runs = []
    for label, path in zip(run_labels(paths), paths):
        records = load(path)
        values, left_out = per_epoch_values(records)
        if left_out:
            print(f"note: {path}: left out {', '.join(left_out)}", file=sys.stderr)
        offset = raport_epoch_offset(records)  # the epochs as the run's lines said them
        runs.append(Run(label, {metric: {epoch + offset: value for epoch, value in by_epoch.items()}
                                for metric, by_epoch in values.items()}))
    for run, path in zip(runs, paths):
        if not run.per_epoch:
            print(f"note: {path} has no end-of-epoch records yet; it is left out", file=sys.stderr)
    metrics = {metric for run in runs for metric in run.per_epoch}
    if not metrics:
        raise UserError("nothing to plot: no raport has an end-of-epoch record")
    out_dir.mkdir(parents=True, exist_ok=True)
    drawn = {}
    for plot in plots_for(metrics):
        if plot.metric not in metrics:
            print(f"{plot.file_name}: skipped, no raport has {plot.metric}")
            continue
        drawn[plot.file_name] = draw(runs, plot, out_dir / plot.file_name)
        print(f"{plot.file_name}: {', '.join(drawn[plot.file_name])}")
    return drawn


def build_parser() -> argparse.ArgumentParser:
    parser = UserErrorParser(prog="plot_raport.py",
                             description="Plot train/val loss, val top-1/top-k and training throughput per "
                             "epoch from experiment raports, one PNG per metric, runs overlaid.")
    parser.add_argument("raports", nargs="+", type=Path, metavar="RAPORT",
                        help="raport files written by main.py (--raport-file)")
    parser.add_argument("-o", "--output-dir", type=Path, metavar="DIR", default=Path("plots"),
                        help="folder for the PNGs (default: plots)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    plot_raports(args.raports, args.output_dir)
    print(f"wrote {args.output_dir}/")
    return 0


if __name__ == "__main__":
    sys.exit(cli_run(main))
