"""Finding and opening image files, the same way for every backend and for classify.py.

A class folder is walked following symbolic links (datasets are often assembled from links), but a link
never makes an image count twice or under another class: a directory already walked, one that holds
the class folder (``ln -s .. train/a/loop``) or one inside another class folder is not entered, and is
reported instead.  Images are opened as 8-bit RGB; 16-bit greyscale (PNG ``I;16``) is scaled, not
clipped.  One size rule holds everywhere (every backend, ``data.check``, classify.py; :mod:`..models.image_size`):
an image whose header declares more than ``MAX_IMAGE_PIXELS`` pixels is unreadable, before any of it is decoded.
A JPEG's header is walked as libjpeg walks it, so the size checked is the size decoded; one in which libjpeg would
find no frame header is unreadable under the same rule.  Where an image is resized whole (validation,
``--evaluate``, classify.py: its short side to the resize size, its long side in proportion), the rule also
holds for the resized image, found from the same header: a 200,000 x 1 strip keeps to the rule itself, but
would make 13 gigapixels at a 256 px short side.  Training crops before it resizes, so it needs no more.  An
image is turned by its EXIF orientation as it is decoded (:mod:`.orientation`), unless the caller says not to.
"""

from __future__ import annotations

import io
import os
import re
import stat
import struct
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import numpy as np
from PIL import Image, UnidentifiedImageError

from ..errors import UserError
from ..models.image_size import ImageTooLarge, check_size
from ..records.datafile import NotARegularFile, open_descriptor
from .orientation import image_orientation, jpeg_orientation, turn_image, turn_tensor

if TYPE_CHECKING:
    import torch

# the image files torchvision's ImageFolder takes (torchvision.datasets.folder.IMG_EXTENSIONS, the same
# from torchvision 0.18 to 0.29; tests/test_data_files.py compares them), written out so that the modules
# that only walk and check folders (data.pack, data.check) answer without importing torch
IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")

SPLITS = ("train", "val")  # a dataset's split folders, beside each other
# the flag that runs without a split, said where the split is found missing
WITHOUT_SPLIT = {"train": "--evaluate validates without one", "val": "--training-only trains without one"}

# PIL modes of 16-bit greyscale images (a PNG may open as "I" in older Pillow releases)
_SIXTEEN_BIT_MODES = {"I;16", "I;16L", "I;16B", "I;16N", "I"}


def is_image_file(name: str) -> bool:
    return name.lower().endswith(IMG_EXTENSIONS)


# control characters (Unicode's Cc: C0, DEL, C1) and the line and paragraph separators, which split a line too
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def _escaped(match: re.Match) -> str:
    return f"\\x{ord(match.group()):02x}" if ord(match.group()) < 0x100 else f"\\u{ord(match.group()):04x}"


def printable(path: str | os.PathLike) -> str:
    """``path`` as a message prints it, whatever its name: a byte that is not UTF-8 as ``\\xNN`` (as ``ls -b``
    shows it) and a control character or a line separator too, so that no stdout refuses the line and no name
    splits it."""
    text = os.fspath(path)
    try:
        raw = os.fsencode(text)
    except UnicodeEncodeError:  # a lone surrogate that stands for no byte (from a JSON escape)
        raw = text.encode("utf-8", "backslashreplace")
    return _CONTROL.sub(_escaped, raw.decode("utf-8", "backslashreplace"))


# why a class folder's name must be a line of text, and what to do: the names are the labels a checkpoint, a raport,
# classify.py's output and Triton's label file (one a line) record, as text
UNDECODABLE_ADVICE = ("rename the class folder to UTF-8 text without control characters (its name is a label that "
                      "checkpoints, raports, classify.py's output and Triton's labels record as a line of text; "
                      "`convmv` renames from another encoding)")
LABEL_PROBLEMS = "cannot be labels (not UTF-8 text, or a line break or another control character in them)"


def label_problem(name: str) -> str | None:
    """Why a class folder's name cannot be a label, the end of a sentence "has a name that ...": "is not UTF-8
    text", "holds a line break or another control character"; None when it can be one."""
    if not is_utf8(name):
        return "is not UTF-8 text"
    if _CONTROL.search(name):
        return "holds a line break or another control character"
    return None


