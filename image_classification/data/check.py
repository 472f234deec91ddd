"""Check an ImageFolder dataset, or a set packed from one, before training on it.

    python -m image_classification.data.check DIR [-j N]

Prints, for ``DIR/train`` and ``DIR/val``, the class and image counts; then every image that cannot be
decoded, every link that training would not follow (loops, links into another class or split, images counted twice), empty
class folders, class folders whose names are not UTF-8 (training refuses them), a split without class
folders, and the classes found in only one split.  A packed set (:mod:`.packed`) is checked against
its manifest: every shard's size and SHA-256 and its members against the sample table, each ``.cls`` member
holding the table's label (a damaged shard is named, its images left unchecked); then its images are decoded
and its links reported as on the folder it was packed from, so both give the same counts.  The images are
listed exactly as training lists them and each is decoded (at reduced scale for JPEGs, which still reads the
whole file); an image whose header declares more than 89,478,485 pixels, or a JPEG whose frame header cannot
be read with certainty, is unreadable here as on every backend, and so is an image of ``val/`` that
validation's resize (its short side to ``--val-resize-size``, main.py's 256 unless told) would make larger
than that.  Exit code 0
when nothing is wrong, 1 when something is, 2 when DIR is not a dataset (no class folder anywhere, or a pack
that did not finish): wherever training would refuse to start, the check fails too.  Every name is printed
through :func:`.files.printable`, so any name reaches any stdout.
"""

from __future__ import annotations

import functools
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from ..errors import UserError
from ..models import default_image_size
from ..models.image_size import MAX_IMAGE_PIXELS
from ..models.preprocessing import val_resize_size
from ..system import machine
from ..system.cli import run
from ..system.cli import UserErrorParser, positive_int, whole_number
from .files import LABEL_PROBLEMS, decode_problem, label_problem, printable
from .layout import class_folders, refuse_unfinished_pack, walk_split
from .packed import (BLOCK, MANIFEST, TABLE, SampleNames, index_name, is_packed, open_plain, read_manifest,
                     read_table, shard_starts)

SPLITS = ("train", "val")
DEFAULT_RESIZE = val_resize_size(default_image_size("resnet50"))  # main.py's validation resize by default: 256


@dataclass
class SplitReport:
    classes: dict[str, int] = field(default_factory=dict)  # class folder -> images
    unreadable: list[str] = field(default_factory=list)  # "path (reason)"
    links: list[str] = field(default_factory=list)  # links not followed, with the reason
    damaged: list[str] = field(default_factory=list)  # a packed set's files that are not as its manifest says
    shards: int = 0  # a packed set's shards
    max_size: tuple[int, int] | None = None  # a pack's --max-size and --quality, where it resized its images

    @property
    def images(self) -> int:
        return sum(self.classes.values())


def check_split(split_dir: Path, workers: int, resize: int | None = None) -> SplitReport:
    """What is wrong in one split; ``resize``: the short side validation resizes its images to (None for
    train/, whose images are cropped before they are resized)."""
    report = SplitReport()
    classes = class_folders(split_dir)
    # the rule of every backend: an image counted once, under its own class
    samples, report.links = walk_split(split_dir, classes)
    report.classes = {name: 0 for name in classes}
    for _, label in samples:
        report.classes[classes[label]] += 1
    files = [path for path, _ in samples]
    with ProcessPoolExecutor(max_workers=workers) if workers > 1 else _InProcess() as pool:
        problems = pool.map(functools.partial(decode_problem, short_side=resize), files, chunksize=64)
        for path, problem in zip(files, problems):
            if problem is not None:
                report.unreadable.append(f"{path} ({problem})")
    return report


