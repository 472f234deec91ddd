"""The command lines of classify.py, checkpoint2model.py, model2onnx.py and data.pack, defined once.

No torch here (nor in what this imports), as for main.py's (:mod:`.parsing`): ``-h`` and a mistyped flag
answer before torch is loaded.  The default precision's help names this machine's choice from /proc/cpuinfo.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from ..errors import UserError
from ..models import MODEL_CONFIGS, list_models
from ..models.preprocessing import DECODE_SCALES
from ..records.datafile import unreadable_reason
from ..system import machine
from ..system.cli import UserErrorParser, positive_int, whole
from .values import flag

CALIBRATION_METHODS = ("minmax", "entropy", "percentile")
ONNX_OPSET = 18  # the lowest opset torch.export's ONNX exporter writes (deploy.torch_export)
EXPORT_FORMATS = ("onnx", "pt2")  # model2onnx.py: an ONNX file, or an AOTInductor package
DEFAULT_CALIBRATION_IMAGES = 100
DEFAULT_MAX_BATCH_SIZE = 64  # of a Triton model: what dynamic batching may gather
LARGEST_MAX_BATCH_SIZE = 2**31 - 1  # config.pbtxt's max_batch_size is an int32: Triton refuses a larger one


def max_batch_size(value: str) -> int:
    """--max-batch-size: a positive int that config.pbtxt can hold."""
    number = whole(value)
    if number > LARGEST_MAX_BATCH_SIZE:
        raise argparse.ArgumentTypeError(f"must be at most {LARGEST_MAX_BATCH_SIZE} (config.pbtxt holds it as a "
                                         f"32-bit integer; Triton would not load the model), got {number}")
    return positive_int(value)


def add_model_arguments(parser: argparse.ArgumentParser, default_arch: str | None) -> None:
    """The flags that pick a model and its weights, shared by classify.py and model2onnx.py."""
    group = parser.add_argument_group("model")
    group.add_argument("--arch", "-a", metavar="ARCH", default=default_arch, choices=list_models(),
                       help="model architecture: " + " | ".join(list_models())
                       + " (default: the checkpoint's, else resnet50)")
    group.add_argument("--model-config", "-c", metavar="CONF", default=None, choices=list(MODEL_CONFIGS),
                       help="model config of the ResNets: " + " | ".join(MODEL_CONFIGS)
                       + " (initialisation only; default: classic)")
    group.add_argument("--weights", "--pretrained-weights", "--pretrained-from-file", metavar="PATH",
                       dest="weights", default=None,
                       help="model weights: an NGC or torchvision file, checkpoint2model.py's output (.pth or "
                       ".safetensors), a training checkpoint, timm's safetensors, or a Hugging Face folder holding "
                       "model.safetensors (and config.json) of a timm or transformers ResNet")
    group.add_argument("--pretrained", action="store_true",
                       help="download NVIDIA's published NGC weights for --arch (needs network access once)")
    group.add_argument("--num-classes", "--num_classes", metavar="N", dest="num_classes", type=positive_int,
                       default=None, help="number of classes (default: the weights', else 1000)")
    group.add_argument("--image-size", metavar="S", type=positive_int, default=None,
                       help="crop size (default: the size the weights were trained at when they record it, "
                       "else the architecture's, 224)")


def int8_fields(what: str) -> dict:
    """``--quantize int8`` and its calibration flags as fields of a group's dataclass (:func:`.values.flag`), shared
    by classify.py, model2onnx.py and main.py (``what``: what the int8 model does there)."""
    return {
        "quantize": flag("--quantize", choices=("int8",),
                         help=f"int8: {what} ONNX Runtime's static int8 quantization of the model (QDQ, int8 weights "
                         "per output channel, uint8 activations, float logits), calibrated on --calibration-data; "
                         "7-bit weights (reduce_range) on a CPU without VNNI or AMX-INT8 (default: off, FP32)"),
        "calibration_data": flag("--calibration-data", metavar="DIR",
                                 help="--quantize int8: images whose activations set the int8 ranges, prepared as "
                                 "validation prepares them: a folder of class folders (chosen evenly over the "
                                 "classes) or a folder of images"),
        "calibration_images": flag("--calibration-images", metavar="N", type=positive_int,
                                   help=f"--quantize int8: how many images of --calibration-data, chosen without "
                                   f"randomness (default: {DEFAULT_CALIBRATION_IMAGES})"),
        "calibration_method": flag("--calibration-method", choices=CALIBRATION_METHODS,
                                   help="--quantize int8: minmax: the activations' extremes; entropy, percentile: "
                                   "ranges that clip rare outliers (default: minmax)"),
    }


def add_int8_arguments(group: argparse._ArgumentGroup, what: str) -> None:
    """:func:`int8_fields`'s flags as arguments of ``group``."""
    for name, item in int8_fields(what).items():
        group.add_argument(*item.metadata["flags"], dest=name, default=item.default, **item.metadata["options"])


