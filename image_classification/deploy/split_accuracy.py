"""classify.py on a split in ImageFolder layout (``DIR/<class>/<image>``): each image's label, and top-1 and
top-k against the class folders' names, with the classes most often confused.

A folder given to ``--image`` that holds no image file itself but class folders is such a split.  It is walked
as training walks one (:func:`..data.layout.list_samples`: links, hard links and entries that are not regular
files left out and said, a class folder whose name cannot be a label refused); an unreadable image is left
out and named, as training does.  A class folder counts under the class of the weights that bears its name
(the names the checkpoint records, or ``--labels``).  A folder whose name no class of the weights bears (or
two of them do) is said in one line and its images are classified and count as wrong, so that the figures
stay those of every readable image of the split; where no folder's name is a class of the weights, the run
stops before classifying, since every figure would be 0.  k is 5, or the class count where the weights have
fewer, as in training's ``val.top5``.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from ..data.files import is_image_file, printable, refuse_labels
from ..data.layout import class_folders, list_samples
from ..errors import UserError

TOP_K = 5  # the second figure: top-5, as training's val.top5 (fewer where the weights have fewer classes)
CONFUSIONS_SHOWN = 10  # rows of the plain-text table; --json lists every pair
NAMES_SHOWN = 5  # folder names a line names before "and N more"


@dataclass
class LabelledSplit:
    """The images of a split folder, each with the index of its class folder in ``classes`` (sorted names)."""

    folder: Path
    classes: list[str]
    samples: list[tuple[Path, int]]

    @property
    def paths(self) -> list[Path]:
        return [path for path, _ in self.samples]


def is_split(folder: Path) -> bool:
    """Whether ``folder`` holds no image file itself but folders: a split, ``DIR/<class>/<image>``."""
    try:
        with os.scandir(folder) as entries:
            listed = list(entries)
    except OSError:
        return False
    if any(is_image_file(entry.name) and entry.is_file() for entry in listed):
        return False
    return any(entry.is_dir() for entry in listed)


def open_labelled_split(folder: Path) -> LabelledSplit:
    """The images of the split ``folder``, walked as training walks a split; a :class:`UserError` where its
    class folders hold none, or where a class folder's name cannot be a label."""
    classes = class_folders(folder)
    refuse_labels(classes, lambda name: folder / name)
    samples = [(Path(path), label) for path, label in list_samples(folder, classes)]
    if not samples:
        raise UserError(f"folder {printable(folder)} holds no image files, nor do its {len(classes)} class "
                        "folders")
    return LabelledSplit(folder, classes, samples)


def _named(names: Sequence[str]) -> str:
    shown = ", ".join(names[:NAMES_SHOWN])
    return shown + (f" and {len(names) - NAMES_SHOWN} more" if len(names) > NAMES_SHOWN else "")


def _weights_classes(split: LabelledSplit, names: Sequence[str]) -> dict[int, int]:
    """Class folder index -> the index of the one class of the weights that bears its name, for each folder
    that has one."""
    indices: dict[str, list[int]] = {}
    for index, name in enumerate(names):
        indices.setdefault(name, []).append(index)
    return {folder: indices[name][0] for folder, name in enumerate(split.classes)
            if len(indices.get(name, ())) == 1}


def _refuse_unmatched(split: LabelledSplit, names: Sequence[str]) -> None:
    """A :class:`UserError` for a split none of whose class folders bears the name of one class of the
    weights."""
    where = printable(split.folder)
    hint = (f"; {where} looks like a dataset's root: give one of its splits, e.g. {where}/val"
            if {"train", "val"} & set(split.classes) else "")
    raise UserError(f"none of the {len(split.classes)} class folders of {where} ({_named(split.classes)}) is "
                    f"the name of a class of the weights ({_named(list(names))}), so no image could count as "
                    f"right; pass --labels FILE, the folder names one a line in the weights' class "
                    f"order{hint}")


@dataclass
class SplitTally:
    """What classify.py counts on one split: images, top-1 and top-k hits, (true, predicted) confusions."""

    split: LabelledSplit
    targets: dict[int, int]  # class folder -> class of the weights, for the folders that have one
    images: int = 0
    top1: int = 0
    topk: int = 0
    confused: Counter = field(default_factory=Counter)

    def add(self, folder_label: int, predictions: Sequence[dict], k: int) -> None:
        """Count one image of class folder ``folder_label`` by its predictions (highest first, at least
        ``k`` of them)."""
        self.images += 1
        target = self.targets.get(folder_label)
        ranked = [prediction["index"] for prediction in predictions[:k]]
        if target is not None and ranked[0] == target:
            self.top1 += 1
            self.topk += 1
            return
        if target is not None and target in ranked:
            self.topk += 1
        self.confused[(self.split.classes[folder_label], predictions[0]["label"])] += 1


