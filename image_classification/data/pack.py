"""Pack an ImageFolder into WebDataset shards that training reads as it reads the folder.

    python -m image_classification.data.pack SRC DST [--shard-size SIZE] [-j N] [--max-size S [--quality Q]]

For each split of SRC (``train/``, ``val/``), ``DST/<split>/`` gets tar shards of about ``--shard-size``
(default 1GB), a DALI index beside each, the sample table and, last, the manifest (the layout is
described in :mod:`.packed`).  The images are listed exactly as training lists the folder (links
followed or not by the same rules; an image that cannot be read, a dangling link, is packed as an
unreadable sample, so the numbering stays the folder's) and stored byte for byte; with ``--max-size S``, an
image whose longer side is above S is stored resized to S on that side (antialiased, decoded at libjpeg's reduced
scale where that still holds S) as a JPEG of ``--quality`` (default 90), which the manifest records (its
pixels as stored, its EXIF orientation tag kept, alone: a run turns it as it turns the folder's), and so
decoding it never needs more than S (one that cannot be decoded, or breaks the size rule, is stored as it is, to
be reported where it is read, as on the folder).

Packing is deterministic: the same folder packs into byte-identical shards.  Every file appears under its
name only once complete (written under a temporary name, synced, renamed), and the manifest last, so an
interrupted pack (SIGTERM, SIGKILL, a full disk) never leaves a set that passes for complete; run the same
command again and it keeps the shards already done (their sources unchanged: names, sizes, times) and
finishes the rest.  One pack at a time per DST, which must be no folder of SRC's and hold nothing but a pack's
files; nothing outside it is ever written, even through a link planted in it (:mod:`.pack_destination`).  The
images are read by ``-j`` threads, in order.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import os
import re
import sys
import tarfile
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator

import numpy as np

from ..arguments.tools import pack_parser
from ..errors import UserError, write_failure
from ..records.datafile import DataFileError, parse_json, read_json, read_regular
from ..system.cli import run
from ..system.signals import stop_raises
from .files import SPLITS, open_image, printable, read_bytes
from .layout import _report_links, check_dataset, relative_names, walk_split
from .pack_destination import PackLock, open_own, prepare_destination, remove_temporaries
from .pack_resize import Resizing, resizing
from .packed import (BLOCK, FORMAT, MANIFEST, MAX_MANIFEST_BYTES, NAMES, PROGRESS, SHARD, TABLE, TABLE_DTYPE, VERSION,
                     index_name, is_packed, names_blob, sample_key, shard_name)

DEFAULT_SHARD_SIZE = 10**9
_INDEX_LINE_BYTES = 128  # more than a line of a shard's DALI index takes (two members, their offsets and sizes)
_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}
_HEADER = dict(mode=0o644, uid=0, gid=0, uname="", gname="", mtime=0, type=tarfile.REGTYPE)
_END = 2 * BLOCK  # a tar ends with two zero blocks, padded to a whole record
MAX_SIZE = 2**32 - 1  # the table's field for a sample's size


def parse_size(text: str) -> int:
    """``64KB``, ``500MB``, ``1GB``, ``2GiB`` or a byte count, as an integer number of bytes."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", text)
    unit = match[2].upper() if match else None
    if match is None or unit not in _UNITS:
        raise UserError(f"--shard-size {text!r}: give a size such as 64KB, 500MB or 1GB")
    size = int(float(match[1]) * _UNITS[unit])
    if size < 4 * BLOCK:
        raise UserError(f"--shard-size {text}: at least 2KB")
    return size


