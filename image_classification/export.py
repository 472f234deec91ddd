"""Getting a trained model out: ``checkpoint2model.py`` (training checkpoint -> plain weights) and
``model2onnx.py`` (weights -> ONNX, checked against PyTorch with onnxruntime).
"""

from __future__ import annotations

import argparse
import inspect
import os
import warnings
from pathlib import Path
from typing import Sequence

import torch
from torch import nn

from .checkpoint import load_checkpoint, save_weights
from .errors import UserError
from .inference import load_model, warn
from .integrity import recorded_description
from .models.weights import checked_arch, extract_state_dict, recorded_num_classes
from .onnx_runtime import ONNX_TOLERANCE, logit_limit, require_onnxruntime
from .signals import stop_raises
from .tool_arguments import checkpoint2model_parser, model2onnx_parser


# ------------------------------------------------------------------------------------------------
# checkpoint2model.py
# ------------------------------------------------------------------------------------------------
def checkpoint_weights(checkpoint: dict, ema: bool, source: str) -> dict[str, torch.Tensor]:
    """The model (or, with ``ema``, the EMA) weights of a training checkpoint, in the native layout."""
    key = "state_dict_ema" if ema else "state_dict"
    weights = checkpoint.get(key)
    if weights is None:
        if ema:
            raise UserError(f"{source} holds no EMA weights (no 'state_dict_ema'): it was trained without "
                            "--use-ema; leave out --ema to extract the model weights")
        raise UserError(f"{source} has no '{key}' entry")
    if not isinstance(weights, dict):
        raise UserError(f"{source}: '{key}' is a {type(weights).__name__}, not a state dict")
    return extract_state_dict(weights)


def checkpoint2model_main(argv: Sequence[str] | None = None) -> int:
    """checkpoint2model.py's job from its command line; returns the exit code."""
    return checkpoint2model(checkpoint2model_parser().parse_args(argv))


def checkpoint2model(args: argparse.Namespace) -> int:
    """Write the weights of the checkpoint that checkpoint2model.py's parsed arguments name."""
    source, target = Path(args.checkpoint_path), Path(args.weight_path)
    if target.exists() and source.exists() and target.resolve() == source.resolve():
        raise UserError("--weight-path is the checkpoint itself; choose another file")
    if target.is_dir():
        raise UserError(f"--weight-path {target} is a folder; give a file name")
    checkpoint = load_checkpoint(source)
    weights = checkpoint_weights(checkpoint, args.ema, str(source))
    best = checkpoint.get("best_prec1")
    best_text = f"{best:.2f}%" if isinstance(best, (int, float)) else "not recorded"
    arch = checked_arch(checkpoint, None, str(source)) or "unrecorded architecture"
    classes = recorded_num_classes(checkpoint)
    classes_text = "class count not recorded" if classes is None else f"{classes} classes"
    print(f"Loaded checkpoint {source}: {arch}, {classes_text}, epoch {checkpoint['epoch']}, "
          f"best top1 {best_text}")
    save_weights(weights, recorded_description(checkpoint), target)
    kind = "EMA weights" if args.ema else "model weights"
    print(f"Saved the {kind} ({len(weights)} tensors) to {target}")
    return 0


# ------------------------------------------------------------------------------------------------
# model2onnx.py
# ------------------------------------------------------------------------------------------------
def export_onnx(model: nn.Module, example: torch.Tensor, path: str | os.PathLike, *, dynamic_batch: bool,
                opset: int) -> None:
    """Write ``model`` as ONNX with the TorchScript-based exporter: one self-contained file, no network,
    the same call on torch 2.4 (where it is the default) and on later versions (``dynamo=False``)."""
    kwargs = {"input_names": ["input"], "output_names": ["output"], "opset_version": opset,
              "do_constant_folding": True}
    if dynamic_batch:
        kwargs["dynamic_axes"] = {"input": {0: "batch"}, "output": {0: "batch"}}
    if "dynamo" in inspect.signature(torch.onnx.export).parameters:
        kwargs["dynamo"] = False
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # torch >= 2.9 calls this exporter legacy
        warnings.simplefilter("ignore", FutureWarning)
        torch.onnx.export(model, (example,), str(path), **kwargs)