class SplitScoring:
    """The tallies of the splits classify.py was given, against the class names of the weights."""

    def __init__(self, splits: Sequence[LabelledSplit], names: Sequence[str], warn: Callable[[str], None]):
        """Match each split's class folders to ``names``: where none matches, a :class:`UserError`; each
        folder of images that matches none is said in one line through ``warn``."""
        self.k = min(TOP_K, len(names))
        self.tallies: list[SplitTally] = []
        self.labels: dict[Path, list[tuple[SplitTally, int]]] = {}
        for split in splits:
            targets = _weights_classes(split, names)
            if not targets:
                _refuse_unmatched(split, names)
            tally = SplitTally(split, targets)
            self.tallies.append(tally)
            for path, folder_label in split.samples:
                self.labels.setdefault(path, []).append((tally, folder_label))
            if line := _unmatched_line(split, targets):
                warn(line)

    def add(self, path: Path, predictions: Sequence[dict]) -> None:
        """Count ``path``'s predictions where it is an image of a split (nothing for a file given alone)."""
        for tally, folder_label in self.labels.get(path, ()):
            tally.add(folder_label, predictions, self.k)

    def reports(self, as_json: bool) -> list[str]:
        """The figures of each split: a JSON object a line (``as_json``), else lines of text."""
        lines = []
        for tally in self.tallies:
            lines += [report_json(tally, self.k)] if as_json else report_text(tally, self.k)
        return lines


def _unmatched_line(split: LabelledSplit, targets: dict[int, int]) -> str | None:
    """The warning for the class folders of images that no single class of the weights bears the name of."""
    counts = Counter(label for _, label in split.samples)
    unmatched = [folder for folder in sorted(counts) if folder not in targets]
    if not unmatched:
        return None
    images = sum(counts[folder] for folder in unmatched)
    names = _named([split.classes[folder] for folder in unmatched])
    one = len(unmatched) == 1
    return (f"warning: {len(unmatched)} class folder{'' if one else 's'} of {printable(split.folder)} "
            f"({names}) {'is' if one else 'are'} not the name of one class of the weights: "
            f"{'its' if one else 'their'} {images} image{'' if images == 1 else 's'} count as wrong")


def _percent(hits: int, images: int) -> float:
    return round(100.0 * hits / images, 2) if images else 0.0


def _left_out(tally: SplitTally) -> int:
    return len(tally.split.samples) - tally.images


def report_text(tally: SplitTally, k: int) -> list[str]:
    """The split's figures as a person reads them: top-1 and top-k, and a table of the commonest
    confusions."""
    where = printable(tally.split.folder)
    if not tally.images:
        return [f"{where}: no image could be read (each is named above)"]
    left_out = _left_out(tally)
    figures = f"top-1 {_percent(tally.top1, tally.images):.2f}%"
    if k > 1:
        figures += f", top-{k} {_percent(tally.topk, tally.images):.2f}%"
    lines = [f"{where}: {figures} of {tally.images} images in {len(tally.split.classes)} class folders"
             + (f" ({left_out} unreadable, left out: each is named above)" if left_out else "")]
    if not tally.confused:
        return lines + ["no image was classified as another class"]
    common = tally.confused.most_common(CONFUSIONS_SHOWN)
    width = max(len(f"{true} -> {predicted}") for (true, predicted), _ in common)
    lines.append("most often confused (true class -> predicted class, images):")
    lines += [f"  {f'{true} -> {predicted}':<{width}}  {count}" for (true, predicted), count in common]
    if len(tally.confused) > len(common):
        lines.append(f"  ... and {len(tally.confused) - len(common)} more pairs (--json lists them all)")
    return lines


def report_json(tally: SplitTally, k: int) -> str:
    """The split's figures as one JSON object: split, images, left_out, classes, top1, top{k} (percent) and
    confused, every (true, predicted) pair with its count, commonest first."""
    return json.dumps({
        "split": str(tally.split.folder), "images": tally.images, "left_out": _left_out(tally),
        "classes": len(tally.split.classes), "top1": _percent(tally.top1, tally.images),
        f"top{k}": _percent(tally.topk, tally.images),
        "confused": [{"true": true, "predicted": predicted, "images": count}
                     for (true, predicted), count in tally.confused.most_common()],
    })
