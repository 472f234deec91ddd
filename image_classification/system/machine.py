"""What a measurement ran on, named the way the docs name it: CPU model, cores, the instruction sets
the CPU has, the GPU and its driver, software, and whether the CPU computes bf16 natively and faster than
FP32 (which decides the CPU's default precision).  A figure without these cannot be compared with
another: the same code ranks its paths differently on an AVX2-only CPU and on one with AVX512-BF16.

:func:`facts` gathers them into a dict (what the benchmarks record in their JSON); :func:`describe` turns
such a dict, recorded here or elsewhere, into the one line that sits beside a figure.

torch is imported by the functions that ask it, not here: :func:`cpu_has_bf16` and
:func:`bf16_faster_by_flags` answer from /proc/cpuinfo alone, for help texts written before torch is loaded, and
the command lines' checks import this module before torch (``--compile`` asks :func:`compile_unsupported`).
"""

from __future__ import annotations

import functools
import os
import platform
import re
import sys
from pathlib import Path

from ..errors import UserError


@functools.lru_cache(maxsize=1)
def _cpuinfo_lines() -> tuple[str, ...] | None:
    """The lines of /proc/cpuinfo, read once per process (a many-core host's file runs to hundreds of KB, and
    the CPU does not change); None where there is no such file (not Linux)."""
    try:
        return tuple(Path("/proc/cpuinfo").read_text().splitlines())
    except OSError:
        return None


def _cpuinfo(*keys: str) -> str | None:
    """The value of /proc/cpuinfo's first line that starts with one of ``keys``; None where there is none
    (or no such file: not Linux)."""
    for line in _cpuinfo_lines() or ():
        if line.startswith(keys):
            return line.split(":", 1)[1].strip()
    return None


def cpu_model() -> str:
    """The CPU's marketing name (``model name`` of /proc/cpuinfo), or what the platform reports."""
    return _cpuinfo("model name") or platform.processor() or platform.machine()


def cpu_vendor() -> str | None:
    """``GenuineIntel`` or ``AuthenticAMD`` (/proc/cpuinfo's ``vendor_id``); None where it does not say."""
    return _cpuinfo("vendor_id")


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
    if _cpuinfo_lines() is None:
        return None
    return set((_cpuinfo("flags", "Features") or "").split())


# /proc/cpuinfo flag -> the name the README gives it, in the order they are listed.  AMX-TILE is left out:
# every CPU with AMX has it, and AMX-BF16 / AMX-INT8 say what it computes.
INSTRUCTION_SETS = (
    ("avx2", "AVX2"), ("avx512f", "AVX512F"), ("avx512_vnni", "AVX512-VNNI"), ("avx_vnni", "AVX-VNNI"),
    ("avx512_bf16", "AVX512-BF16"), ("avx512_fp16", "AVX512-FP16"), ("amx_bf16", "AMX-BF16"),
    ("amx_int8", "AMX-INT8"), ("amx_fp16", "AMX-FP16"),
    ("asimd", "NEON"), ("sve", "SVE"), ("sve2", "SVE2"), ("bf16", "BF16"), ("i8mm", "I8MM"),  # Arm
)


def instruction_sets(flags: set[str] | None = None) -> list[str]:
    """The vector and matrix instruction sets the CPU has (``["AVX2", "AVX512F", "AVX512-BF16"]``), from
    /proc/cpuinfo's flags (or ``flags``).  What the CPU has, which a hypervisor may hide (AMX often is),
    not what torch dispatches for (:func:`cpu_capability`)."""
    flags = _cpu_flags() if flags is None else flags
    return [name for flag, name in INSTRUCTION_SETS if flag in (flags or ())]


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


# what torch's CPU dispatch needs for its AVX512 kernels (cpuinfo's avx512 check), and the settings that lower them
_AVX512_KERNELS = {"avx512f", "avx512bw", "avx512vl", "avx512dq"}


def cpu_kernels_avx512() -> bool:
    """Whether torch's and oneDNN's CPU kernels run AVX512 here, asked without torch: the CPU lists what torch's
    AVX512 dispatch needs, and neither ``ATEN_CPU_CAPABILITY`` nor ``ONEDNN_MAX_CPU_ISA`` caps them below it."""
    capability = os.environ.get("ATEN_CPU_CAPABILITY", "").strip().lower()
    isa = os.environ.get("ONEDNN_MAX_CPU_ISA", "").strip().upper()
    if (capability and not capability.startswith("avx512")) or (isa and not isa.startswith(("AVX512", "AMX", "ALL"))):
        return False
    flags = _cpu_flags()
    return flags is not None and _AVX512_KERNELS <= flags


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


