"""Time to accuracy with and without ``--progressive-resize``: alternating main.py runs, one table.

    python benchmarks/resize_timing.py DIR [--make digits|photos] --fixed 64 --ramp 32 64 3 6 --epochs 8 \
        --seeds 1 2 3 --workspace /tmp/timing -- -a resnet18 --num-classes 10 -b 64 --lr 0.05 ...

``--make`` first writes the data set into DIR where it has no train/ yet: ``digits``, scikit-learn's handwritten
digits as ``make demo`` writes them but ``--fixed`` px square; ``photos``, the loader benchmark's photo set (4
classes x 150 JPEGs of 500x375 cut from scikit-image's photographs) with a val/ of 50 other cuts per class.

For each seed it runs main.py twice on DIR, in one session and alternating (the fixed-size run first for odd
seeds, the progressive one first for even ones, so that a change in the machine's load hits both): once at
``--image-size FIXED``, once with ``--progressive-resize RAMP`` and ``--val-crop-size FIXED``; every other flag
(after ``--``) is the same.  Each run validates after every epoch and writes no checkpoints.

The target is the fixed-size runs' mean final val top-1; a run reaches it at its first epoch within
``--within`` points (default 0.5).  Training time is each epoch's training images over its ``train.total_ips``
from the raport (the training loop alone, wall clock, loader waits included, validation left out), summed up
to that epoch; the wall time to it is the run's ``time`` less what came after that epoch's validation; ``time``
is the whole main.py command's, start-up and every validation included.  Printed: a row per
run, the ratio of the progressive runs' times to the fixed ones', and what one training iteration costs at each
size (``train.compute_time``, ``train.data_time``: the wait for the loader), from the same runs; the machine and
its load average before and after each run.  ``--threads N`` (default 1) sets OMP_NUM_THREADS for the runs.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from image_classification.data.files import is_image_file  # noqa: E402
from image_classification.errors import UserError  # noqa: E402
from image_classification.records.raport import epoch_records  # noqa: E402
from image_classification.system import machine  # noqa: E402
from image_classification.system.cli import UserErrorParser, run  # noqa: E402


@dataclass
class Run:
    seed: int
    schedule: str  # "fixed" or "progressive"
    wall_s: float
    load_before: tuple[float, float, float]
    load_after: tuple[float, float, float]
    epochs: list[dict] = field(default_factory=list)  # per epoch: top1, train_s, val_s, size, compute_s, data_s

    @property
    def final_top1(self) -> float:
        return self.epochs[-1]["top1"]

    def reached(self, target: float) -> int | None:
        """The first epoch whose val top-1 is at least ``target``."""
        return next((index for index, epoch in enumerate(self.epochs) if epoch["top1"] >= target), None)

    def train_seconds(self, through: int | None = None) -> float:
        last = len(self.epochs) if through is None else through + 1
        return sum(epoch["train_s"] for epoch in self.epochs[:last])

    def wall_seconds(self, through: int) -> float:
        """The run's wall time when epoch ``through``'s validation ended: its ``time`` less the training and
        validation of the epochs after it (start-up, checkpoints and logging counted as they came)."""
        later = self.epochs[through + 1:]
        return self.wall_s - sum(epoch["train_s"] + epoch["val_s"] for epoch in later)


def build_parser() -> UserErrorParser:
    parser = UserErrorParser(prog="resize_timing.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("data", metavar="DIR", help="dataset folder (train/ and val/)")
    parser.add_argument("--make", choices=("digits", "photos"), default=None,
                        help="write this data set into DIR first, where DIR has no train/ yet")
    parser.add_argument("--fixed", metavar="S", type=int, required=True, help="the fixed-size run's crop size")
    parser.add_argument("--ramp", metavar=("MIN", "MAX", "START", "END"), type=int, nargs=4, required=True,
                        help="the other run's --progressive-resize")
    parser.add_argument("--epochs", metavar="N", type=int, required=True)
    parser.add_argument("--seeds", metavar="SEED", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--within", metavar="POINTS", type=float, default=0.5)
    parser.add_argument("--threads", metavar="N", type=int, default=1, help="OMP_NUM_THREADS of the runs (default 1)")
    parser.add_argument("--workspace", metavar="DIR", required=True, help="a folder for the runs' workspaces")
    parser.add_argument("--json", metavar="FILE", default=None, help="also write every figure here")
    parser.add_argument("--report", metavar="FILE", default=None,
                        help="run nothing: print the table of the runs a --json FILE holds")
    return parser


PHOTOS_PER_CLASS, PHOTOS_VAL_PER_CLASS = 150, 50


def make_data(kind: str, root: Path, size: int) -> None:
    """The data set ``--make`` names, written into ``root`` unless it has a train/ already."""
    if (root / "train").is_dir():
        return
    if kind == "digits":
        from image_classification.demo import write_digits

        write_digits(root, size=size)
        return
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from benchmark_loader import make_photo_set

    make_photo_set(root / "val-cuts", per_class=PHOTOS_VAL_PER_CLASS, seed=1)  # other cuts than training's
    (root / "val-cuts" / "train").rename(root / "val")
    (root / "val-cuts").rmdir()
    make_photo_set(root, per_class=PHOTOS_PER_CLASS, seed=0)


def train_images(data: Path, batch_size: int) -> int:
    """Images in a training epoch of one process: whole batches of DIR/train's images."""
    count = sum(1 for path in (data / "train").rglob("*") if path.is_file() and is_image_file(path.name))
    return count // batch_size * batch_size


