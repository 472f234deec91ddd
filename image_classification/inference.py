"""Classify images with a trained model: preprocessing, prediction, class names and ``classify.py``.

Preprocessing is the validation pipeline's: the short side is resized to ``round(size / 0.875)``
(256 for 224), the centre ``size`` x ``size`` crop is kept, and pixels are normalised with the ImageNet
mean and standard deviation, exactly as the ``pytorch`` data backend does for validation.  The size and
interpolation are the ones the weights were trained with when the file records them (our checkpoints
and ``checkpoint2model.py``'s output do); ``--image-size`` overrides them, and says so.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Sequence

import torch
from PIL import Image, UnidentifiedImageError
from torch import nn
from torchvision import transforms

from . import machine
from .cli import UserErrorParser, positive_int
from .data.files import is_image_file, open_image, open_rgb
from .data.folder import val_transform
from .errors import UserError
from .integrity import recorded_description
from .models import (MODEL_CONFIGS, build_model, default_image_size, list_models, load_checkpoint_file,
                     load_weights)
from .models.weights import checked_arch, checked_num_classes, fetch_pretrained, recorded_class_names
from .onnx_runtime import OnnxModel
from .preprocessing import Preprocessing, choose_preprocessing
from .runtime import Runtime, make_runtime

BATCH_SIZE = 32  # images classified per forward pass


def warn(message: str) -> None:
    """Notices go to stderr, so that stdout holds only the predictions (and stays valid JSON lines)."""
    print(message, file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------------------
# Images
# ------------------------------------------------------------------------------------------------
def image_transform(preprocessing: Preprocessing | int) -> Callable[[Image.Image], torch.Tensor]:
    """PIL image -> normalised float CHW tensor, as validation sees it (an int: that size, the defaults)."""
    if isinstance(preprocessing, int):
        preprocessing = Preprocessing(preprocessing)
    resize_crop = val_transform(preprocessing.image_size, preprocessing.interpolation, preprocessing.crop_ratio)
    to_tensor = transforms.Compose([resize_crop, transforms.PILToTensor()])
    mean = torch.tensor(preprocessing.mean).view(3, 1, 1)
    std = torch.tensor(preprocessing.std).view(3, 1, 1)
    return lambda image: (to_tensor(image).float() - mean) / std


def load_image(path: str | os.PathLike, decode: bool = True) -> Image.Image | None:
    """Open ``path`` as an RGB image; anything that is not one is a :class:`UserError`.

    With ``decode=False`` only the header is read: a cheap check before any work starts.
    """
    try:
        if not decode:
            with open_image(path):  # the size rule of training, from the header
                return None
        return open_rgb(path)
    except FileNotFoundError:
        raise UserError(f"image file {path} does not exist") from None
    except (UnidentifiedImageError, OSError, ValueError) as error:
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise UserError(f"{path} could not be read as an image ({reason})") from None


def expand_image_paths(paths: Sequence[str]) -> list[Path]:
    """Files as given, folders replaced by the image files directly inside them (sorted).

    Every file's header is read, so a missing or non-image file stops the run before the model is built.
    """
    found: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            images = sorted(p for p in path.iterdir() if p.is_file() and is_image_file(p.name))
            if not images:
                raise UserError(f"folder {path} holds no image files")
            found.extend(images)
        elif path.is_file():
            found.append(path)
        else:
            raise UserError(f"image file {path} does not exist")
    for path in found:
        load_image(path, decode=False)
    return found


# ------------------------------------------------------------------------------------------------
# Model and class names
# ------------------------------------------------------------------------------------------------
@dataclass
class LoadedModel:
    model: nn.Module
    arch: str
    num_classes: int
    class_names: list[str] | None  # names recorded in the checkpoint, if any
    preprocessing: Preprocessing | None = None  # how the weights' training prepared its images, if recorded
    source: str = "the weights"

    def resolve_preprocessing(self, image_size: int | None, log: Callable[[str], None] = warn) -> Preprocessing:
        """The recorded preprocessing, else the arch's default; ``image_size`` overrides it (with a notice)."""
        return choose_preprocessing(self.preprocessing, default_image_size(self.arch), self.source or "the weights",
                                    lambda line: log(f"note: {line}"), image_size=image_size)


