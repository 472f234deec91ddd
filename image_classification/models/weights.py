"""Loading weights into a model, whatever layout they were saved in (the file read as data by :func:`read_weights`:
a PyTorch file, or safetensors weights, ours, timm's or Hugging Face's, mapped by :mod:`.hub_layouts`).

Accepted: both spellings of the stages, ``layer1``.. (torchvision, NGC's 20.06 ResNets and 20.12
EfficientNets) and ``layers.0``.. (the later NVIDIA code, our EfficientNets), a ``module.`` (DDP) or
``_orig_mod.`` (torch.compile) prefix, a whole training checkpoint (its ``state_dict`` or ``model`` entry) and
TensorRT-style 4-D SE weights.  Anything that does not fit the model exactly is an error, never a silent
partial load; weights of another architecture are named where their keys tell which.
"""

from __future__ import annotations

import re
import urllib.error
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Union

import torch
from torch import nn

from image_classification.errors import UserError
from image_classification.models.archs import EFFICIENTNET_SE_RATIO, EFFICIENTNETS, efficientnet_layout
from image_classification.models.hub_layouts import read_hub_weights
from image_classification.records.checkpoint import load_checkpoint_file
from image_classification.records.integrity import recorded_description
from image_classification.records.safetensors_file import is_safetensors

NGC = "https://api.ngc.nvidia.com/v2/models/nvidia/"
PRETRAINED_URLS = {  # NGC 20.06.0 (ResNets) and 20.12.0 (EfficientNets) releases: plain state dicts
    "resnet50": NGC + "resnet50_pyt_amp/versions/20.06.0/files/nvidia_resnet50_200821.pth.tar",
    "resnext101-32x4d":
        NGC + "resnext101_32x4d_pyt_amp/versions/20.06.0/files/nvidia_resnext101-32x4d_200821.pth.tar",
    "se-resnext101-32x4d":
        NGC + "seresnext101_32x4d_pyt_amp/versions/20.06.0/files/nvidia_se-resnext101-32x4d_200821.pth.tar",
    "efficientnet-b0":
        NGC + "efficientnet_b0_pyt_amp/versions/20.12.0/files/nvidia_efficientnet-b0_210412.pth",
    "efficientnet-b4":
        NGC + "efficientnet_b4_pyt_amp/versions/20.12.0/files/nvidia_efficientnet-b4_210412.pth",
    "efficientnet-widese-b0": NGC + "efficientnet_widese_b0_pyt_amp/versions/20.12.0/files/"
                                    "nvidia_efficientnet-widese-b0_210412.pth",
    "efficientnet-widese-b4": NGC + "efficientnet_widese_b4_pyt_amp/versions/20.12.0/files/"
                                    "nvidia_efficientnet-widese-b4_210412.pth",
}

HEADS = ("fc", "classifier.fc")  # the ResNets', the EfficientNets' classifier
HEAD_KEYS = tuple(f"{head}.{name}" for head in HEADS for name in ("weight", "bias"))
FAMILY_NAMES = {"resnet": "a ResNet", "efficientnet": "an EfficientNet"}
FAMILY_KEYS = {"resnet": "conv1, layer1..layer4, fc",
               "efficientnet": "stem, layers.N.blockM, features, classifier.fc"}
WRAPPER_PREFIXES = ("module.", "_orig_mod.")  # DistributedDataParallel, torch.compile
SHOWN = 5  # how many offending keys an error message names


def read_weights(path: str | Path) -> dict:
    """A weights or checkpoint file read as data only: a PyTorch file (:func:`load_checkpoint_file`), or safetensors
    weights, a file or a folder holding ``model.safetensors`` (:func:`.hub_layouts.read_hub_weights`)."""
    if Path(path).is_dir() or is_safetensors(path):
        return read_hub_weights(path)
    return load_checkpoint_file(path)


def checked_arch(weights: Mapping, arch: str | None, source: str) -> str | None:
    """The architecture ``weights`` record, else ``arch``; a record that contradicts ``arch`` (the --arch
    given; None when it was not) is a :class:`UserError` naming the flag that fits."""
    recorded = recorded_description(weights).get("arch")
    if not isinstance(recorded, str):
        return arch
    if arch is not None and recorded != arch:
        raise UserError(f"{source} holds a {recorded} checkpoint, not {arch}; pass --arch {recorded}")
    return recorded


def recorded_num_classes(weights: Mapping | None) -> int | None:
    """How many classes a checkpoint or weights file holds: what it records, else the rows of its ``fc``
    head; None when neither says (or the file is not a set of weights: loading it explains why)."""
    if weights is None:
        return None
    description = recorded_description(weights)
    number = description.get("num_classes") or (description.get("model_options") or {}).get("num_classes")
    if isinstance(number, int) and not isinstance(number, bool):
        return number
    try:
        state = extract_state_dict(weights)
    except UserError:
        return None
    head = next((state[f"{h}.weight"] for h in HEADS if f"{h}.weight" in state), None)
    return int(head.shape[0]) if isinstance(head, torch.Tensor) and head.dim() == 2 else None