def flag_value(flags: list[str], name: str, default: int) -> int:
    for index, token in enumerate(flags):
        if token == name and index + 1 < len(flags):
            return int(flags[index + 1])
        if token.startswith(name + "="):
            return int(token.split("=", 1)[1])
    return default


def run_once(opts, flags: list[str], seed: int, schedule: str, images: int, val_images: int) -> Run:
    workspace = Path(opts.workspace) / f"{schedule}-{seed}"
    sizes = (["--image-size", str(opts.fixed)] if schedule == "fixed" else
             ["--val-crop-size", str(opts.fixed), "--progressive-resize", *map(str, opts.ramp)])
    command = [sys.executable, str(REPO / "main.py"), opts.data, *flags, *sizes, "--epochs", str(opts.epochs),
               "--seed", str(seed), "--no-checkpoints", "--workspace", str(workspace), "--overwrite"]
    env = {**os.environ, "OMP_NUM_THREADS": str(opts.threads)}
    load_before = os.getloadavg()
    start = time.perf_counter()
    result = subprocess.run(command, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if result.returncode:
        raise UserError(f"{schedule} run, seed {seed}, failed (exit {result.returncode}): "
                        f"{(result.stderr or result.stdout).strip().splitlines()[-1:]}")
    epochs = epoch_records(workspace / "experiment_raport.json")
    rows = []
    for number in sorted(epochs):
        data = epochs[number]
        rows.append({"top1": data["val.top1"], "size": data["train.image_size"],
                     "train_s": images / data["train.total_ips"], "val_s": val_images / data["val.total_ips"],
                     "compute_s": data["train.compute_time"], "data_s": data["train.data_time"]})
    return Run(seed, schedule, wall, load_before, os.getloadavg(), rows)


def report(runs: list[Run], opts) -> list[str]:
    fixed = [r for r in runs if r.schedule == "fixed"]
    target = statistics.mean(r.final_top1 for r in fixed) - opts.within
    lines = [f"Measured on {machine.description()}; OMP_NUM_THREADS={opts.threads}.",
             f"Target: the fixed-size runs' mean final val top-1 less {opts.within} points = {target:.2f}%.", "",
             "| seed | training crops | final val top-1 | epoch reaching the target | training s to the target | "
             "wall s to the target | training s, all epochs | `time` of the run, s | load average before / after |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in runs:
        reached = r.reached(target)
        crops = f"{opts.fixed} px" if r.schedule == "fixed" else "--progressive-resize " + " ".join(map(str, opts.ramp))
        to_target = ("not reached", "not reached") if reached is None else \
            (f"{r.train_seconds(reached):.0f}", f"{r.wall_seconds(reached):.0f}")
        lines.append(f"| {r.seed} | {crops} | {r.final_top1:.2f}% | {'-' if reached is None else reached} | "
                     f"{to_target[0]} | {to_target[1]} | {r.train_seconds():.0f} | {r.wall_s:.0f} | "
                     f"{r.load_before[0]:.1f} / {r.load_after[0]:.1f} |")
    lines.append("")
    for label, measure, needs_target in (
            ("training time to the target", lambda r: r.train_seconds(r.reached(target)), True),
            ("wall time to the target", lambda r: r.wall_seconds(r.reached(target)), True),
            ("training time of all epochs", lambda r: r.train_seconds(), False),
            ("`time` of the whole run", lambda r: r.wall_s, False)):
        ratios = []
        for seed in sorted({r.seed for r in runs}):
            pair = {r.schedule: r for r in runs if r.seed == seed}
            if len(pair) < 2 or (needs_target and any(r.reached(target) is None for r in pair.values())):
                continue
            ratios.append(measure(pair["progressive"]) / measure(pair["fixed"]))
        shown = ", ".join(f"{ratio:.2f}" for ratio in ratios) or "no pair reached the target"
        mean = f" (mean {statistics.mean(ratios):.2f})" if ratios else ""
        lines.append(f"- progressive / fixed, {label}, per seed: {shown}{mean}")
    lines += ["", "| crop size | epochs | training s per epoch | compute s per iteration | wait for the loader s per "
              "iteration |", "|---|---|---|---|---|"]
    by_size: dict[int, list[dict]] = {}
    for r in runs:
        for epoch in r.epochs:
            by_size.setdefault(epoch["size"], []).append(epoch)
    for size in sorted(by_size):
        epochs = by_size[size]
        lines.append(f"| {size} px | {len(epochs)} | {statistics.median(e['train_s'] for e in epochs):.1f} | "
                     f"{statistics.median(e['compute_s'] for e in epochs):.3f} | "
                     f"{statistics.median(e['data_s'] for e in epochs):.3f} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    flags = argv[argv.index("--") + 1:] if "--" in argv else []
    opts = build_parser().parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    if opts.report:
        runs = [Run(**{**run, "load_before": tuple(run["load_before"]), "load_after": tuple(run["load_after"])})
                for run in json.loads(Path(opts.report).read_text())]
        print("\n".join(report(runs, opts)), flush=True)
        return 0
    data = Path(opts.data)
    if opts.make:
        make_data(opts.make, data, opts.fixed)
    if not (data / "train").is_dir() or not (data / "val").is_dir():
        raise UserError(f"{data} needs train/ and val/ folders")
    batch = flag_value(flags, "-b", flag_value(flags, "--batch-size", 256))
    images = train_images(data, batch)
    val_images = sum(1 for path in (data / "val").rglob("*") if path.is_file() and is_image_file(path.name))
    runs = []
    for seed in opts.seeds:
        order = ("fixed", "progressive") if seed % 2 else ("progressive", "fixed")
        for schedule in order:
            runs.append(run_once(opts, flags, seed, schedule, images, val_images))
            print(f"seed {seed}, {schedule}: final val top-1 {runs[-1].final_top1:.2f}%, {runs[-1].wall_s:.0f} s",
                  flush=True)
    print("\n".join(report(runs, opts)), flush=True)
    if opts.json:
        Path(opts.json).write_text(json.dumps([asdict(r) for r in runs], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(run(main))