def refuse_labels(names: list[str], where) -> None:
    """Raise a :class:`UserError` naming (escaped) the class folders of ``names`` whose names cannot be labels,
    ``where(name)`` giving each one's path; nothing when every name can be."""
    bad = [name for name in names if label_problem(name) is not None]
    if not bad:
        return
    problems = {label_problem(name) for name in bad}
    problem = problems.pop() if len(problems) == 1 else "is not UTF-8 text or holds a control character"
    shown = ", ".join(printable(where(name)) for name in bad[:5])
    if len(bad) > 5:
        shown += f" and {len(bad) - 5} more"
    if len(bad) == 1:
        raise UserError(f"class folder {shown} has a name that {problem}; {UNDECODABLE_ADVICE}")
    plural = problem.replace("is not", "are not").replace("holds", "hold")
    raise UserError(f"class folders {shown} have names that {plural}; {UNDECODABLE_ADVICE}")


def is_utf8(name: str) -> bool:
    """Whether a file name, as Python lists it, is UTF-8 text (a byte that is not is listed as a lone surrogate,
    which a checkpoint, a raport or a label file cannot hold as text)."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


@dataclass
class ClassWalk:
    """The image files of one class folder, in a stable order, and the links that were not followed."""

    files: list[str] = field(default_factory=list)
    # "path: why" for each link not followed, and each entry named like an image that is not a regular file
    skipped_links: list[str] = field(default_factory=list)


@dataclass
class SplitWalk:
    """What the walks of one split's class folders share: every folder walked and image counted so far."""

    folders: set[tuple[int, int]] = field(default_factory=set)
    images: dict[tuple[int, int], str] = field(default_factory=dict)  # (device, inode): the name counted


# why an entry is left out that is another name (a hard link) of an image file already counted
HARD_LINK = "a hard link to an image already counted under another name"


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder + os.sep)


def _link_refusal(real: str, root: str, split_root: str | None, other_splits: list[str]) -> str | None:
    """Why a link to ``real`` is not followed from the class folder ``root`` of the split ``split_root`` (whose
    sibling splits are ``other_splits``), or None."""
    if _inside(root, real) and root != real:
        return f"links back to {real}, which holds the class folder (a loop)"
    if split_root is not None and _inside(real, split_root) and not _inside(real, root):
        return f"links into another class folder ({real})"
    if any(_inside(real, other) for other in other_splits):
        return f"links into another split of the dataset ({real})"
    return None


def walk_class(class_dir: Path, split_dir: Path | None = None, shared: SplitWalk | None = None) -> ClassWalk:
    """Image files under ``class_dir`` (depth first, names sorted), each counted once, where it really lives;
    an entry named like an image that is not a regular file (a FIFO, a socket, a device) is left out and
    reported, since reading it would wait for good or never end.

    A link, to a folder or to a file, is followed unless its target lies in another class folder or in
    another split of the dataset (``split_dir``'s siblings), or was already counted: walked by this split
    (``shared``, across its classes) or by this class.  A hard link (another name of a file already counted,
    as ``cp -al`` and deduplicating tools make them) is left out too: the file counts under the name walked
    first.  Each entry left out is reported, so no image is counted twice or under a label that is not its
    own, and validation never leaks into training.
    """
    walk = ClassWalk()
    root = os.path.realpath(class_dir)
    split_root = os.path.realpath(split_dir) if split_dir is not None else None
    siblings = [] if split_root is None else \
        [os.path.realpath(os.path.join(os.path.dirname(split_root), name)) for name in SPLITS]
    other_splits = [sibling for sibling in siblings if sibling != split_root]
    shared = shared if shared is not None else SplitWalk()

    def refuse(real: str) -> str | None:
        return _link_refusal(real, root, split_root, other_splits)

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
            if not is_dir and not is_image_file(entry.name):
                continue
            why = refuse(os.path.realpath(entry.path)) if entry.is_symlink() else None
            if why is not None:
                walk.skipped_links.append(f"{entry.path}: {why}")
                continue
            if is_dir:
                subdirectories.append(entry.path)
                continue
            try:
                target = entry.stat(follow_symlinks=True)
            except OSError:  # a dangling link: listed, so that reading it is reported as unreadable
                walk.files.append(entry.path)
                continue
            if not stat.S_ISREG(target.st_mode):  # opening a FIFO would wait for a writer, for good
                walk.skipped_links.append(f"{entry.path}: {NOT_REGULAR}")
                continue
            counted = shared.images.get((target.st_dev, target.st_ino))
            if counted is not None:
                why = "links to an image already counted" if entry.is_symlink() else HARD_LINK
                walk.skipped_links.append(f"{entry.path}: {why} ({counted})")
                continue
            shared.images[(target.st_dev, target.st_ino)] = entry.path
            walk.files.append(entry.path)
        for subdirectory in subdirectories:
            visit(subdirectory)

    visit(str(class_dir))
    return walk


