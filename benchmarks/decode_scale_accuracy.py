"""Validation top-1 of the same training runs with ``--decode-scale auto`` and ``full``, seed by seed, alternating.

    python benchmarks/decode_scale_accuracy.py --demo --seeds 1 2 3
    python benchmarks/decode_scale_accuracy.py --photos 150 50 --image-size 64 --epochs 4 --seeds 1 2 3 /tmp/photo-top1

``--demo`` runs ``python -m image_classification.demo`` (ResNet-18 on scikit-learn's digits) with ``--seed S
--decode-scale X`` and a workspace of its own per run.  ``--photos TRAIN VAL`` first writes DIR as the photo set
(``benchmarks/benchmark_loader.py --photos``: a class per photograph of scikit-image's astronaut, coffee, chelsea and
rocket, 500x375 JPEGs of quality 90), TRAIN cuts a class for train/ and VAL other cuts for val/ (skipped where DIR
has train/), then trains ``main.py``'s resnet18 from scratch on it with the ``pytorch`` backend at
``--image-size`` px crops.  For each seed the two scales run one after the other, the order alternating from seed
to seed.  Each run's line says its last epoch's validation top-1 and how many of its images were decoded at a
reduced scale: the training boxes of its epochs replayed (the run's sampler, draws and size rule, on each image's
header) and the validation images whose resize allows it.  The summary gives each scale's mean and spread and
whether their difference exceeds the runs' noise.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.common import last_epoch_top1  # noqa: E402
from image_classification.errors import UserError  # noqa: E402
from image_classification.system.cli import UserErrorParser, positive_int, run  # noqa: E402

SCALES = ("auto", "full")
PHOTO_RECIPE = ["--data-backend", "pytorch", "--arch", "resnet18", "--lr-schedule", "cosine", "--warmup", "1",
                "--label-smoothing", "0.1", "--weight-decay", "5e-4", "--workers", "2", "--print-freq", "50"]


def build_parser() -> UserErrorParser:
    parser = UserErrorParser(prog="decode_scale_accuracy.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("data", metavar="DIR", nargs="?", help="the photo set's folder (--photos)")
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--demo", action="store_true", help="the demo's recipe on scikit-learn's digits")
    what.add_argument("--photos", metavar=("TRAIN", "VAL"), type=positive_int, nargs=2,
                      help="the photo set, TRAIN and VAL images a class, written into DIR first where it has no train/")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--image-size", type=positive_int, default=64, help="--photos: the crops' side (default 64)")
    parser.add_argument("--epochs", type=positive_int, default=5, help="--photos: epochs a run (default 5)")
    parser.add_argument("-b", "--batch-size", type=positive_int, default=16, help="--photos (default 16)")
    parser.add_argument("--lr", type=float, default=0.025, help="--photos (default 0.025)")
    parser.add_argument("--workspaces", default="/tmp/decode-scale-runs",
                        help="where each run's workspace goes, replaced (default /tmp/decode-scale-runs)")
    return parser


def write_photos(root: Path, train: int, val: int) -> None:
    """The photo set into ``root``: ``train`` cuts a class from scikit-image's photographs, and ``val`` others."""
    if (root / "train").is_dir():
        return
    loader = importlib.util.spec_from_file_location("benchmark_loader", REPO / "benchmarks" / "benchmark_loader.py")
    script = sys.modules[loader.name] = importlib.util.module_from_spec(loader)  # its dataclasses look it up
    loader.loader.exec_module(script)
    script.make_photo_set(root, per_class=train, seed=0)
    scratch = root / "val-written"
    script.make_photo_set(scratch, per_class=val, seed=1)  # other cuts of the same photographs
    (scratch / "train").rename(root / "val")
    scratch.rmdir()


def run_command(opts, seed: int, scale: str, workspace: Path) -> tuple[list[str], list[str]]:
    """(the command line to run, the main.py arguments it trains with) of one run."""
    extra = ["--seed", str(seed), "--decode-scale", scale, "--workspace", str(workspace)]
    if opts.demo:
        from image_classification import demo

        return ([sys.executable, "-m", "image_classification.demo", *extra],
                [*demo.without_overridden(demo.RECIPE, extra), *extra, str(demo.DATA_DIR)])
    arguments = [*PHOTO_RECIPE, "--num-classes", str(len(os.listdir(Path(opts.data) / "train"))),
                 "--image-size", str(opts.image_size), "--epochs", str(opts.epochs), "--batch-size",
                 str(opts.batch_size), "--lr", str(opts.lr), *extra, opts.data]
    return [sys.executable, str(REPO / "main.py"), *arguments], arguments


