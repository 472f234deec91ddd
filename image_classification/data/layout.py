"""The dataset on disk: ``DIR/train/<class>/<image>`` and ``DIR/val/<class>/<image>``.

Which class folders there are (their sorted names are the labels), which images each split holds, and
the checks a dataset must pass before a run starts.  Every backend and ``data.check`` read the layout
through this module, so they count the same images under the same labels.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from ..errors import UserError
from .files import SplitWalk, is_image_file, walk_class


def class_folders(split_dir: Path) -> list[str]:
    """The class folder names of a split, sorted: their order is the label order."""
    return sorted(entry.name for entry in os.scandir(split_dir) if entry.is_dir())


_reported_links: set[str] = set()


def _report_links(problems: list[str]) -> None:
    """One warning per link not followed, however often the folder is listed."""
    for problem in problems:
        if problem not in _reported_links:
            _reported_links.add(problem)
            print(f"warning: not following {problem}", file=sys.stderr, flush=True)


def split_samples(root: Path, split: str, classes: list[str], *, batch_size: int = 1,
                  world_size: int = 1) -> list[tuple[str, int]]:
    """(path, label) of every image of ``root/split`` (train/ or val/), what every backend reads.

    Training refuses a set too small for one batch of ``batch_size`` per process.
    """
    samples = list_samples(root / split, classes)
    if split == "train" and len(samples) // world_size < batch_size:
        raise UserError(
            f"train/ holds {len(samples)} images, fewer than one batch of {batch_size} per process; "
            "lower -b/--batch-size"
        )
    return samples


def list_samples(split_dir: Path, classes: list[str]) -> list[tuple[str, int]]:
    """(path, label) for every image under ``split_dir/<class>/``, in a stable order (see :func:`walk_class`)."""
    samples = []
    shared = SplitWalk()
    for label, name in enumerate(classes):
        class_dir = split_dir / name
        if not class_dir.is_dir():
            continue
        walk = walk_class(class_dir, split_dir, shared)
        _report_links(walk.skipped_links)
        samples.extend((path, label) for path in walk.files)
    return samples


def check_dataset(data_dir: str, num_classes: int | None, *, want_train: bool, want_val: bool) -> list[str]:
    """Validate the dataset layout before the first step; return the sorted class names."""
    root = Path(data_dir)
    if not root.is_dir():
        raise UserError(f"dataset directory {data_dir} does not exist")
    splits = [s for s, wanted in (("train", want_train), ("val", want_val)) if wanted]
    found: dict[str, list[str]] = {}
    for split in splits:
        split_dir = root / split
        if not split_dir.is_dir():
            raise UserError(f"{data_dir} has no {split}/ folder; expected {split}/<class>/<image> files")
        classes = class_folders(split_dir)
        if not classes:
            raise UserError(f"{split_dir} has no class folders; expected {split}/<class>/<image> files")
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


def _has_images(class_dir: Path, split_dir: Path) -> bool:
    """Whether the class folder holds an image; the usual flat folder is answered from its first entries."""
    with os.scandir(class_dir) as entries:
        if any(is_image_file(entry.name) and entry.is_file() for entry in entries):
            return True
    return bool(walk_class(class_dir, split_dir).files)