class UnreadableHeader(ValueError):
    """A JPEG in which the frame header libjpeg would decode cannot be found for sure: the size rule cannot
    be applied, so the image is unreadable (the same words on every path)."""

    def __init__(self, why: str):
        super().__init__(f"JPEG header cannot be read with certainty (size rule): {why}")


# The byte after 0xFF, read as libjpeg(-turbo) reads the markers between the start of the image and its frame
# header.  Each SOFn begins a frame header, the first one found is the frame decoded (a second is an error);
# TEM and RST0-7 stand alone; the segments below carry a two-byte length and are skipped.  Any other marker
# before a frame (SOS, EOI, a second SOI, JPG, DHP, EXP, JPGn, the reserved ones) stops libjpeg with an error.
_SOF_MARKERS = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}
_STANDALONE_MARKERS = {0x01, *range(0xD0, 0xD8)}
_SKIPPED_SEGMENTS = {0xDC, 0xFE, *range(0xE0, 0xF0)}  # DNL, COM, APPn: a length under 2 skips nothing more
_TABLE_SEGMENTS = {0xC4, 0xCC, 0xDB, 0xDD}  # DHT, DAC, DQT, DRI: libjpeg refuses a length under 2


class _Bytes:
    """Forward reads over a binary file from where it stands, a chunk at a time, so that walking the
    markers of a large file never holds it all."""

    CHUNK = 1 << 16

    def __init__(self, handle):
        self.handle, self.data, self.offset = handle, b"", 0  # data[offset:]: the bytes not yet taken

    def take(self, count: int) -> bytes | None:
        """The next ``count`` bytes, or None where the file ends first."""
        while len(self.data) - self.offset < count:
            more = self.handle.read(max(self.CHUNK, count))
            if not more:
                return None
            self.data, self.offset = self.data[self.offset:] + more, 0
        taken = self.data[self.offset:self.offset + count]
        self.offset += count
        return taken

    def skip(self, count: int) -> None:
        ahead = self.offset + count - len(self.data)
        if ahead <= 0:
            self.offset += count
        else:
            self.handle.seek(ahead, os.SEEK_CUR)
            self.data, self.offset = b"", 0

    def skip_past(self, value: bytes) -> bool:
        """Skip to just after the next ``value`` byte; False where the file ends first."""
        while (found := self.data.find(value, self.offset)) < 0:
            self.data, self.offset = self.handle.read(self.CHUNK), 0
            if not self.data:
                return False
        self.offset = found + 1
        return True


def _next_marker(source: _Bytes) -> int | None:
    """The next marker, as libjpeg's ``next_marker`` finds it: bytes other than 0xFF are skipped (libjpeg
    warns of "extraneous bytes" and goes on), as are 0xFF fill bytes and stuffed 0xFF 0x00 pairs."""
    while source.skip_past(b"\xff"):
        byte = source.take(1)
        while byte == b"\xff":
            byte = source.take(1)
        if byte is None:
            return None
        if byte != b"\x00":
            return byte[0]
    return None


class JpegFrame(NamedTuple):
    """What a JPEG's frame header says: its size, its coding process (the SOFn marker), its sample precision
    in bits and its number of colour components (0 where the file ends before saying)."""

    width: int
    height: int
    marker: int
    precision: int
    components: int


