"""--gpu-affinity: splitting the cores among GPUs on made-up machines, NVML faked or missing, and the
start-up order (affinity before CUDA and the process group, for the GPU the process uses)."""

from __future__ import annotations

import os
import sys

import pytest
import torch

from image_classification.system import gpu_affinity as ga


def two_socket_machine(cores_per_socket: int = 4):
    """2 sockets of ``cores_per_socket`` physical cores with 2 threads each, numbered like Linux does."""
    total = 2 * cores_per_socket
    siblings = {c: [c % total, c % total + total] for c in range(2 * total)}
    socket_cpus = [set(range(0, cores_per_socket)) | set(range(total, total + cores_per_socket)),
                   set(range(cores_per_socket, total)) | set(range(total + cores_per_socket, 2 * total))]
    return siblings, socket_cpus


def test_cpu_lists_and_nvml_masks():
    assert ga.parse_cpu_list("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]
    assert ga.mask_to_cpus([0b1011, 1 << 63, 1]) == {0, 1, 3, 127, 128}


def test_physical_cores_group_hyperthreads():
    siblings, socket_cpus = two_socket_machine()
    assert ga.physical_cores(socket_cpus[0], siblings) == [(0, 8), (1, 9), (2, 10), (3, 11)]
    # siblings outside the allowed set are dropped; unknown CPUs are cores of their own
    assert ga.physical_cores({0, 1, 9, 20}, siblings) == [(0,), (1, 9), (20,)]


def test_socket_modes_on_four_gpus():
    siblings, socket_cpus = two_socket_machine()
    per_gpu = ga.gpu_cores([socket_cpus[0], socket_cpus[0], socket_cpus[1], socket_cpus[1]],
                           range(16), siblings)
    contiguous = ga.assign_cores("socket_unique_contiguous", per_gpu)
    assert contiguous == [[(0, 8), (1, 9)], [(2, 10), (3, 11)], [(4, 12), (5, 13)], [(6, 14), (7, 15)]]
    interleaved = ga.assign_cores("socket_unique_interleaved", per_gpu)
    assert interleaved == [[(0, 8), (2, 10)], [(1, 9), (3, 11)], [(4, 12), (6, 14)], [(5, 13), (7, 15)]]
    assert ga.assign_cores("socket", per_gpu)[3] == per_gpu[2]
    assert ga.assign_cores("socket_single", per_gpu) == [[(0, 8)], [(0, 8)], [(4, 12)], [(4, 12)]]
    assert ga.assign_cores("socket_single_unique", per_gpu) == [[(0, 8)], [(1, 9)], [(4, 12)], [(5, 13)]]
    assert ga.assign_cores("none", per_gpu) == per_gpu
    assert ga.logical_cpus(contiguous[1]) == {2, 3, 10, 11}
    assert ga.logical_cpus(contiguous[1], "single_logical") == {2, 3}


def test_balanced_split_takes_the_smallest_share():
    siblings, socket_cpus = two_socket_machine()
    # socket 0 has 3 GPUs (4 cores -> 1 each), socket 1 has 1 GPU (4 cores)
    per_gpu = ga.gpu_cores([socket_cpus[0]] * 3 + [socket_cpus[1]], range(16), siblings)
    balanced = ga.assign_cores("socket_unique_contiguous", per_gpu, balanced=True)
    assert [len(cores) for cores in balanced] == [1, 1, 1, 1]
    unbalanced = ga.assign_cores("socket_unique_contiguous", per_gpu, balanced=False)
    assert [len(cores) for cores in unbalanced] == [2, 1, 1, 4]
    assert ga.assign_cores("socket_unique_interleaved", per_gpu, balanced=False)[0] == [(0, 8), (3, 11)]


def test_more_gpus_than_cores_share_them():
    siblings, socket_cpus = two_socket_machine(cores_per_socket=1)
    per_gpu = ga.gpu_cores([socket_cpus[0]] * 3, range(4), siblings)
    assert ga.assign_cores("socket_unique_contiguous", per_gpu) == [[(0, 2)]] * 3


def test_available_cpus_limit_the_choice_and_overlaps_are_refused():
    siblings, socket_cpus = two_socket_machine()
    per_gpu = ga.gpu_cores([socket_cpus[0], socket_cpus[1]], {0, 1, 2, 8, 9, 10, 4, 12}, siblings)
    assert per_gpu == [[(0, 8), (1, 9), (2, 10)], [(4, 12)]]
    with pytest.raises(ga.TopologyError):
        ga.gpu_cores([{0, 1}, {1, 2}], range(4), {})


def test_mode_none_never_touches_nvml(monkeypatch):
    class Exploding:
        def __getattr__(self, name):
            raise AssertionError("NVML was used")

    monkeypatch.setitem(sys.modules, "pynvml", Exploding())
    assert ga.set_affinity(0, mode="none") == os.sched_getaffinity(0)


def test_without_nvml_affinity_is_left_alone_with_one_notice(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails
    before = os.sched_getaffinity(0)
    assert ga.set_affinity(0, mode="socket_unique_contiguous") == before
    assert ga.set_affinity(1, mode="socket_unique_contiguous") == before
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "NVML is not available" in err


def test_set_affinity_pins_to_the_chosen_cores(monkeypatch):
    """NVML faked: 2 GPUs, one per 'socket', over the CPUs this process may use."""
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2:
        pytest.skip("needs two CPUs")
    halves = [allowed[: len(allowed) // 2], allowed[len(allowed) // 2:]]

    class FakeNVML:
        class NVMLError(Exception):
            pass

        def nvmlInit(self):
            pass

        def nvmlShutdown(self):
            pass

        def nvmlDeviceGetCount(self):
            return 2

        def nvmlDeviceGetHandleByIndex(self, index):
            return index

        def nvmlDeviceGetCpuAffinity(self, handle, words):
            mask = [0] * words
            for cpu in halves[handle]:
                mask[cpu // 64] |= 1 << (cpu % 64)
            return mask

    monkeypatch.setitem(sys.modules, "pynvml", FakeNVML())
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(ga, "read_siblings", lambda cpus: {})
    applied = []
    monkeypatch.setattr(os, "sched_setaffinity", lambda pid, cpus: applied.append(set(cpus)))
    ga.set_affinity(1, mode="socket")
    assert applied == [set(halves[1])]




def test_affinity_is_set_for_the_process_s_gpu_before_cuda_and_the_process_group(monkeypatch):
    """One visible GPU per task (SLURM --gpus-per-task): local rank 3 uses cuda:0, pinned first."""
    from image_classification.system import runtime as rt

    events = []
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("LOCAL_RANK", "3")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "set_device", lambda gpu: events.append(("set_device", gpu)))
    monkeypatch.setattr(ga, "set_affinity", lambda gpu, **kw: events.append(("affinity", gpu, kw["mode"])))
    monkeypatch.setattr(rt.dist, "is_initialized", lambda: False)
    monkeypatch.setattr(rt.dist, "init_process_group",
                        lambda backend, **kw: events.append(("init", backend, kw["timeout"].total_seconds())))
    runtime = rt.make_runtime("cuda", gpu_affinity="socket", dist_timeout=120, log=lambda *_: None)
    assert events == [("affinity", 0, "socket"), ("set_device", 0),
                      ("init", "nccl", 120 + rt.BACKEND_TIMEOUT_MARGIN_S)]
    assert runtime.device == torch.device("cuda", 0) and runtime.watchdog.timeout_s == 120
