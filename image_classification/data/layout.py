"""The dataset on disk: ``DIR/train/<class>/<image>`` and ``DIR/val/<class>/<image>``, or the shards packed
from such a folder (:mod:`.packed`: ``DIR/train/manifest.json`` says which).

Which class folders there are (their sorted names are the labels), which images each split holds, and
the checks a dataset must pass before a run starts.  Every backend and ``data.check`` read the layout
through this module, so they count the same images under the same labels, from a folder or its shards.
"""

from __future__ import annotations

import hashlib
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Protocol

from ..errors import UserError
from ..system.signals import stop_raises
from .files import (HARD_LINK, WITHOUT_SPLIT, SplitWalk, decode_problem, is_image_file, read_bytes, refuse_labels,
                    walk_class)
from .packed import MANIFEST, check_packed, fingerprint, is_packed, names_blob, open_packed_split, unfinished_pack


def class_folders(split_dir: Path) -> list[str]:
    """The class folder names of a split, sorted: their order is the label order."""
    return sorted(entry.name for entry in os.scandir(split_dir) if entry.is_dir())


_reported_links: set[str] = set()


def _report_links(problems: list[str]) -> None:
    """One warning per entry left out (a link not followed, a file that is not regular), and one for all the hard
    links of a split, which a tree made with ``cp -al`` holds by the thousand: how many, and the first; each said
    once, however often the folder is listed."""
    hard = [problem for problem in problems if f": {HARD_LINK} (" in problem]
    lines = [f"leaving out {problem}" for problem in problems if f": {HARD_LINK} (" not in problem]
    if hard:
        first, counted = hard[0][:-1].split(f": {HARD_LINK} (", 1)
        what = "images that are hard links to images" if len(hard) > 1 else "image that is a hard link to an image"
        listed = "; python -m image_classification.data.check lists them all" if len(hard) > 1 else ""
        which = ", the first " if len(hard) > 1 else ": "
        lines.append(f"leaving out {len(hard):,} {what} already counted under another name{which}{first}, the same "
                     f"file as {counted} (a file counts once, under the name walked first{listed})")
    for line in lines:
        if line not in _reported_links:
            _reported_links.add(line)
            print(f"warning: {line}", file=sys.stderr, flush=True)


class Split(Protocol):
    """The images of one split as every backend reads them: sample ``i`` has a label, a name for messages and
    the bytes of its image file.  The sample numbering is the folder's (:func:`list_samples`), whether the
    split is read from its folder or from the shards packed from it, so the samplers order both alike."""

    known_unreadable: Mapping[int, str]  # samples known to be unreadable before any read, with the reason

    def __len__(self) -> int: ...

    def label(self, index: int) -> int: ...

    def name(self, index: int) -> str: ...

    def read(self, index: int) -> bytes: ...

    def problem(self, index: int) -> str | None: ...

    def fingerprint(self) -> dict: ...


class FolderSplit:
    """A split read from its folder (``split_dir``), a file per image."""

    known_unreadable: Mapping[int, str] = MappingProxyType({})  # a file is found unreadable when it is read

    def __init__(self, samples: list[tuple[str, int]], split_dir: Path):
        self.samples, self.split_dir = samples, split_dir

    def __len__(self) -> int:
        return len(self.samples)

    def label(self, index: int) -> int:
        return self.samples[index][1]

    def name(self, index: int) -> str:
        return self.samples[index][0]

    path = name  # what DALI's file reader is handed

    def read(self, index: int) -> bytes:
        return read_bytes(self.samples[index][0])

    def problem(self, index: int) -> str | None:
        """Why sample ``index`` cannot be decoded, or None."""
        return decode_problem(self.samples[index][0])

    def fingerprint(self) -> dict:
        """Which images the split holds (see :func:`.packed.fingerprint`): the same as its packed copy's."""
        names = relative_names(self.split_dir, [path for path, _ in self.samples])
        return fingerprint(len(names), hashlib.sha256(names_blob(names)).hexdigest())


