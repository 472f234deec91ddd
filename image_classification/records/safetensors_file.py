"""Weights in the safetensors format: an 8-byte little-endian header length, a JSON header giving each tensor's
dtype, shape and byte range (and string metadata under ``__metadata__``), then the tensors' bytes.

Nothing in such a file is ever executed, and no other reader is tried on it (no pickle).  The ``safetensors``
package reads and writes the tensors; it is optional (``pip install safetensors``): without it a safetensors
file is refused in one line that says so.  Before the package sees a file, :func:`read_header` holds its header
to the format's bounds (the length within the file, a JSON object, every byte range inside the data), so that a
torn or foreign file is one line saying what is wrong; the bytes checked are the bytes loaded (read once).

The files written here record the same description and content hash as a ``.pth`` weights file
(:mod:`.integrity`): under the metadata key :data:`MARKER` (our metadata's version), ``arch`` and ``sha256`` as
they are, every other entry (``num_classes``, ``classes``, ``preprocessing``, ``model_options``) as JSON.
:func:`read_safetensors` gives back what :func:`.checkpoint.load_checkpoint_file` gives for a ``.pth``: a state
dict whose ``_metadata`` holds that record, its hash verified.
"""

from __future__ import annotations

import json
import os
import struct
from collections import OrderedDict
from pathlib import Path

from ..errors import UserError

SUFFIX = ".safetensors"
MARKER = "image_classification"  # also integrity.META_KEY: our record's key, in a state dict and in the metadata
VERSION = "1"
PLAIN_KEYS = ("arch", "sha256")  # metadata kept as the strings they are; every other entry is JSON
MAX_HEADER = 100_000_000  # the safetensors package's own bound on a header
INSTALL = "pip install safetensors==0.8.*"


def is_safetensors(path: str | os.PathLike) -> bool:
    """Whether ``path`` is named as a safetensors file or opens as one (a header length that fits, then ``{``)."""
    path = Path(path)
    if path.suffix.lower() == SUFFIX:
        return True
    try:
        with open(path, "rb") as handle:
            head = handle.read(9)
            size = os.fstat(handle.fileno()).st_size
    except OSError:
        return False
    return len(head) == 9 and 2 <= struct.unpack("<Q", head[:8])[0] <= size - 8 and head[8:9] == b"{"


def _require_package():
    try:
        import safetensors.torch  # deferred: optional
    except ImportError:
        raise UserError(f"reading and writing .safetensors weights needs the safetensors package: {INSTALL}") from None
    return safetensors.torch


def read_header(data: bytes, where: str) -> dict:
    """The JSON header of the safetensors bytes ``data``, every tensor's byte range checked to lie inside them;
    a :class:`UserError` naming what is wrong otherwise."""
    if len(data) < 8:
        raise UserError(f"{where} is not a safetensors file: it holds {len(data)} bytes, fewer than its header length")
    length = struct.unpack("<Q", data[:8])[0]
    if length > min(MAX_HEADER, len(data) - 8):
        raise UserError(f"{where} is damaged or not a safetensors file: its header length, {length} bytes, exceeds "
                        f"the {len(data) - 8} bytes that follow it (a truncated copy?)")
    try:
        header = json.loads(data[8:8 + length].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise UserError(f"{where} is damaged or not a safetensors file: its header is not JSON ({error})") from None
    if not isinstance(header, dict):
        raise UserError(f"{where} is damaged or not a safetensors file: its header is a JSON "
                        f"{type(header).__name__}, not an object")
    room = len(data) - 8 - length
    for name, entry in header.items():
        if name == "__metadata__":
            if not isinstance(entry, dict) or not all(isinstance(v, str) for v in entry.values()):
                raise UserError(f"{where} is damaged: its __metadata__ is not a map of strings")
            continue
        offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(type(v) is int for v in offsets)
                and 0 <= offsets[0] <= offsets[1]):
            raise UserError(f"{where} is damaged: the tensor {name[:80]!r} has no valid data_offsets")
        if offsets[1] > room:
            raise UserError(f"{where} is damaged or truncated: the tensor {name[:80]!r} ends at byte {offsets[1]} of "
                            f"its data, which holds {room}")
    return header


