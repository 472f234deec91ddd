"""Where a pack writes: the DST folder it is given, checked before anything is written, and the files it
writes there opened so that nothing outside DST is ever written.

A DST is refused when it is SRC or lies inside it, when it holds anything a pack does not write (at its top:
only ``train/``, ``val/`` and the lock; in a split folder: only the pack's own files, see
:func:`.packed.written_by_pack`), and when any of those is a symbolic link.  Every file a pack writes is
opened without following a link (``O_NOFOLLOW``) nor waiting on a FIFO, and is a regular file; a file written
whole is created anew under a temporary name (``O_EXCL``) and renamed into place.  One pack at a time writes a
DST (:class:`PackLock`).
"""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import UserError, write_failure
from ..records.datafile import NotARegularFile, open_descriptor
from ..records.workspace import try_flock
from .files import SPLITS, printable
from .packed import TEMPORARY, written_by_pack

LOCK = ".pack.lock"


def open_own(path: Path, flags: int) -> int:
    """A descriptor of the regular file ``path``, opened with ``flags`` (os.O_*) but never through a link nor
    waiting on a FIFO (:func:`~image_classification.records.datafile.open_descriptor`); UserError otherwise."""
    try:
        return open_descriptor(path, flags)
    except NotARegularFile:
        raise UserError(f"{printable(path)} is not a regular file, which a pack would write; remove it") from None
    except OSError as error:
        if os.path.islink(path):
            raise UserError(f"{printable(path)} is a symbolic link, which a pack never writes through; remove it") from None
        raise write_failure(printable(path), error) from None


def _inside(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def _foreign(folder: Path, ours) -> str | None:
    """Why ``folder`` is no pack's to write in: an entry that is a link, or whose name ``ours`` refuses."""
    with os.scandir(folder) as entries:
        for entry in sorted(entries, key=lambda entry: entry.name):
            if entry.is_symlink():
                return f"{printable(entry.path)} is a symbolic link, which a pack never writes"
            if not ours(entry.name):
                return f"{printable(folder)} holds {printable(entry.name)!r}, which a pack does not write"
    return None


def prepare_destination(source: Path, destination: Path, splits: list[str]) -> None:
    """Refuse a DST that is SRC or lies inside it, or that holds anything a pack does not write or any link
    (see the module's docstring); then make the split folders."""
    real_source, real_destination = source.resolve(), destination.resolve()
    if _inside(real_destination, real_source):
        raise UserError(f"DST {destination} is SRC or inside it; pack into another folder")
    if destination.exists() and not destination.is_dir():
        raise UserError(f"DST {destination} is not a folder")
    if destination.is_dir():
        problem = _foreign(destination, lambda name: name in (*SPLITS, LOCK))
        for split in SPLITS:
            split_dir = destination / split
            if problem is None and split_dir.exists() and not split_dir.is_dir():
                problem = f"{printable(split_dir)} is not a folder"
            if problem is None and split_dir.is_dir():
                problem = _foreign(split_dir, written_by_pack)
        if problem is not None:
            raise UserError(f"{problem}; pack into an empty or new folder")
    destination.mkdir(parents=True, exist_ok=True)
    for split in splits:
        (destination / split).mkdir(exist_ok=True)


def remove_temporaries(destination: Path, splits: list[str]) -> None:
    """Remove the files a killed pack left half written (call with the lock held: none is being written)."""
    for split in splits:
        for entry in os.listdir(destination / split):
            if TEMPORARY.fullmatch(entry):
                (destination / split / entry).unlink()


class PackLock:
    """One pack at a time per DST: an flock on ``DST/.pack.lock``, held until the pack ends (a killed pack's
    dies with it)."""

    def __init__(self, destination: Path):
        self.path, self.handle = destination / LOCK, None

    def __enter__(self) -> "PackLock":
        handle = os.fdopen(open_own(self.path, os.O_RDWR | os.O_CREAT), "r+", encoding="utf-8", errors="replace")
        locked = try_flock(handle)
        if locked is False:
            handle.seek(0)
            holder = handle.read(200).strip() or "another process"
            handle.close()
            raise UserError(f"another pack is writing {self.path.parent} ({holder}); wait for it to end")
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()}\n")
        handle.flush()
        self.handle = handle
        return self

    def __exit__(self, *exc) -> None:
        if self.handle is not None:
            self.handle.close()