def jpeg_frame(handle) -> JpegFrame:
    """The frame header libjpeg decodes, from a binary file standing just past a JPEG's start of image
    (0xFF 0xD8); :class:`UnreadableHeader` where no such frame can be found for sure.

    This is libjpeg's own walk of the markers, so that no arrangement of markers, fill or junk can show
    this reader one frame and the decoder (torchvision's, PIL's) another.
    """
    source = _Bytes(handle)
    while True:
        marker = _next_marker(source)
        if marker is None:
            raise UnreadableHeader("the file ends before its frame header")
        if marker in _STANDALONE_MARKERS:
            continue
        if marker in _SOF_MARKERS:
            frame = source.take(7)  # length, precision, height, width
            if frame is None:
                raise UnreadableHeader("the file ends inside its frame header")
            precision, height, width = struct.unpack(">BHH", frame[2:7])
            components = source.take(1)
            return JpegFrame(width, height, marker, precision, components[0] if components else 0)
        if marker not in _SKIPPED_SEGMENTS and marker not in _TABLE_SEGMENTS:
            raise UnreadableHeader(f"marker 0x{marker:02X} before the frame header, where libjpeg stops")
        raw_length = source.take(2)
        if raw_length is None:
            raise UnreadableHeader("the file ends before its frame header")
        length = struct.unpack(">H", raw_length)[0]
        if length < 2 and marker in _TABLE_SEGMENTS:
            raise UnreadableHeader(f"marker 0x{marker:02X} with a length of {length}, where libjpeg stops")
        source.skip(max(length, 2) - 2)


def jpeg_size(handle) -> tuple[int, int]:
    """(width, height) of the frame libjpeg decodes (see :func:`jpeg_frame`)."""
    frame = jpeg_frame(handle)
    return frame.width, frame.height


def is_jpeg(prefix: bytes) -> bool:
    """A JPEG's signature, as PIL and torchvision recognise one (PIL reads only these as JPEG)."""
    return prefix[:3] == b"\xff\xd8\xff"


def check_jpeg_header(source, short_side: int | None = None) -> None:
    """The size rule (see :func:`..models.image_size.check_size`) from the frame header libjpeg would decode,
    for a path or a binary file that holds a JPEG (nothing otherwise); a file is left where it stood.  Raises
    ImageTooLarge or UnreadableHeader."""
    if isinstance(source, (str, os.PathLike)):
        with open_file(source) as handle:
            check_jpeg_header(handle, short_side)
        return
    start = source.tell()
    try:
        if is_jpeg(source.read(3)):
            source.seek(start + 2)
            check_size(*jpeg_size(source), short_side)
    finally:
        source.seek(start)


def open_image(source, short_side: int | None = None) -> Image.Image:
    """``Image.open`` (which reads the header only) under the size rule: ImageTooLarge past the limit (for the
    image, and for its resize to a ``short_side`` px short side when given), and UnreadableHeader for a JPEG
    whose frame header cannot be found for sure."""
    check_jpeg_header(source, short_side)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # the rule below decides
        try:
            image = Image.open(source)
        except Image.DecompressionBombError:  # PIL refuses past twice its limit, before saying the size
            raise ImageTooLarge() from None
        except UnidentifiedImageError:
            if isinstance(source, (str, os.PathLike)):
                raise
            # PIL names an in-memory file by its repr (<_io.BytesIO object at 0x...>): the caller names the file
            raise UnidentifiedImageError("cannot identify image file") from None
    try:
        check_size(*image.size, short_side)
    except ImageTooLarge:
        image.close()
        raise
    return image


def open_rgb(source, short_side: int | None = None, turn: bool = True) -> Image.Image:
    """Open a path or binary file as an 8-bit RGB image (16-bit greyscale scaled by 255/65535), turned by its
    EXIF orientation where ``turn``, to be resized whole to a ``short_side`` px short side when given
    (validation, classify.py).

    Raises what PIL raises for a file that is not a readable image (OSError, ValueError, ...), ImageTooLarge
    and UnreadableHeader.
    """
    with open_image(source, short_side) as image:
        orientation = image_orientation(image) if turn else 1
        if image.mode in _SIXTEEN_BIT_MODES:
            pixels = np.asarray(image, dtype=np.float64)
            eight_bit = np.clip(np.rint(pixels * (255 / 65535)), 0, 255).astype(np.uint8)
            return turn_image(Image.fromarray(eight_bit, "L").convert("RGB"), orientation)
        if image.mode == "RGB":  # decoded as it is, not copied: it stays readable once its file is closed
            image.load()
            return turn_image(image, orientation)
        return turn_image(image.convert("RGB"), orientation)


