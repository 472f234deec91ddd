"""What a measurement ran on, named the way the docs name it: CPU model, cores, GPU, software, and
what the CPU computes natively (which decides the fastest CPU precision).

torch is imported by the functions that ask it, not here: :func:`cpu_has_bf16` answers from /proc/cpuinfo
alone, for help texts written before torch is loaded.
"""

from __future__ import annotations

import os
import platform
import sys
from pathlib import Path


def cpu_model() -> str:
    """The CPU's marketing name (``model name`` of /proc/cpuinfo), or what the platform reports."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cores() -> int:
    """The cores this process may run on (a container's CPU set, not the host's count)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def cpu_capability() -> str:
    """The vector instruction set torch's CPU kernels were dispatched for here (``AVX2``, ``AVX512``, ...)."""
    import torch

    probe = getattr(getattr(torch.backends, "cpu", None), "get_cpu_capability", None)
    return probe() if probe is not None else "unknown"


def _cpu_flags() -> set[str] | None:
    """The feature flags of /proc/cpuinfo (x86's ``flags``, Arm's ``Features``); None where there is no such
    file (not Linux)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return set(line.split(":", 1)[1].split())
    except OSError:
        return None
    return set()


def _is_x86() -> bool:
    return platform.machine().lower() in ("x86_64", "amd64")


def cpu_bf16_features() -> list[str] | None:
    """The bf16 instructions the CPU lists (x86: AVX512-BF16, AMX-BF16; Arm: the BF16 extension, "BF16"), from
    /proc/cpuinfo alone, without torch; None where that file cannot tell (not Linux)."""
    flags = _cpu_flags()
    if flags is None:
        return None
    names = {"avx512_bf16": "AVX512-BF16", "amx_bf16": "AMX-BF16"} if _is_x86() else {"bf16": "BF16"}
    return [name for flag, name in names.items() if flag in flags]


def cpu_has_bf16() -> bool | None:
    """Whether the CPU lists bf16 instructions (:func:`cpu_bf16_features`); None where /proc/cpuinfo cannot tell."""
    features = cpu_bf16_features()
    return None if features is None else bool(features)


def cpu_bf16_is_native() -> bool:
    """Whether bf16 matrix products run on bf16 hardware here (AVX512-BF16, AMX, Arm's BF16 extension).

    Without it, bf16 autocast is emulated with fp32 instructions plus conversions, slower than plain fp32:
    on an AVX2-only AMD EPYC resnet50 ran at 0.52x (batch 1) and 0.25x (batch 16) of torchvision's fp32 eager.
    oneDNN has no bf16 kernels at all below AVX512 (its check is missing in some torch builds: then False);
    on x86, AVX512 alone still emulates bf16, so the CPU must also list avx512_bf16 or amx_bf16
    (:func:`cpu_has_bf16`; on Arm, oneDNN's check is the BF16 extension itself, which it lists too).
    """
    import torch

    try:
        if not torch.ops.mkldnn._is_mkldnn_bf16_supported():
            return False
    except (AttributeError, RuntimeError):
        return False
    return cpu_has_bf16() is not False  # no /proc/cpuinfo: oneDNN's word


def software() -> str:
    """Python, torch and torchvision versions, e.g. ``Python 3.11.7, torch 2.14.1, torchvision 0.29.1``."""
    import torch

    parts = [f"Python {platform.python_version()}", f"torch {torch.__version__}"]
    torchvision = sys.modules.get("torchvision")
    if torchvision is None:
        try:
            import torchvision
        except ImportError:
            torchvision = None
    if torchvision is not None:
        parts.append(f"torchvision {torchvision.__version__}")
    return ", ".join(parts)


def description(device: str = "cpu") -> str:
    """One line: the GPU when ``device`` is cuda, the host CPU and its cores, the software."""
    import torch

    host = f"{cpu_model()} ({cores()} cores)"
    if device == "cuda" and torch.cuda.is_available():
        return f"1x {torch.cuda.get_device_name()}, host {host}; {software()}, CUDA {torch.version.cuda}"
    return f"{host}, no GPU used; {software()}"
