"""Content hashes that let a checkpoint or weights file prove it is the file that was written.

A bit flip on a disk or in a copy can leave a file that still unpickles, with different numbers in it.
Every file this toolkit writes therefore carries the SHA-256 of its content, computed over the loaded
objects (not the bytes on disk, whose zip layout may change between torch versions):

* a training checkpoint (a dict) keeps it under the ``sha256`` key, over every other entry;
* a plain weights file (a state dict, as ``checkpoint2model.py`` writes it) keeps it in the state dict's
  ``_metadata`` under :data:`META_KEY`, beside the architecture and preprocessing it records; a state dict
  stays loadable by plain PyTorch (``model.load_state_dict``), which ignores that entry.

Files without a hash (NGC's, torchvision's, older ones) load as before.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

import torch

META_KEY = "image_classification"  # our entry in a state dict's _metadata (never a module's name)
HASH_KEY = "sha256"


def content_digest(obj) -> str:
    """SHA-256 over ``obj``'s structure and values: tensors (dtype, shape, bytes), containers, scalars."""
    digest = hashlib.sha256()
    _feed(digest, obj)
    return digest.hexdigest()


def _feed(digest, obj) -> None:
    if isinstance(obj, torch.Tensor):
        tensor = obj.detach().to("cpu").contiguous().reshape(-1)
        digest.update(f"T{tensor.dtype}{tuple(obj.shape)}:".encode())
        if tensor.numel():
            digest.update(tensor.view(torch.uint8).numpy())
    elif isinstance(obj, Mapping):
        digest.update(f"D{len(obj)}:".encode())
        for key, value in obj.items():
            _feed(digest, key)
            _feed(digest, value)
    elif isinstance(obj, (list, tuple)):  # tuples may come back as lists after a round trip: one kind
        digest.update(f"L{len(obj)}:".encode())
        for value in obj:
            _feed(digest, value)
    elif isinstance(obj, str):
        encoded = obj.encode()
        digest.update(f"S{len(encoded)}:".encode() + encoded)
    elif obj is None or isinstance(obj, (bool, int, float)):
        digest.update(f"V{type(obj).__name__}:{obj!r};".encode())
    else:
        raise TypeError(f"cannot hash a {type(obj).__name__} in a checkpoint")


def seal_checkpoint(payload: dict) -> dict:
    """``payload`` with its content hash added (the hash covers every other entry)."""
    body = {key: value for key, value in payload.items() if key != HASH_KEY}
    return {**body, HASH_KEY: content_digest(body)}


def seal_state_dict(state: Mapping[str, torch.Tensor], metadata: dict) -> dict:
    """A plain state dict carrying ``metadata`` and the hash of both in ``_metadata[META_KEY]``."""
    from collections import OrderedDict

    sealed = OrderedDict(state.items())
    inherited = getattr(state, "_metadata", None)
    sealed._metadata = OrderedDict(inherited or {})  # type: ignore[attr-defined]
    record = {key: value for key, value in metadata.items() if key != HASH_KEY}
    record[HASH_KEY] = content_digest([dict(sealed), record])
    sealed._metadata[META_KEY] = record  # type: ignore[attr-defined]
    return sealed


DESCRIPTION_KEYS = ("arch", "model_options", "num_classes", "classes", "preprocessing", "quantization")


def recorded_description(obj) -> dict:
    """What a checkpoint or weights file records about its model (a subset of :data:`DESCRIPTION_KEYS`);
    empty for files written by other software."""
    if isinstance(obj, Mapping) and (HASH_KEY in obj or "arch" in obj):
        source = obj
    else:
        meta = getattr(obj, "_metadata", None)
        source = meta.get(META_KEY) if isinstance(meta, Mapping) else None
        if not isinstance(source, Mapping):
            return {}
    return {key: source[key] for key in DESCRIPTION_KEYS if key in source}


def verify(obj) -> bool | None:
    """True when ``obj`` carries a hash that matches its content, False when it does not match, None when it
    carries none (a file written by other software, or before hashes existed)."""
    if isinstance(obj, Mapping) and HASH_KEY in obj:
        body = {key: value for key, value in obj.items() if key != HASH_KEY}
        try:
            return obj[HASH_KEY] == content_digest(body)
        except TypeError:
            return False
    meta = getattr(obj, "_metadata", None)
    record = meta.get(META_KEY) if isinstance(meta, Mapping) else None
    if isinstance(record, Mapping) and HASH_KEY in record:
        body = {key: value for key, value in record.items() if key != HASH_KEY}
        try:
            return record[HASH_KEY] == content_digest([dict(obj), body])
        except TypeError:
            return False
    return None
