"""Reading the toolkit's own files as data: the manifests, sample tables and shards of packed sets, the ONNX
cache's records, a workspace's lock record, raports and the presets file; and opening the files it writes in
place (a workspace's lock and raport, multiproc.py's logs).

Every one is opened the same way (:func:`open_regular` to read, :func:`open_own` to write in place, both over
:func:`open_descriptor`, which the readers of images and the pack's writer share too): without waiting (``open``
of a FIFO waits for a writer, or a reader, for good), without following a link where the file must be the
toolkit's own, and only when it is a regular file; a file read is read whole with a bound on its size
(:func:`read_regular`).  JSON is parsed by :func:`parse_json` under more bounds, so that no content turns into a
traceback: the nesting (Python's parser recurses once a level and dies of RecursionError near 1,000), and the
numbers (integers within int64, which numpy and the formats' fields hold, and finite floats: ``1e999`` parses as
infinity).

Whatever fails is a :class:`DataFileError` whose text completes a sentence that begins with the file's name
("... is a symbolic link"); each caller ends that sentence its own way: one line and exit code 2 for a
dataset, a notice and a fresh export for a cache record.  Standard library only.
"""

from __future__ import annotations

import errno
import json
import math
import os
import re
import stat
from pathlib import Path

MAX_DEPTH = 32  # far deeper than the toolkit's files nest (a manifest: 4), far shallower than the parser's limit
INT_LIMIT = 2**63  # integers are refused outside [-INT_LIMIT, INT_LIMIT): an int64 holds every one accepted
_INT_DIGITS = len(str(INT_LIMIT))  # a longer integer is out of range before it is converted
# a JSON string (its escapes skipped whole) or a bracket: the brackets outside strings are the nesting
_NESTING_TOKENS = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]', re.DOTALL)


class DataFileError(ValueError):
    """Why a file cannot be read as the data it should hold: the end of a sentence that begins with its name
    ("is a symbolic link", "nests its values more than 32 levels deep")."""


class NotARegularFile(OSError):
    """A path that names a folder, a FIFO, a socket or a device where a regular file was to be opened."""


def open_descriptor(path: str | os.PathLike, flags: int = os.O_RDONLY, *, follow_links: bool = False,
                    mode: int = 0o644) -> int:
    """``os.open(path, flags, mode)`` of a regular file, which blocks as usual once open: the open itself never
    waits (that of a FIFO would wait for a writer, for good), nor goes through a link unless ``follow_links``.
    Raises what ``os.open`` raises (ELOOP for a link), and :class:`NotARegularFile`."""
    flags |= getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    if not follow_links:
        flags |= getattr(os, "O_NOFOLLOW", 0)
    descriptor = os.open(path, flags, mode)
    try:
        if not stat.S_ISREG(os.fstat(descriptor).st_mode):
            raise NotARegularFile(errno.EINVAL, "not a regular file")
        os.set_blocking(descriptor, True)
    except BaseException:
        os.close(descriptor)
        raise
    return descriptor


# Python's open() modes, as the flags of open_descriptor
_MODE_FLAGS = {"r": os.O_RDONLY, "r+": os.O_RDWR, "w": os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
               "a": os.O_WRONLY | os.O_CREAT | os.O_APPEND, "a+": os.O_RDWR | os.O_CREAT | os.O_APPEND,
               "x": os.O_WRONLY | os.O_CREAT | os.O_EXCL}


def open_own(path: str | os.PathLike, mode: str = "r", **options):
    """``open(path, mode, **options)`` of a file the toolkit writes in place (a workspace's lock and raport, a
    log), through :func:`open_descriptor`: never through a link, never waiting on a FIFO, a regular file only.
    Raises what ``os.open`` raises (ELOOP for a link, ENXIO for a FIFO that nobody reads), and
    :class:`NotARegularFile`."""
    flags = _MODE_FLAGS[mode.replace("b", "")]
    return os.fdopen(open_descriptor(path, flags), mode, **options)


def own_file_problem(path: str | os.PathLike) -> str | None:
    """Why ``path`` cannot be a file that the toolkit writes in place (see :func:`open_own`), the end of a sentence
    that begins with its name: "is a symbolic link", "is not a regular file (...)"; None when it is a regular
    file or does not exist.  Found without opening it (a FIFO's open would wait)."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return None
    except OSError:
        return None  # a path the open itself will refuse, with its own reason
    if stat.S_ISLNK(mode):
        return "is a symbolic link"
    if not stat.S_ISREG(mode):
        return "is not a regular file (a folder, a FIFO, a socket or a device)"
    return None


def unreadable_reason(path: str | os.PathLike) -> str:
    """Why ``path``, which is not a regular file, cannot be read as one: the end of a sentence that begins with its
    name ("does not exist", "is a pipe, not a regular file").  Found without opening it (a FIFO's open would wait
    for a writer, for good)."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return "does not exist"
    kind = ("a folder" if stat.S_ISDIR(mode) else "a pipe" if stat.S_ISFIFO(mode) else
            "a socket" if stat.S_ISSOCK(mode) else "a device")
    return f"is {kind}, not a regular file"


def nearest_existing(path: str | os.PathLike) -> Path:
    """``path`` itself when it exists, else the closest folder above it that does (where mkdir would start)."""
    path = Path(os.path.abspath(path))
    while not path.exists() and path.parent != path:
        path = path.parent
    return path


