"""Safetensors weights of other software, mapped onto this toolkit's architectures where they honestly fit.

* Ours (``checkpoint2model.py --weight-path W.safetensors``) record their description: taken as it is.
* timm's ResNets and ResNeXts name their tensors as ours do (``conv1``, ``bn1``, ``layer1.0.conv1``, ``fc``):
  the architecture is the ``ARCHS`` row whose layout (blocks per stage, widths, groups) the tensors have.
* Hugging Face's layout: a folder holding ``model.safetensors`` (or that file itself) and, maybe, a ``config.json``
  beside it (read beside a file of that name only: another folder's config.json may be anyone's).  timm's hub repositories' config (``architecture``, ``num_classes``, ``label_names``,
  ``pretrained_cfg``) names the architecture, the classes and the preprocessing; transformers' ResNet
  (``model_type`` resnet, tensors ``resnet.embedder...``, ``classifier.1``) is renamed to ours, tensor by tensor.

Anything else is refused in one line naming what was found: another timm architecture, another transformers
model, a sharded checkpoint, tensors named after no architecture.  The result is what
:func:`image_classification.records.safetensors_file.read_safetensors` gives for ours: a state dict whose
``_metadata`` records what the files say (no hash: nobody sealed it).
"""

from __future__ import annotations

import json
import re
from collections import OrderedDict
from pathlib import Path

from ..errors import UserError
from ..records.integrity import META_KEY, recorded_description
from ..records.safetensors_file import read_safetensors
from .archs import ARCHS

HF_WEIGHTS, HF_CONFIG, HF_INDEX = "model.safetensors", "config.json", "model.safetensors.index.json"
HF_PICKLE = "pytorch_model.bin"  # what timm's and transformers' older saves hold instead
MAX_CONFIG_BYTES = 10_000_000  # a model's config.json is kilobytes; 1000 label names are tens of them
# timm's names of the architectures it shares with this toolkit (its other ResNets -- resnet50d, the SE-ResNeXts,
# whose squeeze is C/16 wide where ours is 16 -- have other tensors or other shapes)
TIMM_ARCHS = {"resnet18": "resnet18", "resnet34": "resnet34", "resnet50": "resnet50", "resnet101": "resnet101",
              "resnet152": "resnet152", "resnext50_32x4d": "resnext50-32x4d",
              "resnext101_32x4d": "resnext101-32x4d", "resnext101_32x8d": "resnext101-32x8d"}
# transformers' ResNet (modeling_resnet.py) -> ours; ResNetModel's tensors lack the "resnet." of
# ResNetForImageClassification's
TRANSFORMERS_STEM = r"(?:resnet\.)?embedder\.embedder\."
_STAGE = r"(?:resnet\.)?encoder\.stages\.(\d+)\.layers\.(\d+)\."
TRANSFORMERS_RENAMES = (
    (TRANSFORMERS_STEM + r"convolution\.", "conv1."),
    (TRANSFORMERS_STEM + r"normalization\.", "bn1."),
    (_STAGE + r"shortcut\.convolution\.", "layer{0}.{1}.downsample.0."),
    (_STAGE + r"shortcut\.normalization\.", "layer{0}.{1}.downsample.1."),
    (_STAGE + r"layer\.(\d+)\.convolution\.", "layer{0}.{1}.conv{2}."),
    (_STAGE + r"layer\.(\d+)\.normalization\.", "layer{0}.{1}.bn{2}."),
    (r"classifier\.1\.", "fc."),
)
# transformers' ResNet settings under which it computes what ours does (v1.5: the stride on the 3x3 conv)
TRANSFORMERS_SETTINGS = {"embedding_size": 64, "hidden_act": "relu", "num_channels": 3,
                         "downsample_in_first_stage": False, "downsample_in_bottleneck": False}
# the stem of a ResNet or an EfficientNet of ours, behind the wrapper prefixes that load_weights undoes
STEM_NAMES = r"(?:(?:module|_orig_mod)\.)*(?:conv1|stem\.conv)\.weight$"
SHOWN = 3