def check_packed_split(split_dir: Path, workers: int, resize: int | None = None) -> SplitReport:
    """A packed split against its manifest: each shard whole (size, SHA-256, members), then each image of the
    shards that are whole decoded, under the same resize rule as :func:`check_split`."""
    import numpy as np

    manifest = read_manifest(split_dir)
    report = SplitReport(links=list(manifest["links_not_followed"]), shards=len(manifest["shards"]))
    if "max_size" in manifest:
        report.max_size = (manifest["max_size"], manifest["quality"])
    try:
        table = read_table(split_dir, manifest["samples"], manifest["table"]["sha256"])
    except UserError as error:
        report.damaged.append(f"{TABLE}: {error}")
        report.classes = {name: 0 for name in manifest["classes"]}
        return report
    counts = np.bincount(table["label"], minlength=len(manifest["classes"]))
    report.classes = dict(zip(manifest["classes"], counts.tolist()))
    names, starts = SampleNames(split_dir, manifest), shard_starts(manifest)
    unreadable = dict(manifest["unreadable"])
    tasks = []
    bounds = [(int(starts[number]), int(starts[number + 1])) for number in range(len(manifest["shards"]))]
    with ProcessPoolExecutor(max_workers=workers) if workers > 1 else _InProcess() as pool:
        # the shards are hashed by the workers too, one a task (each is read whole; on one core it was the
        # longest part of checking a large set), their problems in the manifest's order
        checks = [(split_dir, shard, table[first:end], first) for shard, (first, end) in zip(manifest["shards"], bounds)]
        shard_problems = pool.map(_shard_problem_task, checks)
        for shard, (first, end), problem in zip(manifest["shards"], bounds, shard_problems):
            if problem is not None:
                report.damaged.append(f"{shard['file']}: {problem}")
                continue
            rows = [(index, int(table["block"][index]) * BLOCK, int(table["size"][index]))
                    for index in range(first, end) if index not in unreadable]
            tasks += [(shard["file"], rows[i:i + 256]) for i in range(0, len(rows), 256)]
            report.unreadable += [f"{names(index)} in {shard['file']} (OSError: unreadable when it was packed: "
                                  f"{unreadable[index]})" for index in range(first, end) if index in unreadable]
        found_by_task = pool.map(_decode_problems, [(split_dir, file, rows, resize) for file, rows in tasks])
        for (file, _), found in zip(tasks, found_by_task):
            report.unreadable += [f"{names(index)} in {file} ({problem})" for index, problem in found]
    return report


def _shard_problem_task(task: tuple) -> str | None:
    return _shard_problem(*task)


