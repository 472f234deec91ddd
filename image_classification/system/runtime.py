"""Decide the runtime once: device, precision, memory format and the process's place in the job.

Everything else receives a :class:`Runtime`; nothing else calls ``.cuda()``, picks a dtype or reads
the distributed environment.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from . import gpu_affinity as affinity, host, machine
from .distributed import PeerWatchdog, attempt_store
from .machine import distributed_env, lone_slurm_task_notice
from .slurm import slurm_rendezvous_env

# torch's C++-extension module (which torch.compile and the ONNX exporter import) warns "No CUDA runtime is
# found" on every machine without a GPU: a fact each command already states, not something to act on.
logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)

_MEMORY_FORMATS = {"nchw": torch.contiguous_format, "nhwc": torch.channels_last}
MEMORY_FORMAT_NAMES = {value: name for name, value in _MEMORY_FORMATS.items()}
_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}
DTYPE_NAMES = {value: name for name, value in _DTYPES.items()}


@dataclass
class Runtime:
    device: torch.device
    amp_dtype: torch.dtype | None  # None: full precision
    memory_format: torch.memory_format
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    watchdog: PeerWatchdog | None = None  # distributed runs: ends a wait for a peer that never comes
    process_group: bool = False  # in a process group even alone (a one-process DDP run, as tests make)

    @property
    def distributed(self) -> bool:
        """Whether gradients and metrics go through collectives (DDP, all-reduce)."""
        return self.world_size > 1 or self.process_group

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def is_cuda(self) -> bool:
        return self.device.type == "cuda"

    @property
    def amp_dtype_name(self) -> str | None:
        """The autocast dtype as the flags name it (``float16``, ``bfloat16``), None in full precision."""
        return DTYPE_NAMES.get(self.amp_dtype)

    @property
    def needs_loss_scaling(self) -> bool:
        """Whether the run scales its loss (:func:`.host.scales_loss`: fp16 only)."""
        return host.scales_loss(self.amp_dtype_name)

    def autocast(self) -> contextlib.AbstractContextManager:
        if self.amp_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.amp_dtype)

    def waiting_for_peers(self, what: str) -> contextlib.AbstractContextManager:
        """Guard a call that blocks until every process takes part (a collective read back on the host).

        A process that waits longer than ``--dist-timeout`` there says so in one line and exits 5, on
        every backend: NCCL's own watchdog would otherwise abort it with a C++ trace.
        """
        if self.watchdog is None:
            return contextlib.nullcontext()
        return self.watchdog.guard(what)

    def describe(self) -> dict:
        """What the run's raport records of where it ran: the device, the autocast dtype, the memory format taken
        and the processes."""
        return {"device": str(self.device), "amp_dtype": str(self.amp_dtype),
                "memory_format": MEMORY_FORMAT_NAMES[self.memory_format], "world_size": self.world_size}

    def synchronize(self) -> None:
        if self.is_cuda:
            torch.cuda.synchronize(self.device)

    def print(self, *values, **kwargs) -> None:
        """Print on the global rank 0 only."""
        if self.is_main:
            print(*values, **kwargs, flush=True)


def out_of_memory_reason(error: RuntimeError) -> str | None:
    """What ran out, when ``error`` is an allocation that failed (the device's memory, or the host's: the CPU
    allocator's "can't allocate memory"); else None.  A size taken from the flags (``-b``, ``--num-classes``)
    that no memory holds is then one line, not a traceback."""
    text = str(error)
    if not (isinstance(error, torch.OutOfMemoryError) or "can't allocate memory" in text):
        return None
    first = text.splitlines()[0] if text else "out of memory"
    return re.sub(r"^\[enforce fail at [^\]]*\] (err == 0\. )?", "", first)[:200]


def make_runtime(
    device: str = "auto",
    amp: bool = False,
    amp_dtype: str | None = None,
    memory_format: str = "nchw",
    tf32: bool = True,
    log=print,
    *,
    cpu_channels_last: bool = False,
    gpu_affinity: str = "none",
    dist_timeout: float = 300.0,
    cudnn_benchmark: bool = True,
) -> Runtime:
    """Take the device, precision and layout :func:`.host.choose` decides, and join the process group when
    launched by torchrun/SLURM; rank 0 says each choice the flags alone do not.

    The order matters on a GPU node: the process is pinned to its GPU's cores (``gpu_affinity``) before
    CUDA and the process group start their threads, which inherit the affinity. ``cudnn_benchmark``
    autotunes convolutions per input shape: right for training's fixed shapes, wasted on one-off runs.
    """
    choice = host.choose(device, amp, amp_dtype, memory_format, cpu_channels_last=cpu_channels_last,
                         bf16_native=machine.cpu_bf16_is_native)
    rank, local_rank, world_size = distributed_env()
    notes = [notice for notice in (lone_slurm_task_notice(),) if notice]
    torch_device = _take_device(choice.cuda, local_rank, gpu_affinity, tf32, cudnn_benchmark, notes)
    if rank == 0:
        for note in notes + [f"=> {line}" for line in choice.notes]:
            log(note)
    watchdog = None
    if world_size > 1:
        if not dist.is_initialized():
            _join_process_group(choice.cuda, torch_device, rank, local_rank, world_size, dist_timeout)
        watchdog = PeerWatchdog(rank, dist_timeout)
    dtype = _DTYPES[choice.amp_dtype] if choice.amp_dtype else None
    return Runtime(torch_device, dtype, _MEMORY_FORMATS[choice.memory_format], rank, local_rank, world_size,
                   watchdog)


def _take_device(cuda: bool, local_rank: int, gpu_affinity: str, tf32: bool, cudnn_benchmark: bool,
                 notes: list[str]) -> torch.device:
    """This process's device: its GPU (pinned to the GPU's cores first, cuDNN and TF32 set), or the CPU."""
    if not cuda:
        if gpu_affinity != "none":
            notes.append(f"=> --gpu-affinity {gpu_affinity} pins processes to a GPU's cores; there is no GPU: "
                         "ignored")
        return torch.device("cpu")
    gpu = local_rank % torch.cuda.device_count()
    if gpu_affinity != "none":
        affinity.set_affinity(gpu, mode=gpu_affinity)
    torch.cuda.set_device(gpu)
    torch.backends.cudnn.benchmark = cudnn_benchmark
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    return torch.device("cuda", gpu)


# The backend's own timeout comes a minute after the watchdog's, so the one line is said first.
BACKEND_TIMEOUT_MARGIN_S = 60.0


def _join_process_group(use_cuda: bool, device: torch.device, rank: int, local_rank: int, world_size: int,
                        timeout_s: float) -> None:
    if "SLURM_PROCID" in os.environ and "RANK" not in os.environ:
        os.environ.setdefault("RANK", str(rank))
        os.environ.setdefault("WORLD_SIZE", str(world_size))
        os.environ.setdefault("LOCAL_RANK", str(local_rank))
        for key, value in slurm_rendezvous_env().items():
            os.environ.setdefault(key, value)
    backend = "nccl" if use_cuda else "gloo"
    init_kwargs = {"device_id": device} if use_cuda else {}
    timeout = timedelta(seconds=timeout_s + BACKEND_TIMEOUT_MARGIN_S)
    store = attempt_store(timeout)  # under torchrun: this attempt's keys, not a killed attempt's
    if store is None:
        dist.init_process_group(backend, init_method="env://", timeout=timeout, **init_kwargs)
    else:
        dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=timeout,
                                **init_kwargs)