def cpu_bf16_is_faster() -> bool:
    """Whether bf16 autocast runs faster than FP32 here, which makes bf16 the CPU's default precision: native bf16
    (:func:`cpu_bf16_is_native`) computed by AMX, by AMD's AVX512-BF16 or by Arm's BF16 extension; not an Intel CPU
    with AVX512-BF16 alone, whose bf16 kernels ran no faster than FP32 (docs/performance.md, "Inference", measures
    each class of CPU)."""
    if not cpu_bf16_is_native():
        return False
    return bf16_faster_by_flags() is not False  # no /proc/cpuinfo: oneDNN's word


def bf16_faster_by_flags() -> bool | None:
    """:func:`cpu_bf16_is_faster` from /proc/cpuinfo alone, without torch (for help texts): the CPU lists
    AMX-BF16, AVX512-BF16 on a CPU not made by Intel, or Arm's BF16 extension; None where that file cannot
    tell.  The run also needs oneDNN's bf16 kernels, which some torch builds lack (:func:`cpu_bf16_is_native`)."""
    flags = _cpu_flags()
    if flags is None:
        return None
    if not _is_x86():
        return "bf16" in flags
    return "amx_bf16" in flags or ("avx512_bf16" in flags and cpu_vendor() != "GenuineIntel")


def _torchvision_version() -> str | None:
    torchvision = sys.modules.get("torchvision")
    if torchvision is None:
        try:
            import torchvision
        except ImportError:
            return None
    return torchvision.__version__


def gpu_driver() -> str | None:
    """The NVIDIA driver's version (``580.159.04``): from NVML (nvidia-ml-py), else the kernel module's
    /proc/driver/nvidia/version; None where neither answers."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            version = pynvml.nvmlSystemGetDriverVersion()
        finally:
            pynvml.nvmlShutdown()
        return version.decode() if isinstance(version, bytes) else str(version)
    except Exception:  # noqa: BLE001 - no NVML library, no driver, or an old binding: try the next source
        pass
    try:
        return kernel_module_version(Path("/proc/driver/nvidia/version").read_text())
    except OSError:
        return None


def kernel_module_version(text: str) -> str | None:
    """The driver version in /proc/driver/nvidia/version's text, proprietary or open kernel module."""
    match = re.search(r"Kernel Module(?: for \S+)?\s+(\d[\d.]*)", text)
    return match.group(1) if match else None


def cuda_available() -> bool:
    """Whether torch sees a CUDA device here: the one place that asks (:func:`.host.use_cuda` decides whether a
    command uses it).  A process that has not imported torch yet asks NVIDIA's driver first: without one torch
    can find no GPU, and its import takes seconds that a ``--dry-run`` need not wait for."""
    if "torch" not in sys.modules and gpu_driver() is None:
        return False
    import torch  # deferred: seconds, where a driver says a GPU may be there (or torch is loaded already)

    return torch.cuda.is_available()


def gpu(index: int | None = None) -> dict | None:
    """CUDA device ``index`` (default: the current one): name, memory, compute capability, how many devices
    there are, the driver and torch's CUDA version; None where CUDA is not available."""
    if not cuda_available():
        return None
    import torch

    properties = torch.cuda.get_device_properties(torch.cuda.current_device() if index is None else index)
    return {"name": properties.name, "memory_gib": round(properties.total_memory / 2**30, 1),
            "capability": f"{properties.major}.{properties.minor}", "count": torch.cuda.device_count(),
            "driver": gpu_driver(), "cuda": torch.version.cuda}


def compile_unsupported() -> str | None:
    """Why this torch cannot ``torch.compile`` on this Python, or None: its compiler front end, Dynamo,
    supports a new Python only from a later torch (Python 3.12 from torch 2.4)."""
    import torch._dynamo

    if torch._dynamo.is_dynamo_supported():
        return None
    return (f"torch {torch.__version__} cannot torch.compile on Python {platform.python_version()}; "
            "a newer torch can")