def decode_problem(source: str | bytes, short_side: int | None = None) -> str | None:
    """Why the image at ``source`` (a path, or an image file's bytes) cannot be decoded (nor resized whole to a
    ``short_side`` px short side, when given), or None when it can."""
    try:
        with open_image(_readable(source), short_side) as image:
            image.draft("RGB", (1, 1))  # JPEG: decode at 1/8 scale; every byte is still read
            image.load()
    except Exception as error:  # anything PIL raises makes the file unusable for training
        return _named(error)
    return None


def size_problem(source: str | bytes, short_side: int | None = None) -> str | None:
    """How the image at ``source`` (a path, or an image file's bytes) breaks the size rule (see
    :func:`..models.image_size.check_size`), from its header alone; None when it does not, or when its header
    cannot be read at all."""
    try:
        with open_image(_readable(source), short_side):
            pass
    except (ImageTooLarge, UnreadableHeader) as error:
        return _named(error)
    except Exception:  # not an image PIL reads: not the size rule's to say
        return None
    return None


def _readable(source: str | bytes):
    """What :func:`open_image` reads: a path as it is, an image file's bytes as a binary file."""
    return io.BytesIO(source) if isinstance(source, bytes) else source


def _named(error: Exception) -> str:
    """An image's problem as every path reports it: the error's type and the first line of its message."""
    return f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else 'unreadable'}"


NOT_REGULAR = "not a regular file (a pipe, a socket or a device)"


def open_file(path: str | os.PathLike):
    """``path`` opened for binary reading, a link followed, only if it is a regular file: the open itself does
    not wait (a FIFO's would, for a writer), and a file swapped for a FIFO after it was listed is refused
    as well.  Raises what ``open`` raises, and :class:`~image_classification.records.datafile.NotARegularFile` (an
    OSError, so that each reader reports it as it reports a file it cannot read)."""
    try:
        return os.fdopen(open_descriptor(path, follow_links=True), "rb")
    except NotARegularFile:
        raise NotARegularFile(f"{printable(path)}: {NOT_REGULAR}") from None


def read_bytes(path: str) -> bytes:
    """The whole file at ``path`` (see :func:`open_file`): what every reader of a folder hands the decoders."""
    with open_file(path) as handle:
        return handle.read()


def read_rgb_tensor(path: str, turn: bool = True) -> torch.Tensor:
    """A CHW uint8 RGB tensor of the image at ``path``, for augmentation on tensors."""
    return decode_rgb_tensor(read_bytes(path), turn)


def decode_rgb_tensor(raw: bytes, turn: bool = True) -> torch.Tensor:
    """A CHW uint8 RGB tensor of an image file's bytes (from a folder or a shard alike), turned by its EXIF
    orientation where ``turn``.

    JPEGs are decoded by the process's CPU decoder (:func:`.decoders.cpu_decoder`: TorchCodec's, torchvision's
    or Pillow's, libjpeg-turbo's pixels all), once their header passes the size rule; anything that decoder
    refuses, or gives at another size than the header's (turned by its own reading of a tag), and every other
    format go through :func:`open_rgb`, so a broken file raises what PIL raises.
    """
    import torch

    from .decoders import cpu_decoder, rgb_tensor  # deferred: torch (decoders imports it), as above

    if is_jpeg(raw):
        handle = io.BytesIO(raw)
        handle.seek(2)
        width, height = jpeg_size(handle)
        check_size(width, height)
        try:
            image = cpu_decoder().decode(torch.frombuffer(bytearray(raw), dtype=torch.uint8))
        except RuntimeError:
            image = None  # PIL decides, and names the problem
        if image is not None and image.shape[-2:] == (height, width):
            return turn_tensor(image, jpeg_orientation(raw)) if turn else image
    return rgb_tensor(open_rgb(io.BytesIO(raw), turn=turn))
