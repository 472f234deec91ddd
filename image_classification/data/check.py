"""Check an ImageFolder dataset before training on it.

    python -m image_classification.data.check DIR [-j N]

Prints, for ``DIR/train`` and ``DIR/val``, the class and image counts; then every image that cannot be
decoded, every link that training would not follow (loops, links into another class or split, images counted twice), empty
class folders, and the classes found in only one split.  The images are listed exactly as training lists
them and each is decoded (at reduced scale for JPEGs, which still reads the whole file); an image whose
header declares more than 89,478,485 pixels, or a JPEG whose frame header cannot be read with certainty,
is unreadable here as on every backend, and so is an image of ``val/`` that validation's resize (its short
side to ``--val-resize-size``, main.py's 256 unless told) would make larger than that.  Exit code 0
when nothing is wrong, 1 when something is, 2 when DIR is not a dataset.
"""

from __future__ import annotations

import functools
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from .. import machine
from ..cli import UserErrorParser, positive_int
from ..cli import run
from ..errors import UserError
from ..models import default_image_size
from .common import val_resize_size
from .files import MAX_IMAGE_PIXELS, SplitWalk, decode_problem, walk_class
from .layout import class_folders

SPLITS = ("train", "val")
DEFAULT_RESIZE = val_resize_size(default_image_size("resnet50"))  # main.py's validation resize by default: 256


@dataclass
class SplitReport:
    classes: dict[str, int] = field(default_factory=dict)  # class folder -> images
    unreadable: list[str] = field(default_factory=list)  # "path (reason)"
    links: list[str] = field(default_factory=list)  # links not followed, with the reason

    @property
    def images(self) -> int:
        return sum(self.classes.values())


def check_split(split_dir: Path, workers: int, resize: int | None = None) -> SplitReport:
    """What is wrong in one split; ``resize``: the short side validation resizes its images to (None for
    train/, whose images are cropped before they are resized)."""
    report = SplitReport()
    files: list[str] = []
    shared = SplitWalk()  # the rule of every backend: an image counted once, under its own class
    for name in class_folders(split_dir):
        walk = walk_class(split_dir / name, split_dir, shared)
        report.classes[name] = len(walk.files)
        report.links += walk.skipped_links
        files += walk.files
    with ProcessPoolExecutor(max_workers=workers) if workers > 1 else _InProcess() as pool:
        problems = pool.map(functools.partial(decode_problem, short_side=resize), files, chunksize=64)
        for path, problem in zip(files, problems):
            if problem is not None:
                report.unreadable.append(f"{path} ({problem})")
    return report


class _InProcess:
    """ProcessPoolExecutor's map, run in this process (-j 1)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        return None

    @staticmethod
    def map(function, items, chunksize: int = 1):
        return map(function, items)


def check(root: Path, workers: int, out: TextIO | None = None, resize: int = DEFAULT_RESIZE) -> int:
    """Print the report of the dataset at ``root`` to ``out`` (sys.stdout as it is at the call, so a
    redirect or capture made after import sees it), its val/ images checked for a validation resize to a
    ``resize`` px short side; the number of problems found."""
    out = sys.stdout if out is None else out
    if not root.is_dir():
        raise UserError(f"dataset directory {root} does not exist")
    splits = {split: root / split for split in SPLITS if (root / split).is_dir()}
    if not splits:
        raise UserError(f"{root} has neither train/ nor val/; expected train/<class>/<image> and val/<class>/<image>")
    reports = {split: check_split(path, workers, resize if split == "val" else None) for split, path in splits.items()}
    problems = 0
    print(f"{root}", file=out)
    for split, report in reports.items():
        print(f"  {split}/: {len(report.classes)} classes, {report.images:,} images", file=out)
    for split, report in reports.items():
        empty = [name for name, count in report.classes.items() if count == 0]
        sections = (
            ("unreadable images", report.unreadable),
            ("links not followed", report.links),
            ("class folders without images", empty),
        )
        for title, items in sections:
            if items:
                problems += len(items)
                print(f"  {split}/ {title}: {len(items)}", file=out)
                for item in items:
                    print(f"    {item}", file=out)
    if len(reports) == 2:
        train, val = (set(reports[split].classes) for split in SPLITS)
        for title, names in (("classes only in train/", train - val), ("classes only in val/", val - train)):
            if names:
                problems += len(names)
                print(f"  {title}: {', '.join(sorted(names))}", file=out)
    else:
        missing = next(split for split in SPLITS if split not in reports)
        problems += 1
        print(f"  no {missing}/ folder", file=out)
    print("ok: nothing to fix" if problems == 0 else f"{problems} problem(s) found", file=out)
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = UserErrorParser(prog="python -m image_classification.data.check",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("data", metavar="DIR", help="the dataset: DIR/train/<class>/<image>, DIR/val/<class>/<image>")
    parser.add_argument("-j", "--workers", type=int, default=machine.cores(),
                        help="processes decoding the images (default: this machine's cores)")
    parser.add_argument("--val-resize-size", metavar="S", type=positive_int, default=DEFAULT_RESIZE,
                        help="the short side validation resizes val/ images to, as main.py's flag: an image that "
                        f"this resize would make larger than {MAX_IMAGE_PIXELS:,} pixels is unreadable (default: "
                        f"{DEFAULT_RESIZE}, main.py's for 224 px crops)")
    args = parser.parse_args(argv)
    if args.workers < 1:
        raise UserError(f"-j/--workers must be at least 1, got {args.workers}")
    return 1 if check(Path(args.data), args.workers, resize=args.val_resize_size) else 0


if __name__ == "__main__":
    sys.exit(run(main, sys.argv[1:]))
