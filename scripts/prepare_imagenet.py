"""Build the ImageNet folder layout that main.py reads from the official ILSVRC2012 archives.

    python scripts/prepare_imagenet.py --train-tar ILSVRC2012_img_train.tar \\
        --val-tar ILSVRC2012_img_val.tar --devkit ILSVRC2012_devkit_t12.tar.gz /imagenet

* ``OUT/train/<wnid>/*.JPEG``: the train archive holds one inner ``<wnid>.tar`` per class.
* ``OUT/val/<wnid>/*.JPEG``: the val archive's 50,000 images, sorted into classes with the devkit:
  ``data/meta.mat`` maps an ILSVRC2012_ID to its wnid (read with scipy, which scikit-learn in
  requirements.txt brings), and ``data/ILSVRC2012_validation_ground_truth.txt`` holds the ID of every val
  image, in file-name order.

Invariants, so that a run can be stopped at any moment and started again: a file under ``OUT/train`` or
``OUT/val`` is always complete (written under a temporary name in ``OUT/.partial`` and renamed), and so
is a class folder under ``OUT/train`` (filled in ``OUT/.partial/train/<wnid>`` and renamed when its inner
archive is done).  A rerun skips complete classes and files and finishes the partial ones.  One run at a
time per OUT.  The run ends with a check of the class and image counts (1000 classes, 1,281,167 train and
50,000 val images by default): what is missing is reported and the exit code is 1.

Every folder and file name taken from the archives (a wnid of the devkit, a class archive's name, an
image's name) must be a plain name, one path component that the file system takes: anything else is
refused with one line, and nothing is written before the devkit and the train archive's class names have
been checked.
"""

from __future__ import annotations

import argparse
import io
import os
import re
import shutil
import sys
import tarfile
import zlib
from pathlib import Path
from typing import IO, Iterator, Sequence

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tqdm import tqdm  # noqa: E402

from image_classification.errors import UserError  # noqa: E402
from image_classification.records.checkpoint import longest_name  # noqa: E402
from image_classification.system.cli import run  # noqa: E402
from image_classification.system.cli import UserErrorParser, positive_int  # noqa: E402

META = "data/meta.mat"
GROUND_TRUTH = "data/ILSVRC2012_validation_ground_truth.txt"
VAL_NAME = re.compile(r"ILSVRC2012_val_(\d+)\.JPEG")
STAGING = ".partial"  # under OUT, so that renames stay on one file system
CHUNK = 1 << 20
DAMAGED = (tarfile.TarError, EOFError, zlib.error)  # what a damaged or truncated archive raises


# ------------------------------------------------------------------------------------------------
# Names from the archives
# ------------------------------------------------------------------------------------------------
def plain_name(name: str, what: str, where: str | Path, limit: int) -> str:
    """``name`` when it is one path component that the file system takes; else a :class:`UserError`.

    Names come from the archives, and a wnid like ``../../x`` would otherwise write outside OUT.
    """
    size = len(os.fsencode(name))
    if name in ("", ".", "..") or "/" in name or "\\" in name or not name.isprintable():
        problem = "is not a plain file or folder name"
    elif size > limit:
        problem = f"is {size} bytes long, more than the file system takes ({limit})"
    else:
        return name
    raise UserError(f"{where} names {what} {_shown(name)}, which {problem}: is it the official archive?")


def _shown(name: str) -> str:
    """``name`` for a one-line message: quoted, control characters escaped, cut when long."""
    return repr(name if len(name) <= 60 else name[:60] + "...")


# ------------------------------------------------------------------------------------------------
# The devkit: one wnid per val image
# ------------------------------------------------------------------------------------------------
def _devkit_member(devkit: tarfile.TarFile, suffix: str, path: Path) -> bytes:
    member = next((m for m in devkit.getmembers() if m.isfile() and m.name.endswith(suffix)), None)
    if member is None:
        raise UserError(f"{path} has no {suffix}: is it ILSVRC2012_devkit_t12.tar.gz?")
    return devkit.extractfile(member).read()