def folder_problem(folder: str | os.PathLike) -> str | None:
    """Why no file can be written into ``folder`` (made first where it is missing), as far as can be told without
    writing anything, the end of a sentence that begins with what is written there: "cannot be written: X is a
    file, not a folder", "cannot be written: X is read-only"; None when nothing tells."""
    existing = nearest_existing(folder)
    if not existing.is_dir():
        return f"cannot be written: {existing} is a file, not a folder"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"cannot be written: {existing} is read-only"
    return None


def refused_own_file(path: str | os.PathLike, error: OSError) -> str | None:
    """What :func:`own_file_problem` says of ``path`` when ``error``, raised by :func:`open_own`, is its refusal of a
    link, a FIFO, a folder (EISDIR: opened for writing) or another file that is not regular; None for any other
    error (a full disk, a read-only one)."""
    if isinstance(error, NotARegularFile) or error.errno in (errno.ELOOP, errno.ENXIO, errno.EISDIR):
        return own_file_problem(path) or "is not a regular file (a folder, a FIFO, a socket or a device)"
    return None


def open_regular(path: str | os.PathLike, *, follow_links: bool = False) -> int:
    """A read-only descriptor of ``path``, a regular file (see :func:`open_descriptor`); a link is refused unless
    ``follow_links``, and a FIFO without waiting for a writer; DataFileError otherwise."""
    try:
        return open_descriptor(path, follow_links=follow_links)
    except NotARegularFile:
        raise DataFileError("is not a regular file (a folder, a device or a pipe)") from None
    except OSError as error:
        if error.errno == errno.ELOOP and not follow_links:
            raise DataFileError("is a symbolic link") from None
        if error.errno == errno.ENOENT:
            raise DataFileError("does not exist") from None
        raise DataFileError(f"cannot be opened ({error.strerror or error})") from None


def read_regular(path: str | os.PathLike, max_bytes: int | None = None, *, follow_links: bool = False) -> bytes:
    """The bytes of ``path`` (see :func:`open_regular`), refused past ``max_bytes`` (None: no bound) without
    reading more than one byte beyond it, even from a file that grows meanwhile."""
    with os.fdopen(open_regular(path, follow_links=follow_links), "rb") as handle:
        try:
            if max_bytes is not None and os.fstat(handle.fileno()).st_size > max_bytes:
                raise DataFileError(f"holds more than {max_bytes:,} bytes")
            data = handle.read() if max_bytes is None else handle.read(max_bytes + 1)
        except OSError as error:
            raise DataFileError(f"cannot be read ({error.strerror or error})") from None
    if max_bytes is not None and len(data) > max_bytes:
        raise DataFileError(f"holds more than {max_bytes:,} bytes")
    return data


def utf8_text(data: bytes) -> str:
    """``data`` as UTF-8 text; DataFileError naming the first byte that is not."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise DataFileError(f"is not UTF-8 text (byte {error.start + 1} is not)") from None


def parse_json(data: bytes | str, max_bytes: int, *, allow_nonfinite: bool = False):
    """The value of the JSON text ``data`` under the module's bounds: at most ``max_bytes`` long, nested at most
    :data:`MAX_DEPTH` deep, integers within int64, floats finite (unless ``allow_nonfinite``: NaN and the
    infinities Python's own writer puts in a raport); DataFileError otherwise."""
    if len(data) > max_bytes:
        raise DataFileError(f"holds more than {max_bytes:,} bytes")
    text = utf8_text(data) if isinstance(data, bytes) else data
    _check_nesting(text)
    floats = _any_float if allow_nonfinite else _finite_float
    try:
        return json.loads(text, parse_int=_bounded_int, parse_float=floats, parse_constant=floats)
    except json.JSONDecodeError as error:
        raise DataFileError(f"is not JSON ({error.msg}: line {error.lineno} column {error.colno})") from None


def read_json(path: str | os.PathLike, max_bytes: int, *, follow_links: bool = False):
    """:func:`parse_json` of the file at ``path`` (read by :func:`read_regular`)."""
    return parse_json(read_regular(path, max_bytes, follow_links=follow_links), max_bytes)


def _check_nesting(text: str) -> None:
    """Refuse ``text`` when its brackets outside strings nest deeper than :data:`MAX_DEPTH`, before it is parsed
    (where the text is no valid JSON, the parser refuses it no deeper than this counts)."""
    depth = 0
    for token in _NESTING_TOKENS.finditer(text):
        bracket = token.group()
        if bracket in "[{":
            depth += 1
            if depth > MAX_DEPTH:
                line = text.count("\n", 0, token.start()) + 1
                raise DataFileError(f"nests its values more than {MAX_DEPTH} levels deep (line {line})")
        elif bracket in "]}":
            depth -= 1


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) <= _INT_DIGITS:
        value = int(text)
        if -INT_LIMIT <= value < INT_LIMIT:
            return value
    raise DataFileError(f"holds the whole number {text[:24]}{'...' if len(text) > 24 else ''}, beyond what a 64-bit "
                        "integer holds")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise DataFileError(f"holds the number {text[:24]}, which is not finite")
    return value


def _any_float(text: str) -> float:
    return float(text)
