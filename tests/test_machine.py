"""image_classification/system/machine.py: every figure names its machine, the CPU's instruction sets and the GPU
with its driver among it."""

from __future__ import annotations

import importlib

import torch

from image_classification.system import machine

XEON_FLAGS = {"fpu", "sse2", "avx", "avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni", "avx512_bf16",
              "avx512_fp16"}


def test_instruction_sets_are_named_as_the_readme_names_them():
    assert machine.instruction_sets(XEON_FLAGS) == ["AVX2", "AVX512F", "AVX512-VNNI", "AVX-VNNI", "AVX512-BF16",
                                                    "AVX512-FP16"]
    assert machine.instruction_sets({"avx", "avx2", "fma"}) == ["AVX2"]  # the AVX2-only EPYC
    sapphire = {"avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8"}
    assert machine.instruction_sets(sapphire) == ["AVX2", "AVX512F", "AVX512-BF16", "AMX-BF16", "AMX-INT8"]
    assert machine.instruction_sets({"fp", "asimd", "sve", "bf16", "i8mm"}) == ["NEON", "SVE", "BF16", "I8MM"]
    assert machine.instruction_sets(set()) == []


def test_a_cpu_figure_names_the_model_cores_instruction_sets_and_software():
    recorded = {"cpu_model": "AMD EPYC 7B13", "cpu_cores": 2, "cpu_instruction_sets": ["AVX2"],
                "cpu_capability": "AVX2", "gpu": None, "python": "3.11.7", "torch": "2.14.1",
                "torchvision": "0.29.1", "onnxruntime": "1.31.1"}
    assert machine.describe(recorded) == ("AMD EPYC 7B13 (2 cores; AVX2; torch's CPU kernels AVX2), no GPU used; "
                                          "Python 3.11.7, torch 2.14.1, torchvision 0.29.1, onnxruntime 1.31.1")
    older = {key: value for key, value in recorded.items() if key not in ("cpu_instruction_sets", "onnxruntime")}
    assert "AMD EPYC 7B13 (2 cores; instruction sets not recorded;" in machine.describe(older)


def test_a_gpu_figure_names_the_gpu_its_driver_and_cuda():
    recorded = {"cpu_model": "Intel(R) Xeon(R) Platinum 8480+", "cpu_cores": 16,
                "cpu_instruction_sets": ["AVX2", "AVX512F", "AVX512-BF16", "AMX-BF16"], "cpu_capability": "AVX512",
                "gpu": {"name": "NVIDIA H100 80GB HBM3", "memory_gib": 79.1, "capability": "9.0", "count": 1,
                        "driver": "580.159.04", "cuda": "13.0"},
                "python": "3.12.3", "torch": "2.11.0", "torchvision": "0.26.0"}
    assert machine.describe(recorded) == (
        "1x NVIDIA H100 80GB HBM3 (79.1 GiB, compute capability 9.0, driver 580.159.04, CUDA 13.0), host "
        "Intel(R) Xeon(R) Platinum 8480+ (16 cores; AVX2, AVX512F, AVX512-BF16, AMX-BF16; torch's CPU kernels "
        "AVX512); Python 3.12.3, torch 2.11.0, torchvision 0.26.0")
    recorded["gpu"] = {**recorded["gpu"], "count": 8, "driver": None}
    assert "driver unknown, CUDA 13.0; one of 8 GPUs)" in machine.describe(recorded)


def test_the_driver_version_is_read_from_either_kernel_module():
    proprietary = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.159.04  Thu Oct  2 2025\nGCC version: gcc 12"
    open_module = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  Release Build  (dvs-builder)"
    assert machine.kernel_module_version(proprietary) == "580.159.04"
    assert machine.kernel_module_version(open_module) == "580.95.05"
    assert machine.kernel_module_version("no driver here") is None


def test_this_machine_s_facts_and_the_benchmarks_record_of_them():
    facts = machine.facts("cpu")
    assert facts["gpu"] is None and facts["cpu_instruction_sets"] == machine.instruction_sets()
    assert machine.description() == machine.describe(facts)
    if torch.cuda.is_available():
        assert machine.facts("cuda")["gpu"]["name"] == torch.cuda.get_device_name()
    environment = importlib.import_module("benchmarks.common").environment(torch.device("cpu"))
    assert environment["machine"] == machine.describe(environment)
    assert environment["cpu_instruction_sets"] == facts["cpu_instruction_sets"]
    assert environment["device_name"] == facts["cpu_model"] and environment["device"] == "cpu"


def test_the_avx512_kernels_are_asked_of_the_cpu_s_flags_and_the_settings_that_cap_them(monkeypatch):
    """``--memory-format auto`` takes channels-last on the CPU only where torch's and oneDNN's kernels are AVX512:
    the CPU lists what torch's AVX512 dispatch needs, and ATEN_CPU_CAPABILITY or ONEDNN_MAX_CPU_ISA, which lower
    them, do not say otherwise; asked without torch (a dry run)."""
    import sys

    for name in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(machine, "_cpu_flags", lambda: XEON_FLAGS | {"avx512vl", "avx512dq"})
    assert machine.cpu_kernels_avx512()
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_AMX")
    assert machine.cpu_kernels_avx512()
    for name, capped in (("ATEN_CPU_CAPABILITY", "avx2"), ("ATEN_CPU_CAPABILITY", "default"),
                         ("ONEDNN_MAX_CPU_ISA", "AVX2")):
        with monkeypatch.context() as scoped:
            scoped.setenv(name, capped)
            assert not machine.cpu_kernels_avx512(), (name, capped)
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA")
    monkeypatch.setattr(machine, "_cpu_flags", lambda: {"avx", "avx2", "fma"})  # the AVX2-only EPYC
    assert not machine.cpu_kernels_avx512()
    monkeypatch.setattr(machine, "_cpu_flags", lambda: XEON_FLAGS)  # AVX512F without VL and DQ: torch runs AVX2
    assert not machine.cpu_kernels_avx512()
    monkeypatch.setattr(machine, "_cpu_flags", lambda: None)  # not Linux: cannot tell, the reference's NCHW
    assert not machine.cpu_kernels_avx512()
    monkeypatch.setitem(sys.modules, "torch", None)  # no import of torch on the way
    assert not machine.cpu_kernels_avx512()


def test_auto_keeps_nchw_on_an_avx2_cpu_and_takes_channels_last_for_the_bottleneck_models_on_avx512():
    from image_classification.system import host

    for avx512, layout in ((True, "nhwc"), (False, "nchw")):
        choice = host.choose("cpu", False, None, "auto", cpu_channels_last=True, cuda=False, avx512=avx512)
        assert choice.memory_format == layout
    assert host.choose("cpu", False, None, "auto", cpu_channels_last=False, cuda=False, avx512=True).memory_format \
        == "nchw"  # ResNet-18 and -34
    assert host.choose("cpu", False, None, "nhwc", cpu_channels_last=True, cuda=False, avx512=False).memory_format \
        == "nhwc"  # a typed layout wins