def check_classify_paths(args: argparse.Namespace) -> None:
    """classify.py's ``--image`` paths each name a file or a folder, and ``--labels`` a file: checked without torch,
    as soon as the flags are parsed, so that a typo answers at once.  Raises :class:`UserError`."""
    for raw in args.image:
        if not (os.path.isdir(raw) or os.path.isfile(raw)):
            raise UserError(f"image file {Path(raw)} {unreadable_reason(raw)}")
    if args.labels and not os.path.isfile(args.labels):
        raise UserError(f"labels file {args.labels} {unreadable_reason(args.labels)}")


def check_int8_flags(args: argparse.Namespace, needs_runtime: bool) -> None:
    """Each int8 flag comes with what it tunes (alone it would do nothing, silently); ``needs_runtime``:
    --quantize also needs --runtime onnxruntime. Raises :class:`UserError`."""
    given = [flag for flag, value in (("--calibration-data", args.calibration_data),
                                      ("--calibration-images", args.calibration_images),
                                      ("--calibration-method", args.calibration_method)) if value is not None]
    if args.quantize is None:
        if given:
            raise UserError(f"{given[0]} calibrates an int8 model: it needs --quantize int8")
        return
    if needs_runtime and args.runtime != "onnxruntime":
        raise UserError("--quantize int8 runs the model with ONNX Runtime: it needs --runtime onnxruntime")
    if args.calibration_data is None:
        raise UserError("--quantize int8 needs --calibration-data DIR: images whose activations set the int8 "
                        "ranges (a hundred or so of the training images)")


def precision_default_text() -> str:
    """--precision's default in words, naming what this machine's CPU gets and why, as far as /proc/cpuinfo
    tells without torch: whether oneDNN computes bf16 with those instructions only the run can ask (it says
    so when not, see ``inference.classify_runtime``)."""
    rule = ("AMP on CUDA; on the CPU AMP only where bf16 runs faster than FP32 (AMX, or AVX512-BF16 on AMD) "
            "and oneDNN computes it, else FP32")
    features = machine.cpu_bf16_features()
    if features is None:
        return rule
    if machine.bf16_faster_by_flags():
        here = f"here AMP where this torch's oneDNN computes bf16: this CPU lists {', '.join(features)}"
    elif features:
        here = f"here FP32: this CPU lists {', '.join(features)} but no AMX, and computes bf16 no faster than FP32"
    else:
        here = "here FP32: this CPU lists no bf16 instructions and would emulate bf16, slower than FP32"
    return f"{rule}; {here}"


def classify_parser() -> argparse.ArgumentParser:
    parser = UserErrorParser(prog="classify.py", description="Classify images with a trained model.")
    parser.add_argument("--image", metavar="PATH", nargs="+", action="extend", required=True,
                        help="image file, folder whose images are all classified, or split in ImageFolder layout "
                        "(DIR/<class>/<image>), whose images are then scored against their class folders' names: "
                        "top-1, top-5 and the classes most often confused; may be repeated")
    add_model_arguments(parser, default_arch=None)
    run = parser.add_argument_group("inference")
    run.add_argument("--precision", choices=("AMP", "FP32"), default=None,
                     help="AMP: fp16 autocast on CUDA, bf16 on CPU; FP32: full precision (default: "
                     + precision_default_text() + ")")
    run.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                     help="where to run; auto takes CUDA when present (default: auto)")
    run.add_argument("--memory-format", choices=("nhwc", "nchw"), default="nhwc",
                     help="nhwc: channels-last model and images, the faster layout for oneDNN and cuDNN; "
                     "nchw: the plain layout; PyTorch's model only (default: nhwc)")
    run.add_argument("--cpu", dest="device", action="store_const", const="cpu", help="same as --device cpu")
    run.add_argument("--runtime", choices=("torch", "onnxruntime", "aoti"), default=None,
                     help="onnxruntime: export the model to ONNX once (cached by a hash of its weights) and run "
                     "it with ONNX Runtime, on the CPU, or on CUDA with onnxruntime-gpu; needs the onnx extra; "
                     "aoti: run an AOTInductor package, --weights M.pt2 as written by model2onnx.py --output "
                     "M.pt2 (its classes and preprocessing its own), or other weights compiled into one for this "
                     "run, which takes tens of seconds to minutes (default: torch; aoti for a .pt2 package)")
    add_int8_arguments(run, "with --runtime onnxruntime, classify with")
    run.add_argument("--decode-scale", choices=DECODE_SCALES, default="auto",
                     help="auto: decode each JPEG at the smallest of libjpeg's scales (1/2, 1/4, 1/8) whose short side "
                     "still holds the resize's, as validation does; full: decode every pixel (default: auto)")
    run.add_argument("--tta", "--val-tta", dest="tta", choices=("flip",), default=None,
                     help="test-time augmentation: flip classifies each image by the mean of its logits and its "
                     "mirror image's, as main.py --val-tta flip validates (default: none)")
    run.add_argument("--topk", metavar="K", type=positive_int, default=5,
                     help="how many classes to show per image (default: 5)")
    run.add_argument("--labels", metavar="FILE", default=None,
                     help="class names, one per line in class-index order (default: the names the checkpoint "
                     "records, else ImageNet's for 1000 classes, else the class index)")
    run.add_argument("--json", action="store_true",
                     help="print one JSON object per image: "
                     "{path, predictions: [{label, index, probability}]}, then one per split: {split, images, "
                     "left_out, classes, top1, top5, confused: [{true, predicted, images}]}")
    return parser