def _shard_problem(split_dir: Path, shard: dict, rows, first: int) -> str | None:
    """What is wrong with one shard, read whole: its size, SHA-256 and members against the manifest and the
    table's ``rows`` (its samples, from sample ``first`` on: where each image lies, and its label against the
    shard's ``.cls`` member, which other readers take it from), and its DALI index's presence; None when
    nothing."""
    import hashlib

    path = split_dir / shard["file"]
    if os.path.islink(path) or not os.path.lexists(path):
        return "a symbolic link, not the shard" if os.path.islink(path) else "missing"
    try:
        descriptor = open_plain(split_dir, shard["file"])
    except UserError as error:
        return str(error)
    with open(descriptor, "rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        if size != shard["bytes"]:
            return f"{size:,} bytes, the manifest says {shard['bytes']:,} (cut short or changed since it was packed)"
        hasher = hashlib.sha256()
        while chunk := handle.read(1 << 20):
            hasher.update(chunk)
        if hasher.hexdigest() != shard["sha256"]:
            return "its SHA-256 differs from the manifest's (changed or damaged since it was packed)"
        problem = _members_problem(handle, shard["samples"], rows, first)
    if problem is None and not (split_dir / index_name(shard["file"])).is_file():
        return f"its DALI index {index_name(shard['file'])} is missing"
    return problem


def _members_problem(handle, samples: int, rows, first: int) -> str | None:
    """What is wrong with the members of the shard open as ``handle`` against the table's ``rows`` (its
    ``samples`` samples, from sample ``first`` on): each sample's image where the table places it, then its
    ``.cls`` member, holding the table's label."""
    import tarfile

    handle.seek(0)
    try:
        with tarfile.open(fileobj=handle, mode="r:") as tar:
            members = [(member.name, member.offset_data, member.size) for member in tar]
    except tarfile.TarError as error:
        return f"not a readable tar ({error})"
    keys = [f"{first + i:09d}" for i in range(samples)]
    images, labels = members[0::2], members[1::2]
    expected = [(offset, size) for offset, size in zip(rows["block"].astype(int) * BLOCK, rows["size"].tolist())]
    if len(members) != 2 * samples or [(offset, size) for _, offset, size in images] != expected \
            or [name.split(".")[0] for name, _, _ in images] != keys \
            or [name for name, _, _ in labels] != [f"{key}.cls" for key in keys]:
        return f"its members are not the {samples} samples its manifest and sample table list"
    wrong = [(index, text) for index, ((_, offset, size), label) in enumerate(zip(labels, rows["label"].tolist()))
             if (text := os.pread(handle.fileno(), min(size, 32), offset)) != str(label).encode()]
    if wrong:
        index, text = wrong[0]
        return (f"its .cls members give {len(wrong)} sample(s) another label than the sample table does (sample "
                f"{first + index}: {text.decode('ascii', 'backslashreplace')!r} in the shard, "
                f"{int(rows['label'][index])} in the table)")
    return None


def _decode_problems(task: tuple[Path, str, list[tuple[int, int, int]], int | None]) -> list[tuple[int, str]]:
    """(sample, problem) of every sample of ``task`` (a split folder, the name of a shard in it, its samples'
    index, offset and size, and the validation resize's short side or None) that cannot be decoded."""
    split_dir, file, rows, resize = task
    found = []
    with open(open_plain(split_dir, file), "rb") as handle:
        for index, offset, size in rows:
            problem = decode_problem(os.pread(handle.fileno(), size, offset), resize)
            if problem is not None:
                found.append((index, problem))
    return found


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
    ``resize`` px short side; the number of problems found.  Every name is printed through
    :func:`.files.printable`, so that any name reaches any stdout."""
    out = sys.stdout if out is None else out
    packed = root.is_dir() and is_packed(root)
    reports = _check_splits(root, packed, workers, resize)
    problems = 0
    print(printable(root) + (" (packed)" if packed else ""), file=out)
    for split, report in reports.items():
        shards = f" in {report.shards} shard(s)" if packed else ""
        print(f"  {split}/: {len(report.classes)} classes, {report.images:,} images{shards}", file=out)
        if report.max_size is not None:
            size, quality = report.max_size
            print(f"    packed with --max-size {size} --quality {quality}: images larger than {size} px on their "
                  f"longer side are stored at {size} px as JPEGs of quality {quality}, so training on this copy sees "
                  "the folder's images in the same order, but other pixels, its crops drawn on the smaller images",
                  file=out)
    for split, report in reports.items():
        if not report.classes:
            problems += 1
            print(f"  {split}/ has no class folders; expected {split}/<class>/<image> files", file=out)
        sections = (
            ("damaged files", report.damaged),
            ("unreadable images", report.unreadable),
            ("entries left out (links not followed, files that are not regular)", report.links),
            ("class folders without images", [name for name, count in report.classes.items() if count == 0]),
            (f"class folders whose names {LABEL_PROBLEMS}",
             [name for name in report.classes if label_problem(name) is not None]),
        )
        for title, items in sections:
            if items:
                problems += len(items)
                print(f"  {split}/ {title}: {len(items)}", file=out)
                for item in items:
                    print(f"    {printable(item)}", file=out)
    if len(reports) == 2:
        train, val = (set(reports[split].classes) for split in SPLITS)
        for title, names in (("classes only in train/", train - val), ("classes only in val/", val - train)):
            if names:
                problems += len(names)
                print(f"  {title}: {', '.join(printable(name) for name in sorted(names))}", file=out)
    else:
        missing = next(split for split in SPLITS if split not in reports)
        problems += 1
        print(f"  no {missing}/{MANIFEST} (its pack did not finish?)" if packed else f"  no {missing}/ folder",
              file=out)
    print("ok: nothing to fix" if problems == 0 else f"{problems} problem(s) found", file=out)
    return problems


def _check_splits(root: Path, packed: bool, workers: int, resize: int) -> dict[str, SplitReport]:
    """The report of each split of the dataset at ``root``; UserError where it is no dataset training would
    start on at all: no split, no class folder in any (a folder), a pack that did not finish."""
    if not root.is_dir():
        raise UserError(f"dataset directory {root} does not exist")
    if packed:
        splits = {split: root / split for split in SPLITS if os.path.lexists(root / split / MANIFEST)}
    else:
        splits = {split: root / split for split in SPLITS if (root / split).is_dir()}
    if not splits:
        raise UserError(f"{root} has neither train/ nor val/; expected train/<class>/<image> and val/<class>/<image>")
    if not packed and not any(class_folders(path) for path in splits.values()):
        for path in splits.values():
            refuse_unfinished_pack(path)
        raise UserError(f"{root} has no class folders in {' nor '.join(f'{split}/' for split in splits)}; expected "
                        "train/<class>/<image> and val/<class>/<image>")
    check_one = check_packed_split if packed else check_split
    return {split: check_one(path, workers, resize if split == "val" else None) for split, path in splits.items()}


def main(argv: list[str] | None = None) -> int:
    parser = UserErrorParser(prog="python -m image_classification.data.check",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("data", metavar="DIR", help="the dataset: DIR/train/<class>/<image>, DIR/val/<class>/<image>, "
                        "or a set packed from one (DIR/train/manifest.json)")
    parser.add_argument("-j", "--workers", type=whole_number, default=machine.cores(),
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
