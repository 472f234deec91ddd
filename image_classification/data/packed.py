"""Packed datasets: an ImageFolder's images in WebDataset tar shards, read the toolkit's own way.

``python -m image_classification.data.pack SRC DST`` (:mod:`.pack`) writes, for each split of SRC, a folder
``DST/<split>/`` holding:

* ``shard-NNNNNN.tar``: WebDataset shards, POSIX ustar with fixed headers (mode 0644, owner 0, time 0).
  Sample ``i`` of the split is two members, ``KKKKKKKKK.<ext>`` (the image file's bytes, unchanged, under
  its own extension in lower case) and ``KKKKKKKKK.cls`` (its label as decimal text), ``KKKKKKKKK`` being
  ``i`` in nine digits.  Samples follow the folder's order (:func:`.layout.list_samples`), so the samplers
  number them as they number the folder's files, and the same seed trains on the same images in the same
  order and crops.
* ``shard-NNNNNN.idx``: the shard's index in the format of DALI's ``wds2idx`` (v1.2), for
  ``fn.readers.webdataset``.
* ``samples.npy``: the sample table, 12 bytes a sample: where its image starts in its shard (in 512-byte
  blocks), its size and its label; the manifest's shard counts say which shard holds it.
* ``names.bin``: each sample's path relative to the split folder, NUL-terminated, for messages.
* ``manifest.json``, written last: classes, shards (samples, bytes, SHA-256), the SHA-256 of the table and
  of the names, the samples that could not be read when packing, the links not followed; for a pack with
  ``--max-size``, that size and the ``--quality`` of the images it resized (their members are then ``.jpg``).

A split is opened by its manifest, read within :mod:`..records.datafile`'s bounds (size, nesting, numbers).  What is
checked before a run starts (cheap even for 14 M samples): the format version, every file a plain name of the
split folder and a regular file (not a link, not a FIFO, which would wait for a writer), every shard's size, the
table's SHA-256, that every sample lies inside its shard and that the first and last sample of each shard
have their own tar headers.  Every read takes the sample's header with its bytes and refuses a header that
is not the sample's.  Shard hashes are read in full by ``data.check`` only.  The shards stay open for the run (a worker process reads with ``os.pread`` on the
descriptors it inherits): a file open per shard, not per image.
"""

from __future__ import annotations

import hashlib
import os
import re
import sys
from pathlib import Path

import numpy as np

from ..errors import UserError
from ..records.datafile import DataFileError, open_regular, read_json
from .files import SPLITS, UNDECODABLE_ADVICE, WITHOUT_SPLIT, decode_problem, label_problem, printable

FORMAT = "image-classification packed split"
VERSION = 1
MANIFEST = "manifest.json"
TABLE = "samples.npy"
NAMES = "names.bin"
BLOCK = 512  # tar's block: every member's data starts at a multiple of it
TABLE_DTYPE = np.dtype([("block", "<u4"), ("size", "<u4"), ("label", "<i4")])
SHARD = re.compile(r"shard-(\d{6})\.tar")
PROGRESS = ".pack-progress.jsonl"  # a pack's shards finished so far, until the manifest holds them
TEMPORARY = re.compile(r"\.(shard-\d{6}\.(tar|idx)|samples\.npy|names\.bin|manifest\.json)\.tmp")  # being written
# Far more than a manifest takes (ImageNet's in 1 GB shards: about 0.5 MB; each unreadable sample and link not
# followed adds its name), far less than what would exhaust memory once parsed.
MAX_MANIFEST_BYTES = 256 << 20
_SHA256 = re.compile(r"[0-9a-f]{64}")
_SPARE_FILES = 256  # descriptors left for everything else when the shards' are counted


def names_blob(names: list[str]) -> bytes:
    """``names.bin``: each sample's path relative to its split, NUL-terminated, in the bytes ``os.fsencode`` gives
    (encoded in one call: 0.15 s for ImageNet's 1.28 M names, a quarter of a call per name)."""
    text = "\0".join(names) + "\0" if names else ""
    return text.encode(sys.getfilesystemencoding(), sys.getfilesystemencodeerrors())


def fingerprint(images: int, names_sha256: str) -> dict:
    """What a checkpoint records of the training images, to tell a resume that they changed: their count and the
    SHA-256 of their names in order (``names.bin``'s: the same for a folder and its packed copy; a name holds its
    class folder, so the labels are in it too)."""
    return {"images": images, "names_sha256": names_sha256}


