"""Getting a trained model out: ``checkpoint2model.py`` (training checkpoint -> plain weights) and
``model2onnx.py`` (weights -> ONNX through torch.export, FP32 or int8, checked against PyTorch with onnxruntime,
a file or a model of Triton's model repository; or an AOTInductor package, checked against PyTorch).  Both
carry the model's architecture, class names and preprocessing (:func:`.torch_export.deployed_record`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np
import torch
from torch import nn

from ..arguments.tools import (DEFAULT_MAX_BATCH_SIZE, ONNX_OPSET, check_int8_flags, checkpoint2model_parser,
                               model2onnx_parser)
from ..errors import UserError, write_failure
from ..models.weights import checked_arch, extract_state_dict, recorded_num_classes
from ..records.checkpoint import load_checkpoint, position_text, save_weights
from ..records.datafile import folder_problem
from ..records.integrity import recorded_description
from ..records.scratch import scratch_folder
from ..system.signals import stop_raises
from .aoti import PACKAGE_SUFFIX, PACKAGE_TOLERANCE, AotiModel, compile_problem, write_package
from .inference import LoadedModel, calibrate, class_names_for, load_model, warn
from ..models.quantized import is_quantized
from .onnx_runtime import INT8, QAT, export_ready, kind_of, logit_limit, require_finite, require_onnxruntime
from .quantization import Quantization, int8_request, quantize
from .torch_export import RECORD_KEY, deployed_record, export_onnx, traced_batch
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
    """How an exported model's logits compare with PyTorch's FP32 ones over some batches."""

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
    run = lambda batch: session.run(["output"], {"input": batch.numpy()})[0]  # noqa: E731
    return [agreement(run, model, batches) for batches in inputs]


def agreement(run, model: nn.Module, inputs: Sequence[torch.Tensor]) -> Agreement:
    """How ``run`` (a batch -> its logits as an array) follows ``model`` on the batches ``inputs``."""
    found = Agreement()
    with torch.no_grad():
        for batch in inputs:
            expected = model(batch).numpy()
            require_finite(expected, f"{len(batch)} check images")
            got = np.asarray(run(batch))
            if got.shape != expected.shape:
                raise RuntimeError(f"the exported model's output shape {got.shape} differs from PyTorch's "
                                   f"{expected.shape}")
            # a NaN or inf from the graph is the largest difference there is (max() would pass over a NaN)
            difference = float(np.abs(got - expected).max()) if np.isfinite(got).all() else float("inf")
            found.max_difference = max(found.max_difference, difference)
            found.scale = max(found.scale, float(np.abs(expected).max()))
            found.agreeing += int((got.argmax(1) == expected.argmax(1)).sum())
            found.images += len(expected)
    return found


def default_onnx_path(weights: str | None, arch: str, suffix: str = "", extension: str = ".onnx") -> Path:
    """``w.pth.tar`` / ``w.pth`` / ``w.pt`` -> ``w.onnx`` beside it; ``<arch>.onnx`` without weights;
    ``suffix`` (``_int8``) before ``extension`` (``.onnx``, ``.pt2``)."""
    if not weights:
        return Path(f"{arch}{suffix}{extension}")
    path = Path(weights)
    name = path.name
    for ending in (".pth.tar", ".pth", ".pt", ".tar"):
        if name.endswith(ending):
            name = name[: -len(ending)]
            break
    return path.with_name(name + suffix + extension)


def model2onnx_main(argv: Sequence[str] | None = None) -> int:
    """model2onnx.py's job from its command line; returns the exit code."""
    return model2onnx(model2onnx_parser().parse_args(argv))


def export_format(args: argparse.Namespace) -> str:
    """``onnx`` or ``pt2``: --format where given, else --output's suffix, else onnx; a contradiction, or a flag that
    only the other format takes, is one line."""
    suffix = Path(args.output).suffix.lower() if args.output else ""
    chosen = args.format or ("pt2" if suffix == PACKAGE_SUFFIX else "onnx")
    if args.output and suffix != f".{chosen}" and (args.format or suffix == ".onnx"):
        what = "an ONNX file" if chosen == "onnx" else "a .pt2 package"
        raise UserError(f"--output {args.output} is not named as {what} (--format {chosen}): name it M.{chosen}")
    if chosen == "onnx":
        if args.device is not None:
            raise UserError("--device picks what a .pt2 package is compiled for; an ONNX file runs anywhere: leave "
                            "it out, or write M.pt2")
        return chosen
    given = [flag for flag, value in (("--quantize", args.quantize), ("--triton-repository", args.triton_repository),
                                      ("--opset", args.opset), ("--no-dynamic-batch", not args.dynamic_batch))
             if value]
    if given:
        raise UserError(f"{given[0]} is for ONNX files; a .pt2 package is compiled as it is, its batch free: leave "
                        f"out {given[0]}, or write M.onnx")
    return chosen


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


