"""Classify images with a trained model: preprocessing, prediction, class names and ``classify.py``.

Preprocessing is the validation pipeline's: the image is turned by its EXIF orientation tag, the short side is
resized to ``round(size / 0.875)`` (256 for 224), the centre ``size`` x ``size`` crop is kept, and pixels are
normalised with the ImageNet mean and standard deviation, exactly as the ``pytorch`` data backend does for
validation.  The size, interpolation and turn are the ones the weights were trained with when the file
records them (our checkpoints and ``checkpoint2model.py``'s output do; weights recorded before the turn saw
the images as stored, and are shown them so, said in one line); ``--image-size`` overrides the size, and says
so.
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

from ..arguments.tools import check_classify_paths, check_int8_flags, classify_parser
from ..data.files import is_image_file, open_image, open_rgb
from ..data.transforms import open_resized, val_transform
from ..errors import UserError
from ..models import build_model, default_image_size, load_weights
from ..models.preprocessing import Preprocessing, choose_preprocessing
from ..models.quantized import check_quantizers, holds_quantizers, quantize_model
from ..models.weights import (checked_arch, checked_num_classes, extract_state_dict, fetch_pretrained, read_weights,
                              recorded_class_names)
from ..records.datafile import unreadable_reason
from ..records.integrity import recorded_description
from ..system import host, machine
from ..system.runtime import Runtime, make_runtime
from .aoti import AotiModel, compiled_for_this_run, is_package
from .onnx_runtime import OnnxModel, onnx_device, require_onnxruntime
from .quantization import Int8Request, Quantization, int8_request, read_calibration
from .split_accuracy import LabelledSplit, SplitScoring, is_split, open_labelled_split
from .torch_export import read_deployed
from .tta import flip_tta

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


def calibrate(request: Int8Request, preprocessing: Preprocessing, log: Callable[[str], None] = warn) -> Quantization:
    """The int8 calibration set ``request`` names, each image prepared as validation prepares it."""
    transform = image_transform(preprocessing)
    return read_calibration(request, lambda path: transform(load_resized(path, preprocessing)), log)


def load_image(path: str | os.PathLike, decode: bool = True, short_side: int | None = None) -> Image.Image | None:
    """Open ``path`` as an RGB image; anything that is not one is a :class:`UserError`, and so is one too large to
    resize whole to a ``short_side`` px short side when given (the size rule of validation).

    With ``decode=False`` only the header is read: a cheap check before any work starts.
    """
    if not decode:
        def header():
            with open_image(path, short_side):  # the size rule, from the header
                return None

        return _as_user_error(path, header)
    return _as_user_error(path, lambda: open_rgb(path, short_side))


def load_resized(path: str | os.PathLike, preprocessing: Preprocessing, decode_scale: str = "auto") -> Image.Image:
    """``path`` as validation resizes it, turned by its EXIF orientation where the preprocessing says so, its
    short side to the preprocessing's resize size, a JPEG decoded at the smallest of libjpeg's scales that
    keeps that size (``decode_scale`` "auto"; "full" decodes every pixel); a :class:`UserError` as
    :func:`load_image` raises it."""
    return _as_user_error(path, lambda: open_resized(path, preprocessing.resize_size, preprocessing.interpolation,
                                                     decode_scale, preprocessing.exif_orientation))


def _as_user_error(path: str | os.PathLike, read: Callable[[], Image.Image | None]) -> Image.Image | None:
    """``read()``, what it raises for a file that is no readable image turned into a :class:`UserError`."""
    try:
        return read()
    except FileNotFoundError:
        raise UserError(f"image file {path} does not exist") from None
    except (UnidentifiedImageError, OSError, ValueError) as error:
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise UserError(f"{path} could not be read as an image ({reason})") from None


def expand_image_paths(paths: Sequence[str]) -> tuple[list[Path], list[LabelledSplit]]:
    """Files as given, folders replaced by the image files directly inside them (sorted), and a folder of class
    folders (a split, ``DIR/<class>/<image>``) by its images, walked as training walks a split; the splits too.

    A path that does not exist, or a folder without images, stops the run before the model is built.  Every
    file's header is read: as in training, an unreadable image is named on stderr and left out, and only when
    none is readable does the run stop (one line, naming the first).
    """
    found: list[Path] = []
    splits: list[LabelledSplit] = []
    for raw in paths:
        path = Path(raw)
        if is_split(path):
            splits.append(open_labelled_split(path))
            found.extend(splits[-1].paths)
        elif path.is_dir():
            images = sorted(p for p in path.iterdir() if p.is_file() and is_image_file(p.name))
            if not images:
                raise UserError(f"folder {path} holds no image files")
            found.extend(images)
        elif path.is_file():
            found.append(path)
        else:
            raise UserError(f"image file {path} {unreadable_reason(path)}")
    return readable_images(found), splits


def readable_images(paths: Sequence[Path], short_side: int | None = None) -> list[Path]:
    """``paths`` whose headers read and keep to the size rule (for the image, and for its resize to a
    ``short_side`` px short side when given); each other one is named on stderr and left out, and a
    :class:`UserError` names the first when none is left."""
    readable, problems = [], []
    for path in paths:
        try:
            load_image(path, decode=False, short_side=short_side)
        except UserError as error:
            problems.append(str(error))
            continue
        readable.append(path)
    if not readable:
        if len(problems) == 1:
            raise UserError(problems[0])
        raise UserError(f"none of the {len(problems)} images could be read: {problems[0]}, and "
                        f"{len(problems) - 1} more")
    for problem in problems:
        skipped(problem)
    return readable


def skipped(problem: str) -> None:
    """Name an image left out on stderr, as training does with an unreadable image."""
    warn(f"warning: skipped: {problem}")


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
               model_config: str | None = None, pretrained: bool = False, log: Callable[[str], None] = warn,
               ) -> LoadedModel:
    """Build ``arch`` and load ``weights`` (any layout ``load_weights`` reads), in eval mode on the CPU.

    A training checkpoint that records its architecture and class count supplies them when the caller
    leaves ``arch`` or ``num_classes`` as None; a plain state dict supplies its head's class count.
    Contradictions between the flags and the file are :class:`UserError`.
    """
    if weights and pretrained:
        raise UserError("--weights and --pretrained exclude each other; pass one source of weights")
    if weights and is_package(weights):
        raise UserError(f"'{weights}' is an AOTInductor package (.pt2), not PyTorch weights: classify.py --weights "
                        f"{weights} runs it; main.py and model2onnx.py take the weights it was compiled from")
    checkpoint: dict = {}
    if weights:
        checkpoint = read_weights(weights)
        arch = checked_arch(checkpoint, arch, weights)
        num_classes = checked_num_classes(checkpoint, num_classes, weights)
    arch = arch or "resnet50"
    num_classes = num_classes or 1000
    model = build_model(arch, num_classes=num_classes, model_config=model_config)
    quantized = bool(checkpoint) and holds_quantizers(extract_state_dict(checkpoint))
    if quantized:
        quantize_model(model)  # trained quantization-aware: its activation ranges load with the weights
    if pretrained:
        weights = str(fetch_pretrained(arch, log=log))
    if weights:
        try:
            load_weights(model, checkpoint or weights, log=log)
        except UserError as error:
            message = str(error).replace("the given state dict", f"'{weights}'").rstrip(".")
            raise UserError(f"{message}; are they weights of --arch {arch}?") from None
    if quantized:
        check_quantizers(model, f"'{weights}'")
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
def predict(model: nn.Module, images: torch.Tensor, runtime: Runtime, tta: str | None = None) -> torch.Tensor:
    """Class probabilities (float32, softmax over the logits) for a batch of normalised images; with ``tta``
    ``"flip"``, over the mean of their logits and their mirror images' (:func:`.tta.flip_tta`)."""
    images = images.to(runtime.device).contiguous(memory_format=runtime.memory_format)
    with runtime.autocast():
        logits = model(images)
        if tta is not None:
            logits = flip_tta(model, images, logits)
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
                   names: Sequence[str], topk: int, decode_scale: str = "auto", tta: str | None = None
                   ) -> Iterator[tuple[Path, list[dict]]]:
    """(path, top-k predictions) for every image, classified ``BATCH_SIZE`` at a time (each decoded as
    :func:`load_resized` says; ``tta``: see :func:`predict`); an image that cannot be decoded (a header that
    reads, a body that does not) is named on stderr and left out."""
    if isinstance(preprocessing, int):
        preprocessing = Preprocessing(preprocessing)
    transform = image_transform(preprocessing)
    for start in range(0, len(paths), BATCH_SIZE):
        chunk, images = [], []
        for path in paths[start:start + BATCH_SIZE]:
            try:
                images.append(transform(load_resized(path, preprocessing, decode_scale)))
            except UserError as error:
                skipped(str(error))
                continue
            chunk.append(path)
        if not chunk:
            continue
        for path, probabilities in zip(chunk, predict(model, torch.stack(images), runtime, tta)):
            yield path, top_predictions(probabilities, names, topk)