def shard_name(number: int) -> str:
    return f"shard-{number:06d}.tar"


def index_name(shard: str) -> str:
    """The DALI index beside a shard: ``NAME.idx`` for ``NAME.tar``."""
    return shard[: -len(".tar")] + ".idx"


def sample_key(index: int) -> str:
    return f"{index:09d}"


def is_packed(root: Path) -> bool:
    """Whether ``root`` is a packed set: a split folder of it holds a manifest."""
    return any(os.path.lexists(root / split / MANIFEST) for split in SPLITS)


def written_by_pack(name: str) -> bool:
    """Whether a pack writes a file of this name into a split folder (finished, or being written)."""
    return name in (MANIFEST, TABLE, NAMES, PROGRESS) or bool(TEMPORARY.fullmatch(name)) \
        or bool(SHARD.fullmatch(name.replace(".idx", ".tar")))


def unfinished_pack(split_dir: Path) -> bool:
    """Whether ``split_dir`` holds what a pack writes but no manifest: a pack that was stopped or killed."""
    try:
        names = os.listdir(split_dir)
    except OSError:
        return False
    return MANIFEST not in names and any(written_by_pack(name) for name in names)


def _unusable(path: Path, error: DataFileError) -> UserError:
    """The one line for a packed set's file that cannot be read as the file its pack wrote."""
    if os.path.islink(path):
        return UserError(f"{path} is a symbolic link; a packed set's files must be its own: pack it again into the "
                         "place it is read from")
    return UserError(f"{path} {error}; pack the dataset again")


def open_plain(directory: Path, name: str) -> int:
    """A read-only descriptor of ``directory/name``, a regular file that is not a link (so a manifest cannot
    send the reader outside the split folder) nor a FIFO (which would wait for a writer); UserError otherwise."""
    path = directory / name
    try:
        return open_regular(path)
    except DataFileError as error:
        raise _unusable(path, error) from None


def read_manifest(split_dir: Path) -> dict:
    """The manifest of a packed split, its every field checked; UserError for one that is damaged (or no JSON
    within :mod:`..records.datafile`'s bounds), of another format version or that names a file outside the split
    folder."""
    path = split_dir / MANIFEST
    try:
        manifest = read_json(path, MAX_MANIFEST_BYTES)
    except DataFileError as error:
        raise _unusable(path, error) from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise UserError(f"{path} is not the manifest of a set packed by image_classification.data.pack")
    if manifest.get("version") != VERSION:
        raise UserError(f"{path} is of pack format {manifest.get('version')!r}; this version reads format "
                        f"{VERSION}: pack the dataset again with this version")
    problem = _manifest_problem(manifest)
    if problem is not None:
        raise UserError(f"{path} is damaged ({problem}); pack the dataset again")
    return manifest


def _is_count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _manifest_problem(manifest: dict) -> str | None:
    """What is wrong with a manifest of the right format and version, or None."""
    classes, shards = manifest.get("classes"), manifest.get("shards")
    if not isinstance(classes, list) or not all(isinstance(name, str) for name in classes):
        return "its classes are not a list of names"
    if not _is_count(manifest.get("samples")) or not isinstance(shards, list):
        return "no sample count or shard list"
    for key, name in (("table", TABLE), ("names", NAMES)):
        entry = manifest.get(key)
        if not isinstance(entry, dict) or entry.get("file") != name \
                or not _SHA256.fullmatch(str(entry.get("sha256"))):
            return f"its {key} entry is not {name} with a SHA-256"
    for number, shard in enumerate(shards):
        if not isinstance(shard, dict) or shard.get("file") != shard_name(number) \
                or shard.get("index") != index_name(shard_name(number)):
            return f"shard entry {number} is not {shard_name(number)}"
        if not (_is_count(shard.get("samples")) and _is_count(shard.get("bytes"))) \
                or not _SHA256.fullmatch(str(shard.get("sha256"))):
            return f"{shard_name(number)} has no sample count, size or SHA-256"
    if sum(shard["samples"] for shard in shards) != manifest["samples"]:
        return "its shards' sample counts do not add up to its sample count"
    unreadable = manifest.get("unreadable", [])
    if not isinstance(unreadable, list) or not all(
            isinstance(item, list) and len(item) == 2 and _is_count(item[0]) and item[0] < manifest["samples"]
            and isinstance(item[1], str) for item in unreadable):
        return "its list of unreadable samples is malformed"
    links = manifest.get("links_not_followed", [])
    if not isinstance(links, list) or not all(isinstance(item, str) for item in links):
        return "its list of links not followed is malformed"
    if "max_size" in manifest or "quality" in manifest:
        size, quality = manifest.get("max_size"), manifest.get("quality")
        if not (_is_count(size) and size > 0 and _is_count(quality) and 1 <= quality <= 100):
            return "its --max-size or --quality is not a positive size and a quality of 1 to 100"
    return None