def read_hub_weights(path: str | Path) -> OrderedDict:
    """The weights at ``path`` (a safetensors file, or a folder holding ``model.safetensors``) in our names,
    with what they or their ``config.json`` record; a :class:`UserError` where they fit no architecture of ours."""
    path = Path(path)
    if path.is_dir():
        if not (path / HF_WEIGHTS).is_file():
            found = (f": it holds {HF_INDEX}, a sharded checkpoint, which this toolkit does not read"
                     if (path / HF_INDEX).is_file() else f": pass its {HF_PICKLE} (read as data only) instead"
                     if (path / HF_PICKLE).is_file() else f"; pass a weights file, or a folder holding {HF_WEIGHTS}")
            raise UserError(f"'{path}' is a folder without a {HF_WEIGHTS}{found}")
        path = path / HF_WEIGHTS
    state = read_safetensors(path)
    if recorded_description(state):
        return state
    config_path = path.with_name(HF_CONFIG)
    config = read_config(config_path) if path.name == HF_WEIGHTS and config_path.is_file() else {}
    where = f"'{path}'" + (f" (with its {HF_CONFIG})" if config else "")
    if "model_type" in config or "architectures" in config:
        return _transformers_weights(state, config, where)
    if any(re.match(TRANSFORMERS_STEM, key) for key in state):
        return _transformers_weights(state, {}, where)
    return _timm_weights(state, config, where)


def read_config(path: Path) -> dict:
    """A Hugging Face ``config.json``: a JSON object, else a :class:`UserError`."""
    try:
        if path.stat().st_size > MAX_CONFIG_BYTES:
            raise UserError(f"'{path}' is larger than a model's config ({MAX_CONFIG_BYTES:,} bytes); is it one?")
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise UserError(f"'{path}' could not be read as a JSON config ({error})") from None
    if not isinstance(config, dict):
        raise UserError(f"'{path}' holds a JSON {type(config).__name__}, not a model's config object")
    return config


def _timm_weights(state: OrderedDict, config: dict, where: str) -> OrderedDict:
    """Tensors in our (timm's, torchvision's) names: the architecture from ``config``'s ``architecture``, else from
    their layout."""
    named = config.get("architecture")
    arch = layout = resnet_of(state)
    if named is not None:
        timm_name = str(named).split(".")[0]  # "resnet50.a1_in1k": the architecture and its pretrained tag
        if timm_name not in TIMM_ARCHS:
            raise UserError(f"{where} names timm's {str(named)[:60]}, which this toolkit does not build (it builds "
                            f"timm's {', '.join(TIMM_ARCHS)})")
        arch = TIMM_ARCHS[timm_name]
        if layout is not None and layout != arch:
            raise UserError(f"{where} names timm's {timm_name}, but its tensors have the layout of {layout}: the "
                            f"config is another model's")
    elif arch is None and not any(re.match(STEM_NAMES, key) for key in state):  # else load_weights says what fits
        raise UserError(f"{where} holds {len(state)} tensors whose names match no architecture of this toolkit "
                        f"({_shown(state)}): it is not the weights of a ResNet or EfficientNet")
    return _described(state, arch, config.get("num_classes"), label_list(config.get("label_names")),
                      timm_preprocessing(config), where)


def _transformers_weights(state: OrderedDict, config: dict, where: str) -> OrderedDict:
    """transformers' ResNet renamed to ours; its config, where given, must describe one that computes as ours."""
    if config:
        kind, classes = config.get("model_type"), config.get("architectures")
        if kind != "resnet":
            raise UserError(f"{where} describes a transformers {str(kind)[:40]} model ({str(classes)[:80]}), not a "
                            "ResNet: only transformers' ResNet and timm's ResNets map onto this toolkit's models")
        for key, value in TRANSFORMERS_SETTINGS.items():
            if key in config and config[key] != value:
                raise UserError(f"{where} has {key} {str(config[key])[:40]}, where this toolkit's ResNets have "
                                f"{value}: its model computes differently")
    renamed = OrderedDict()
    for key, tensor in state.items():
        for pattern, target in TRANSFORMERS_RENAMES:
            if match := re.match(pattern, key):
                numbers = [int(group) + 1 for group in match.groups()]  # stages and convs count from 1, blocks 0
                if len(numbers) >= 2:
                    numbers[1] -= 1
                renamed[target.format(*numbers) + key[match.end():]] = tensor
                break
        else:
            raise UserError(f"{where}: the transformers tensor {key[:80]!r} has no counterpart in this toolkit's "
                            "ResNets")
    arch = resnet_of(renamed)
    if arch is None:
        raise UserError(f"{where} is a transformers ResNet whose layout (blocks per stage, widths) is none of this "
                        f"toolkit's: {', '.join(a for a, row in ARCHS.items() if row[4] == 1 and not row[5])}")
    return _described(renamed, arch, None, label_list(config.get("id2label")), None, where)