# ------------------------------------------------------------------------------------------------
# classify.py
# ------------------------------------------------------------------------------------------------
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


def classify_runtime(device: str, precision: str | None, memory_format: str) -> Runtime:
    """The runtime of a one-off classification: ``precision`` None picks :func:`default_precision`."""
    if precision is None:
        wants_cuda = host.use_cuda(device)
        precision = default_precision("cuda" if wants_cuda else "cpu")
        listed = [] if wants_cuda else machine.cpu_bf16_features()
        promised = not wants_cuda and machine.bf16_faster_by_flags()
        if precision == "FP32" and promised:  # what -h could not know: it promised AMP only where oneDNN agrees
            warn(f"note: FP32 by default: this CPU lists {', '.join(listed)}, but this torch's oneDNN computes no "
                 "bf16 with it (--precision AMP would emulate bf16, slower than FP32)")
    # no cuDNN autotuning: a one-off run would re-tune at every new batch shape (the last batch is
    # usually smaller) for no gain
    runtime = make_runtime(device, amp=precision == "AMP", memory_format=memory_format, log=lambda *_: None,
                           cudnn_benchmark=False)
    if runtime.device.type == "cpu" and runtime.amp_dtype is not None and not machine.cpu_bf16_is_faster():
        warn(f"note: {_slower_bf16()}: --precision AMP runs slower than FP32 here")
    return runtime


