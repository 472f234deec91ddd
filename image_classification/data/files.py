"""Finding and opening image files, the same way for every backend and for classify.py.

A class folder is walked following symbolic links (datasets are often assembled from links), but a link
never makes an image count twice or under another class: a directory already walked, one that holds
the class folder (``ln -s .. train/a/loop``) or one inside another class folder is not entered, and is
reported instead.  Images are opened as 8-bit RGB; 16-bit greyscale (PNG ``I;16``) is scaled, not
clipped.
"""

from __future__ import annotations

import io
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torchvision.datasets.folder import IMG_EXTENSIONS

SPLITS = ("train", "val")  # a dataset's split folders, beside each other

# PIL modes of 16-bit greyscale images (a PNG may open as "I" in older Pillow releases)
_SIXTEEN_BIT_MODES = {"I;16", "I;16L", "I;16B", "I;16N", "I"}


def is_image_file(name: str) -> bool:
    return name.lower().endswith(IMG_EXTENSIONS)


@dataclass
class ClassWalk:
    """The image files of one class folder, in a stable order, and the links that were not followed."""

    files: list[str] = field(default_factory=list)
    skipped_links: list[str] = field(default_factory=list)  # "path: why" for each link not followed


@dataclass
class SplitWalk:
    """What the walks of one split's class folders share: every folder walked and image counted so far."""

    folders: set[tuple[int, int]] = field(default_factory=set)
    images: set[tuple[int, int]] = field(default_factory=set)


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder + os.sep)


def walk_class(class_dir: Path, split_dir: Path | None = None, shared: SplitWalk | None = None) -> ClassWalk:
    """Image files under ``class_dir`` (depth first, names sorted), each counted once, where it really lives.

    A link, to a folder or to a file, is followed unless its target lies in another class folder or in
    another split of the dataset (``split_dir``'s siblings), or was already counted: walked by this split
    (``shared``, across its classes) or by this class.  Each link not followed is reported, so no image
    is counted twice or under a label that is not its own, and validation never leaks into training.
    """
    walk = ClassWalk()
    root = os.path.realpath(class_dir)
    split_root = os.path.realpath(split_dir) if split_dir is not None else None
    other_splits = [] if split_root is None else [
        os.path.realpath(os.path.join(os.path.dirname(split_root), name)) for name in SPLITS
        if os.path.realpath(os.path.join(os.path.dirname(split_root), name)) != split_root]
    shared = shared if shared is not None else SplitWalk()

    def refuse(real: str) -> str | None:
        if _inside(root, real) and root != real:
            return f"links back to {real}, which holds the class folder (a loop)"
        if split_root is not None and _inside(real, split_root) and not _inside(real, root):
            return f"links into another class folder ({real})"
        if any(_inside(real, other) for other in other_splits):
            return f"links into another split of the dataset ({real})"
        return None

    def visit(directory: str) -> None:
        info = os.stat(directory)
        if (info.st_dev, info.st_ino) in shared.folders:
            walk.skipped_links.append(f"{directory}: a directory already walked (a loop, or linked twice)")
            return
        shared.folders.add((info.st_dev, info.st_ino))
        try:
            entries = sorted(os.scandir(directory), key=lambda entry: entry.name)
        except OSError as error:
            walk.skipped_links.append(f"{directory}: cannot be listed ({error.strerror})")
            return
        subdirectories = []
        for entry in entries:
            try:
                is_dir = entry.is_dir(follow_symlinks=True)
            except OSError:
                continue  # a dangling link
            if is_dir:
                if entry.is_symlink():
                    why = refuse(os.path.realpath(entry.path))
                    if why is not None:
                        walk.skipped_links.append(f"{entry.path}: {why}")
                        continue
                subdirectories.append(entry.path)
            elif is_image_file(entry.name):
                if entry.is_symlink():
                    why = refuse(os.path.realpath(entry.path))
                    if why is not None:
                        walk.skipped_links.append(f"{entry.path}: {why}")
                        continue
                try:
                    target = entry.stat(follow_symlinks=True)
                except OSError:  # a dangling link: listed, so that reading it is reported as unreadable
                    walk.files.append(entry.path)
                    continue
                if (target.st_dev, target.st_ino) in shared.images:
                    walk.skipped_links.append(f"{entry.path}: an image already counted under another name")
                    continue
                shared.images.add((target.st_dev, target.st_ino))
                walk.files.append(entry.path)
        for subdirectory in subdirectories:
            visit(subdirectory)

    visit(str(class_dir))
    return walk


def open_rgb(source) -> Image.Image:
    """Open a path or binary file as an 8-bit RGB image (16-bit greyscale scaled by 255/65535).

    Raises what PIL raises for a file that is not a readable image (OSError, ValueError, ...).
    """
    with Image.open(source) as image:
        if image.mode in _SIXTEEN_BIT_MODES:
            pixels = np.asarray(image, dtype=np.float64)
            eight_bit = np.clip(np.rint(pixels * (255 / 65535)), 0, 255).astype(np.uint8)
            return Image.fromarray(eight_bit, "L").convert("RGB")
        return image.convert("RGB")


def decode_problem(path: str) -> str | None:
    """Why ``path`` cannot be decoded as an image, or None when it can."""
    try:
        with Image.open(path) as image:
            image.draft("RGB", (1, 1))  # JPEG: decode at 1/8 scale; every byte is still read
            image.load()
    except Exception as error:  # anything PIL raises makes the file unusable for training
        return f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else 'unreadable'}"
    return None


def read_rgb_tensor(path: str) -> torch.Tensor:
    """A CHW uint8 RGB tensor of the image at ``path``, for augmentation on tensors.

    JPEGs are decoded by torchvision's libjpeg-turbo decoder straight into a tensor (faster than PIL
    plus a conversion); anything it refuses, and every other format, goes through :func:`open_rgb`, so a
    broken file raises what PIL raises.
    """
    with open(path, "rb") as handle:
        raw = handle.read()
    if raw[:3] == b"\xff\xd8\xff":
        from torchvision.io import ImageReadMode, decode_jpeg

        try:
            return decode_jpeg(torch.frombuffer(bytearray(raw), dtype=torch.uint8), mode=ImageReadMode.RGB)
        except RuntimeError:
            pass  # PIL decides, and names the problem
    return torch.from_numpy(np.array(open_rgb(io.BytesIO(raw)))).permute(2, 0, 1)