def label_list(labels) -> list | None:
    """Class names in class-index order: a list as it is, a map of every index from 0 (transformers' ``id2label``,
    timm's ``label_names`` where they have gaps) as a list; None for anything else."""
    if isinstance(labels, dict) and {str(key) for key in labels} == {str(i) for i in range(len(labels))}:
        by_index = {str(key): name for key, name in labels.items()}
        return [by_index[str(i)] for i in range(len(labels))]
    return list(labels) if isinstance(labels, list) else None


def _described(state: OrderedDict, arch: str | None, num_classes, labels, preprocessing: dict | None,
               where: str) -> OrderedDict:
    """``state`` recording ``arch`` and, where the files give them, its class count, names and preprocessing;
    a count or names that contradict the head's rows are a :class:`UserError`."""
    head = state.get("fc.weight")
    rows = int(head.shape[0]) if head is not None and head.dim() == 2 else None
    if rows is not None and isinstance(num_classes, int) and num_classes != rows:
        raise UserError(f"{where} says {num_classes} classes, but its classifier has {rows} rows")
    record: dict = {"arch": arch} if arch else {}
    if rows is not None:
        record["num_classes"] = rows
        if isinstance(labels, list) and all(isinstance(name, str) for name in labels):
            if len(labels) != rows:
                raise UserError(f"{where} names {len(labels)} classes, but its classifier has {rows} rows")
            record["classes"] = labels
    if preprocessing is not None:
        record["preprocessing"] = preprocessing
    state._metadata = OrderedDict({META_KEY: record})  # type: ignore[attr-defined]
    return state


def timm_preprocessing(config: dict) -> dict | None:
    """timm's ``pretrained_cfg`` as our preprocessing record, where ours can repeat it (a centre crop of a square,
    bilinear or bicubic); None otherwise (the architecture's default applies)."""
    cfg = config.get("pretrained_cfg")
    if not isinstance(cfg, dict):
        return None
    size, mean, std = cfg.get("input_size"), cfg.get("mean"), cfg.get("std")
    square = isinstance(size, list) and len(size) == 3 and size[1] == size[2] and type(size[2]) is int
    numbers = all(isinstance(v, list) and len(v) == 3 and all(isinstance(x, (int, float)) for x in v)
                  for v in (mean, std))
    if not (square and numbers and cfg.get("crop_mode", "center") == "center"
            and cfg.get("interpolation") in ("bilinear", "bicubic") and type(cfg.get("crop_pct")) in (int, float)):
        return None
    return {"image_size": size[2], "interpolation": cfg["interpolation"], "crop_ratio": float(cfg["crop_pct"]),
            "mean": [v * 255 for v in mean], "std": [v * 255 for v in std], "exif_orientation": True}


def resnet_of(state) -> str | None:
    """The ``ARCHS`` row whose layout ``state`` (in our names) has: block kind, blocks per stage, widths, expansion,
    groups, squeeze-and-excitation; None where none has it."""
    def shape(name: str) -> tuple[int, ...] | None:
        tensor = state.get(name)
        return tuple(tensor.shape) if tensor is not None and hasattr(tensor, "shape") else None

    if shape("conv1.weight") != (64, 3, 7, 7):
        return None
    block = "bottleneck" if shape("layer1.0.conv3.weight") else "basic"
    last = "conv3" if block == "bottleneck" else "conv2"
    layers, widths = [], []
    for stage in range(1, 5):
        layers.append(len({key.split(".")[1] for key in state if re.match(rf"layer{stage}\.\d+\.conv1\.", key)}))
        first, inner = shape(f"layer{stage}.0.conv1.weight"), shape(f"layer{stage}.0.conv2.weight")
        if first is None or inner is None:
            return None
        widths.append(first[0])
    out, inner = shape(f"layer1.0.{last}.weight"), shape("layer1.0.conv2.weight")
    if out is None or inner is None or not inner[1]:
        return None
    found = (block, tuple(layers), tuple(widths), out[0] // widths[0], widths[0] // inner[1],
             shape("layer1.0.squeeze.squeeze.weight") is not None)
    return next((arch for arch, row in ARCHS.items() if row == found), None)


def _shown(state) -> str:
    keys = list(state)
    return ", ".join(keys[:SHOWN]) + (f" and {len(keys) - SHOWN} more" if len(keys) > SHOWN else "")