def _dynamic_batch(args: argparse.Namespace) -> bool:
    """Whether the graph's batch stays free: the default; Triton's batching and int8's calibration need it."""
    if not args.dynamic_batch:
        needing = "--triton-repository" if args.triton_repository is not None else \
            "--quantize int8" if args.quantize else None
        if needing:
            raise UserError(f"{needing} needs the batch dimension free: leave out --no-dynamic-batch")
    return args.dynamic_batch


@dataclass
class Destination:
    """Where model2onnx.py writes: ``output`` (the ONNX file or package, or the Triton model's graph), ``folder``
    (the folder it goes into, where the export's scratch folder lies) and ``what`` (the output, in a user's
    words)."""

    output: Path
    folder: Path
    what: str
    model_name: str | None = None  # of a Triton model
    class_names: Sequence[str] = ()  # of a Triton model: labels.txt


def destination(args: argparse.Namespace, loaded: LoadedModel, extension: str = ".onnx") -> Destination:
    """Where the parsed arguments write ``loaded``'s export; one line, before any work, where it cannot be
    written there (a folder in its place or on its path, a read-only folder, a Triton model already there)."""
    int8 = "_int8" if args.quantize else ""
    if args.triton_repository is not None:
        name = args.model_name or f"{loaded.arch}{int8}"
        folder = check_free(args.triton_repository, name)
        found = Destination(folder / "1" / "model.onnx", Path(args.triton_repository), f"the Triton model {folder}",
                            name, class_names_for(loaded.num_classes, None, loaded.class_names))
    else:
        output = Path(args.output) if args.output else default_onnx_path(args.weights, loaded.arch, int8, extension)
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
    package = export_format(args) == "pt2"
    device = torch.device(args.device or "cpu")
    if package and (problem := compile_problem(device)):
        raise UserError(f"cannot compile a .pt2 package: {problem}")
    if not package:
        require_onnxruntime("model2onnx")
    check_int8_flags(args, needs_runtime=False)
    _check_triton_flags(args)
    dynamic = _dynamic_batch(args)
    if not args.weights and not args.pretrained:
        warn(f"warning: no --weights given: exporting {args.arch or 'resnet50'} with random weights")
    loaded = load_model(args.arch, args.weights, args.num_classes, args.model_config, args.pretrained)
    preprocessing = loaded.resolve_preprocessing(args.image_size)
    if package and is_quantized(loaded.model):
        raise UserError(f"'{args.weights}' was trained quantization-aware: its int8 model is an ONNX file (write "
                        "M.onnx); a .pt2 package would run the fake-quantized float model")
    model = export_ready(loaded.model, preprocessing.image_size, bool(args.quantize))
    target = destination(args, loaded, PACKAGE_SUFFIX if package else ".onnx")
    record = deployed_record(loaded.arch, class_names_for(loaded.num_classes, None, loaded.class_names),
                             preprocessing)
    generator = torch.Generator().manual_seed(0)
    size = preprocessing.image_size
    example = torch.randn(traced_batch(args.batch_size or 1, dynamic), 3, size, size, generator=generator)
    checks = [example, example[:1]] if dynamic else [example]  # batch N and batch 1: the batch really is free
    if package:
        return _write_package(model, loaded, record, size, target, checks, device)
    return _write_onnx(args, model, loaded, record, target, checks, preprocessing)