def checked_num_classes(weights: Mapping, num_classes: int | None, source: str) -> int | None:
    """The class count ``weights`` hold (:func:`recorded_num_classes`), else ``num_classes``; a count that
    contradicts ``num_classes`` (the --num-classes given; None when it was not) is a :class:`UserError`
    naming the flag that fits.  For using weights as they are; training that replaces the head reads
    :func:`recorded_num_classes` and decides itself."""
    recorded = recorded_num_classes(weights)
    if recorded is None:
        return num_classes
    if num_classes is not None and recorded != num_classes:
        raise UserError(f"{source} has {recorded} classes, but --num-classes is {num_classes}; "
                        f"pass --num-classes {recorded}")
    return recorded


def recorded_class_names(weights: Mapping, num_classes: int) -> list[str] | None:
    """The class names a training checkpoint records (training writes its class folders' names), when
    they are ``num_classes`` strings; None otherwise."""
    names = recorded_description(weights).get("classes")
    if isinstance(names, list) and len(names) == num_classes and all(isinstance(n, str) for n in names):
        return list(names)
    return None


def extract_state_dict(checkpoint: Mapping) -> dict[str, torch.Tensor]:
    """The model weights of a checkpoint, wrapper prefixes undone and stages spelled as their family's models
    spell them: ``layer1``.. for a ResNet's, ``layers.0``.. for an EfficientNet's (:func:`weights_family`)."""
    for key in ("state_dict", "model"):
        if isinstance(checkpoint.get(key), Mapping):
            checkpoint = checkpoint[key]
            break
    state = {}
    for key, value in checkpoint.items():
        if not isinstance(key, str) or not isinstance(value, torch.Tensor):
            raise UserError(f"The checkpoint entry {key!r} is not a tensor, so this is not a state dict.")
        while key.startswith(WRAPPER_PREFIXES):
            key = key.split(".", 1)[1]
        state[key] = value
    if weights_family(state) == "efficientnet":
        rename = (r"^layer(\d+)\.", lambda m: f"layers.{int(m.group(1)) - 1}.")
    else:
        rename = (r"^layers\.(\d+)\.", lambda m: f"layer{int(m.group(1)) + 1}.")
    return {re.sub(*rename, key): value for key, value in state.items()}


def weights_family(keys) -> str | None:
    """``efficientnet`` or ``resnet``: the family whose names ``keys`` (a state dict's, prefixes undone) use;
    None for neither."""
    if "stem.conv.weight" in keys:
        return "efficientnet"
    return "resnet" if "conv1.weight" in keys else None


def efficientnet_of(state: Mapping[str, torch.Tensor]) -> str | None:
    """The EfficientNet whose layout ``state`` (in our names) has: its stem, head, blocks per stage and, for
    widese, the squeeze-and-excitation of stage 1; None where none has it."""
    def rows(name: str, index: int) -> int | None:
        tensor = state.get(name)
        return int(tensor.shape[index]) if isinstance(tensor, torch.Tensor) and tensor.dim() > index else None

    blocks: dict[int, set[int]] = {}
    for key in state:
        if match := re.match(r"layers\.(\d+)\.block(\d+)\.", key):
            blocks.setdefault(int(match.group(1)), set()).add(int(match.group(2)))
    found = (rows("stem.conv.weight", 0), rows("features.conv.weight", 0),
             [len(blocks[i]) for i in sorted(blocks)], rows("layers.1.block0.se.squeeze.weight", 0))
    for arch, row in EFFICIENTNETS.items():
        stem, stages, head = efficientnet_layout(arch)
        squeezed = stages[0][4] * (stages[1][3] if row[5] else 1)  # stage 1's input, or its hidden channels
        layout = (stem, head, [stage[2] for stage in stages], max(1, int(squeezed * EFFICIENTNET_SE_RATIO)))
        if found == layout:
            return arch
    return None


def _refuse_another_architecture(state: dict, expected: dict, where: str) -> None:
    """A :class:`UserError` naming the architecture the weights are, where their keys say it is not the
    model's: another family, or another EfficientNet."""
    theirs, ours = weights_family(state), weights_family(expected)
    if theirs is None or ours is None:
        return
    named = efficientnet_of(state) if theirs == "efficientnet" else None
    model = efficientnet_of(expected) if ours == "efficientnet" else None
    if theirs == ours and (named is None or named == model):
        return
    what = f"{named}'s" if named else f"{FAMILY_NAMES[theirs]}'s ({FAMILY_KEYS[theirs]})"
    model_text = model if theirs == ours and model else FAMILY_NAMES[ours]
    hint = f"pass --arch {named}" if named else "pass the --arch they were trained as"
    raise UserError(f"The weights in {where} are {what}, not {model_text}'s: {hint}.")