def load_model(arch: str | None, weights: str | None = None, num_classes: int | None = None,
               model_config: str = "classic", pretrained: bool = False, log: Callable[[str], None] = warn,
               ) -> LoadedModel:
    """Build ``arch`` and load ``weights`` (any layout ``load_weights`` reads), in eval mode on the CPU.

    A training checkpoint that records its architecture and class count supplies them when the caller
    leaves ``arch`` or ``num_classes`` as None; a plain state dict supplies its head's class count.
    Contradictions between the flags and the file are :class:`UserError`.
    """
    if weights and pretrained:
        raise UserError("--weights and --pretrained exclude each other; pass one source of weights")
    checkpoint: dict = {}
    if weights:
        checkpoint = load_checkpoint_file(weights)
        arch = checked_arch(checkpoint, arch, weights)
        num_classes = checked_num_classes(checkpoint, num_classes, weights)
    arch = arch or "resnet50"
    num_classes = num_classes or 1000
    model = build_model(arch, num_classes=num_classes, model_config=model_config)
    if pretrained:
        weights = str(fetch_pretrained(arch, log=log))
    if weights:
        try:
            load_weights(model, checkpoint or weights, log=log)
        except UserError as error:
            message = str(error).replace("the given state dict", f"'{weights}'").rstrip(".")
            raise UserError(f"{message}; are they weights of --arch {arch}?") from None
    names = recorded_class_names(checkpoint, num_classes)
    description = recorded_description(checkpoint)
    preprocessing = None
    if isinstance(description.get("preprocessing"), dict):
        preprocessing = Preprocessing.from_dict(description["preprocessing"], f"'{weights}'")
    return LoadedModel(model.eval(), arch, num_classes, names, preprocessing, f"'{weights}'" if weights else "")


def imagenet_class_names() -> list[str]:
    """The 1000 ImageNet-1k class names, in class-index order, from torchvision's bundled metadata."""
    from torchvision.models import ResNet50_Weights

    return list(ResNet50_Weights.IMAGENET1K_V1.meta["categories"])


