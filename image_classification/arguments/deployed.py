"""The ``evaluation of the deployed model`` group: --evaluate through ONNX Runtime, in FP32 or int8, or through
an AOTInductor package, as classify.py and model2onnx.py deploy the model."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from ..errors import UserError
from .tools import check_int8_flags, int8_fields
from .values import add_group, flag


_INT8 = int8_fields("with --runtime onnxruntime, validate")


@dataclass(frozen=True)
class DeployConfig:
    """The ``evaluation of the deployed model`` group: what ``--evaluate`` validates, PyTorch's model, its export
    run by ONNX Runtime (in FP32 or int8) or its AOTInductor package, as classify.py and model2onnx.py deploy it."""

    runtime: str = flag("--runtime", default="torch", choices=("torch", "onnxruntime", "aoti"),
                        help="onnxruntime: validate the model exported to ONNX (cached as classify.py caches it) and "
                        "run by ONNX Runtime, through the same validation loop and raport as PyTorch's; on the "
                        "CPU, or on CUDA with onnxruntime-gpu; aoti: validate it compiled into an AOTInductor "
                        "package for the run's device, as model2onnx.py --output M.pt2 writes it (tens of seconds "
                        "to minutes of compiling) (default: torch)")
    quantize: str | None = _INT8["quantize"]
    calibration_data: str | None = _INT8["calibration_data"]
    calibration_images: int | None = _INT8["calibration_images"]
    calibration_method: str | None = _INT8["calibration_method"]


def add_deployed_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``evaluation of the deployed model`` group: --runtime, and the int8 flags shared with classify.py and
    model2onnx.py."""
    add_group(parser, "evaluation of the deployed model (with --evaluate)", DeployConfig)


def check_deployed_combinations(args: argparse.Namespace) -> None:
    """--runtime onnxruntime and aoti validate the exported model as it is: only with --evaluate, and with nothing
    that changes how PyTorch would run the model. Raises :class:`UserError`."""
    check_int8_flags(args, needs_runtime=True)
    if args.runtime == "torch":
        return
    if not args.evaluate:
        raise UserError(f"--runtime {args.runtime} validates an exported model: it needs --evaluate")
    changes = [flag for flag, given in (("--amp", args.amp), ("--jit script", args.jit != "no"),
                                        ("--compile", args.compile)) if given]
    if changes:
        how = "the exported graph as it is (FP32, or int8 with --quantize int8)" if args.runtime == "onnxruntime" \
            else "the compiled package as it is (FP32)"
        raise UserError(f"--runtime {args.runtime} runs {how}; leave out {changes[0]}")