def relative_names(split_dir: Path, paths: list[str]) -> list[str]:
    """The paths of a split's images, as its walk lists them, relative to the split folder: each sample's name
    in messages, in a packed set's ``names.bin`` and in its :func:`.packed.fingerprint`."""
    prefix = str(split_dir) + os.sep  # where the walk starts every path it lists
    return [path[len(prefix):] if path.startswith(prefix) else os.path.relpath(path, split_dir) for path in paths]


IDENTITY = ("images", "names_sha256")  # which images: a fingerprint's other fields say how they are read


def data_change_notice(recorded, current: dict, batch: int) -> str | None:
    """The line a resume says where the training images differ from those its checkpoint ``recorded`` (see
    :func:`.packed.fingerprint`), ``batch`` batches into an epoch, or where they are read otherwise (packed at
    another ``--max-size``, decoded at another ``--decode-scale``); None where nothing changed, or where nothing
    was recorded (a checkpoint of an earlier version, synthetic data)."""
    if not isinstance(recorded, dict) or not current:
        return None
    if any(recorded.get(key) != current.get(key) for key in IDENTITY):
        return _images_changed(recorded, current, batch)
    resized, decoded = _max_size_change(recorded, current), _decode_scale_change(recorded, current)
    if resized:  # the boxes are drawn on images of another size: other crops
        return (f"=> {resized}: the same images in the same order, but their crops are drawn on images of another "
                "size and resized from other pixels; the resume is not exact")
    if decoded:
        return (f"=> {decoded}: the same images, order and crop boxes, resized from other pixels (within the bound "
                "docs/data.md gives); the resume is not bitwise exact")
    return None


def _max_size_change(recorded: dict, current: dict) -> str | None:
    """What changed in the longest side the training images were packed at (None: their own size), or None."""
    before, now = recorded.get("max_size"), current.get("max_size")
    if before == now:
        return None

    def said(size) -> str:
        return f"packed with --max-size {size}" if size else "at their own size"

    return f"the training images were {said(before)} then, {said(now)} now"


def _decode_scale_change(recorded: dict, current: dict) -> str | None:
    """What changed in how the JPEGs were decoded (a checkpoint without the field decoded every pixel), or None."""
    before, now = recorded.get("decode_scale", "full"), current.get("decode_scale", "full")
    if before == now:
        return None
    return f"the JPEGs were decoded with --decode-scale {before} then, {now} now"


def _images_changed(recorded: dict, current: dict, batch: int) -> str:
    before, now = recorded.get("images"), current["images"]
    before = before if isinstance(before, int) else "?"
    what = f"{before} training images then, {now} now" if before != now else \
        f"{now} training images then and now, but not the same ones"
    if batch:
        return (f"=> the dataset changed since the checkpoint was written ({what}): the rest of this epoch is dealt "
                "from the new set's order, so some of its images are seen twice in this epoch and others not at "
                "all; the resume is not exact")
    return f"=> the dataset changed since the checkpoint was written ({what}); training goes on with it"


def open_split(root: Path, split: str, classes: list[str], *, batch_size: int = 1, world_size: int = 1) -> Split:
    """The images of ``root/split`` (train/ or val/), from the shards of a packed set or from the folder.

    Training refuses a set too small for one batch of ``batch_size`` per process.
    """
    source = open_packed_split(root / split, classes) if is_packed(root) else \
        FolderSplit(list_samples(root / split, classes), root / split)
    per_process = len(source) // world_size
    if split == "train" and per_process < batch_size:
        fits = f"; -b {1 << (per_process.bit_length() - 1)} fits" if per_process else ""
        raise UserError(f"train/ holds {len(source)} images, fewer than one batch of {batch_size} per process: "
                        f"lower -b/--batch-size{fits}")
    return source