def check_packed(root: Path, num_classes: int | None, *, want_train: bool, want_val: bool) -> list[str]:
    """The packed set's counterpart of :func:`.layout.check_dataset`: its manifests checked, the class names
    returned."""
    splits = [split for split, wanted in (("train", want_train), ("val", want_val)) if wanted]
    found: dict[str, list[str]] = {}
    for split in splits:
        if not os.path.lexists(root / split / MANIFEST):
            packed = next(other for other in SPLITS if os.path.lexists(root / other / MANIFEST))
            raise UserError(f"{root} is a packed set ({packed}/{MANIFEST}) but {split}/ has no {MANIFEST}: its pack "
                            f"did not finish, or the source had no such split; run the pack again "
                            f"({WITHOUT_SPLIT[split]})")
        manifest = read_manifest(root / split)
        if not manifest["classes"]:
            raise UserError(f"{root / split / MANIFEST} lists no classes; pack the dataset again")
        unusable = [name for name in manifest["classes"] if label_problem(name) is not None]
        if unusable:
            raise UserError(f"{root / split / MANIFEST} lists the class {printable(unusable[0])}, whose name "
                            f"{label_problem(unusable[0])}; {UNDECODABLE_ADVICE}, and pack the dataset again")
        found[split] = manifest["classes"]
    if len(found) == 2 and found["train"] != found["val"]:
        raise UserError(f"the manifests of {root}/train and {root}/val list different classes; pack the dataset "
                        "again")
    classes = next(iter(found.values()))
    if num_classes is not None and len(classes) > num_classes:
        raise UserError(f"the dataset has {len(classes)} classes but --num-classes is {num_classes}; "
                        f"pass --num-classes {len(classes)}")
    return classes


def open_packed_split(split_dir: Path, classes: list[str]) -> PackedSplit:
    """The packed split at ``split_dir``, opened and checked (see the module's docstring)."""
    manifest = read_manifest(split_dir)
    if manifest["classes"] != classes:
        raise UserError(f"{split_dir / MANIFEST} changed since the run checked it (its classes differ)")
    return PackedSplit(split_dir, manifest)


def _raise_open_file_limit(needed: int) -> None:
    """Let this process hold ``needed`` more descriptors (the soft limit raised up to the hard one)."""
    try:
        import resource
    except ImportError:
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = needed + _SPARE_FILES
    if soft == resource.RLIM_INFINITY or soft >= wanted:
        return
    ceiling = wanted if hard == resource.RLIM_INFINITY else min(hard, wanted)
    resource.setrlimit(resource.RLIMIT_NOFILE, (ceiling, hard))
    if ceiling < wanted:
        raise UserError(f"{needed} shards stay open during a run, more than this system lets a process hold "
                        f"({hard} files); raise `ulimit -n` or pack with a larger --shard-size")


def read_table(directory: Path, count: int, sha256: str) -> np.ndarray:
    """The sample table, read straight into its array (no second copy), its SHA-256 and shape checked."""
    path = directory / TABLE
    with os.fdopen(open_plain(directory, TABLE), "rb") as handle:
        try:
            version = np.lib.format.read_magic(handle)
            read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else \
                np.lib.format.read_array_header_2_0
            shape, fortran, dtype = read_header(handle)
        except (ValueError, OSError, SyntaxError) as error:
            raise UserError(f"{path} is not a sample table ({error}); pack the dataset again") from None
        header = handle.tell()
        if dtype != TABLE_DTYPE or shape != (count,) or fortran:
            raise UserError(f"{path} holds {shape} {dtype}, not the {count} samples of its manifest; pack the "
                            "dataset again")
        table = np.empty(count, dtype=TABLE_DTYPE)
        hasher = hashlib.sha256()
        handle.seek(0)
        hasher.update(handle.read(header))
        view = table.view(np.uint8)
        if handle.readinto(view) != view.nbytes or handle.read(1):
            raise UserError(f"{path} is not {header + view.nbytes} bytes long; pack the dataset again")
        hasher.update(view)
    if hasher.hexdigest() != sha256:
        raise UserError(f"{path} does not match its manifest's SHA-256 (damaged, or from another pack); pack the "
                        "dataset again")
    return table