def facts(device: str = "cpu") -> dict:
    """What :func:`describe` names, as a dict to record beside a figure: the GPU only when ``device`` is
    cuda (a CPU figure on a GPU machine used none)."""
    import torch

    return {
        "cpu_model": cpu_model(), "cpu_cores": cores(), "cpu_instruction_sets": instruction_sets(),
        "cpu_capability": cpu_capability(), "cpu_bf16_native": cpu_bf16_is_native(),
        "gpu": gpu() if device == "cuda" else None,
        "python": platform.python_version(), "torch": torch.__version__, "torchvision": _torchvision_version(),
    }


def describe(recorded: dict) -> str:
    """One line naming the machine of ``recorded`` (:func:`facts`' keys; ``onnxruntime`` where present)::

        1x NVIDIA H100 80GB HBM3 (79.1 GiB, compute capability 9.0, driver 580.159.04, CUDA 13.0), host
        Intel(R) Xeon(R) Processor (16 cores; AVX2, AVX512F, AVX512-BF16; torch's CPU kernels AVX512); Python ...
    """
    sets = ", ".join(recorded.get("cpu_instruction_sets") or []) or "instruction sets not recorded"
    capability = recorded.get("cpu_capability")
    kernels = f"; torch's CPU kernels {capability}" if capability else ""
    host = f"{recorded['cpu_model']} ({recorded['cpu_cores']} cores; {sets}{kernels})"
    software = ", ".join(f"{label} {recorded[key]}" for key, label in (
        ("python", "Python"), ("torch", "torch"), ("torchvision", "torchvision"), ("onnxruntime", "onnxruntime"))
        if recorded.get(key))
    device = recorded.get("gpu")
    if not device:
        return f"{host}, no GPU used; {software}"
    others = f"; one of {device['count']} GPUs" if device.get("count", 1) > 1 else ""
    return (f"1x {device['name']} ({device['memory_gib']} GiB, compute capability {device['capability']}, "
            f"driver {device.get('driver') or 'unknown'}, CUDA {device.get('cuda')}{others}), host {host}; "
            f"{software}")


def description(device: str = "cpu") -> str:
    """One line: the GPU and its driver when ``device`` is cuda, the host CPU with its cores and instruction
    sets, the software."""
    return describe(facts(device))


# ------------------------------------------------------------------------------------------------
# The processes of a job, as the launchers' variables say (no torch: launch.py --dry-run reads them)
# ------------------------------------------------------------------------------------------------
def _env_int(*names: str) -> int | None:
    for name in names:
        if name in os.environ:
            return int(os.environ[name])
    return None


def distributed_env() -> tuple[int, int, int]:
    """(rank, local_rank, world_size) from torchrun's or SLURM's variables; (0, 0, 1) otherwise."""
    world = _env_int("WORLD_SIZE")
    if world is not None:
        return _env_int("RANK") or 0, _env_int("LOCAL_RANK") or 0, world
    # srun sets the step's task count in every task; a batch script alone has none, so it stays single.
    slurm_world = _env_int("SLURM_STEP_NUM_TASKS")
    if slurm_world is not None and slurm_world > 1:
        return _env_int("SLURM_PROCID") or 0, _env_int("SLURM_LOCALID") or 0, slurm_world
    return 0, 0, 1


def lone_slurm_task_notice() -> str | None:
    """What to say of a process that SLURM's variables place in a job of several tasks, when no task count of a
    step (``SLURM_STEP_NUM_TASKS``, what :func:`distributed_env` reads, set by srun in every task) says it runs
    with others: ``SLURM_NTASKS`` alone is also a batch script's, whose one process runs alone, said in a line;
    a task numbered above 0 would run alone too and meet rank 0's workspace lock, so it is refused."""
    if "WORLD_SIZE" in os.environ or "SLURM_STEP_NUM_TASKS" in os.environ:
        return None
    procid, tasks = _env_int("SLURM_PROCID"), _env_int("SLURM_NTASKS")
    reads = ("main.py takes the number of processes from SLURM_STEP_NUM_TASKS, which srun sets in every task "
             "(SLURM_NTASKS is a batch script's too, whose one process runs alone)")
    if procid:
        raise UserError(f"SLURM_PROCID is {procid} but SLURM_STEP_NUM_TASKS is not set: {reads}; start the tasks "
                        "with srun, or set WORLD_SIZE, RANK, LOCAL_RANK, MASTER_ADDR and MASTER_PORT")
    if tasks is not None and tasks > 1:
        return (f"=> SLURM_NTASKS is {tasks} but SLURM_STEP_NUM_TASKS is not set: this process runs alone; {reads}, "
                "so start the tasks with srun to run them together")
    return None