def _padded(size: int) -> int:
    return -(-size // BLOCK) * BLOCK


def _cls_text(label: int) -> bytes:
    return str(label).encode("ascii")


def sample_bytes(size: int, label: int) -> int:
    """What a sample of ``size`` image bytes takes in a shard: two headers and two padded members."""
    return 2 * BLOCK + _padded(size) + _padded(len(_cls_text(label)))


def _header(name: str, size: int) -> bytes:
    info = tarfile.TarInfo(name)
    info.size = size
    for key, value in _HEADER.items():
        setattr(info, key, value)
    return info.tobuf(tarfile.USTAR_FORMAT, "utf-8", "strict")


# ------------------------------------------------------------------------------------------------
# What to pack
# ------------------------------------------------------------------------------------------------
@dataclass
class SplitPlan:
    """One split's samples in the folder's order, with what the file system says of each when listed."""

    source_dir: Path  # SRC/<split>
    target_dir: Path  # DST/<split>
    classes: list[str]
    paths: list[str]
    names: list[str]  # the paths relative to source_dir: what names.bin and the messages hold
    labels: np.ndarray
    sizes: np.ndarray  # bytes when listed; -1 where the file cannot even be looked at (a dangling link)
    mtimes: np.ndarray
    problems: dict[int, str]  # samples that cannot be read, with the reason
    links: list[str]  # links not followed, as training reports them
    shards: list[range] = field(default_factory=list)
    resizing: Resizing | None = None
    resized: set[int] = field(default_factory=set)  # the samples stored resized (as JPEGs), once read

    def extension(self, index: int) -> str:
        if index in self.resized:
            return "jpg"
        return os.path.splitext(self.paths[index])[1].lower().lstrip(".")

    def sources(self, rows: range) -> str:
        """A digest of what shard ``rows`` is packed from: a kept shard must have the same."""
        resized = f" {self.resizing.max_size} {self.resizing.quality}" if self.resizing else ""
        hasher = hashlib.sha256(f"{FORMAT} {VERSION}{resized}\n".encode())
        for index in rows:
            hasher.update(os.fsencode(self.names[index]) + b"\0")
            hasher.update(f"{self.labels[index]} {self.sizes[index]} {self.mtimes[index]}\n".encode())
        return hasher.hexdigest()


def plan_split(source_dir: Path, target_dir: Path, classes: list[str], shard_size: int,
               resizing: Resizing | None = None) -> SplitPlan:
    """List ``source_dir`` as training does, look at every file, and cut the samples into shards (by their sizes,
    or, where ``resizing`` stores them smaller, by an estimate from their headers)."""
    samples, links = walk_split(source_dir, classes)
    _report_links(links)
    sizes = np.full(len(samples), -1, dtype=np.int64)
    mtimes = np.zeros(len(samples), dtype=np.int64)
    problems = {}
    for index, (path, _) in enumerate(samples):
        try:
            info = os.stat(path)
        except OSError as error:
            problems[index] = f"{type(error).__name__}: {error}"
            continue
        if info.st_size > MAX_SIZE:
            problems[index] = f"larger than {MAX_SIZE:,} bytes, more than a packed set holds"
            continue
        sizes[index], mtimes[index] = info.st_size, info.st_mtime_ns
    paths = [path for path, _ in samples]
    names = relative_names(source_dir, paths)
    plan = SplitPlan(source_dir, target_dir, classes, paths, names,
                     np.array([label for _, label in samples], dtype=np.int64), sizes, mtimes, problems, links,
                     resizing=resizing)
    first, used = 0, 0
    for index in range(len(samples)):
        size = max(int(sizes[index]), 0)
        if resizing is not None and size:
            size = _estimated_size(paths[index], size, resizing)
        cost = sample_bytes(size, int(plan.labels[index]))
        if index > first and used + cost + _END > shard_size:
            plan.shards.append(range(first, index))
            first, used = index, 0
        used += cost
    if len(samples):
        plan.shards.append(range(first, len(samples)))
    return plan


def _estimated_size(path: str, size: int, resizing: Resizing) -> int:
    """About how many bytes the image at ``path`` (``size`` bytes) takes once stored: in proportion to its pixels
    where :class:`Resizing` shrinks it (its header read), else its size."""
    try:
        with open_image(path) as image:
            width, height = image.size
    except Exception:  # stored as it is
        return size
    target = resizing.target(width, height)
    return size if target is None else max(1, size * target[0] * target[1] // (width * height))


# ------------------------------------------------------------------------------------------------
# Writing
# ------------------------------------------------------------------------------------------------
READ_CHUNK = 32  # files a thread reads per task: a task per file would cost more than reading a small one


def _read_ahead(plan: SplitPlan, rows: range, pool: ThreadPoolExecutor, window: int) -> Iterator[bytes | str]:
    """What :func:`_read_source` gives for each sample of ``rows``, in order, read by ``pool`` in chunks of
    READ_CHUNK, at most ``window`` chunks ahead of the one handed out."""
    pending: deque[Future] = deque()
    for start in range(rows.start, rows.stop, READ_CHUNK):
        chunk = range(start, min(start + READ_CHUNK, rows.stop))
        pending.append(pool.submit(lambda part: [_read_source(plan, index) for index in part], chunk))
        if len(pending) >= window:
            yield from pending.popleft().result()
    while pending:
        yield from pending.popleft().result()


def _read_source(plan: SplitPlan, index: int) -> bytes | str:
    """The bytes of sample ``index``'s file, or why there are none."""
    if index in plan.problems:
        return plan.problems[index]
    try:
        data = read_bytes(plan.paths[index])
    except OSError as error:
        return f"{type(error).__name__}: {error}"
    if len(data) != plan.sizes[index]:
        raise UserError(f"{plan.paths[index]} changed while it was packed ({plan.sizes[index]} bytes when listed, "
                        f"{len(data)} when read); run the pack again")
    if plan.resizing is not None:
        smaller = plan.resizing.shrink(data)
        if smaller is not None:
            plan.resized.add(index)
            return smaller
    return data


def _write_durably(path: Path, chunks: Iterable[bytes]) -> str:
    """Write ``path`` under a temporary name (a file made here, never a link), sync it and rename it into place;
    its SHA-256."""
    temporary = path.with_name(f".{path.name}.tmp")
    hasher = hashlib.sha256()
    temporary.unlink(missing_ok=True)
    try:
        with os.fdopen(open_own(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL), "wb") as handle:
            for chunk in chunks:
                handle.write(chunk)
                hasher.update(chunk)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)
    return hasher.hexdigest()


@dataclass
class ShardRecord:
    """A finished shard: what the manifest lists, and what a later pack needs to keep it."""

    file: str
    first: int
    samples: int
    bytes: int
    sha256: str
    index_sha256: str
    sources: str
    unreadable: list[list] = field(default_factory=list)  # [sample, reason] of those packed without bytes

    def entry(self) -> dict:
        return {"file": self.file, "index": index_name(self.file), **{key: getattr(self, key) for key in (
            "samples", "bytes", "sha256", "first", "index_sha256", "sources", "unreadable")}}


def write_shard(plan: SplitPlan, number: int, pool: ThreadPoolExecutor, window: int, table: np.ndarray,
                advance: Callable[[int], None]) -> ShardRecord:
    """Write shard ``number`` and its index, filling its rows of ``table``."""
    rows = plan.shards[number]
    lines = [f"v1.2 {len(rows)}\n"]
    unreadable: list[list] = []
    offset = 0

    def chunks() -> Iterator[bytes]:
        nonlocal offset
        for index, data in zip(rows, _read_ahead(plan, rows, pool, window)):
            if isinstance(data, str):
                unreadable.append([index, data])
                data = b""
            key, extension, label = sample_key(index), plan.extension(index), int(plan.labels[index])
            members = ((f"{key}.{extension}", data), (f"{key}.cls", _cls_text(label)))
            parts, pieces = [], []
            for member, content in members:
                parts.append((member.rsplit(".", 1)[1], offset + BLOCK, len(content), member))
                pieces += [_header(member, len(content)), content, bytes(_padded(len(content)) - len(content))]
                offset += BLOCK + _padded(len(content))
            yield b"".join(pieces)
            table[index] = (parts[0][1] // BLOCK, parts[0][2], label)
            lines.append(" ".join(f"{ext} {start} {size} {member}" for ext, start, size, member in parts) + "\n")
            advance(1)
        end = offset + _END
        end += -end % tarfile.RECORDSIZE
        yield bytes(end - offset)
        offset = end

    file = shard_name(number)
    digest = _write_durably(plan.target_dir / file, chunks())
    index_digest = _write_durably(plan.target_dir / index_name(file), [line.encode() for line in lines])
    return ShardRecord(file, rows.start, len(rows), offset, digest, index_digest, plan.sources(rows), unreadable)


def kept_shard(plan: SplitPlan, number: int, record: dict | None, table: np.ndarray) -> ShardRecord | None:
    """The record of shard ``number`` when the file on disk is the one this plan would write (packed from
    the same sources, its size and its index's hash as recorded), its rows of ``table`` filled from its
    index; None when it must be written."""
    rows = plan.shards[number]
    file = shard_name(number)
    try:
        kept = ShardRecord(**{key: record[key] for key in ShardRecord.__dataclass_fields__})
        if kept.file != file or kept.first != rows.start or kept.samples != len(rows) \
                or kept.sources != plan.sources(rows) or os.lstat(plan.target_dir / file).st_size != kept.bytes:
            return None
        index = read_regular(plan.target_dir / index_name(file), _INDEX_LINE_BYTES * (len(rows) + 1))
        if hashlib.sha256(index).hexdigest() != kept.index_sha256:
            return None
        lines = index.decode().splitlines()
        if lines[0] != f"v1.2 {len(rows)}" or len(lines) != len(rows) + 1:
            return None
        for index_row, line in zip(rows, lines[1:]):
            _, start, size = line.split(" ", 3)[:3]
            table[index_row] = (int(start) // BLOCK, int(size), int(plan.labels[index_row]))
    except (TypeError, KeyError, ValueError, OSError):
        return None
    return kept


def _known_records(split_dir: Path) -> dict[str, dict]:
    """The finished shards a previous pack recorded: in its manifest, then in its progress file."""
    records: dict[str, dict] = {}
    try:
        manifest = read_json(split_dir / MANIFEST, MAX_MANIFEST_BYTES)
        records.update({shard["file"]: shard for shard in manifest["shards"]})
    except (DataFileError, KeyError, TypeError):
        pass
    try:
        lines = read_regular(split_dir / PROGRESS, MAX_MANIFEST_BYTES).splitlines()
    except DataFileError:
        lines = []
    for line in lines:
        try:
            record = parse_json(line, MAX_MANIFEST_BYTES)
            records[record["file"]] = record
        except (DataFileError, KeyError, TypeError):
            continue  # a line cut short by a kill
    return records


def _append_progress(split_dir: Path, record: ShardRecord) -> None:
    with os.fdopen(open_own(split_dir / PROGRESS, os.O_WRONLY | os.O_APPEND | os.O_CREAT), "w", encoding="utf-8") \
            as handle:
        handle.write(json.dumps(record.entry()) + "\n")
        handle.flush()
        os.fsync(handle.fileno())


def pack_split(plan: SplitPlan, workers: int, progress) -> dict:
    """Write (or keep) every shard of ``plan``, then the table, the names and the manifest; returns the
    manifest, with the number of shards written under ``written`` (not in the file)."""
    split_dir = plan.target_dir
    records = _known_records(split_dir)
    table = np.zeros(len(plan.paths), dtype=TABLE_DTYPE)
    done: list[ShardRecord | None] = [kept_shard(plan, number, records.get(shard_name(number)), table)
                                      for number in range(len(plan.shards))]
    written = sum(record is None for record in done)
    names = names_blob(plan.names)
    if written and (split_dir / MANIFEST).exists():
        for record in done:  # what the manifest knew, kept for a pack killed before it writes the next one
            if record is not None:
                _append_progress(split_dir, record)
        (split_dir / MANIFEST).unlink()  # the set is not complete until the new manifest is written
    with ThreadPoolExecutor(max_workers=workers) as pool:
        for number, record in enumerate(done):
            if record is None:
                done[number] = write_shard(plan, number, pool, 2 * workers, table, progress.update)
                _append_progress(split_dir, done[number])
            else:
                progress.update(len(plan.shards[number]))
    for entry in os.listdir(split_dir):  # shards of an earlier, longer pack
        match = SHARD.fullmatch(entry.replace(".idx", ".tar"))
        if match and int(match[1]) >= len(plan.shards):
            (split_dir / entry).unlink()
    table_bytes = _npy_bytes(table)
    manifest = {
        "format": FORMAT, "version": VERSION, "split": split_dir.name, "classes": plan.classes,
        "samples": len(plan.paths),
        "table": {"file": TABLE, "sha256": hashlib.sha256(table_bytes).hexdigest()},
        "names": {"file": NAMES, "sha256": hashlib.sha256(names).hexdigest()},
        "shards": [record.entry() for record in done],
        "unreadable": sorted(item for record in done for item in record.unreadable),
        "links_not_followed": plan.links,
        **(plan.resizing.record() if plan.resizing is not None else {}),
    }
    text = json.dumps(manifest, indent=1, ensure_ascii=True).encode() + b"\n"
    files = {TABLE: table_bytes, NAMES: names, MANIFEST: text}
    if written or any(_read_bytes(split_dir / name, content) != content for name, content in files.items()):
        (split_dir / MANIFEST).unlink(missing_ok=True)
        for name, content in files.items():  # the manifest last
            _write_durably(split_dir / name, [content])
    (split_dir / PROGRESS).unlink(missing_ok=True)
    return {**manifest, "written": written}


def _read_bytes(path: Path, expected: bytes) -> bytes | None:
    """The bytes of the pack's file at ``path`` where they can be compared with ``expected``, else None."""
    try:
        return read_regular(path, len(expected))
    except DataFileError:
        return None


def _npy_bytes(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


# ------------------------------------------------------------------------------------------------
# The command
# ------------------------------------------------------------------------------------------------
KEPT = "the shards finished are kept: run the same command again to finish"  # what an interrupted pack leaves


@contextlib.contextmanager
def _writing(destination: Path, outcome: str) -> Iterator[None]:
    """A write into DST that fails is one line (``outcome`` after it): exit 2 where DST is read-only, 4 where its
    disk is full (:func:`~image_classification.errors.write_failure`)."""
    try:
        yield
    except OSError as error:
        raise write_failure(f"DST {destination}", error, outcome) from None


def pack(source: Path, destination: Path, shard_size: int = DEFAULT_SHARD_SIZE, workers: int = 8,
         resizing: Resizing | None = None) -> int:
    """Pack every split of ``source`` into ``destination`` (its larger images stored smaller where ``resizing``
    says); the number of images packed."""
    if not source.is_dir():
        raise UserError(f"SRC {source} does not exist")
    if is_packed(source):
        raise UserError(f"SRC {source} is a packed set already; give the ImageFolder it was packed from")
    splits = [split for split in SPLITS if (source / split).is_dir()]
    if not splits:
        raise UserError(f"SRC {source} has neither train/ nor val/; expected train/<class>/<image> files")
    classes = check_dataset(str(source), None, want_train="train" in splits, want_val="val" in splits)
    with _writing(destination, "nothing was written"):
        prepare_destination(source, destination, splits)
    started, total = time.perf_counter(), 0
    with PackLock(destination):
        with _writing(destination, KEPT):
            remove_temporaries(destination, splits)
        plans = [plan_split(source / split, destination / split, classes, shard_size, resizing) for split in splits]
        from tqdm import tqdm

        for split, plan in zip(splits, plans):
            with tqdm(total=len(plan.paths), unit="img", desc=f"{split}/", file=sys.stderr,
                      disable=not sys.stderr.isatty(), dynamic_ncols=True) as progress, _writing(destination, KEPT):
                manifest = pack_split(plan, workers, progress)
            for index, reason in manifest["unreadable"]:
                print(f"warning: {plan.paths[index]} cannot be read ({reason}); packed as an unreadable image",
                      file=sys.stderr, flush=True)
            written, size = manifest["written"], sum(shard["bytes"] for shard in manifest["shards"])
            resized = f"; {len(plan.resized):,} of the images written resized to {resizing.max_size} px" \
                if resizing is not None and written else ""
            print(f"{printable(destination / split)}: {len(classes)} classes, {len(plan.paths):,} images in "
                  f"{len(plan.shards)} shard(s), {size / 1e6:,.1f} MB ({written} written, {len(plan.shards) - written} kept)"
                  f"{resized}", flush=True)
            total += len(plan.paths)
    elapsed = time.perf_counter() - started
    print(f"packed {total:,} images in {elapsed:.1f} s ({total / max(elapsed, 1e-9):,.0f} images/s)", flush=True)
    return total


def main(argv: list[str] | None = None, *, prog: str = "python -m image_classification.data.pack") -> int:
    """The command's entry (``prog``: its name in usage lines); returns the exit code."""
    return pack_command(pack_parser(prog).parse_args(argv))


def pack_command(args: argparse.Namespace) -> int:
    """The command, its arguments parsed by :func:`arguments.tools.pack_parser`; returns the exit code."""
    with stop_raises(f"packing {args.destination}", KEPT):
        pack(Path(args.source), Path(args.destination), parse_size(args.shard_size), args.workers,
             resizing(args.max_size, args.quality))
    return 0


if __name__ == "__main__":
    sys.exit(run(main, sys.argv[1:]))