def main(argv: Sequence[str] | None = None) -> int:
    """classify.py's job from its command line; returns the exit code.  The paths are checked as the script checks
    them once its flags are parsed (:func:`~image_classification.commands.classify`), which then calls
    :func:`classify`."""
    args = classify_parser().parse_args(argv)
    check_classify_paths(args)
    return classify(args)


def classify(args: argparse.Namespace) -> int:
    """Classify the images that classify.py's parsed arguments name, their paths checked
    (:func:`~image_classification.arguments.tools.check_classify_paths`); returns the exit code."""
    check_int8_flags(args, needs_runtime=True)
    package = bool(args.weights) and is_package(args.weights)
    runtime_name = _runtime_name(args, package)
    paths, splits = expand_image_paths(args.image)
    if package:
        model, names, preprocessing = package_to_run(args)
        scoring = SplitScoring(splits, names, warn) if splits else None  # before any image is classified
        paths = readable_images(paths, preprocessing.resize_size)
        runtime = classify_runtime(model.device.type, "FP32", "nchw")  # the package takes NCHW float32
    else:
        if not args.weights and not args.pretrained:
            warn(f"warning: no --weights given: {args.arch or 'resnet50'} is untrained and its predictions "
                 "mean nothing")
        loaded = load_model(args.arch, args.weights, args.num_classes, args.model_config, args.pretrained)
        names = class_names_for(loaded.num_classes, args.labels, loaded.class_names)
        scoring = SplitScoring(splits, names, warn) if splits else None  # before any image is classified
        preprocessing = loaded.resolve_preprocessing(args.image_size)
        paths = readable_images(paths, preprocessing.resize_size)  # the resize's size rule, known from the weights
        model, runtime = _model_to_run(args, runtime_name, loaded, preprocessing)
    predicted = 0
    topk = max(args.topk, scoring.k) if scoring else args.topk  # a split's top-5 needs five
    for path, predictions in classify_paths(model, paths, runtime, preprocessing, names, topk,
                                            args.decode_scale, args.tta):
        predicted += 1
        if scoring:
            scoring.add(path, predictions)
            predictions = predictions[:args.topk]
        if args.json:
            print(json.dumps({"path": str(path), "predictions": predictions}), flush=True)
            continue
        print(path)
        for prediction in predictions:
            print(f"{prediction['label']}: {100 * prediction['probability']:.1f}%")
        sys.stdout.flush()
    if not predicted:
        raise UserError("none of the images could be read (each is named above)")
    if scoring:
        print_split_reports(scoring, args.json)
    return 0