def checkpoint2model_parser() -> argparse.ArgumentParser:
    parser = UserErrorParser(prog="checkpoint2model.py",
                             description="Extract the model weights of a training checkpoint as a plain state "
                             "dict, loadable with --weights / --pretrained-weights.")
    parser.add_argument("--checkpoint-path", metavar="PATH", required=True,
                        help="training checkpoint to read")
    parser.add_argument("--weight-path", metavar="PATH", required=True,
                        help="where to write the weights: a PyTorch file, or W.safetensors (the safetensors package "
                        "needed) with the architecture, classes and preprocessing as its string metadata")
    parser.add_argument("--ema", action="store_true",
                        help="extract the exponential moving average of the weights (runs with --use-ema)")
    return parser


def model2onnx_parser() -> argparse.ArgumentParser:
    parser = UserErrorParser(prog="model2onnx.py",
                             description="Export a model to ONNX through torch.export (checked against PyTorch "
                             "with onnxruntime), or compile it into an AOTInductor package (.pt2, checked "
                             "against PyTorch).")
    add_model_arguments(parser, default_arch=None)
    group = parser.add_argument_group("export")
    group.add_argument("--output", metavar="FILE", default=None,
                       help="file to write: M.onnx, or M.pt2 for an AOTInductor package (default: the weights' "
                       "path, or <arch>, with the --format's suffix)")
    group.add_argument("--format", choices=EXPORT_FORMATS, default=None,
                       help="onnx: an ONNX file; pt2: an AOTInductor package, the model compiled ahead of time "
                       "for --device, run by classify.py --weights M.pt2 (default: --output's suffix, else onnx)")
    group.add_argument("-b", "--batch-size", metavar="N", type=positive_int, default=None,
                       help="the images the export is traced and checked on; its batch stays free, so this "
                       "sizes only the example (at least 2: torch.export fixes a batch of 1); with "
                       "--no-dynamic-batch the graph's fixed batch (default: 2, or 1 with --no-dynamic-batch)")
    group.add_argument("--dynamic-batch", action=argparse.BooleanOptionalAction, default=True,
                       help="leave the batch dimension free (named 'batch'), checked at batch 1 and at -b; "
                       "--no-dynamic-batch fixes it to -b (ONNX only; not with --quantize int8 or "
                       "--triton-repository) (default: free)")
    group.add_argument("--opset", metavar="N", type=positive_int, default=None,
                       help=f"ONNX opset version; below {ONNX_OPSET} the TorchScript-based exporter, which torch "
                       f"deprecates, writes the file (default: {ONNX_OPSET})")
    group.add_argument("--device", choices=("cpu", "cuda"), default=None,
                       help="--format pt2: what the package is compiled for, and runs on (default: cpu)")
    add_int8_arguments(group, "write the model after")
    triton = parser.add_argument_group("Triton Inference Server")
    triton.add_argument("--triton-repository", metavar="DIR", default=None,
                        help="write a model of Triton's model repository instead of --output: DIR/NAME/config.pbtxt "
                        "(ONNX Runtime backend, batch dimension left to Triton, dynamic batching), "
                        "DIR/NAME/1/model.onnx and DIR/NAME/labels.txt (the class names)")
    triton.add_argument("--model-name", metavar="NAME", default=None,
                        help="--triton-repository: the model's name (default: the architecture, with _int8 "
                        "under --quantize int8)")
    triton.add_argument("--max-batch-size", metavar="N", type=max_batch_size, default=None,
                        help=f"--triton-repository: the largest batch Triton forms (default: {DEFAULT_MAX_BATCH_SIZE})")
    return parser


def pack_parser(prog: str = "python -m image_classification.data.pack") -> argparse.ArgumentParser:
    """``prog``: the command's name in usage lines (``ic-pack`` installed)."""
    parser = UserErrorParser(prog=prog, description="Pack an ImageFolder into WebDataset shards that training "
                             "reads as it reads the folder.")
    parser.add_argument("source", metavar="SRC",
                        help="the ImageFolder: SRC/train/<class>/<image>, SRC/val/<class>/<image>")
    parser.add_argument("destination", metavar="DST", help="where the shards go: DST/train/, DST/val/")
    parser.add_argument("--shard-size", default="1GB", metavar="SIZE",
                        help="about how large a shard grows, e.g. 64KB, 500MB, 1GB (default: 1GB)")
    parser.add_argument("-j", "--workers", type=positive_int, default=8,
                        help="threads reading the images (default: 8)")
    parser.add_argument("--max-size", metavar="S", type=positive_int, default=None,
                        help="store each image whose longer side is above S px resized to S px on that side (in "
                        "proportion, antialiased) and encoded as a JPEG; smaller images keep their bytes "
                        "(default: every image as it is)")
    parser.add_argument("--quality", metavar="Q", type=positive_int, default=None,
                        help="--max-size: the JPEG quality of the resized images, 1-100 (default: 90)")
    return parser