def reduced_counts(arguments: list[str]) -> tuple[int, int, int, int]:
    """(training boxes decoded reduced, training boxes, validation images decoded reduced, validation images) of
    the run main.py makes of ``arguments``: its sampler's order and each sample's draw replayed on the images'
    headers, as the ``pytorch`` backend's workers make them under ``--decode-scale auto``."""
    from image_classification.arguments import parse_args
    from image_classification.data import reduced
    from image_classification.data.common import DataConfig, ShardSampler
    from image_classification.data.layout import class_folders, open_split
    from image_classification.data.transforms import TrainTransform, seeded
    from image_classification.models.preprocessing import val_resize_size

    args = parse_args(arguments)
    root = Path(args.data)
    classes = class_folders(root / "train")
    sizes = {}
    for split in ("train", "val"):
        files = open_split(root, split, classes)
        sizes[split] = [(jpeg.height, jpeg.width) if jpeg else None
                        for jpeg in (reduced.scalable_jpeg(files.read(index)) for index in range(len(files)))]
    transform = TrainTransform(DataConfig(str(root), "pytorch", args.image_size, args.batch_size,
                                          crop_scale=tuple(args.crop_scale), hflip=args.hflip))
    reduced_boxes = boxes = 0
    for epoch in range(args.epochs):
        sampler = ShardSampler(len(sizes["train"]), 0, 1, shuffle=True, seed=args.seed)
        sampler.set_epoch(epoch)
        indices, seeds = sampler.pass_order()
        whole = len(indices) - len(indices) % args.batch_size  # the last partial batch is dropped
        for index, seed in zip(indices[:whole], seeds[:whole]):
            boxes += 1
            if sizes["train"][index] is not None:
                draw = seeded(int(seed), transform.draw, *sizes["train"][index])
                reduced_boxes += reduced.crop_scale(draw.box[2], draw.box[3], args.image_size) > 1
    short = val_resize_size(args.image_size)
    reduced_val = sum(size is not None and reduced.resize_scale(size[1], size[0], short) > 1 for size in sizes["val"])
    return reduced_boxes, boxes, reduced_val, len(sizes["val"])


def summary(values: list[float]) -> str:
    spread = f", sd {statistics.stdev(values):.2f}" if len(values) > 1 else ""
    return f"mean {statistics.mean(values):.2f}%{spread}, min {min(values):.2f}, max {max(values):.2f}"


def main(argv: list[str] | None = None) -> int:
    opts = build_parser().parse_args(argv)
    if opts.photos and not opts.data:
        raise UserError("--photos needs DIR, the photo set's folder")
    if opts.photos:
        write_photos(Path(opts.data), *opts.photos)
    from image_classification.system import machine

    print(f"machine: {machine.description()}; load average {' / '.join(f'{x:.1f}' for x in os.getloadavg())}",
          flush=True)
    top1 = {scale: [] for scale in SCALES}
    for turn, seed in enumerate(opts.seeds):
        for scale in SCALES if turn % 2 == 0 else SCALES[::-1]:
            workspace = Path(opts.workspaces) / f"seed{seed}-{scale}"
            shutil.rmtree(workspace, ignore_errors=True)
            command, arguments = run_command(opts, seed, scale, workspace)
            started = time.monotonic()
            subprocess.run(command, cwd=REPO, check=True, stdout=subprocess.DEVNULL)
            top1[scale].append(last_epoch_top1(workspace / "experiment_raport.json"))
            boxes, all_boxes, val, all_val = reduced_counts(arguments) if scale == "auto" else (0, 0, 0, 0)
            counted = (f"; decoded reduced: {boxes} of {all_boxes} training boxes, {val} of {all_val} validation "
                       "images" if scale == "auto" else "; every image decoded whole")
            print(f"seed {seed}, --decode-scale {scale}: val top-1 {top1[scale][-1]:.2f}%{counted} "
                  f"({time.monotonic() - started:.0f} s)", flush=True)
    for scale in SCALES:
        print(f"--decode-scale {scale}: {summary(top1[scale])}", flush=True)
    differences = [a - b for a, b in zip(top1["auto"], top1["full"])]
    noise = max(statistics.stdev(top1["auto"]), statistics.stdev(top1["full"])) if len(opts.seeds) > 1 else 0.0
    mean = statistics.mean(differences)
    print(f"auto - full, seed by seed: {', '.join(f'{d:+.2f}' for d in differences)}; mean {mean:+.2f} points, "
          f"{'within' if abs(mean) <= noise else 'beyond'} the runs' noise (the larger sd, {noise:.2f})", flush=True)
    print(f"load average at the end: {' / '.join(f'{x:.1f}' for x in os.getloadavg())}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(run(main, sys.argv[1:]))