def print_split_reports(scoring: SplitScoring, as_json: bool) -> None:
    """After the images' lines, each split's top-1, top-5 and confusions: a JSON object a split with
    ``as_json``, else text after a blank line."""
    if not as_json:
        print()
    for line in scoring.reports(as_json):
        print(line)
    sys.stdout.flush()


def _runtime_name(args: argparse.Namespace, package: bool) -> str:
    """--runtime, by default torch, or aoti for a .pt2 package (which runs only so); what it refuses, refused."""
    chosen = args.runtime or ("aoti" if package else "torch")
    if package and chosen != "aoti":
        raise UserError(f"'{args.weights}' is an AOTInductor package: it runs as compiled (--runtime aoti, the "
                        f"default for a .pt2 file); leave out --runtime {chosen}")
    if args.precision == "AMP" and chosen != "torch":
        how = "the exported graph as it is (FP32, or int8 with --quantize int8)" if chosen == "onnxruntime" else \
            "the compiled package as it is (FP32)"
        raise UserError(f"--runtime {chosen} runs {how}; leave out --precision AMP")
    if chosen == "onnxruntime":
        require_onnxruntime("--runtime onnxruntime")
    return chosen


def package_to_run(args: argparse.Namespace) -> tuple[AotiModel, list[str], Preprocessing]:
    """The .pt2 package of --weights, loaded and proven (:class:`.aoti.AotiModel`), with the class names (--labels,
    else its own) and the preprocessing it records; flags that contradict it are refused in one line."""
    if args.pretrained:
        raise UserError("--weights and --pretrained exclude each other; pass one source of weights")
    source = f"'{args.weights}'"
    model = AotiModel(args.weights)
    arch, names, preprocessing = read_deployed(model.record, source)
    if args.device in ("cpu", "cuda") and args.device != model.device.type:
        raise UserError(f"{source} is compiled for {model.device.type}: leave out --device {args.device}, or "
                        f"compile it for {args.device} (model2onnx.py --device {args.device})")
    contradictions = [(flag, given, own) for flag, given, own in (
        ("--arch", args.arch, arch), ("--num-classes", args.num_classes, len(names)),
        ("--image-size", args.image_size, preprocessing.image_size)) if given is not None and given != own]
    if contradictions:
        flag, given, own = contradictions[0]
        raise UserError(f"{source} is a package of {arch} with {len(names)} classes at {preprocessing.image_size} "
                        f"px, compiled as it is: leave out {flag} {given} (it records {own})")
    if args.labels:
        names = read_labels(args.labels, len(names))
    return model, names, preprocessing


def _model_to_run(args: argparse.Namespace, runtime_name: str, loaded: LoadedModel, preprocessing: Preprocessing):
    """The model classify.py runs for ``runtime_name`` and the runtime its images are prepared in: PyTorch's on
    the chosen device, precision and layout; ONNX Runtime's export of it; or it compiled into a package."""
    if runtime_name == "onnxruntime":
        device = onnx_device(args.device)
        request = int8_request(args)
        quantization = calibrate(request, preprocessing) if request is not None else None
        runtime = classify_runtime("cpu", "FP32", "nchw")  # the images stay on the host: ONNX Runtime copies them
        return OnnxModel(loaded.model, preprocessing.image_size, warn, quantization, device), runtime
    if runtime_name == "aoti":
        runtime = classify_runtime(args.device, "FP32", "nchw")
        return compiled_for_this_run(loaded.model, preprocessing.image_size, runtime.device, warn), runtime
    runtime = classify_runtime(args.device, args.precision, args.memory_format)
    return loaded.model.to(runtime.device, memory_format=runtime.memory_format), runtime