class PackedSplit:
    """A split read from its shards (the :class:`.layout.Split` every backend reads): sample ``i``'s bytes are
    one ``os.pread`` on its shard, which stays open."""

    def __init__(self, split_dir: Path, manifest: dict):
        self.directory = split_dir
        shards = manifest["shards"]
        self.shard_files = [split_dir / shard["file"] for shard in shards]
        self.shard_bytes = [shard["bytes"] for shard in shards]
        self.starts = shard_starts(manifest)
        table = read_table(split_dir, manifest["samples"], manifest["table"]["sha256"])
        self.blocks, self.sizes, self.labels = table["block"], table["size"], table["label"]
        self._check_table(len(manifest["classes"]))
        # the samples that could not be read when packing: known unreadable before any read
        self.known_unreadable = {index: reason for index, reason in manifest.get("unreadable", [])}
        _raise_open_file_limit(len(shards))
        self._identity: list[tuple[int, int]] = []
        self._descriptors: list[int] | None = None
        self._open_shards()
        self.names = SampleNames(split_dir, manifest)
        self.max_size: int | None = manifest.get("max_size")  # --max-size: the images' longest side at most

    def _check_table(self, classes: int) -> None:
        labels = self.labels
        if len(labels) and (labels.min() < 0 or labels.max() >= classes):
            raise UserError(f"{self.directory / TABLE} holds labels outside its {classes} classes; pack the dataset "
                            "again")
        for number, (first, end) in enumerate(zip(self.starts[:-1], self.starts[1:])):
            ends = self.blocks[first:end].astype(np.int64) * BLOCK + self.sizes[first:end]
            if len(ends) and int(ends.max()) > self.shard_bytes[number]:
                raise UserError(f"{self.directory / TABLE} places samples past the end of "
                                f"{self.shard_files[number].name}; pack the dataset again")

    def _open_shards(self) -> None:
        """Open every shard, checking its size against the manifest (and, after a pickle, that it is the
        same file the run checked)."""
        descriptors = []
        try:
            for number, path in enumerate(self.shard_files):
                descriptor = open_plain(self.directory, path.name)
                descriptors.append(descriptor)
                info = os.fstat(descriptor)
                if info.st_size != self.shard_bytes[number]:
                    raise UserError(f"{path} is {info.st_size:,} bytes, its manifest says "
                                    f"{self.shard_bytes[number]:,}: the shard was changed or damaged since it was "
                                    "packed (python -m image_classification.data.check names every damaged shard); "
                                    "pack the dataset again")
                checked = len(self._identity) == len(self.shard_files)
                if checked and self._identity[number] != (info.st_dev, info.st_ino):
                    raise UserError(f"{path} was replaced since the run started")
                if len(self._identity) < len(self.shard_files):
                    self._identity.append((info.st_dev, info.st_ino))
                self._check_ends(number, descriptor)
        except BaseException:
            for descriptor in descriptors:
                os.close(descriptor)
            raise
        self._descriptors = descriptors

    def _check_ends(self, number: int, descriptor: int) -> None:
        """The first and the last sample of shard ``number`` are where the table places them, with the sizes it
        records: a shard swapped with another of the same size, or written by a pack of other files, is refused
        before the run starts (where a re-pack changed neither sample's place nor size, the shard hashes of
        ``data.check`` tell it apart)."""
        first, end = int(self.starts[number]), int(self.starts[number + 1])
        try:
            for index in sorted({first, end - 1} - set(self.known_unreadable)) if end > first else []:
                self._read_member(descriptor, number, index)
        except OSError as error:
            raise UserError(f"{error}; pack the dataset again") from None

    def __getstate__(self) -> dict:
        """Pickled (a worker process started by spawn): the descriptors are reopened there, checked to be
        the files this process checked."""
        state = dict(self.__dict__)
        state["_descriptors"] = None
        return state

    def __len__(self) -> int:
        return len(self.labels)

    def shard_of(self, index: int) -> int:
        return int(np.searchsorted(self.starts, index, side="right")) - 1

    def label(self, index: int) -> int:
        return int(self.labels[index])

    def read(self, index: int) -> bytes:
        """The image file's bytes of sample ``index``; OSError when it cannot be had."""
        reason = self.known_unreadable.get(index)
        if reason is not None:
            raise OSError(f"unreadable when it was packed: {reason}")
        if self._descriptors is None:
            self._open_shards()
        shard = self.shard_of(index)
        return self._read_member(self._descriptors[shard], shard, index)[BLOCK:]

    def _read_member(self, descriptor: int, shard: int, index: int) -> bytes:
        """Sample ``index``'s image member, its tar header first, in one read from shard ``shard`` (open as
        ``descriptor``); OSError where the header is not the sample's (a shard changed since it was packed) or
        the shard ends first."""
        size, offset = int(self.sizes[index]) + BLOCK, int(self.blocks[index]) * BLOCK - BLOCK
        data = os.pread(descriptor, size, offset)
        while len(data) < size:
            more = os.pread(descriptor, size - len(data), offset + len(data))
            if not more:
                raise OSError(f"{self.shard_files[shard]} ends inside sample {index}: it was cut short after the "
                              "run started")
            data += more
        # the header names the sample and records the table's size (ustar's octal field, as tarfile writes it
        # at the pack): a shard of a re-pack, or an entry moved onto another member, is told apart
        if not (data.startswith(f"{sample_key(index)}.".encode())
                and data[124:136] == b"%011o\0" % (size - BLOCK)):
            raise OSError(f"{self.shard_files[shard]} does not hold sample {index} where its table places it: the "
                          "shard was changed since it was packed")
        return data

    def fingerprint(self) -> dict:
        """Which images the split holds (see :func:`fingerprint`): those of the folder it was packed from, and the
        ``--max-size`` they were stored at where the pack resized them."""
        found = fingerprint(len(self), self.names.sha256)
        return found if self.max_size is None else {**found, "max_size": self.max_size}

    def problem(self, index: int) -> str | None:
        """Why sample ``index`` cannot be read or decoded, or None."""
        try:
            raw = self.read(index)
        except OSError as error:
            return f"{type(error).__name__}: {error}"
        return decode_problem(raw)

    def name(self, index: int) -> str:
        """Sample ``index`` for messages: its name in the folder and the shard holding it."""
        return f"{self.names(index)} in {self.shard_files[self.shard_of(index)]}"