def _ordered(record: dict) -> dict:
    """``record`` in the one order its hash is taken in: the description's keys first, in their order, then the
    rest by name (a safetensors header keeps no order of its own)."""
    from .integrity import DESCRIPTION_KEYS  # deferred: torch (integrity imports it)

    return {key: record[key] for key in [*(k for k in DESCRIPTION_KEYS if k in record),
                                         *sorted(k for k in record if k not in DESCRIPTION_KEYS)]}


def _decoded(metadata: dict, where: str) -> dict | None:
    """Our record from a file's metadata (the description and its hash: other entries, which other tools may add,
    are not ours), None for a file written by other software."""
    from .integrity import DESCRIPTION_KEYS, HASH_KEY  # deferred: torch (integrity imports it)

    if metadata.get(MARKER) != VERSION:
        if MARKER in metadata:
            raise UserError(f"{where} records its description in version {metadata[MARKER][:20]!r} of this "
                            f"toolkit's metadata; this version reads {VERSION}")
        return None
    record = {}
    for key, text in _ordered(metadata).items():
        if key not in (*DESCRIPTION_KEYS, HASH_KEY):
            continue
        if key in PLAIN_KEYS:
            record[key] = text
            continue
        try:
            record[key] = json.loads(text)
        except json.JSONDecodeError:
            raise UserError(f"{where} is damaged: its metadata entry {key[:40]!r} is not JSON") from None
    return record


def read_safetensors(path: str | os.PathLike) -> OrderedDict:
    """The tensors of a safetensors file, on the CPU, as a state dict; ours carry their record in ``_metadata``
    (as a ``.pth``'s do), its hash verified.  Anything wrong with the file is a :class:`UserError`."""
    from .integrity import META_KEY, verify  # deferred: torch (integrity imports it)

    path = Path(path)
    where = f"'{path}'"
    if not path.is_file():
        raise UserError(f"Weights file {where} does not exist or is not a file.")
    torch_safetensors = _require_package()
    try:
        data = path.read_bytes()
    except OSError as error:
        raise UserError(f"{where} could not be read ({error.strerror or error})") from None
    header = read_header(data, where)
    try:
        tensors = torch_safetensors.load(data)
    except Exception as error:  # the package's SafetensorError, or torch refusing a dtype or a size
        reason = (str(error).strip().splitlines() or [type(error).__name__])[0][:160]
        raise UserError(f"{where} is damaged or not a safetensors file of tensors ({reason})") from None
    state = OrderedDict((name, tensors[name]) for name in sorted(tensors))  # as sealed: the header's order is its own
    record = _decoded(header.get("__metadata__") or {}, where)
    if record is not None:
        state._metadata = OrderedDict({META_KEY: record})  # type: ignore[attr-defined]
        if verify(state) is False:
            raise UserError(f"{where} is damaged: its content does not match the hash recorded when it was written; "
                            "use another copy")
    return state


def safetensors_bytes(state_dict: dict, description: dict) -> bytes:
    """The safetensors file of ``state_dict`` (each tensor contiguous, in its own storage) with ``description``
    and the hash of both as string metadata (:func:`.checkpoint.save_weights` writes it atomically)."""
    from .integrity import META_KEY, seal_state_dict  # deferred: torch (integrity imports it)

    torch_safetensors = _require_package()
    tensors = {name: state_dict[name].detach().to("cpu").contiguous().clone() for name in sorted(state_dict)}
    record = seal_state_dict(tensors, _ordered(description))._metadata[META_KEY]  # type: ignore[attr-defined]
    metadata = {"format": "pt", MARKER: VERSION}
    for key, value in record.items():
        metadata[key] = value if key in PLAIN_KEYS else json.dumps(value)
    return torch_safetensors.save(tensors, metadata=metadata)
