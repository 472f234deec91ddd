"""A model of Triton Inference Server's model repository, written from an exported ONNX graph.

``ROOT/NAME/config.pbtxt`` names the ONNX Runtime backend (platform ``onnxruntime_onnx``), the graph's inputs
and outputs with the names, element types and shapes the graph itself declares (its first dimension, the
batch, left to Triton through ``max_batch_size``), and turns dynamic batching on; ``ROOT/NAME/1/model.onnx``
is the graph, version 1; ``ROOT/NAME/labels.txt`` holds the class names, one a line, which Triton's
classification extension returns.  The config is written as protobuf text by hand: Triton's client
library is needed only by the tests that parse it.

The model's folder is assembled in the export's scratch folder, inside the repository (see :mod:`..records.scratch`),
and renamed into its place, so a reader never sees half a model, and a folder that is already there (another
model, or another version of this one) is refused, never replaced.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
from pathlib import Path
from typing import Sequence

from ..errors import StorageError, UserError

LABELS_FILE = "labels.txt"
# ONNX TensorProto element types -> Triton's data types
TRITON_TYPES = {1: "TYPE_FP32", 2: "TYPE_UINT8", 3: "TYPE_INT8", 4: "TYPE_UINT16", 5: "TYPE_INT16",
                6: "TYPE_INT32", 7: "TYPE_INT64", 9: "TYPE_BOOL", 10: "TYPE_FP16", 11: "TYPE_FP64",
                12: "TYPE_UINT32", 13: "TYPE_UINT64", 16: "TYPE_BF16"}
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")


def check_model_name(name: str) -> None:
    """A model name is one folder of the repository: letters, digits, ``_ . -``, not starting with a dot."""
    if not _NAME.match(name) or len(name) > 200:
        raise UserError(f"--model-name {name[:60]!r} is not a model name: use letters, digits, '_', '.' and '-' "
                        "(not first), at most 200 characters")


def _tensors(values, initializers: set[str], what: str) -> list[tuple[str, str, list[int]]]:
    """(name, Triton type, shape without the batch dimension) of each graph input or output."""
    described = []
    for value in values:
        if value.name in initializers:
            continue
        tensor = value.type.tensor_type
        dims = [dim.dim_value if dim.HasField("dim_value") else -1 for dim in tensor.shape.dim]
        if not dims or dims[0] != -1:
            raise UserError(f"the graph's {what} {value.name!r} has no free batch dimension (shape {dims}); Triton "
                            "batches the first dimension")
        if tensor.elem_type not in TRITON_TYPES:
            raise UserError(f"the graph's {what} {value.name!r} has ONNX element type {tensor.elem_type}, which "
                            "Triton has no type for")
        described.append((value.name, TRITON_TYPES[tensor.elem_type], dims[1:]))
    return described


def config_text(graph_bytes: bytes, name: str, max_batch_size: int) -> str:
    """config.pbtxt of the graph ``graph_bytes`` (see the module docstring); the first output carries the labels."""
    import onnx

    graph = onnx.load_from_string(graph_bytes).graph
    initializers = {tensor.name for tensor in graph.initializer}
    lines = [f'name: "{name}"', 'platform: "onnxruntime_onnx"', f"max_batch_size: {max_batch_size}"]
    for section, values, what in (("input", graph.input, "input"), ("output", graph.output, "output")):
        entries = []
        for index, (tensor, kind, dims) in enumerate(_tensors(values, initializers, what)):
            label = [f'    label_filename: "{LABELS_FILE}"'] if what == "output" and index == 0 else []
            entries.append("\n".join(["  {", f'    name: "{tensor}"', f"    data_type: {kind}",
                                      f"    dims: [ {', '.join(map(str, dims))} ]", *label, "  }"]))
        lines.append(f"{section} [\n" + ",\n".join(entries) + "\n]")
    lines.append("dynamic_batching { }")
    return "\n".join(lines) + "\n"


def labels_text(class_names: Sequence[str]) -> str:
    """One class name a line; a name that would break the lines is refused."""
    for name in class_names:
        if not name or any(character in name for character in "\r\n"):
            raise UserError(f"the class name {name[:60]!r} cannot be a line of Triton's label file (empty, or "
                            "holding a line break)")
    return "".join(f"{name}\n" for name in class_names)


def check_free(root: str | os.PathLike, name: str) -> Path:
    """The folder of model ``name`` in the repository ``root``, where it can be written: a valid name, not
    there yet; else :class:`UserError`."""
    check_model_name(name)
    root = Path(root)
    if root.exists() and not root.is_dir():
        raise UserError(f"--triton-repository {root} is not a folder")
    target = root / name
    if os.path.lexists(target):
        raise UserError(f"{target} already exists; choose another --model-name or --triton-repository, or "
                        "remove it first")
    return target


def write_model(root: str | os.PathLike, name: str, graph_bytes: bytes, max_batch_size: int,
                class_names: Sequence[str], scratch: Path) -> Path:
    """Write model ``name`` of the repository ``root`` (module docstring), assembled in ``scratch``, a folder
    inside ``root``; returns its folder."""
    target = check_free(root, name)
    config, labels = config_text(graph_bytes, name, max_batch_size), labels_text(class_names)
    staging = scratch / name
    try:
        (staging / "1").mkdir(parents=True)
        (staging / "1" / "model.onnx").write_bytes(graph_bytes)
        (staging / "config.pbtxt").write_text(config, encoding="utf-8")
        (staging / LABELS_FILE).write_text(labels, encoding="utf-8")
        os.rename(staging, target)  # refused where a folder with files came meanwhile
    except OSError as error:
        raise StorageError(f"{target} could not be written ({error.strerror or error}); nothing was replaced") from None
    finally:
        with contextlib.suppress(OSError):
            shutil.rmtree(staging)
    return target