def onnx_max_difference(path: str | os.PathLike, model: nn.Module,
                        inputs: Sequence[torch.Tensor]) -> tuple[float, float]:
    """Check the file with the ONNX checker, run it with onnxruntime on the CPU and return the largest
    absolute difference from PyTorch's FP32 outputs over ``inputs``, and the largest absolute logit."""
    import onnx
    import onnxruntime

    onnx.checker.check_model(str(path))
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    worst = scale = 0.0
    with torch.no_grad():
        for batch in inputs:
            expected = model(batch).numpy()
            (got,) = session.run(["output"], {"input": batch.numpy()})
            if got.shape != expected.shape:
                raise RuntimeError(f"ONNX output shape {got.shape} differs from PyTorch's {expected.shape}")
            worst = max(worst, float(abs(got - expected).max()))
            scale = max(scale, float(abs(expected).max()))
    return worst, scale


def default_onnx_path(weights: str | None, arch: str) -> Path:
    """``w.pth.tar`` / ``w.pth`` / ``w.pt`` -> ``w.onnx`` beside it; ``<arch>.onnx`` without weights."""
    if not weights:
        return Path(f"{arch}.onnx")
    path = Path(weights)
    name = path.name
    for suffix in (".pth.tar", ".pth", ".pt", ".tar"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
            break
    return path.with_name(name + ".onnx")


def model2onnx_main(argv: Sequence[str] | None = None) -> int:
    """model2onnx.py's job from its command line; returns the exit code."""
    return model2onnx(model2onnx_parser().parse_args(argv))


def model2onnx(args: argparse.Namespace) -> int:
    """Export and check the model that model2onnx.py's parsed arguments describe."""
    require_onnxruntime("model2onnx")
    if not args.weights and not args.pretrained:
        warn(f"warning: no --weights given: exporting {args.arch or 'resnet50'} with random weights")
    loaded = load_model(args.arch, args.weights, args.num_classes, args.model_config, args.pretrained)
    model = loaded.model.float().eval()
    size = loaded.resolve_preprocessing(args.image_size).image_size
    output = Path(args.output) if args.output else default_onnx_path(args.weights, loaded.arch)
    if output.is_dir():
        raise UserError(f"--output {output} is a folder; give a file name")
    output.parent.mkdir(parents=True, exist_ok=True)

    generator = torch.Generator().manual_seed(0)
    example = torch.randn(args.batch_size, 3, size, size, generator=generator)
    checks = [example]
    if args.dynamic_batch:  # prove the batch dimension really is free
        checks.append(torch.randn(args.batch_size + 1, 3, size, size, generator=generator))

    tmp = output.with_name(f".{output.name}.{os.getpid()}.tmp")  # renamed into place once it passed the check
    with stop_raises("exporting the model to ONNX", f"{output} was not written"):  # exit 75, tmp removed
        try:
            print(f"Exporting {loaded.arch} ({loaded.num_classes} classes) at {size}x{size}, batch "
                  f"{'dynamic' if args.dynamic_batch else args.batch_size}, opset {args.opset}", flush=True)
            export_onnx(model, example, tmp, dynamic_batch=args.dynamic_batch, opset=args.opset)
            difference, scale = onnx_max_difference(tmp, model, checks)
            limit = logit_limit(ONNX_TOLERANCE, scale)
            print(f"onnxruntime vs PyTorch, max abs difference of the logits: {difference:.3g} "
                  f"(limit {limit:.3g}; largest logit {scale:.3g})", flush=True)
            if not difference < limit:
                warn(f"error: the ONNX model's outputs differ from PyTorch's by {difference:.3g} (limit "
                     f"{limit:.3g}, 1e-3 of the largest logit {scale:.3g} or 1e-3 below 1); {output} was not written")
                return 1
            os.replace(tmp, output)
        finally:
            tmp.unlink(missing_ok=True)
    print(f"Saved {output}")
    return 0
