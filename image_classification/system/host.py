"""The decisions about the machine that every command asks, each made here once: whether CUDA is used, what
``--amp`` means on this device, whether a precision scales its loss, and which layout ``--memory-format
auto`` takes.  :func:`~image_classification.system.runtime.make_runtime` follows them for a run, ``launch.py
--dry-run`` to say what a run would do, classify.py, export and the loaders to pick a device.

torch is imported only to ask whether CUDA is there (:func:`.machine.cuda_available`, which asks NVIDIA's driver
first), so ``launch.py --dry-run`` on a machine without a GPU imports none.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import UserError
from . import machine

DEVICES = ("auto", "cpu", "cuda")
AMP_DTYPES = ("float16", "bfloat16")


def use_cuda(device: str = "auto") -> bool:
    """Whether a command asked for ``device`` (``auto``, ``cpu`` or ``cuda``) runs on CUDA: ``auto`` where there
    is a device; ``cuda`` without one is a user's error."""
    if device == "cpu":
        return False
    if device == "cuda" and not machine.cuda_available():
        raise UserError("--device cuda was asked for, but no CUDA device is available")
    return machine.cuda_available()


def amp_dtype(amp: bool, requested: str | None, cuda: bool) -> str | None:
    """The autocast dtype ``--amp`` (with ``--amp-dtype``) means on this device: fp16 on CUDA (with loss scaling,
    NVIDIA's recipes), bf16 on the CPU (the fp32 exponent range: no loss scaling); None without ``--amp``."""
    if not amp:
        return None
    return requested or ("float16" if cuda else "bfloat16")


def scales_loss(dtype: str | None) -> bool:
    """Whether a run in autocast ``dtype`` scales its loss: fp16 gradients underflow without a scale; bf16 and
    fp32 ones do not."""
    return dtype == "float16"


def auto_memory_format(cuda: bool, dtype: str | None, cpu_channels_last: bool) -> tuple[str, str]:
    """``--memory-format auto``'s layout, and why in words: on CUDA channels-last under autocast (fp16 and bf16
    convolutions run on tensor cores in NHWC, which cuDNN otherwise transposes to; NVIDIA's AMP presets choose
    it), NCHW in TF32 and FP32, the reference's default; on the CPU channels-last where ``cpu_channels_last``
    (the architecture trains faster so on this CPU, :func:`choose`: docs/performance.md, "The memory format on the
    CPU")."""
    if cuda:
        if dtype is not None:
            return "nhwc", "in which autocast's convolutions run on the GPU's tensor cores"
        return "nchw", ""
    if cpu_channels_last:
        return "nhwc", "in which this model trains faster on this CPU (AVX512)"
    return "nchw", ""


@dataclass(frozen=True)
class HostChoice:
    """What a run's device and precision flags come to on this machine: the device type, the autocast dtype
    (None: full precision), the memory format, and a line for each choice a person would not foresee."""

    cuda: bool
    amp_dtype: str | None
    memory_format: str
    notes: tuple[str, ...] = ()


def choose(device: str, amp: bool, requested_dtype: str | None, memory_format: str, *,
           cpu_channels_last: bool = False, cuda: bool | None = None, bf16_native=None,
           avx512: bool | None = None) -> HostChoice:
    """The device, precision and layout of a run on this machine (``cuda``: whether to use CUDA, decided by
    :func:`use_cuda` unless given), with the lines that say what the flags alone do not; ``bf16_native``: asks
    whether the CPU computes bf16 in hardware (oneDNN's word, which imports torch; by default its flags').
    ``cpu_channels_last``: the architecture trains faster in channels-last on an AVX512 CPU, which ``auto`` then
    takes where the CPU's kernels are AVX512 (``avx512``, by default :func:`.machine.cpu_kernels_avx512`); on an
    AVX2 CPU the layouts measured alike, and NCHW, the reference's, is kept."""
    cuda = use_cuda(device) if cuda is None else cuda
    if cpu_channels_last and not cuda:
        cpu_channels_last = machine.cpu_kernels_avx512() if avx512 is None else avx512
    bf16_native = bf16_native or (lambda: machine.cpu_has_bf16() is not False)
    dtype, notes = amp_dtype(amp, requested_dtype, cuda), []
    if amp and not cuda:
        if requested_dtype is None:
            notes.append("--amp on the CPU: bf16 autocast, no loss scaling")
        if dtype == "bfloat16" and not bf16_native():
            notes.append(f"this CPU ({machine.cpu_capability()}) has no bf16 hardware: bf16 autocast is emulated "
                         "and runs slower than FP32 here (drop --amp for speed)")
        if dtype == "float16":
            notes.append("--amp-dtype float16 on the CPU: fp16 autocast with loss scaling, as on CUDA; it exists "
                         "to run the fp16 path here and trains far slower than bf16 or FP32 (--amp alone takes "
                         "bf16 on the CPU)")
    layout = memory_format
    if memory_format == "auto":
        layout, why = auto_memory_format(cuda, dtype, cpu_channels_last)
        if layout == "nhwc":
            notes.append(f"memory format nhwc: channels-last, {why} (--memory-format nchw for the plain layout)")
    return HostChoice(cuda, dtype, layout, tuple(notes))
