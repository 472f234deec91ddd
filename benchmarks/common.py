"""What every benchmark records: the machine, the software, and robust statistics of repeated timings."""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
from pathlib import Path
from typing import Sequence

import torch

from image_classification import machine


def environment(device: torch.device) -> dict:
    """The device, the host CPU and the versions of the software that produced a figure."""
    import torchvision

    info = {
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else machine.cpu_model(),
        "cpu_model": machine.cpu_model(),
        "cpu_cores": machine.cores(),
        "cpu_capability": machine.cpu_capability(),
        "cpu_bf16_native": machine.cpu_bf16_is_native(),
        # when the run ends: on a shared machine, other work on the cores slows every path down
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torchvision": torchvision.__version__,
    }
    try:
        import onnxruntime

        info["onnxruntime"] = onnxruntime.__version__
    except ImportError:
        pass
    return info


def summarise(values: Sequence[float]) -> dict:
    """Median, spread (max - min, and relative to the median), and every value."""
    median = statistics.median(values)
    return {"median": median, "min": min(values), "max": max(values), "spread": max(values) - min(values),
            "relative_spread": (max(values) - min(values)) / median if median else 0.0, "values": list(values)}


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) with linear interpolation between the closest ranks."""
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def write_json(result: dict, path: str | None) -> None:
    """Write ``result`` to ``path`` (through a temporary file, so a failure leaves no half file)."""
    if not path:
        return
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    temporary = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    temporary.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    os.replace(temporary, target)


def command_line() -> str:
    """This process's command line, as a user would type it."""
    import shlex

    return "python " + shlex.join([os.path.relpath(sys.argv[0])] + sys.argv[1:])
