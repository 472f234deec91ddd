"""Ours against timm's ``train.py`` on the same data, model and recipe: top-1 and images/s, runs alternating.

    python benchmarks/peer_timm.py --timm-train ~/pytorch-image-models/train.py --photos /tmp/photos

Each seed of ``--seeds`` trains twice from scratch on DIR (``train/`` and ``val/``), once with ``main.py`` and
once with timm's ``train.py``, the order alternating from seed to seed so that both sides meet the same load;
each run is a process of its own, on the CPU, in FP32.  The recipe is the same on both sides, written out
for each (see :func:`ours_command` and :func:`timm_command`): ``--arch`` at ``--image-size``, batch ``-b``, ``-j``
loader workers, SGD with Nesterov momentum 0.9 (timm's ``sgd``), ``--lr`` with a per-epoch cosine to 0 over
``--epochs`` and no warm-up, label smoothing 0.1, weight decay 1e-4 on the weights only (timm leaves every
one-dimensional tensor out: BatchNorm's and the biases), the last BatchNorm of each residual block
initialised at zero (timm's default), random-resized crops of 8-100% of the area and 3/4-4/3 aspect ratio
with horizontal flips, bilinear, no colour jitter, and validation on the centre crop of the image resized
to ``image size / 0.95`` (timm's ResNet-50 ``crop_pct``).  Each side keeps its own default memory layout: ours
channels-last on the CPU for ResNet-50 (``--memory-format auto``), timm's NCHW.  ``--ours-flags`` adds flags to
ours and ``--timm-flags`` to timm's (they win): ``--timm-flags=--channels-last`` runs both in one layout.

timm's ``train.py`` is not part of the pip package: ``--timm-train`` is its path in a clone of
https://github.com/huggingface/pytorch-image-models, best at the tag of the installed timm.  It runs on this
Python, with the timm it imports from its own folder (a clone's ``timm/``) or else the installed one; the
output names that timm's version.  ``--photos`` first writes the photo set into DIR where DIR has no ``train/``:
a class per photograph of scikit-image's astronaut, coffee, chelsea and rocket, 200 JPEG cuts of each for
training and 50 others for validation, 400x300 (needs scikit-image).

For each run it prints the validation top-1 after the last epoch, the training images/s of the last epoch
(wall clock from its first iteration's log line to its last, taken by this script from both sides' output
as it arrives: the first iteration is left out, data waits count), the whole command's wall time (start-up,
validation and checkpoints included) and the load average; then each side's medians, the images/s ratio
with its spread over the rounds, and whether the top-1 difference is within the spread of the seeds.  The
machine (CPU model and instruction sets) heads the output; ``-o`` writes it all as JSON.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import math
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.common import last_epoch_top1, ratio_spread, ratio_text, summarise, write_json  # noqa: E402
from image_classification.errors import UserError  # noqa: E402
from image_classification.system.cli import UserErrorParser, positive_int, run  # noqa: E402
from image_classification.train.metrics import TRAIN_WINDOW  # noqa: E402  main.py's, epochs from 1

TIMM_CROP_PCT = 0.95  # timm's ResNet-50 (resnet50.a1_in1k): validation resizes to floor(image size / crop_pct)
PHOTO_SIZE, TRAIN_PER_CLASS, VAL_PER_CLASS = (400, 300), 200, 50
SIDES = ("ours", "timm")
# The version of the timm a Python started in train.py's folder imports (a clone's own package first), read
# from its version.py: importing timm imports torch, seconds on a small machine (a minute on a loaded one)
TIMM_VERSION = ("import importlib.util, pathlib, runpy; "
                "version = pathlib.Path(importlib.util.find_spec('timm').origin).with_name('version.py'); "
                "print(runpy.run_path(str(version))['__version__'] if version.is_file() "
                "else __import__('timm').__version__)")
TIMM_ITERATION = re.compile(r"Train: (\d+) \[\s*(\d+)/")  # train.py's training log lines, epochs from 0


def build_parser() -> argparse.ArgumentParser:
    parser = UserErrorParser(prog="peer_timm.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("data", metavar="DIR", help="dataset root holding train/<class>/ and val/<class>/")
    parser.add_argument("--timm-train", metavar="PATH", required=True,
                        help="timm's train.py, from a clone of pytorch-image-models at the installed timm's tag")
    parser.add_argument("--photos", action="store_true",
                        help="first write the photo set into DIR where it has no train/ (needs scikit-image)")
    parser.add_argument("--seeds", metavar="S", type=int, nargs="+", default=[1, 2, 3],
                        help="one round per seed, each side trained once (default: 1 2 3)")
    parser.add_argument("-a", "--arch", default="resnet50", help="model, by the name both know (default: resnet50)")
    parser.add_argument("--image-size", metavar="S", type=positive_int, default=96, help="crop size (default: 96)")
    parser.add_argument("-b", "--batch-size", metavar="N", type=positive_int, default=32, help="batch (default: 32)")
    parser.add_argument("-j", "--workers", metavar="N", type=int, default=2, help="loader workers (default: 2)")
    parser.add_argument("--epochs", metavar="N", type=positive_int, default=2, help="epochs (default: 2)")
    parser.add_argument("--lr", metavar="LR", type=float, default=0.1, help="learning rate (default: 0.1)")
    parser.add_argument("--ours-flags", metavar="FLAGS", default="",
                        help="more main.py flags for ours, in one argument: --ours-flags=\"--last_bn_0_init false\"")
    parser.add_argument("--timm-flags", metavar="FLAGS", default="",
                        help="more train.py flags for timm's, in one argument: --timm-flags=--channels-last")
    parser.add_argument("-o", "--output", metavar="JSON", help="also write the figures here")
    return parser


def timm_val_resize(image_size: int) -> int:
    return math.floor(image_size / TIMM_CROP_PCT)


def ours_command(opts: argparse.Namespace, seed: int, workspace: Path, num_classes: int) -> list[str]:
    """main.py with the recipe, every choice written out (our defaults differ from timm's in several)."""
    return [
        sys.executable, "-u", str(REPO / "main.py"), opts.data, "--data-backend", "pytorch", "--device", "cpu",
        "-a", opts.arch, "--num-classes", str(num_classes), "--image-size", str(opts.image_size),
        "--val-resize-size", str(timm_val_resize(opts.image_size)), "--interpolation", "bilinear",
        "-b", str(opts.batch_size), "-j", str(opts.workers), "--epochs", str(opts.epochs),
        "--optimizer", "sgd", "--nesterov", "--momentum", "0.9", "--lr", str(opts.lr), "--lr-schedule", "cosine",
        "--warmup", "0", "--label-smoothing", "0.1", "--weight-decay", "1e-4", "--bias-weight-decay", "0",
        "--last_bn_0_init", "true", "--seed", str(seed), "--print-freq", "1", "--workspace", str(workspace),
        *shlex.split(opts.ours_flags),
    ]


def timm_command(opts: argparse.Namespace, seed: int, output: Path, num_classes: int) -> list[str]:
    """timm's train.py with the recipe; its defaults that the recipe keeps are written out too."""
    return [
        sys.executable, "-u", opts.timm_train, opts.data, "--train-split", "train", "--val-split", "val",
        "--device", "cpu", "--model", opts.arch, "--num-classes", str(num_classes),
        "--img-size", str(opts.image_size), "--crop-pct", str(TIMM_CROP_PCT), "--interpolation", "bilinear",
        "--train-interpolation", "bilinear", "--scale", "0.08", "1.0", "--ratio", str(3 / 4), str(4 / 3),
        "--hflip", "0.5", "--color-jitter", "0", "-b", str(opts.batch_size), "-j", str(opts.workers),
        "--epochs", str(opts.epochs), "--opt", "sgd", "--momentum", "0.9", "--lr", str(opts.lr), "--sched", "cosine",
        "--min-lr", "0", "--warmup-epochs", "0", "--cooldown-epochs", "0", "--smoothing", "0.1",
        "--weight-decay", "1e-4", "--seed", str(seed), "--log-interval", "1", "--output", str(output),
        "--experiment", "run", *shlex.split(opts.timm_flags),
    ]


@dataclass
class Run:
    side: str
    seed: int
    top1: float
    images_per_s: float  # the last epoch's training images/s, its first iteration left out
    wall_s: float  # the whole command
    load_average: tuple[float, float]  # 1-minute load at the start and at the end


def last_epoch_rate(stamped: Sequence[tuple[float, str]], pattern: re.Pattern, epoch: int, batch: int) -> float:
    """Images/s of ``epoch``'s training from the arrival times of its iteration lines: the images of the
    iterations after the first over the time from the first line to the last."""
    seen = [(at, int(match[2])) for at, line in stamped
            if (match := pattern.search(line)) and int(match[1]) == epoch]
    if len(seen) < 2 or seen[-1][1] <= seen[0][1]:
        raise UserError(f"fewer than two training iterations of epoch {epoch} were logged: the epoch is too short "
                        "to time (a larger data set, or a smaller -b)")
    (first_at, first), (last_at, last) = seen[0], seen[-1]
    return (last - first) * batch / (last_at - first_at)


def timm_top1(output: str) -> float:
    """The last epoch's validation top-1 in the results train.py prints at its end."""
    if "--result" not in output:
        raise UserError("timm's train.py printed no --result block: is --timm-train timm's train.py?")
    return float(json.loads(output.split("--result", 1)[1])[-1]["validation"]["top1"])


def run_once(command: list[str], cwd: Path) -> tuple[list[tuple[float, str]], float, int]:
    """Run ``command``; (its output lines, each with the seconds since the start at which it arrived; the wall
    time; the exit status)."""
    started = time.perf_counter()
    stamped = []
    with subprocess.Popen(command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"}) as process:
        for line in process.stdout:
            stamped.append((time.perf_counter() - started, line.rstrip("\n")))
    return stamped, time.perf_counter() - started, process.returncode


def run_side(side: str, opts: argparse.Namespace, seed: int, num_classes: int) -> Run:
    with tempfile.TemporaryDirectory(prefix=f"peer_timm_{side}_") as folder:
        folder = Path(folder)
        command = (ours_command if side == "ours" else timm_command)(opts, seed, folder, num_classes)
        load_before = os.getloadavg()[0]
        stamped, wall, code = run_once(command, folder)
        output = "\n".join(line for _, line in stamped)
        if code != 0:
            raise UserError(f"{side}'s run (seed {seed}) ended with exit {code}: {output[-2000:]}")
        # the last epoch of each: main.py counts epochs from 1, timm's train.py from 0
        pattern, last = (TRAIN_WINDOW, opts.epochs) if side == "ours" else (TIMM_ITERATION, opts.epochs - 1)
        rate = last_epoch_rate(stamped, pattern, last, opts.batch_size)
        top1 = last_epoch_top1(folder / "experiment_raport.json") if side == "ours" else timm_top1(output)
    return Run(side, seed, top1, rate, wall, (load_before, os.getloadavg()[0]))


def write_photo_set(root: Path) -> None:
    """The photo set into ``root`` (train/ and val/, cut with different seeds) where it has no train/."""
    from benchmarks.benchmark_loader import make_photo_set  # deferred: scikit-image's photos, only where written

    if (root / "train").is_dir():
        return
    print(f"=> writing the photo set into {root}", flush=True)
    with tempfile.TemporaryDirectory(dir=root.parent if root.parent.is_dir() else None) as scratch:
        make_photo_set(Path(scratch), per_class=VAL_PER_CLASS, size=PHOTO_SIZE, seed=1)
        make_photo_set(root, per_class=TRAIN_PER_CLASS, size=PHOTO_SIZE, seed=0)
        shutil.move(str(Path(scratch) / "train"), str(root / "val"))


def class_count(root: Path) -> int:
    for split in ("train", "val"):
        if not (root / split).is_dir():
            raise UserError(f"{root} has no {split}/ folder: both sides need train/<class>/ and val/<class>/"
                            + (" (--photos writes the photo set there)" if split == "train" else ""))
    return sum(1 for entry in (root / "train").iterdir() if entry.is_dir())


def check_timm(path: str) -> str:
    """The version of the timm that ``path`` (train.py) imports: its folder's, else the installed one."""
    if not Path(path).is_file():
        try:
            tag = f"tag v{importlib.metadata.version('timm')}"
        except importlib.metadata.PackageNotFoundError:
            tag = "the tag of the timm you install (pip install timm)"
        raise UserError(f"--timm-train {path}: no such file; clone https://github.com/huggingface/"
                        f"pytorch-image-models at {tag} and give its train.py")
    found = subprocess.run([sys.executable, "-c", TIMM_VERSION], cwd=Path(path).parent, capture_output=True,
                           text=True)
    if found.returncode != 0:
        raise UserError("timm is not installed in this Python: pip install timm (its train.py runs the other side)")
    return found.stdout.strip()


def summary(runs: list[Run]) -> dict:
    """Each side's medians and spreads, the images/s ratio with its spread, and the top-1 verdict."""
    sides = {side: [r for r in runs if r.side == side] for side in SIDES}
    result = {side: {"top1": summarise([r.top1 for r in mine]), "images_per_s": summarise([r.images_per_s for r in mine]),
                     "wall_s": summarise([r.wall_s for r in mine])} for side, mine in sides.items()}
    ours, timm = ([r.images_per_s for r in sides[side]] for side in SIDES)
    ratio = statistics.median(ours) / statistics.median(timm)
    difference = result["ours"]["top1"]["median"] - result["timm"]["top1"]["median"]
    noise = max(result[side]["top1"]["spread"] for side in SIDES)
    result["images_per_s_ratio"] = {"ratio": ratio, "spread": ratio_spread(ours, timm)}
    result["top1_difference"] = {"points": difference, "seeds_spread": noise,
                                 "within_noise": len(ours) >= 2 and abs(difference) <= noise}
    return result


def report(result: dict) -> list[str]:
    ratio, top1 = result["images_per_s_ratio"], result["top1_difference"]
    lines = [f"{side}: top-1 median {result[side]['top1']['median']:.2f}% "
             f"({', '.join(f'{v:.1f}' for v in result[side]['top1']['values'])}), "
             f"{result[side]['images_per_s']['median']:.1f} images/s, {result[side]['wall_s']['median']:.0f} s a run"
             for side in SIDES]
    lines.append(f"images/s, ours over timm's: {ratio_text(ratio['ratio'], ratio['spread'])}")
    if len(result["ours"]["top1"]["values"]) < 2:
        verdict = "(one seed: no spread to judge it by)"
    else:
        where = "within" if top1["within_noise"] else "beyond"
        verdict = f"{where} the seeds' spread of {top1['seeds_spread']:.2f}"
    lines.append(f"top-1, ours - timm's: {top1['points']:+.2f} points, {verdict}")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    opts = build_parser().parse_args(argv)
    version = check_timm(opts.timm_train)
    root = Path(opts.data).resolve()
    opts.data, opts.timm_train = str(root), str(Path(opts.timm_train).resolve())
    if opts.photos:
        write_photo_set(root)
    num_classes = class_count(root)
    import torch

    from benchmarks.common import environment

    machine = environment(torch.device("cpu"))
    print(f"=> {machine['machine']}; timm {version}", flush=True)
    for side, flags in (("main.py", opts.ours_flags), ("timm's train.py", opts.timm_flags)):
        if flags:
            print(f"=> {side} also gets: {flags}", flush=True)
    runs = []
    for index, seed in enumerate(opts.seeds):
        for side in SIDES if index % 2 == 0 else SIDES[::-1]:
            done = run_side(side, opts, seed, num_classes)
            runs.append(done)
            print(f"seed {seed} {side}: top-1 {done.top1:.2f}%, {done.images_per_s:.1f} images/s (last epoch), "
                  f"{done.wall_s:.0f} s, load {done.load_average[0]:.1f} -> {done.load_average[1]:.1f}", flush=True)
    result = summary(runs)
    for line in report(result):
        print(line)
    # the version has a key of its own: "timm" is that side's figures (it held the version, lost to them)
    write_json({"machine": machine, "timm_version": version, "recipe": vars(opts),
                "runs": [asdict(r) for r in runs], **result}, opts.output)
    return 0


if __name__ == "__main__":
    sys.exit(run(main, sys.argv[1:]))