def shard_starts(manifest: dict) -> np.ndarray:
    """The first sample of every shard, and the sample count last: shard ``k`` holds ``starts[k]:starts[k+1]``."""
    counts = [shard["samples"] for shard in manifest["shards"]]
    return np.concatenate([[0], np.cumsum(counts, dtype=np.int64)]).astype(np.int64)


class SampleNames:
    """Each sample's path in the folder it was packed from, relative to the split, for messages: read from
    ``names.bin`` when first asked (they are not needed to train), ``sample N`` where that file is damaged."""

    def __init__(self, directory: Path, manifest: dict):
        self.directory, self.sha256, self.count = directory, manifest["names"]["sha256"], manifest["samples"]
        self._names: tuple[bytes, np.ndarray] | None = None

    def __call__(self, index: int) -> str:
        if self._names is None:
            try:
                with os.fdopen(open_plain(self.directory, NAMES), "rb") as handle:
                    blob = handle.read()
            except UserError:
                blob = b""
            if hashlib.sha256(blob).hexdigest() != self.sha256:
                blob = b""
            ends = np.flatnonzero(np.frombuffer(blob, dtype=np.uint8) == 0)
            self._names = (blob, ends if len(ends) == self.count else np.empty(0, dtype=np.int64))
        blob, ends = self._names
        if not len(ends):
            return f"sample {index}"  # the number still finds the sample
        start = int(ends[index - 1]) + 1 if index else 0
        return os.fsdecode(blob[start:int(ends[index])])
