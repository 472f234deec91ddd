"""Getting a trained model out: ``checkpoint2model.py`` (training checkpoint -> plain weights) and
``model2onnx.py`` (weights -> ONNX, FP32 or int8, checked against PyTorch with onnxruntime; a file, or a model
of Triton's model repository).
"""

from __future__ import annotations

import argparse
import contextlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np
import torch
from torch import nn

from ..arguments.tools import DEFAULT_MAX_BATCH_SIZE, check_int8_flags, checkpoint2model_parser, model2onnx_parser
from ..errors import UserError, write_failure
from ..models.weights import checked_arch, extract_state_dict, recorded_num_classes
from ..records.checkpoint import load_checkpoint, position_text, save_weights
from ..records.datafile import folder_problem
from ..records.integrity import recorded_description
from ..records.scratch import scratch_folder
from ..system.signals import stop_raises
from .inference import LoadedModel, calibrate, class_names_for, load_model, warn
from .onnx_runtime import INT8, ONNX_TOLERANCE, export_onnx, logit_limit, require_finite, require_onnxruntime
from .quantization import Quantization, int8_request, quantize
from .triton_repository import check_free, check_model_name, write_model


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
    epoch, batch = checkpoint.get("epoch"), checkpoint.get("batch", 0)
    counts = all(isinstance(value, int) and not isinstance(value, bool) for value in (epoch, batch))
    where = position_text(epoch, batch) if counts else f"epoch {str(epoch)[:40]}"
    print(f"Loaded checkpoint {source}: {arch}, {classes_text}, {where}, best top1 {best_text}")
    save_weights(weights, recorded_description(checkpoint), target)
    kind = "EMA weights" if args.ema else "model weights"
    print(f"Saved the {kind} ({len(weights)} tensors) to {target}")
    return 0


# ------------------------------------------------------------------------------------------------
# model2onnx.py
# ------------------------------------------------------------------------------------------------
@dataclass
class Agreement:
    """How an ONNX graph's logits compare with PyTorch's FP32 ones over some batches."""

    max_difference: float = 0.0  # the largest absolute logit difference
    scale: float = 0.0  # the largest absolute PyTorch logit
    agreeing: int = 0  # images whose top-1 class is PyTorch's
    images: int = 0


def onnx_agreement(path: str | os.PathLike, model: nn.Module, *inputs: Sequence[torch.Tensor]) -> list[Agreement]:
    """Check the file with the ONNX checker, run it with onnxruntime on the CPU and compare its outputs with
    PyTorch's FP32 ones: an :class:`Agreement` for each sequence of batches in ``inputs``, from one session."""
    import onnx
    import onnxruntime

    onnx.checker.check_model(str(path))
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return [_agreement(session, model, batches) for batches in inputs]


def _agreement(session, model: nn.Module, inputs: Sequence[torch.Tensor]) -> Agreement:
    found = Agreement()
    with torch.no_grad():
        for batch in inputs:
            expected = model(batch).numpy()
            require_finite(expected, f"{len(batch)} check images")
            (got,) = session.run(["output"], {"input": batch.numpy()})
            if got.shape != expected.shape:
                raise RuntimeError(f"ONNX output shape {got.shape} differs from PyTorch's {expected.shape}")
            # a NaN or inf from the graph is the largest difference there is (max() would pass over a NaN)
            difference = float(np.abs(got - expected).max()) if np.isfinite(got).all() else float("inf")
            found.max_difference = max(found.max_difference, difference)
            found.scale = max(found.scale, float(np.abs(expected).max()))
            found.agreeing += int((got.argmax(1) == expected.argmax(1)).sum())
            found.images += len(expected)
    return found


def default_onnx_path(weights: str | None, arch: str, suffix: str = "") -> Path:
    """``w.pth.tar`` / ``w.pth`` / ``w.pt`` -> ``w.onnx`` beside it; ``<arch>.onnx`` without weights;
    ``suffix`` (``_int8``) before ``.onnx``."""
    if not weights:
        return Path(f"{arch}{suffix}.onnx")
    path = Path(weights)
    name = path.name
    for ending in (".pth.tar", ".pth", ".pt", ".tar"):
        if name.endswith(ending):
            name = name[: -len(ending)]
            break
    return path.with_name(name + suffix + ".onnx")


def model2onnx_main(argv: Sequence[str] | None = None) -> int:
    """model2onnx.py's job from its command line; returns the exit code."""
    return model2onnx(model2onnx_parser().parse_args(argv))


def _check_triton_flags(args: argparse.Namespace) -> None:
    """--model-name and --max-batch-size tune --triton-repository, which takes the place of --output."""
    if args.triton_repository is None:
        given = [flag for flag, value in (("--model-name", args.model_name),
                                          ("--max-batch-size", args.max_batch_size)) if value is not None]
        if given:
            raise UserError(f"{given[0]} describes a model of Triton's model repository: it needs "
                            "--triton-repository DIR")
        return
    if args.output is not None:
        raise UserError("--triton-repository writes the model into DIR/NAME/1/model.onnx: leave out --output")
    if args.model_name is not None:
        check_model_name(args.model_name)


@dataclass
class Destination:
    """Where model2onnx.py writes: ``output`` (the ONNX file, or the Triton model's graph), ``folder`` (the folder
    it goes into, where the export's scratch folder lies) and ``what`` (the output, in a user's words)."""

    output: Path
    folder: Path
    what: str
    model_name: str | None = None  # of a Triton model
    class_names: Sequence[str] = ()  # of a Triton model: labels.txt