def _unwrap(model: nn.Module) -> nn.Module:
    """The plain model inside DistributedDataParallel (``.module``) and torch.compile (``._orig_mod``)."""
    for attr in ("module", "_orig_mod"):
        inner = getattr(model, attr, None)
        if isinstance(inner, nn.Module):
            return _unwrap(inner)
    return model


def _names(keys: list[str]) -> str:
    more = f" and {len(keys) - SHOWN} more" if len(keys) > SHOWN else ""
    return ", ".join(keys[:SHOWN]) + more


def load_weights(model: nn.Module, source: Union[str, Path, Mapping], *, allow_head_mismatch: bool = False,
                 log: Callable[[str], None] = print, label: str | None = None, resuming: bool = False) -> None:
    """Load a checkpoint file or state dict into ``model``, which it must fit exactly.

    With ``allow_head_mismatch`` a classifier of another size is skipped (the model keeps its fresh ``fc``),
    for fine-tuning to a different number of classes.  ``resuming``: the weights are those of a run that
    continues (a classifier of another size is then advised as a resume, not an evaluation).
    """
    where = f"'{label or source}'" if label or isinstance(source, (str, Path)) else "the given state dict"
    checkpoint = read_weights(source) if isinstance(source, (str, Path)) else source
    if not isinstance(checkpoint, Mapping):
        raise UserError(f"Weights come from a checkpoint file or state dict, not a {type(source).__name__}.")
    state = extract_state_dict(checkpoint)
    model = _unwrap(model)
    expected = model.state_dict()

    for key, value in state.items():  # TensorRT-style SE: 1x1 convs where we have Linear layers
        target = expected.get(key)
        if target is not None and target.dim() == 2 and value.dim() == 4 and value.shape[2:] == (1, 1):
            state[key] = value.flatten(1)
    for key in expected:  # checkpoints from before BN counted its batches
        if key.endswith("num_batches_tracked") and key not in state:
            state[key] = expected[key]

    not_finite = [k for k, v in state.items() if v.is_floating_point() and not torch.isfinite(v).all()]
    if not_finite:
        raise UserError(f"The weights in {where} hold NaN or infinite values ({_names(not_finite)}): the "
                        "training that wrote them diverged, or the file is damaged.")
    missing = [k for k in expected if k not in state]
    unexpected = [k for k in state if k not in expected]
    mismatched = [k for k in expected if k in state and state[k].shape != expected[k].shape]
    head_only = bool(mismatched) and not missing and not unexpected and set(mismatched) <= set(HEAD_KEYS)
    bias = next((f"{head}.bias" for head in HEADS if f"{head}.bias" in expected), "fc.bias")
    if head_only and allow_head_mismatch:
        log(f"Replaced the classifier head: the weights have {len(state[bias])} classes, the model "
            f"{len(expected[bias])}; {bias[:-5]} starts from its fresh initialisation.")
        for key in mismatched:
            state[key] = expected[key]
    elif missing or unexpected or mismatched:
        if not head_only:
            _refuse_another_architecture(state, expected, where)
        problems = []
        if missing:
            problems.append(f"missing keys {_names(missing)}")
        if unexpected:
            problems.append(f"unexpected keys {_names(unexpected)}")
        if mismatched:
            problems.append("shape mismatches " + _names(
                [f"{k} {tuple(state[k].shape)} vs model {tuple(expected[k].shape)}" for k in mismatched]))
        if head_only:
            classes = len(state[bias])
            advice = (f"pass --num-classes {classes} to resume that run as it is (to fine-tune its weights on "
                      f"another number of classes, start a new run from them with --pretrained-weights {where} in "
                      "another --workspace)") if resuming else (
                      f"pass --num-classes {classes} to use them as they are (to fine-tune on another number of "
                      "classes, train with --pretrained-weights instead of evaluating)")
            raise UserError(f"The weights in {where} have {classes} classes and the model "
                            f"{len(expected[bias])}: {advice}.")
        raise UserError(f"The weights in {where} do not fit this model: {'; '.join(problems)}.")
    model.load_state_dict(state, strict=True)


def fetch_pretrained(arch: str, log: Callable[[str], None] = print) -> Path:
    """Path of the published NGC weights for ``arch``, downloaded into the torch.hub cache if needed."""
    if arch not in PRETRAINED_URLS:
        raise UserError(f"No published weights for '{arch}'; they exist for: {', '.join(PRETRAINED_URLS)}.")
    url = PRETRAINED_URLS[arch]
    path = Path(torch.hub.get_dir()) / "checkpoints" / url.rsplit("/", 1)[1]
    if not path.is_file():
        log(f"Downloading {url} to {path}")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            torch.hub.download_url_to_file(url, str(path), progress=True)
        except (urllib.error.URLError, OSError) as e:
            raise UserError(f"Downloading the {arch} weights from {url} failed ({e}); download the file "
                            f"elsewhere and pass its path instead (--pretrained-from-file PATH, or "
                            f"load_weights(model, PATH)).") from e
    return path
