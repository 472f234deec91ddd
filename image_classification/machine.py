"""What a measurement ran on, named the way the README names it: CPU model, cores, GPU, software."""

from __future__ import annotations

import os
import platform
import sys
from pathlib import Path

import torch


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


def software() -> str:
    """Python, torch and torchvision versions, e.g. ``Python 3.11.7, torch 2.14.1, torchvision 0.29.1``."""
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
    host = f"{cpu_model()} ({cores()} cores)"
    if device == "cuda" and torch.cuda.is_available():
        return f"1x {torch.cuda.get_device_name()}, host {host}; {software()}, CUDA {torch.version.cuda}"
    return f"{host}, no GPU used; {software()}"