def destination(args: argparse.Namespace, loaded: LoadedModel) -> Destination:
    """Where the parsed arguments write ``loaded``'s export; one line, before any work, where it cannot be
    written there (a folder in its place or on its path, a read-only folder, a Triton model already there)."""
    int8 = "_int8" if args.quantize else ""
    if args.triton_repository is not None:
        name = args.model_name or f"{loaded.arch}{int8}"
        folder = check_free(args.triton_repository, name)
        found = Destination(folder / "1" / "model.onnx", Path(args.triton_repository), f"the Triton model {folder}",
                            name, class_names_for(loaded.num_classes, None, loaded.class_names))
    else:
        output = Path(args.output) if args.output else default_onnx_path(args.weights, loaded.arch, int8)
        if output.is_dir():
            raise UserError(f"--output {output} is a folder; give a file name")
        found = Destination(output, output.parent, str(output))
    problem = folder_problem(found.folder)
    if problem is not None:
        raise UserError(f"{found.what} {problem}")
    return found


@contextlib.contextmanager
def export_scratch(target: Destination) -> Iterator[Path]:
    """The export's scratch folder beside its output (:mod:`..records.scratch`; what killed exports left there is
    removed first), the output's folder made where missing.  A failed write in the block is one line: exit code 2
    where the folder cannot be written (read-only, no permission), 4 otherwise (a full disk)."""
    try:
        target.folder.mkdir(parents=True, exist_ok=True)
        with scratch_folder(target.folder, target.model_name or target.output.name) as scratch:
            yield scratch
    except OSError as error:
        raise write_failure(target.what, error, "nothing was written") from None


def model2onnx(args: argparse.Namespace) -> int:
    """Export and check the model that model2onnx.py's parsed arguments describe."""
    require_onnxruntime("model2onnx")
    check_int8_flags(args, needs_runtime=False)
    _check_triton_flags(args)
    if not args.weights and not args.pretrained:
        warn(f"warning: no --weights given: exporting {args.arch or 'resnet50'} with random weights")
    loaded = load_model(args.arch, args.weights, args.num_classes, args.model_config, args.pretrained)
    model = loaded.model.float().eval()
    preprocessing = loaded.resolve_preprocessing(args.image_size)
    size = preprocessing.image_size
    target = destination(args, loaded)
    triton = target.model_name is not None
    request = int8_request(args)
    quantization = calibrate(request, preprocessing) if request is not None else None
    dynamic = args.dynamic_batch or triton or quantization is not None  # Triton batches, calibration too

    generator = torch.Generator().manual_seed(0)
    example = torch.randn(args.batch_size, 3, size, size, generator=generator)
    checks = [example]
    if dynamic:  # prove the batch dimension really is free
        checks.append(torch.randn(args.batch_size + 1, 3, size, size, generator=generator))

    output = target.output
    with stop_raises("exporting the model to ONNX", f"{output} was not written"), \
            export_scratch(target) as scratch:  # exit 75 on a stop signal, the scratch folder removed
        print(f"Exporting {loaded.arch} ({loaded.num_classes} classes) at {size}x{size}, batch "
              f"{'dynamic' if dynamic else args.batch_size}, opset {args.opset}", flush=True)
        written = scratch / "model.onnx"
        export_onnx(model, example, written, dynamic_batch=dynamic, opset=args.opset)
        (found,) = onnx_agreement(written, model, checks)
        limit = logit_limit(ONNX_TOLERANCE, found.scale)
        print(f"onnxruntime vs PyTorch, max abs difference of the logits: {found.max_difference:.3g} "
              f"(limit {limit:.3g}; largest logit {found.scale:.3g})", flush=True)
        if not found.max_difference < limit:
            warn(f"error: the ONNX model's outputs differ from PyTorch's by {found.max_difference:.3g} (limit "
                 f"{limit:.3g}, 1e-3 of the largest logit {found.scale:.3g} or 1e-3 below 1); {output} was not "
                 "written")
            return 1
        if quantization is not None:
            quantize(written, scratch / "int8.onnx", quantization, scratch)
            written = scratch / "int8.onnx"
            if not _int8_is_close(written, model, quantization, output):
                return 1
        if triton:
            saved = write_model(args.triton_repository, target.model_name, written.read_bytes(),
                                args.max_batch_size or DEFAULT_MAX_BATCH_SIZE, target.class_names, scratch)
            print(f"Saved the Triton model {target.model_name} in {saved}: config.pbtxt, 1/model.onnx, labels.txt "
                  f"({len(target.class_names)} classes)")
            return 0
        os.replace(written, output)
    print(f"Saved {output}")
    return 0


def _int8_is_close(path: Path, model: nn.Module, quantization: Quantization, output: Path) -> bool:
    """Say how the int8 graph's predictions compare with PyTorch's FP32 ones on the calibration images; False
    (said) where those of the first image differ by more than the ONNX cache accepts of an int8 model."""
    images = torch.from_numpy(quantization.images)
    found, probe = onnx_agreement(path, model, [images[start:start + 32] for start in range(0, len(images), 32)],
                                  [quantization.probe()])
    limit = logit_limit(INT8.tolerance, probe.scale, INT8.floor)
    print(f"int8 vs PyTorch FP32 on the {found.images} calibration images: top-1 agreement "
          f"{100 * found.agreeing / found.images:.1f}%, max abs difference of the logits {found.max_difference:.3g} "
          f"(largest logit {found.scale:.3g}); on the first image {probe.max_difference:.3g} (limit {limit:.3g})",
          flush=True)
    if probe.max_difference > limit:
        warn(f"error: the int8 model's logits on the first calibration image differ from PyTorch's by "
             f"{probe.max_difference:.3g} (limit {limit:.3g}, {INT8.tolerance:g} of the largest logit); {output} "
             "was not written; try another --calibration-method, or leave out --quantize")
        return False
    return True