def val_labels(devkit_path: Path, limit: int) -> list[str]:
    """The wnid of every val image: entry i belongs to ILSVRC2012_val_{i+1:08d}.JPEG; each a plain name
    of at most ``limit`` bytes."""
    try:
        from scipy.io import loadmat
    except ImportError:
        raise UserError("reading the devkit's data/meta.mat needs scipy: pip install scipy "
                        "(scikit-learn from requirements.txt brings it)") from None
    try:
        with tarfile.open(devkit_path) as devkit:
            meta = _devkit_member(devkit, META, devkit_path)
            truth = _devkit_member(devkit, GROUND_TRUTH, devkit_path)
    except DAMAGED as error:
        raise UserError(f"{devkit_path} is not a readable devkit archive: {error}") from None
    try:
        synsets = loadmat(io.BytesIO(meta), squeeze_me=True)["synsets"]
        wnid_of = {int(i): str(w) for i, w in zip(synsets["ILSVRC2012_ID"], synsets["WNID"])}
    except (ValueError, KeyError, TypeError) as error:
        raise UserError(f"{META} in {devkit_path} has no synsets table with ILSVRC2012_ID and WNID "
                        f"({error})") from None
    try:
        ids = [int(line) for line in truth.decode().split()]
        labels = [wnid_of[i] for i in ids]
    except (ValueError, KeyError) as error:
        raise UserError(f"{GROUND_TRUTH} in {devkit_path} names an ID that meta.mat lacks: {error}") from None
    for wnid in set(labels):
        plain_name(wnid, "the class (WNID)", devkit_path, limit)
    return labels


# ------------------------------------------------------------------------------------------------
# Extraction
# ------------------------------------------------------------------------------------------------
def write_atomically(source: IO[bytes], dest: Path, staging: Path) -> None:
    """Copy ``source`` to ``dest`` through a temporary file: ``dest`` never holds part of a file."""
    temporary = staging / f"{os.getpid()}.tmp"
    try:
        with source, open(temporary, "wb") as out:
            shutil.copyfileobj(source, out, CHUNK)
        os.replace(temporary, dest)
    except OSError as error:  # a full disk, a read-only folder: not our bug
        raise UserError(f"cannot write {dest}: {error.strerror or error}") from None


def _files(tar: tarfile.TarFile) -> Iterator[tarfile.TarInfo]:
    """The archive's regular files; iterating seeks past the data of members nobody reads."""
    return (member for member in tar if member.isfile())


def train_class(member: tarfile.TarInfo, archive: Path, limit: int) -> str:
    """The wnid of one class archive of the train archive, checked to be a plain name."""
    name = Path(member.name).name
    if not name.endswith(".tar"):
        raise UserError(f"{archive} should hold one <wnid>.tar per class, but holds {_shown(member.name)}: "
                        "is it ILSVRC2012_img_train.tar?")
    return plain_name(name[:-len(".tar")], "the class", archive, limit)


def check_train_classes(archive: Path, limit: int) -> None:
    """Read the train archive's index (its headers only) and check every class name, before any writing."""
    with tarfile.open(archive) as outer:
        for member in _files(outer):
            train_class(member, archive, limit)


def extract_train(archive: Path, out: Path, expected_classes: int) -> None:
    staging = out / STAGING
    limit = longest_name(out)
    (staging / "train").mkdir(parents=True, exist_ok=True)
    (out / "train").mkdir(exist_ok=True)
    with tarfile.open(archive) as outer:
        for member in tqdm(_files(outer), total=expected_classes, unit="class", desc="train"):
            wnid = train_class(member, archive, limit)
            if (out / "train" / wnid).is_dir():
                continue  # complete: only finished classes are renamed into train/
            partial = staging / "train" / wnid
            partial.mkdir(exist_ok=True)
            with outer.extractfile(member) as inner_file, tarfile.open(fileobj=inner_file) as inner:
                for image in _files(inner):
                    name = plain_name(Path(image.name).name, "the image", f"{archive} ({wnid}.tar)", limit)
                    dest = partial / name
                    if not dest.exists():
                        write_atomically(inner.extractfile(image), dest, staging)
            os.rename(partial, out / "train" / wnid)


def extract_val(archive: Path, out: Path, labels: Sequence[str]) -> None:
    staging = out / STAGING
    staging.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive) as tar:
        for member in tqdm(_files(tar), total=len(labels), unit="image", desc="val"):
            name = Path(member.name).name
            match = VAL_NAME.fullmatch(name)
            if match is None:
                raise UserError(f"{archive} should hold ILSVRC2012_val_NNNNNNNN.JPEG images, but holds "
                                f"{_shown(member.name)}: is it ILSVRC2012_img_val.tar?")
            index = int(match.group(1)) - 1
            if not 0 <= index < len(labels):
                raise UserError(f"{name} has no label: the devkit's ground truth covers {len(labels)} images")
            dest = out / "val" / labels[index] / name
            if not dest.exists():
                dest.parent.mkdir(parents=True, exist_ok=True)
                write_atomically(tar.extractfile(member), dest, staging)


def _extract(what, archive: Path, *args) -> None:
    """Run one extraction pass, a damaged archive becoming a :class:`UserError` that names it."""
    try:
        what(archive, *args)
    except DAMAGED as error:
        raise UserError(f"{archive} is damaged or truncated ({error}); download it again") from None