def _write_onnx(args: argparse.Namespace, model: nn.Module, loaded: LoadedModel, record: dict, target: Destination,
                checks: list[torch.Tensor], preprocessing) -> int:
    """The ONNX half of :func:`model2onnx`: export, check against PyTorch, quantize where asked, write."""
    triton = target.model_name is not None
    request = int8_request(args)
    quantization = calibrate(request, preprocessing) if request is not None else None
    dynamic, opset, output = len(checks) > 1, args.opset or ONNX_OPSET, target.output
    size = preprocessing.image_size
    with stop_raises("exporting the model to ONNX", f"{output} was not written"), \
            export_scratch(target) as scratch:  # exit 75 on a stop signal, the scratch folder removed
        kind = kind_of(None, model)
        trained = ", int8 as trained quantization-aware" if kind is QAT else ""
        print(f"Exporting {loaded.arch} ({loaded.num_classes} classes) at {size}x{size}, batch "
              f"{'dynamic' if dynamic else len(checks[0])}, opset {opset}{trained}", flush=True)
        written = scratch / "model.onnx"
        exporter = export_onnx(model, checks[0], written, dynamic_batch=dynamic, opset=opset, log=warn)
        (found,) = onnx_agreement(written, model, checks)
        limit = logit_limit(kind.tolerance, found.scale, kind.floor)
        sizes = " and ".join(str(len(batch)) for batch in checks)
        print(f"onnxruntime vs PyTorch, max abs difference of the logits at batch {sizes}: {found.max_difference:.3g}"
              f" (limit {limit:.3g}; largest logit {found.scale:.3g}; exported through {exporter})", flush=True)
        if not found.max_difference < limit:
            warn(f"error: the ONNX model's outputs differ from PyTorch's by {found.max_difference:.3g} (limit "
                 f"{limit:.3g}, {kind.tolerance:g} of the largest logit {found.scale:.3g} or {kind.tolerance:g} "
                 f"below {kind.floor:g}); {output} was not written")
            return 1
        if quantization is not None:
            quantize(written, scratch / "int8.onnx", quantization, scratch)
            written = scratch / "int8.onnx"
            if not _int8_is_close(written, model, quantization, output):
                return 1
        add_metadata(written, record)
        if triton:
            saved = write_model(args.triton_repository, target.model_name, written.read_bytes(),
                                args.max_batch_size or DEFAULT_MAX_BATCH_SIZE, target.class_names, scratch)
            print(f"Saved the Triton model {target.model_name} in {saved}: config.pbtxt, 1/model.onnx, labels.txt "
                  f"({len(target.class_names)} classes)")
            return 0
        os.replace(written, output)
    print(f"Saved {output}")
    return 0


def add_metadata(path: Path, record: dict) -> None:
    """Put ``record`` (:func:`.torch_export.deployed_record`) into the ONNX file's metadata_props, as JSON under
    :data:`.torch_export.RECORD_KEY`."""
    import onnx

    graph = onnx.load(str(path))
    kept = [(entry.key, entry.value) for entry in graph.metadata_props if entry.key != RECORD_KEY]
    onnx.helper.set_model_props(graph, {**dict(kept), RECORD_KEY: json.dumps(record)})
    onnx.save(graph, str(path))


def _write_package(model: nn.Module, loaded: LoadedModel, record: dict, size: int, target: Destination,
                   checks: list[torch.Tensor], device: torch.device) -> int:
    """The .pt2 half of :func:`model2onnx`: compile, check against PyTorch at batch N and 1, write."""
    output = target.output
    with stop_raises("compiling the model into a .pt2 package", f"{output} was not written"), \
            export_scratch(target) as scratch:
        print(f"Compiling {loaded.arch} ({loaded.num_classes} classes) at {size}x{size}, batch dynamic, into an "
              f"AOTInductor package for {device.type} (tens of seconds to minutes)", flush=True)
        written = scratch / f"model{PACKAGE_SUFFIX}"
        write_package(model, size, written, device, record, len(checks[0]))
        package = AotiModel(written)  # proven on the probe image
        found = agreement(lambda batch: package(batch).numpy(), model, checks)
        limit = logit_limit(PACKAGE_TOLERANCE[device.type], found.scale)
        print(f"the package vs PyTorch, max abs difference of the logits at batch "
              f"{' and '.join(str(len(batch)) for batch in checks)}: {found.max_difference:.3g} (limit {limit:.3g}; "
              f"largest logit {found.scale:.3g})", flush=True)
        if not found.max_difference < limit:
            warn(f"error: the package's outputs differ from PyTorch's by {found.max_difference:.3g} (limit "
                 f"{limit:.3g}); {output} was not written")
            return 1
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