def read_labels(path: str | os.PathLike, num_classes: int) -> list[str]:
    """One class name per line (blank lines at the end ignored); the count must match the model."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise UserError(f"labels file {path} does not exist") from None
    except (OSError, UnicodeDecodeError) as error:
        raise UserError(f"labels file {path} could not be read as text ({error})") from None
    while lines and not lines[-1].strip():
        lines.pop()
    if len(lines) != num_classes:
        raise UserError(f"labels file {path} has {len(lines)} names, but the model has {num_classes} classes")
    return [line.strip() for line in lines]


def class_names_for(num_classes: int, labels_file: str | None, recorded: list[str] | None) -> list[str]:
    """Names from --labels, else the checkpoint's, else ImageNet's for 1000 classes, else the indices."""
    if labels_file:
        return read_labels(labels_file, num_classes)
    if recorded:
        return recorded
    if num_classes == 1000:
        return imagenet_class_names()
    return [str(index) for index in range(num_classes)]


# ------------------------------------------------------------------------------------------------
# Prediction
# ------------------------------------------------------------------------------------------------
@torch.no_grad()
def predict(model: nn.Module, images: torch.Tensor, runtime: Runtime) -> torch.Tensor:
    """Class probabilities (float32, softmax over the logits) for a batch of normalised images."""
    images = images.to(runtime.device).contiguous(memory_format=runtime.memory_format)
    with runtime.autocast():
        logits = model(images)
    probabilities = logits.float().softmax(dim=1).cpu()
    if not torch.isfinite(probabilities).all():
        raise UserError("the model's outputs are NaN or inf for these images; its predictions would mean nothing "
                        "(try --precision FP32)")
    return probabilities


def top_predictions(probabilities: torch.Tensor, names: Sequence[str], k: int) -> list[dict]:
    """The ``k`` most likely classes of one image, highest first, as {label, index, probability}."""
    values, indices = probabilities.topk(min(k, probabilities.numel()))
    return [{"label": names[i], "index": i, "probability": p}
            for p, i in zip(values.tolist(), indices.tolist())]


def classify_paths(model: nn.Module, paths: Sequence[Path], runtime: Runtime, preprocessing: Preprocessing | int,
                   names: Sequence[str], topk: int) -> Iterator[tuple[Path, list[dict]]]:
    """(path, top-k predictions) for every image, classified ``BATCH_SIZE`` at a time."""
    transform = image_transform(preprocessing)
    for start in range(0, len(paths), BATCH_SIZE):
        chunk = paths[start:start + BATCH_SIZE]
        batch = torch.stack([transform(load_image(path)) for path in chunk])
        for path, probabilities in zip(chunk, predict(model, batch, runtime)):
            yield path, top_predictions(probabilities, names, topk)


# ------------------------------------------------------------------------------------------------
# classify.py
# ------------------------------------------------------------------------------------------------
def add_model_arguments(parser: argparse.ArgumentParser, default_arch: str | None) -> None:
    """The flags that pick a model and its weights, shared by classify.py and model2onnx.py."""
    group = parser.add_argument_group("model")
    group.add_argument("--arch", "-a", metavar="ARCH", default=default_arch, choices=list_models(),
                       help="model architecture: " + " | ".join(list_models())
                       + " (default: the checkpoint's, else resnet50)")
    group.add_argument("--model-config", "-c", metavar="CONF", default="classic", choices=list(MODEL_CONFIGS),
                       help="model config: " + " | ".join(MODEL_CONFIGS)
                       + " (initialisation only; default: classic)")
    group.add_argument("--weights", "--pretrained-weights", "--pretrained-from-file", metavar="PATH",
                       dest="weights", default=None,
                       help="model weights: an NGC or torchvision file, checkpoint2model.py's output or a "
                       "training checkpoint")
    group.add_argument("--pretrained", action="store_true",
                       help="download NVIDIA's published NGC weights for --arch (needs network access once)")
    group.add_argument("--num-classes", "--num_classes", metavar="N", dest="num_classes", type=positive_int,
                       default=None, help="number of classes (default: the weights', else 1000)")
    group.add_argument("--image-size", metavar="S", type=positive_int, default=None,
                       help="crop size (default: the size the weights were trained at when they record it, "
                       "else the architecture's, 224)")


def default_precision(device_type: str) -> str:
    """The faster precision on ``device_type``: AMP (fp16) on CUDA; on the CPU AMP (bf16) only where bf16
    was measured faster than FP32 on that class of CPU (:func:`machine.cpu_bf16_is_faster`: AMX, AMD's
    AVX512-BF16), FP32 elsewhere (the layout, channels-last, is faster either way)."""
    return "AMP" if device_type == "cuda" or machine.cpu_bf16_is_faster() else "FP32"


def _slower_bf16() -> str:
    """Why bf16 runs slower than FP32 on this CPU."""
    if machine.cpu_bf16_is_native():
        return f"this CPU ({machine.cpu_capability()}, no AMX) computes bf16 no faster than FP32"
    return f"this CPU ({machine.cpu_capability()}) emulates bf16"


def precision_default_text() -> str:
    """--precision's default in words, naming what this machine's CPU gets and why."""
    here = "here AMP: bf16 runs faster than FP32 on this CPU" if default_precision("cpu") == "AMP" else \
        f"here FP32: {_slower_bf16()}"
    return ("AMP on CUDA; on the CPU AMP only where bf16 runs faster than FP32 (AMX, or AVX512-BF16 on AMD), "
            f"else FP32; {here}")


def classify_runtime(device: str, precision: str | None, memory_format: str) -> Runtime:
    """The runtime of a one-off classification: ``precision`` None picks :func:`default_precision`."""
    if precision is None:
        wants_cuda = device == "cuda" or (device == "auto" and torch.cuda.is_available())
        precision = default_precision("cuda" if wants_cuda else "cpu")
    # no cuDNN autotuning: a one-off run would re-tune at every new batch shape (the last batch is
    # usually smaller) for no gain
    runtime = make_runtime(device, amp=precision == "AMP", memory_format=memory_format, log=lambda *_: None,
                           cudnn_benchmark=False)
    if runtime.device.type == "cpu" and runtime.amp_dtype is not None and not machine.cpu_bf16_is_faster():
        warn(f"note: {_slower_bf16()}: --precision AMP runs slower than FP32 here")
    return runtime


def build_parser() -> argparse.ArgumentParser:
    parser = UserErrorParser(prog="classify.py", description="Classify images with a trained model.")
    parser.add_argument("--image", metavar="PATH", nargs="+", action="extend", required=True,
                        help="image file, or folder whose images are all classified; may be repeated")
    add_model_arguments(parser, default_arch=None)
    run = parser.add_argument_group("inference")
    run.add_argument("--precision", choices=("AMP", "FP32"), default=None,
                     help="AMP: fp16 autocast on CUDA, bf16 on CPU; FP32: full precision (default: "
                     + precision_default_text() + ")")
    run.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                     help="where to run; auto takes CUDA when present (default: auto)")
    run.add_argument("--memory-format", choices=("nhwc", "nchw"), default="nhwc",
                     help="nhwc: channels-last model and images, the faster layout for oneDNN and cuDNN; "
                     "nchw: the plain layout (default: nhwc)")
    run.add_argument("--cpu", dest="device", action="store_const", const="cpu", help="same as --device cpu")
    run.add_argument("--runtime", choices=("torch", "onnxruntime"), default="torch",
                     help="onnxruntime: export the model to ONNX once (cached by a hash of its weights) and run "
                     "it with ONNX Runtime, FP32 on the CPU; needs the onnx extra (default: torch)")
    run.add_argument("--topk", metavar="K", type=positive_int, default=5,
                     help="how many classes to show per image (default: 5)")
    run.add_argument("--labels", metavar="FILE", default=None,
                     help="class names, one per line in class-index order (default: the names the checkpoint "
                     "records, else ImageNet's for 1000 classes, else the class index)")
    run.add_argument("--json", action="store_true",
                     help="print one JSON object per image: "
                     "{path, predictions: [{label, index, probability}]}")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.runtime == "onnxruntime" and (args.device == "cuda" or args.precision == "AMP"):
        raise UserError("--runtime onnxruntime runs FP32 on the CPU; leave out --device cuda and --precision AMP")
    paths = expand_image_paths(args.image)
    if args.labels and not Path(args.labels).is_file():
        raise UserError(f"labels file {args.labels} does not exist")
    if not args.weights and not args.pretrained:
        warn(f"warning: no --weights given: {args.arch or 'resnet50'} is untrained and its predictions "
             "mean nothing")
    loaded = load_model(args.arch, args.weights, args.num_classes, args.model_config, args.pretrained)
    names = class_names_for(loaded.num_classes, args.labels, loaded.class_names)
    preprocessing = loaded.resolve_preprocessing(args.image_size)
    if args.runtime == "onnxruntime":
        runtime = classify_runtime("cpu", "FP32", "nchw")
        model = OnnxModel(loaded.model, preprocessing.image_size, log=warn)
    else:
        runtime = classify_runtime(args.device, args.precision, args.memory_format)
        model = loaded.model.to(runtime.device, memory_format=runtime.memory_format)
    for path, predictions in classify_paths(model, paths, runtime, preprocessing, names, args.topk):
        if args.json:
            print(json.dumps({"path": str(path), "predictions": predictions}), flush=True)
            continue
        print(path)
        for prediction in predictions:
            print(f"{prediction['label']}: {100 * prediction['probability']:.1f}%")
        sys.stdout.flush()
    return 0