# ------------------------------------------------------------------------------------------------
# The final check
# ------------------------------------------------------------------------------------------------
def count_images(split: Path) -> dict[str, int]:
    """Files per class folder of one split."""
    if not split.is_dir():
        return {}
    return {folder.name: sum(1 for f in folder.iterdir() if f.is_file())
            for folder in split.iterdir() if folder.is_dir()}


def _some(names: Sequence[str], limit: int = 10) -> str:
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more


def check(out: Path, wnids: set[str], expected: dict[str, tuple[int, int]]) -> tuple[list[str], list[str]]:
    """The counts of the prepared folder, and what it lacks: one sentence per problem, none when complete.

    ``wnids`` are the classes the devkit's ground truth names; ``expected`` maps a split to its
    (classes, images).
    """
    counted, problems = [], []
    for split, (classes, images) in expected.items():
        counts = count_images(out / split)
        found = sum(counts.values())
        counted.append(f"{split}: {len(counts):,} classes, {found:,} images")
        if len(counts) != classes:
            problems.append(f"{split}: {len(counts):,} classes instead of {classes:,}")
        if found != images:
            problems.append(f"{split}: {found:,} images instead of {images:,}")
        if missing := sorted(wnids - counts.keys()):
            problems.append(f"{split}: no folder for {_some(missing)}")
        if unknown := sorted(counts.keys() - wnids):
            problems.append(f"{split}: folders the devkit does not name: {_some(unknown)}")
        if empty := sorted(wnid for wnid, n in counts.items() if n == 0):
            problems.append(f"{split}: empty class folders: {_some(empty)}")
    if (out / STAGING).exists():
        problems.append(f"{out / STAGING} holds unfinished work: run again to finish it")
    return counted, problems


# ------------------------------------------------------------------------------------------------
# Command line
# ------------------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    parser = UserErrorParser(
        prog="prepare_imagenet.py",
        description="Build OUT/train/<wnid>/ and OUT/val/<wnid>/ from the official ILSVRC2012 archives. "
        "Resumable: run it again after an interruption.",
        epilog="Reading the devkit needs scipy. Ends with a count check; exit code 1 when something is "
        "missing.")
    parser.add_argument("--train-tar", type=Path, required=True, metavar="FILE",
                        help="ILSVRC2012_img_train.tar (one inner .tar per class)")
    parser.add_argument("--val-tar", type=Path, required=True, metavar="FILE", help="ILSVRC2012_img_val.tar")
    parser.add_argument("--devkit", type=Path, required=True, metavar="FILE",
                        help="ILSVRC2012_devkit_t12.tar.gz (the val ground truth)")
    parser.add_argument("--expect-classes", type=positive_int, default=1000, metavar="N",
                        help="classes the check expects in train/ and val/ (default: 1000)")
    parser.add_argument("--expect-train-images", type=positive_int, default=1_281_167, metavar="N",
                        help="train images the check expects (default: 1281167)")
    parser.add_argument("--expect-val-images", type=positive_int, default=50_000, metavar="N",
                        help="val images the check expects (default: 50000)")
    parser.add_argument("out", type=Path, metavar="OUT", help="the dataset folder to build, e.g. /imagenet")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Extract what is not there yet, then check the counts: 0 when complete, 1 when not."""
    args = build_parser().parse_args(argv)
    if args.out.exists() and not args.out.is_dir():
        raise UserError(f"{args.out} is a file, not a folder")
    for archive in (args.train_tar, args.val_tar, args.devkit):
        if not archive.is_file():
            raise UserError(f"no such archive: {archive}")
    # first, the names: a bad devkit or archive should fail before hours of extraction, and write nothing
    limit = longest_name(args.out)
    labels = val_labels(args.devkit, limit)
    _extract(check_train_classes, args.train_tar, limit)
    args.out.mkdir(parents=True, exist_ok=True)
    _extract(extract_train, args.train_tar, args.out, args.expect_classes)
    _extract(extract_val, args.val_tar, args.out, labels)
    shutil.rmtree(args.out / STAGING)  # only temporary files are left in it once both passes are through
    counted, problems = check(args.out, set(labels),
                              {"train": (args.expect_classes, args.expect_train_images),
                               "val": (args.expect_classes, args.expect_val_images)})
    print("\n".join(counted))
    for problem in problems:
        print(f"incomplete: {problem}", file=sys.stderr)
    if problems:
        return 1
    print(f"{args.out} is complete")
    return 0


if __name__ == "__main__":
    sys.exit(run(main))
