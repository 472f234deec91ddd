"""Scratch folders of an export: beside its output, named after their writer, cleared by the next export.

An export (model2onnx.py, the ONNX cache) writes what it needs on the way, the FP32 graph before its int8
quantization, ONNX Runtime's own copies of the graph, a Triton model being assembled, in a folder of its
own beside its output: ``.NAME.<stamp>.<random>.tmp``, where ``<stamp>`` is :func:`.workspace.writer_stamp`
(pid, process start, machine).  The finished file is renamed from there into place (the same file system),
and the folder is removed when the export ends, whether it succeeded, failed or was stopped by a signal.
A writer killed outright (SIGKILL, a crash) leaves its folder; the next export into the same place removes
it once :func:`.workspace.stamp_is_dead` proves its writer gone: a live writer's folder, and one of another
machine sharing the place, stay.

ONNX Runtime's quantizer makes its temporary folders with :mod:`tempfile` and takes no folder for them:
:func:`temporaries_in` points :mod:`tempfile` at the scratch folder while it runs, so that they too lie
where the next export finds them (and never in ``$TMPDIR``, which nothing clears).
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import tempfile
from pathlib import Path
from typing import Iterator

from .workspace import stamp_is_dead, writer_stamp

STAMP = r"(?P<stamp>\d+-(?:\d+|x)-[0-9a-f]{12})"  # a writer_stamp() inside a name
SCRATCH = re.compile(rf"^\..+\.{STAMP}\.[0-9a-f]{{8}}\.tmp$")


def remove_dead_writers(folder: Path, pattern: re.Pattern = SCRATCH) -> list[Path]:
    """Delete the entries of ``folder`` (files, or folders with all they hold) whose name ``pattern`` matches
    and whose writer, the match's ``stamp`` group, is proven dead.  Nothing is said where it cannot be done."""
    removed = []
    with contextlib.suppress(OSError):
        for entry in list(os.scandir(folder)):
            match = pattern.match(entry.name)
            if not match or not stamp_is_dead(match["stamp"]):
                continue
            with contextlib.suppress(OSError):
                if entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.path)
                else:
                    os.unlink(entry.path)
                removed.append(Path(entry.path))
    return removed


@contextlib.contextmanager
def scratch_folder(folder: Path, name: str) -> Iterator[Path]:
    """A new folder ``folder/.NAME.<stamp>.<random>.tmp`` for the block, removed with all it holds when the
    block ends; the scratch folders of dead writers in ``folder`` are removed first.  ``folder`` must exist;
    an OSError where it cannot be written."""
    remove_dead_writers(folder)
    path = folder / f".{name}.{writer_stamp()}.{secrets.token_hex(4)}.tmp"
    path.mkdir()
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@contextlib.contextmanager
def temporaries_in(folder: Path) -> Iterator[None]:
    """:mod:`tempfile` makes its files and folders in ``folder`` while the block runs (``tempfile.tempdir``:
    ``$TMPDIR`` is read once, at the first use)."""
    previous = tempfile.tempdir
    tempfile.tempdir = str(folder)
    try:
        yield
    finally:
        tempfile.tempdir = previous