def walk_split(split_dir: Path, classes: list[str]) -> tuple[list[tuple[str, int]], list[str]]:
    """(path, label) for every image under ``split_dir/<class>/``, in a stable order (see :func:`walk_class`),
    and the links not followed ("path: why")."""
    samples, links = [], []
    shared = SplitWalk()
    for label, name in enumerate(classes):
        class_dir = split_dir / name
        if not class_dir.is_dir():
            continue
        walk = walk_class(class_dir, split_dir, shared)
        links += walk.skipped_links
        samples.extend((path, label) for path in walk.files)
    return samples, links


def list_samples(split_dir: Path, classes: list[str]) -> list[tuple[str, int]]:
    """(path, label) for every image under ``split_dir/<class>/``, each link not followed warned about once."""
    samples, links = walk_split(split_dir, classes)
    _report_links(links)
    return samples


def reading_dataset():
    """Within the block, SIGTERM or SIGUSR1 ends a start-up that reads the dataset at once (exit 75), even where
    a read waits for good (a hung network file system): nothing was trained or written yet."""
    return stop_raises("reading the dataset", "nothing was trained or written: run the same command again")


def check_dataset(data_dir: str, num_classes: int | None, *, want_train: bool, want_val: bool) -> list[str]:
    """Validate the dataset layout before the first step; return the sorted class names."""
    with reading_dataset():
        return _check_dataset(data_dir, num_classes, want_train=want_train, want_val=want_val)


def _check_dataset(data_dir: str, num_classes: int | None, *, want_train: bool, want_val: bool) -> list[str]:
    root = Path(data_dir)
    if not root.is_dir():
        raise UserError(f"dataset directory {data_dir} does not exist")
    if is_packed(root):
        return check_packed(root, num_classes, want_train=want_train, want_val=want_val)
    splits = [s for s, wanted in (("train", want_train), ("val", want_val)) if wanted]
    found: dict[str, list[str]] = {}
    for split in splits:
        split_dir = root / split
        if not split_dir.is_dir():
            raise UserError(f"{data_dir} has no {split}/ folder; expected {split}/<class>/<image> files "
                            f"({WITHOUT_SPLIT[split]})")
        classes = class_folders(split_dir)
        if not classes:
            refuse_unfinished_pack(split_dir)
            raise UserError(f"{split_dir} has no class folders; expected {split}/<class>/<image> files")
        refuse_labels(classes, lambda name: split_dir / name)
        for name in classes:
            if not _has_images(split_dir / name, split_dir):
                raise UserError(f"class folder {split_dir / name} holds no images")
        found[split] = classes
    if len(found) == 2 and found["train"] != found["val"]:
        only_train = sorted(set(found["train"]) - set(found["val"]))
        only_val = sorted(set(found["val"]) - set(found["train"]))
        detail = "; ".join(
            part for part in (
                f"only in train/: {', '.join(only_train[:5])}" if only_train else "",
                f"only in val/: {', '.join(only_val[:5])}" if only_val else "",
            ) if part
        )
        raise UserError(f"train/ and val/ class folders differ ({detail})")
    classes = next(iter(found.values()))
    if num_classes is not None and len(classes) > num_classes:
        raise UserError(
            f"the dataset has {len(classes)} classes but --num-classes is {num_classes}; "
            f"pass --num-classes {len(classes)}"
        )
    return classes


def refuse_unfinished_pack(split_dir: Path) -> None:
    """UserError where ``split_dir`` holds a pack's files without their manifest (the pack was stopped or killed)."""
    if unfinished_pack(split_dir):
        raise UserError(f"{split_dir} holds the shards of a pack that did not finish (no {MANIFEST}); run the same "
                        "pack command again to finish it")


def _has_images(class_dir: Path, split_dir: Path) -> bool:
    """Whether the class folder holds an image; the usual flat folder is answered from its first entries."""
    with os.scandir(class_dir) as entries:
        if any(is_image_file(entry.name) and entry.is_file() for entry in entries):
            return True
    return bool(walk_class(class_dir, split_dir).files)
