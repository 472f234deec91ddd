"""``--gpu-affinity``: pin each process to the CPU cores near its GPU, as NVML reports them.

The splitting of cores between GPUs is a set of pure functions of the topology (which logical CPUs
each GPU is close to, and which logical CPUs share a physical core), so it can be tested with made-up
machines.  :func:`set_affinity` reads the real topology; on a machine without NVML (no NVIDIA driver,
no ``pynvml``) it changes nothing and says so once.
"""

from __future__ import annotations

import os
import sys
from typing import Iterable, Mapping, Sequence

MODES = (
    "none",
    "socket",
    "socket_single",
    "socket_single_unique",
    "socket_unique_interleaved",
    "socket_unique_contiguous",
)
CORE_MODES = ("all_logical", "single_logical")

Core = tuple[int, ...]  # the logical CPUs (hyperthread siblings) of one physical core, sorted


class TopologyError(ValueError):
    """The GPUs' CPU sets overlap without being identical, so sockets cannot be told apart."""


# ------------------------------------------------------------------------------------------------
# Pure functions of the topology
# ------------------------------------------------------------------------------------------------
def parse_cpu_list(text: str) -> list[int]:
    """``"0-3,8,10-11"`` (the kernel's list format) -> ``[0, 1, 2, 3, 8, 10, 11]``."""
    cpus: list[int] = []
    for part in text.strip().split(","):
        if not part:
            continue
        low, _, high = part.partition("-")
        cpus.extend(range(int(low), int(high or low) + 1))
    return cpus


def mask_to_cpus(words: Sequence[int]) -> set[int]:
    """NVML's CPU affinity: 64-bit words, word i holding CPUs 64i to 64i+63, lowest bit first."""
    return {64 * index + bit for index, word in enumerate(words) for bit in range(64) if word >> bit & 1}


def physical_cores(cpus: Iterable[int], siblings: Mapping[int, Sequence[int]]) -> list[Core]:
    """Group logical ``cpus`` into physical cores (only siblings within ``cpus`` are kept), in CPU order.

    A CPU missing from ``siblings`` counts as a core of its own.
    """
    wanted = set(cpus)
    cores = {tuple(sorted(set(siblings.get(cpu, (cpu,))) & wanted)) for cpu in wanted}
    return sorted(cores)


def gpu_cores(gpu_cpus: Sequence[Iterable[int]], available: Iterable[int],
              siblings: Mapping[int, Sequence[int]]) -> list[list[Core]]:
    """Per GPU, the physical cores near it that this process may use.

    GPUs on one socket must report the same cores and GPUs on different sockets disjoint ones.
    """
    available = set(available)
    result = [physical_cores(set(cpus) & available, siblings) for cpus in gpu_cpus]
    for i, first in enumerate(result):
        for second in result[i + 1:]:
            if first != second and set(first) & set(second):
                raise TopologyError("GPUs report CPU sets that overlap without being the same")
    return result


def _split_contiguous(cores: list[Core], parts: int) -> list[list[Core]]:
    """Contiguous chunks whose sizes differ by at most one, the larger ones first."""
    size, extra = divmod(len(cores), parts)
    chunks, start = [], 0
    for k in range(parts):
        end = start + size + (k < extra)
        chunks.append(cores[start:end])
        start = end
    return chunks


