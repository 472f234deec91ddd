"""The ``precision and device`` group: where the run goes, in which precision and memory layout, and how long
the processes of a distributed run wait for each other."""

from __future__ import annotations

import argparse

from ..system.cli import positive_float
from ..system.gpu_affinity import MODES as GPU_AFFINITY_MODES
from .values import MAX_WAIT_S, float32, raise_first


def add_precision_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``precision and device`` group."""
    precision = parser.add_argument_group("precision and device")
    precision.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                           help="where to run; auto takes CUDA when present (default: auto)")
    precision.add_argument("--amp", action="store_true",
                           help="Run model AMP (automatic mixed precision) mode: fp16 with loss scaling on "
                           "CUDA, bf16 on CPU")
    precision.add_argument("--amp-dtype", choices=("float16", "bfloat16"), default=None,
                           help="autocast type under --amp (default: float16 on CUDA, bfloat16 on CPU)")
    precision.add_argument("--static-loss-scale", metavar="S", type=float32, default=None,
                           help="Static loss scale, positive power of 2 values can improve amp convergence. "
                           "Alone it fixes the fp16 scale at S (default: none: fp16 --amp scales "
                           "dynamically from 65536)")
    precision.add_argument("--dynamic-loss-scale", action="store_true",
                           help="Use dynamic loss scaling, starting at --static-loss-scale: doubled after 100 "
                           "steps without overflow, halved on overflow. If supplied, this argument supersedes "
                           "--static-loss-scale.")
    precision.add_argument("--tf32", action=argparse.BooleanOptionalAction, default=True,
                           help="allow TF32 matmuls and convolutions on CUDA; --no-tf32 makes FP32 really "
                           "FP32 (default: on)")
    precision.add_argument("--memory-format", choices=("auto", "nchw", "nhwc"), default="auto",
                           help="memory layout, nchw or nhwc; auto: nhwc (channels-last) on the CPU for the "
                           "bottleneck models (ResNet-50 and deeper, ResNeXt, SE-ResNeXt) and the EfficientNets, "
                           "which train faster in it there, else nchw, the reference's (default: auto)")
    precision.add_argument("--gpu-affinity", choices=GPU_AFFINITY_MODES, default="none",
                           help="pin each process to the CPU cores near its GPU (default: none)")
    precision.add_argument("--dist-timeout", metavar="SECONDS", type=positive_float, default=300.0,
                           help="a process that waits longer than this for the others of a distributed run "
                           "(one is gone or hung) stops with one line and exit code 5; raise it when saving "
                           "a checkpoint takes longer; from 1 second to a year (default: 300)")


def check_precision_values(args: argparse.Namespace) -> None:
    """The precision and device flags' ranges that argparse's types do not cover. Raises :class:`UserError`."""
    raise_first((
        (args.static_loss_scale is not None and args.static_loss_scale <= 0,
         f"--static-loss-scale must be positive, got {args.static_loss_scale}"),
        (args.dist_timeout > MAX_WAIT_S,
         f"--dist-timeout must be at most a year ({MAX_WAIT_S:,} seconds), got {args.dist_timeout:g}"),
        (args.dist_timeout < 1,  # shorter, the processes' own start-up or the first save times out
         f"--dist-timeout must be at least 1 second, got {args.dist_timeout:g}"),
    ))
