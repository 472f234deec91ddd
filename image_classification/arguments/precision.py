"""The ``precision and device`` group: where the run goes, in which precision and memory layout, and how long
the processes of a distributed run wait for each other."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from ..system.cli import positive_float
from ..system.gpu_affinity import MODES as GPU_AFFINITY_MODES
from ..system.host import scales_loss
from .values import MAX_WAIT_S, add_group, flag, float32, raise_first


DEFAULT_LOSS_SCALE = 2.0**16  # where a dynamic fp16 loss scale starts unless told (torch's GradScaler default)


@dataclass(frozen=True)
class PrecisionConfig:
    """The ``precision and device`` group: where the run goes, in which precision and memory layout, and how long
    the processes of a distributed run wait for each other.  What these come to on a machine is the runtime's
    decision (:mod:`..system.host`); the loss scale :meth:`choose_loss_scale`'s, which the run records in
    ``loss_scale`` and ``loss_scale_adapts``."""

    device: str = flag("--device", default="auto", choices=("auto", "cpu", "cuda"),
                       help="where to run; auto takes CUDA when present (default: auto)")
    amp: bool = flag("--amp", action="store_true",
                     help="Run model AMP (automatic mixed precision) mode: fp16 with loss scaling on CUDA, bf16 on CPU")
    amp_dtype: str | None = flag("--amp-dtype", choices=("float16", "bfloat16"),
                                 help="autocast type under --amp (default: float16 on CUDA, bfloat16 on CPU)")
    static_loss_scale: float | None = flag("--static-loss-scale", metavar="S", type=float32,
                                           help="Static loss scale, positive power of 2 values can improve amp "
                                           "convergence. Alone it fixes the fp16 scale at S (default: none: fp16 "
                                           "--amp scales dynamically from 65536)")
    dynamic_loss_scale: bool = flag("--dynamic-loss-scale", action="store_true",
                                    help="Use dynamic loss scaling, starting at --static-loss-scale: doubled after 100 "
                                    "steps without overflow, halved on overflow. If supplied, this argument "
                                    "supersedes --static-loss-scale.")
    tf32: bool = flag("--tf32", default=True, action=argparse.BooleanOptionalAction,
                      help="allow TF32 matmuls and convolutions on CUDA; --no-tf32 makes FP32 really FP32 "
                      "(default: on)")
    memory_format: str = flag("--memory-format", default="auto", choices=("auto", "nchw", "nhwc"),
                              help="memory layout, nchw or nhwc; auto: nhwc (channels-last) under --amp on CUDA and, "
                              "on a CPU with AVX512 kernels, where they train faster so, for the bottleneck models "
                              "(ResNet-50 and deeper, ResNeXt, SE-ResNeXt) and the EfficientNets; else nchw, the "
                              "reference's (default: auto)")
    gpu_affinity: str = flag("--gpu-affinity", default="none", choices=GPU_AFFINITY_MODES,
                             help="pin each process to the CPU cores near its GPU (default: none)")
    dist_timeout: float = flag("--dist-timeout", default=300.0, metavar="SECONDS", type=positive_float,
                               help="a process that waits longer than this for the others of a distributed run "
                               "(one is gone or hung) stops with one line and exit code 5; raise it when saving "
                               "a checkpoint takes longer; from 1 second to a year (default: 300)")

    loss_scale: float = DEFAULT_LOSS_SCALE  # fp16 only: the scale, or where a dynamic one starts (choose_loss_scale)
    loss_scale_adapts: bool = True

    def choose_loss_scale(self, amp_dtype: str | None) -> tuple[float, bool, str | None]:
        """(initial scale, dynamic?, a notice or None) for a run in autocast ``amp_dtype``.

        fp16 gradients underflow without a loss scale, so fp16 always scales, dynamically unless the user fixes
        the scale: ``--static-loss-scale S`` alone keeps S; with ``--dynamic-loss-scale`` S is only the start.  bf16
        and fp32 runs take no scale at all, and a scale flag there is ignored aloud."""
        if not scales_loss(amp_dtype):
            if self.static_loss_scale is None and not self.dynamic_loss_scale:
                return DEFAULT_LOSS_SCALE, True, None
            why = "without --amp" if amp_dtype is None else "under bf16 autocast, which needs no loss scaling"
            return DEFAULT_LOSS_SCALE, True, f"=> --static-loss-scale / --dynamic-loss-scale are ignored {why}"
        static = self.static_loss_scale
        if static is not None and not self.dynamic_loss_scale:
            return static, False, (f"=> fp16 loss scale fixed at {static:g} (--static-loss-scale without "
                                   "--dynamic-loss-scale); steps whose gradients overflow are skipped, and the scale "
                                   "never adapts")
        return (DEFAULT_LOSS_SCALE if static is None else static), True, None


def add_precision_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``precision and device`` group."""
    add_group(parser, "precision and device", PrecisionConfig)


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