def assign_cores(mode: str, cores_per_gpu: Sequence[Sequence[Core]],
                 balanced: bool = True) -> list[list[Core]]:
    """The physical cores each GPU's process gets under ``mode`` (GPUs on a socket share its cores).

    With ``balanced``, the ``socket_unique_*`` modes give every GPU the same number of cores: the
    smallest fair share over all sockets.  A socket with more GPUs than cores shares them round-robin.
    """
    if mode not in MODES:
        raise ValueError(f"unknown affinity mode {mode!r}; choose one of {', '.join(MODES)}")
    cores_per_gpu = [list(cores) for cores in cores_per_gpu]
    if mode == "none":
        return cores_per_gpu
    sockets: dict[tuple[Core, ...], list[int]] = {}
    for gpu, cores in enumerate(cores_per_gpu):
        sockets.setdefault(tuple(cores), []).append(gpu)
    share = max(1, min((len(cores) // len(gpus) for cores, gpus in sockets.items()), default=1))

    result: list[list[Core]] = [[] for _ in cores_per_gpu]
    for socket_cores, gpus in sockets.items():
        cores = list(socket_cores)
        if not cores:
            continue
        for k, gpu in enumerate(gpus):
            if mode == "socket":
                result[gpu] = cores
            elif mode == "socket_single":
                result[gpu] = cores[:1]
            elif mode == "socket_single_unique" or len(gpus) > len(cores):
                result[gpu] = [cores[k % len(cores)]]
            elif mode == "socket_unique_contiguous" and balanced:
                result[gpu] = cores[k * share:(k + 1) * share]
            elif mode == "socket_unique_contiguous":
                result[gpu] = _split_contiguous(cores, len(gpus))[k]
            else:  # socket_unique_interleaved
                result[gpu] = cores[k::len(gpus)][:share] if balanced else cores[k::len(gpus)]
    return result


def logical_cpus(cores: Iterable[Core], core_mode: str = "all_logical") -> set[int]:
    """The logical CPUs to pin to: every sibling of each core, or the first one only."""
    if core_mode not in CORE_MODES:
        raise ValueError(f"unknown cores option {core_mode!r}; choose one of {', '.join(CORE_MODES)}")
    if core_mode == "single_logical":
        return {core[0] for core in cores}
    return {cpu for core in cores for cpu in core}


# ------------------------------------------------------------------------------------------------
# The machine
# ------------------------------------------------------------------------------------------------
def _notice(message: str) -> None:
    print(f"gpu affinity: {message}", file=sys.stderr, flush=True)


def read_siblings(cpus: Iterable[int]) -> dict[int, list[int]]:
    """Each CPU's hyperthread siblings from sysfs; CPUs whose topology cannot be read are left out."""
    siblings = {}
    for cpu in cpus:
        path = f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list"
        try:
            with open(path) as handle:
                siblings[cpu] = parse_cpu_list(handle.read())
        except OSError:
            continue
    return siblings


def _nvml_handles(pynvml, count: int | None) -> list:
    """NVML handles of the GPUs this process can see, in CUDA order (``CUDA_VISIBLE_DEVICES`` applied)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None or not visible.strip():
        total = pynvml.nvmlDeviceGetCount()
        return [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(total if count is None else count)]
    handles = []
    for ident in [part.strip() for part in visible.split(",") if part.strip()][:count]:
        if ident.isdigit():
            handles.append(pynvml.nvmlDeviceGetHandleByIndex(int(ident)))
        else:
            handles.append(pynvml.nvmlDeviceGetHandleByUUID(ident))
    return handles


def set_affinity(gpu_id: int, nproc_per_node: int | None = None, *, mode: str, cores: str = "all_logical",
                 balanced: bool = True) -> set[int]:
    """Pin this process to the cores ``mode`` gives GPU ``gpu_id``; return the CPUs it may now use.

    ``nproc_per_node`` is how many GPUs share the node's cores (default: every visible GPU).  Mode
    ``none`` leaves the affinity alone without touching NVML; without NVML nothing changes either.
    """
    if mode not in MODES:
        raise ValueError(f"unknown affinity mode {mode!r}; choose one of {', '.join(MODES)}")
    if cores not in CORE_MODES:
        raise ValueError(f"unknown cores option {cores!r}; choose one of {', '.join(CORE_MODES)}")
    if not hasattr(os, "sched_setaffinity"):
        if mode != "none":
            _notice(f"this system cannot pin processes to cores; --gpu-affinity {mode} is ignored")
        return set(range(os.cpu_count() or 1))
    current = os.sched_getaffinity(0)
    if mode == "none":
        return current
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as error:  # ImportError, or NVMLError without a driver
        if gpu_id == 0:
            _notice(f"NVML is not available ({error.__class__.__name__}); --gpu-affinity {mode} is ignored")
        return current
    try:
        handles = _nvml_handles(pynvml, nproc_per_node)
        words = (os.cpu_count() + 63) // 64
        gpu_cpus = [mask_to_cpus(pynvml.nvmlDeviceGetCpuAffinity(handle, words)) for handle in handles]
    except pynvml.NVMLError as error:
        _notice(f"NVML could not report the CPUs near the GPUs ({error}); --gpu-affinity {mode} is ignored")
        return current
    finally:
        pynvml.nvmlShutdown()
    if not 0 <= gpu_id < len(gpu_cpus):
        _notice(f"GPU {gpu_id} is not one of the {len(gpu_cpus)} visible GPUs; the affinity is left alone")
        return current
    try:
        per_gpu = gpu_cores(gpu_cpus, current, read_siblings(current))
    except TopologyError as error:
        _notice(f"{error}; the affinity is left alone")
        return current
    chosen = logical_cpus(assign_cores(mode, per_gpu, balanced)[gpu_id], cores)
    if not chosen:
        _notice(f"no CPU near GPU {gpu_id} is available to this process; the affinity is left alone")
        return current
    os.sched_setaffinity(0, chosen)
    return os.sched_getaffinity(0)
