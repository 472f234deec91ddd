"""benchmarks/: each script runs end to end at tiny sizes and writes the JSON its figures are read from."""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import json
import os
import re
import shutil
import sys
import types

import pytest
import torch
from PIL import Image

from helpers import aoti_available
from image_classification.system import machine
from image_classification.system.cli import run

benchmark = importlib.import_module("benchmarks.infer_throughput")
infer_paths = importlib.import_module("benchmarks.infer_paths")
infer_timing = importlib.import_module("benchmarks.infer_timing")


@pytest.mark.slow  # docs/efficientnet.md's train_throughput.py commands run in the docs test
def test_train_throughput_times_every_path_against_the_plain_loop(tmp_path):
    benchmark = importlib.import_module("benchmarks.train_throughput")
    output = tmp_path / "train.json"
    argv = ["-a", "resnet18", "--image-size", "32", "-b", "4", "--num-classes", "10", "--iters", "2",
            "--warmup", "1", "--repeats", "2", "--device", "cpu", "--label-smoothing", "0.1",
            "--paths", "eager", "channels_last", "-o", str(output)]
    assert benchmark.main(argv) == 0
    result = json.loads(output.read_text())
    assert {"command", "config", "environment", "warmup_seconds", "plain", "paths", "best"} <= result.keys()
    assert result["config"]["label_smoothing"] == 0.1 and result["config"]["precision"] == "fp32"
    assert {"cpu_model", "cpu_cores", "torch", "torchvision"} <= result["environment"].keys()
    assert list(result["paths"]) == ["eager", "channels_last"] and result["best"] in result["paths"]
    for side in ("plain", "eager", "channels_last"):
        stats = result["plain"] if side == "plain" else result["paths"][side]
        assert len(stats["values"]) == 2 and all(value > 0 for value in stats["values"])
        assert stats["min"] <= stats["median"] <= stats["max"]
        assert result["warmup_seconds"][side] > 0
    for stats in result["paths"].values():
        assert stats["ratio"] == pytest.approx(stats["median"] / result["plain"]["median"])
        rounds = [a / b for a, b in zip(stats["values"], result["plain"]["values"])]
        assert stats["ratio_spread"] == pytest.approx((max(rounds) - min(rounds)) / (sum(rounds) / 2))
        assert stats["verdict"] == (abs(stats["ratio"] - 1) > stats["ratio_spread"])
    layout = result["paths"]["channels_last"]["over_eager"]  # what the layout alone gives: the same step in NCHW
    eager = result["paths"]["eager"]
    assert "over_eager" not in eager and layout["ratio"] == pytest.approx(
        result["paths"]["channels_last"]["median"] / eager["median"])
    rounds = [a / b for a, b in zip(result["paths"]["channels_last"]["values"], eager["values"])]
    assert layout["ratio_spread"] == pytest.approx((max(rounds) - min(rounds)) / (sum(rounds) / 2))
    profile = result["plain"]["profile"]  # on the CPU: where the plain loop's operator time goes
    convolutions = profile["conv_forward"] + profile["conv_backward"]
    assert 0 < profile["conv_forward"] < 1 and 0 < profile["conv_backward"] < 1 and convolutions < 1
    assert profile["bound"] == pytest.approx(1 / convolutions)


def test_the_training_profile_starts_kineto_silent_unless_the_user_set_its_level(monkeypatch):
    """Kineto's lines (USDT profiler_start/stop, and "ERROR: gpuGetDeviceCount failed with code 35" without a
    GPU) are none of ours: its level is set before the profiler first starts, and a level the user set stays."""
    benchmark = importlib.import_module("benchmarks.train_throughput")
    levels = []
    real = torch.profiler.profile

    def profile(*args, **kwargs):
        levels.append(os.environ.get("KINETO_LOG_LEVEL"))
        return real(*args, **kwargs)

    monkeypatch.setattr(torch.profiler, "profile", profile)
    step = lambda: torch.nn.functional.conv2d(torch.ones(1, 1, 4, 4), torch.ones(1, 1, 3, 3)).sum()  # noqa: E731
    for preset in (None, "2"):
        monkeypatch.setenv("KINETO_LOG_LEVEL", "placeholder")  # restored (unset) after the test
        monkeypatch.delenv("KINETO_LOG_LEVEL")
        if preset is not None:
            monkeypatch.setenv("KINETO_LOG_LEVEL", preset)
        assert benchmark.convolution_shares(step, lambda: None)["conv_forward"] > 0
    assert levels == ["6", "2"]


@pytest.mark.slow
def test_the_training_profile_writes_nothing_to_stderr_in_a_fresh_process():
    """What a user sees: a new process profiling its first steps prints no line of Kineto's."""
    import subprocess
    import sys

    from helpers import REPO

    code = ("import torch; from benchmarks.train_throughput import convolution_shares; "
            "step = lambda: torch.nn.functional.conv2d(torch.ones(1, 1, 8, 8), torch.ones(1, 1, 3, 3)).sum(); "
            "print(convolution_shares(step, lambda: None)['conv_forward'] > 0)")
    env = {key: value for key, value in os.environ.items() if key != "KINETO_LOG_LEVEL"}
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, env={**env, "PYTHONPATH": str(REPO),
                            "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and result.stdout == "True\n" and result.stderr == "", result.stderr


def test_train_throughput_refuses_compile_without_a_compiler(monkeypatch, capsys):
    benchmark = importlib.import_module("benchmarks.train_throughput")
    monkeypatch.setattr("shutil.which", lambda name: None)
    monkeypatch.delenv("CXX", raising=False)
    from image_classification.system.cli import run

    assert run(benchmark.main, ["--device", "cpu", "--paths", "compile"]) == 2
    assert "needs a C++ compiler" in capsys.readouterr().err


def test_a_ratio_inside_the_spread_of_its_rounds_gets_no_verdict():
    """A figure whose rounds moved more than the difference it claims says so and names no winner."""
    from benchmarks.common import ratio_spread, ratio_text, verdict

    steady = ratio_spread([120, 121, 119], [100, 100, 100])  # ratios 1.19-1.21: spread about 2%
    assert steady == pytest.approx(0.02 / 1.20) and verdict(1.20, steady)
    assert ratio_text(1.20, steady) == "1.20x" and ratio_text(1.20, steady, bold=True) == "**1.20x**"
    noisy = ratio_spread([104, 96, 110], [100, 100, 100])  # ratios 0.96-1.10: 14% spread
    assert not verdict(1.04, noisy) and not verdict(0.9, noisy) and verdict(0.8, noisy)
    text = ratio_text(1.04, noisy, bold=True)
    assert "**" not in text and "no verdict" in text and "spread 13%" in text
    assert ratio_spread([120], [100]) is None and not verdict(1.5, None)  # one round: no spread measured
    assert "no verdict" in ratio_text(1.5, None)


def test_infer_throughput_reports_every_path_and_skips_what_cannot_run(tmp_path, monkeypatch):
    benchmark = importlib.import_module("benchmarks.infer_throughput")
    monkeypatch.setitem(__import__("sys").modules, "onnxruntime", None)  # as if it were not installed
    output, chart = tmp_path / "infer.json", tmp_path / "infer.png"
    argv = ["-a", "resnet18", "--image-size", "32", "--batch-sizes", "1", "2", "--paths", "eager",
            "channels_last", "bf16", "onnxruntime", "--iters", "2", "--warmup", "1", "--repeats", "1",
            "--device", "cpu", "-o", str(output), "--chart", str(chart)]
    assert benchmark.main(argv) == 0
    result = json.loads(output.read_text())
    paths = result["paths"]
    assert list(paths) == ["torchvision", "eager", "channels_last", "bf16", "onnxruntime"]
    assert "onnxruntime is not installed" in paths["onnxruntime"]["skipped"]
    for name in ("torchvision", "eager", "channels_last", "bf16"):
        for batch in ("1", "2"):
            row = paths[name][batch]
            assert 0 < row["p50_ms"] <= row["p90_ms"] <= row["p99_ms"]
            assert row["batches"] == 2 and row["images_per_s"] > 0
            assert row["speedup"] == pytest.approx(row["images_per_s"] / paths["torchvision"][batch]["images_per_s"])
            assert row["speedup_spread"] is None and row["verdict"] is False  # one round: no verdict
    assert paths["eager"]["max_abs_diff"] < 1e-4 and paths["eager"]["top1_agreement"] == 1.0  # same weights
    assert paths["bf16"]["max_abs_diff"] > 0  # bfloat16 rounds; it is measured, not assumed
    assert paths["eager"]["compared_images"] == 3  # the measured batches of 1 and 2
    assert (paths["eager"]["dtype"], paths["bf16"]["dtype"]) == ("float32", "bfloat16")
    assert result["classify_default"] == ("bf16" if machine.cpu_bf16_is_faster() else "channels_last")
    assert {"cpu_capability", "cpu_bf16_native", "load_average"} <= result["environment"].keys()
    assert set(result["best"]) == {"1", "2"} and result["best"]["1"] in paths
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    ceiling = result["fp32_ceiling"]  # on the CPU: the model's FLOPs at the rate of a dense FP32 product
    assert ceiling["gflop_per_image"] == pytest.approx(infer_timing.model_gflop("resnet18", 32))
    assert ceiling["gemm_gflops"] > 0
    assert ceiling["images_per_s"] == pytest.approx(ceiling["gemm_gflops"] / ceiling["gflop_per_image"])


def test_the_fp32_ceiling_counts_the_published_flops():
    """At 224 px: ResNet-50 4.09 and ResNet-18 1.81 G multiply-adds (two FLOPs each), as torchvision lists them."""
    assert infer_timing.model_gflop("resnet50", 224) == pytest.approx(8.18, abs=0.01)
    assert infer_timing.model_gflop("resnet18", 224) == pytest.approx(3.63, abs=0.01)


def test_a_path_that_compiles_on_its_first_call_never_times_that_call(monkeypatch):
    """The benchmark's clock moves only inside the calls: 10 s for the first (the compilation), 1 ms after."""
    calls, clock = [], types.SimpleNamespace(now=0.0)
    monkeypatch.setattr(infer_timing, "time", types.SimpleNamespace(perf_counter=lambda: clock.now))

    def compiling(images):
        calls.append(len(images))
        clock.now += 10.0 if len(calls) == 1 else 0.001
        return images

    path = infer_paths.Path_("compile", compiling, min_warmup=1)
    infer_timing.measure_paths([path], [2], 8, torch.device("cpu"), iters=2, warmup=0, repeats=1)
    assert len(calls) == 3 and path.latencies[2] == pytest.approx([0.001, 0.001])
    assert path.warmup_seconds[2] == pytest.approx(10.0)


@pytest.fixture(scope="module")
def state() -> dict:
    torch.manual_seed(0)
    return benchmark.build_model("resnet18", num_classes=10).state_dict()


def test_every_path_times_the_model_alone_on_a_batch_already_on_the_device(state, tmp_path, monkeypatch):
    """The batch is uploaded once before timing and no path moves data between devices inside its timed
    call: the meta device stands for a GPU here (tensors there have shapes, no data)."""
    device, inside, moves, devices = torch.device("meta"), [], [], []
    for method in ("to", "cpu", "cuda"):
        original = getattr(torch.Tensor, method)

        def recording(self, *args, _original=original, _method=method, **kwargs):
            to_a_device = "device" in kwargs or any(isinstance(a, (torch.device, str, torch.Tensor)) for a in args)
            if inside and (_method != "to" or to_a_device):  # .to(dtype) is a cast, not a transfer
                moves.append(_method)
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, method, recording)
    paths = [infer_paths.build_baseline("resnet18", state, device)]
    paths += [infer_paths.build_path(name, state, "resnet18", 10, device, 32, tmp_path)
              for name in ("eager", "channels_last")]
    for path in paths:
        def timed(images, _forward=path.forward):
            devices.append(images.device)
            inside.append(True)
            try:
                return _forward(images)
            finally:
                inside.pop()

        path.forward = timed
        infer_timing.measure_paths([path], [1, 2], 32, device, iters=2, warmup=1, repeats=1)
    assert len(devices) == 3 * 2 * 3 and set(devices) == {device}
    assert moves == []


@pytest.mark.parametrize("name, dtype", [("bf16", torch.bfloat16), ("fp16", torch.float16)])
def test_a_mixed_path_runs_the_dtype_it_is_named_after_on_any_device(state, tmp_path, monkeypatch, name, dtype):
    """The fp16 autocast of a GPU is its own path, never the "bf16" row (meta stands for the GPU)."""
    used = []

    @contextlib.contextmanager
    def autocast(device_type, dtype=None, **kwargs):
        used.append((device_type, dtype))
        yield

    monkeypatch.setattr(torch, "autocast", autocast)
    path = infer_paths.build_path(name, state, "resnet18", 10, torch.device("meta"), 32, tmp_path)
    path.forward(torch.zeros(1, 3, 32, 32, device="meta"))
    assert used == [("meta", dtype)] and path.dtype == str(dtype).removeprefix("torch.")
    if name == "fp16":
        cpu = infer_paths.build_path(name, state, "resnet18", 10, torch.device("cpu"), 32, tmp_path)
        assert "CUDA only" in cpu.skipped and cpu.dtype == "float16"


def test_compile_builds_a_static_graph_for_each_batch_size(state, tmp_path, monkeypatch):
    compiled = []

    def compile_(model, **options):
        compiled.append(options)
        return model

    monkeypatch.setattr(torch, "compile", compile_)
    monkeypatch.setattr(shutil, "which", lambda name: f"/usr/bin/{name}")
    path = infer_paths.build_path("compile", state, "resnet18", 10, torch.device("cpu"), 32, tmp_path)
    infer_timing.measure_paths([path], [1, 2], 32, torch.device("cpu"), iters=1, warmup=0, repeats=1)
    assert compiled == [{"dynamic": False}, {"dynamic": False}]


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_compile_without_a_compiler_is_skipped_on_every_device(state, tmp_path, monkeypatch, device):
    """A GPU host without a C compiler records compile as skipped instead of failing in its warm-up."""
    monkeypatch.setattr(shutil, "which", lambda name: None)
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.delenv("CXX", raising=False)
    path = infer_paths.build_path("compile", state, "resnet18", 10, torch.device(device), 32, tmp_path)
    assert path.skipped.startswith(f"torch.compile on {device} needs a C")


def test_the_cuda_benchmark_turns_cudnn_autotuning_on(monkeypatch):
    saved = torch.backends.cudnn.benchmark
    try:
        torch.backends.cudnn.benchmark = False
        assert benchmark.select_device("cpu").type == "cpu" and torch.backends.cudnn.benchmark is False
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        assert benchmark.select_device("auto").type == "cuda" and torch.backends.cudnn.benchmark is True
    finally:
        torch.backends.cudnn.benchmark = saved


def test_the_loader_benchmark_profiles_the_cpu_dali_pipeline_stage_by_stage(tmp_path, capsys):
    pytest.importorskip("nvidia.dali")
    from helpers import load_script

    loader = load_script("benchmark_loader", "benchmarks")
    argv = ["--photos", "2", "--dali-stages", "-b", "4", "-j", "1", "--image-size", "32", str(tmp_path / "photos")]
    assert loader.main(argv) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.startswith("CPU DALI pipeline, batch 4, 1 threads, 32 px crops: read ")
    shares = loader.profile_dali_stages(loader.build_parser().parse_args(argv))
    assert list(shares) == ["read", "decode", "resize", "normalise"] and all(ms >= 0 for ms in shares.values())


def test_the_loader_benchmark_builds_the_photo_set_and_states_a_ratio_only_beyond_its_spread(tmp_path, capsys,
                                                                                             monkeypatch):
    """--photos writes a class per photograph; the summary gives the median of the epochs' ratios with their
    spread, and the verdict line (which the performance page's table takes) follows the spread rule: all three
    as the epochs' own rates make them, whatever the rates (a loaded machine moves them, not the logic)."""
    import statistics

    from benchmarks.common import ratio_text
    from helpers import load_script

    loader = load_script("benchmark_loader", "benchmarks")
    figures = load_script("readme_figures")
    reported, report = [], loader.report_against
    monkeypatch.setattr(loader, "report_against", lambda timing, base: reported.append((timing, base))
                        or report(timing, base))
    data = tmp_path / "photos"
    argv = ["--photos", "2", "--data-backend", "pytorch", "-b", "2", "-j", "0", "--epochs", "3", "--image-size", "32",
            "--device", "cpu", "--baseline", str(data)]
    assert loader.main(argv) == 0
    output = capsys.readouterr().out
    assert sorted(path.name for path in (data / "train").iterdir()) == sorted(loader.PHOTO_SET)
    assert all(len(list(folder.glob("*.jpg"))) == 2 for folder in (data / "train").iterdir())
    [(timing, base)] = reported
    assert (timing.name, base.name, len(timing.rates), len(base.rates)) == ("pytorch", "torchvision", 3, 3)
    ratios = [ours / plain for ours, plain in zip(timing.rates[1:], base.rates[1:])]  # the first epoch left out
    speedup, spread, _ = timing.against(base)
    assert (speedup, spread) == pytest.approx((statistics.median(ratios), (max(ratios) - min(ratios)) / speedup))
    summary = figures.LOADER_SUMMARY.search(output)
    assert summary is not None and summary.group(3) == "pytorch"
    assert (summary.group(6), summary.group(7)) == (f"{speedup:.2f}", f"spread {spread:.1%}")
    assert re.search(r"^verdict: (.*)$", output, re.M).group(1) == ratio_text(speedup, spread)


def test_the_loader_benchmark_s_speed_up_is_the_median_of_the_epochs_ratios_with_their_spread():
    """Exact rates: the first epoch (start-up) left out of both figures; a ratio inside its spread is no verdict."""
    from benchmarks.common import ratio_text
    from helpers import load_script

    loader = load_script("benchmark_loader", "benchmarks")
    ours, base = loader.Timing("pytorch", [1.0, 30.0, 36.0, 33.0]), loader.Timing("torchvision", [9.0, 10.0, 12.0, 10.0])
    speedup, spread, words = ours.against(base)
    assert (speedup, spread, words) == (3.0, pytest.approx(0.3 / 3.0), "spread 10.0% over 3 epochs")
    assert ratio_text(speedup, spread) == "3.00x"
    close = loader.Timing("pytorch", [1.0, 10.5, 9.5, 10.0])
    assert ratio_text(*close.against(base)[:2]) == "1.00x (spread 26% >= the 0% difference: no verdict)"
    assert loader.Timing("pytorch", [1.0]).against(loader.Timing("torchvision", [2.0]))[1:] == (None, "spread unknown")


def test_the_loader_benchmark_times_a_backend_beside_others(tmp_path, capsys):
    """--beside: epochs alternate between the backends, and --data-backend's speed is given over each of them."""
    import re

    from helpers import load_script

    loader = load_script("benchmark_loader", "benchmarks")
    argv = ["--photos", "2", "--data-backend", "pytorch-gpu", "--beside", "pytorch", "-b", "2", "-j", "0", "--epochs",
            "2", "--image-size", "32", "--device", "cpu", str(tmp_path / "photos")]
    assert loader.main(argv) == 0
    output = capsys.readouterr().out
    epochs = re.findall(r"^(\S+) epoch (\d+): 8 images in", output, re.M)
    assert epochs == [("pytorch", "0"), ("pytorch-gpu", "0"), ("pytorch", "1"), ("pytorch-gpu", "1")]
    assert re.search(r"^pytorch: [\d.]+ images/s, [\d.]+ CPU ms/image; pytorch-gpu: [\d.]+ images/s, .* speed-up "
                     r"[\d.]+x", output, re.M)
    assert re.search(r"^verdict against pytorch: [\d.]+x", output, re.M)


def test_the_loader_benchmark_times_one_backend_with_two_jpeg_decoders(tmp_path, capsys, monkeypatch):
    """--beside-decoder: epochs alternate between the decoders (each epoch decodes with its own, its workers
    forked under it) and the speed of --decoder's is given over the other's; the start-up line names --decoder's."""
    import re

    from helpers import load_script
    from image_classification.data import decoders
    from image_classification.errors import UserError

    used = []
    for library in decoders.LIBRARIES:  # stand-ins: torchcodec need not be installed
        monkeypatch.setitem(decoders._LOADERS, library, lambda library=library: decoders.JpegDecoder(
            library, "1.0", lambda data, library=library: used.append(library) or decoders._pillow().decode(data),
            decoders._pillow().decode_batch))
    loader = load_script("benchmark_loader", "benchmarks")
    argv = ["--photos", "2", "--data-backend", "pytorch", "--decoder", "torchcodec", "--beside-decoder", "torchvision",
            "--decode-scale", "full", "-b", "2", "-j", "0", "--epochs", "2", "--image-size", "32", "--device", "cpu", str(tmp_path / "photos")]
    assert loader.main(argv) == 0
    output = capsys.readouterr().out
    assert "=> JPEG decoder: torchcodec 1.0 (libjpeg-turbo, in the loader workers" in output
    epochs = re.findall(r"^(\S+) epoch (\d+): 8 images in", output, re.M)
    assert epochs == [("pytorch/torchvision", "0"), ("pytorch/torchcodec", "0"), ("pytorch/torchvision", "1"),
                      ("pytorch/torchcodec", "1")]
    assert used == (["torchvision"] * 8 + ["torchcodec"] * 8) * 2
    assert re.search(r"^verdict against pytorch/torchvision: [\d.]+x", output, re.M)
    monkeypatch.setitem(decoders._LOADERS, "torchcodec", lambda: __import__("torchcodec_is_not_here"))
    with pytest.raises(UserError, match=r"^--beside-decoder torchcodec: torchcodec is not installed here"):
        loader.main(["--data-backend", "pytorch", "--beside-decoder", "torchcodec", str(tmp_path / "photos")])


@pytest.mark.slow
def test_the_int8_path_times_the_quantized_export_on_the_cpu_only(state, tmp_path):
    pytest.importorskip("onnxruntime")
    onnx = pytest.importorskip("onnx")
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert "int8" in infer_paths.default_paths(cpu) and "int8" not in infer_paths.default_paths(cuda)
    path = infer_paths.build_path("int8", state, "resnet18", 10, cpu, 32, tmp_path)
    baseline = infer_paths.build_baseline("resnet18", state, cpu)
    infer_timing.measure_paths([baseline, path], [2], 32, cpu, iters=1, warmup=0, repeats=1)
    assert path.dtype.startswith("int8") and len(path.latencies[2]) == 1
    assert path.compared == 2 and path.max_abs_diff > 1e-4  # int8 rounds: measured, not assumed
    graph = onnx.load(str(tmp_path / "model_int8.onnx")).graph
    assert "QuantizeLinear" in {node.op_type for node in graph.node}
    assert infer_paths.build_path("int8", state, "resnet18", 10, torch.device("meta"), 32, tmp_path).skipped == \
        "the ONNX Runtime paths are measured on the CPU only"


def test_the_largest_batch_that_fits_is_found_by_halving_on_out_of_memory():
    from benchmarks.common import largest_fitting

    tried, released = [], []

    def attempt(batch: int) -> str:
        tried.append(batch)
        if batch > 24:
            raise torch.OutOfMemoryError(f"CUDA out of memory. Tried to allocate {batch} GiB")
        return f"measured at {batch}"

    assert largest_fitting(attempt, 64, release=lambda: released.append(True)) == (16, "measured at 16", [64, 32])
    assert tried == [64, 32, 16] and len(released) == 2  # memory given back after each failed attempt


def test_a_workspace_that_cudnn_cannot_allocate_counts_as_out_of_memory_and_other_errors_do_not():
    from benchmarks.common import largest_fitting
    from image_classification.errors import UserError

    def cudnn(batch: int) -> int:
        if batch > 4:
            raise RuntimeError("cuDNN error: CUDNN_STATUS_ALLOC_FAILED")
        return batch

    assert largest_fitting(cudnn, 16, release=lambda: None)[0] == 4

    def broken(batch: int) -> int:
        raise RuntimeError("Expected all tensors to be on the same device")

    with pytest.raises(RuntimeError, match="same device"):
        largest_fitting(broken, 16, release=lambda: None)  # not a reason to try a smaller batch

    def never(batch: int) -> int:
        raise torch.OutOfMemoryError("CUDA out of memory")

    with pytest.raises(UserError, match="not even a batch of 1"):
        largest_fitting(never, 4, release=lambda: None)


def test_train_throughput_measures_at_the_largest_batch_that_fits(tmp_path, tiny_arch, monkeypatch):
    """A model whose forward runs out of memory above batch 2: the benchmark halves -b until it trains."""
    benchmark = importlib.import_module("benchmarks.train_throughput")
    real_build = benchmark.build_model

    def build_model(arch, num_classes):
        def out_of_memory_above_2(module, inputs):
            if inputs[0].shape[0] > 2:
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

        model = real_build(arch, num_classes=num_classes)
        model.register_forward_pre_hook(out_of_memory_above_2)
        return model

    monkeypatch.setattr(benchmark, "build_model", build_model)
    output = tmp_path / "train.json"
    argv = ["-a", tiny_arch, "--image-size", "32", "-b", "8", "--largest-batch", "--num-classes", "10", "--iters",
            "1", "--warmup", "1", "--repeats", "1", "--device", "cpu", "--paths", "eager", "-o", str(output)]
    assert benchmark.main(argv) == 0
    config = json.loads(output.read_text())["config"]
    assert config["batch_size"] == 2
    assert config["largest_batch"] == {"tried_from": 8, "out_of_memory_at": [8, 4]}


def test_the_loader_benchmark_says_what_it_writes_while_it_writes(tmp_path, capsys, monkeypatch):
    """--make-dataset takes seconds to minutes: a line before, one every HEARTBEAT_SECONDS (here at once) with
    the time left, and one at the end; a typo is named with the flag meant."""
    pytest.importorskip("skimage")
    from helpers import load_script, refused
    from image_classification.system.cli import run
    from image_classification.train import progress

    monkeypatch.setattr(progress, "HEARTBEAT_SECONDS", 0.0)
    loader = load_script("benchmark_loader", "benchmarks")
    loader.write_data(loader.build_parser().parse_args(["--make-dataset", "2", str(tmp_path / "d")]))
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"=> writing 4 JPEG images cut from scikit-image's photos into {tmp_path / 'd' / 'train'}"
    assert [line.split(",")[0] for line in lines[1:-1]] == [f"=> writing: {n}/4 images" for n in (1, 2, 3)]
    assert lines[-1].startswith("=> wrote 4 images in ") and len(list((tmp_path / "d").rglob("*.jpg"))) == 4
    line = refused(run(loader.main, ["--make-datset", "2", str(tmp_path / "e")]), capsys)
    assert line.endswith("unknown flag --make-datset; did you mean --make-dataset?")


def test_the_camera_set_is_written_at_the_size_asked_and_a_size_it_cannot_write_is_refused(tmp_path, capsys):
    pytest.importorskip("skimage.data")
    from helpers import load_script, refused

    loader = load_script("benchmark_loader", "benchmarks")
    opts = loader.build_parser().parse_args(["--camera", "2", "--camera-size", "320x240", str(tmp_path / "cam")])
    loader.write_data(opts)
    assert capsys.readouterr().out.startswith("=> writing 2 JPEG images of 320x240, camera photographs made from "
                                              f"scikit-image's photos, into {tmp_path / 'cam' / 'train'}\n")
    assert [Image.open(path).size for path in sorted((tmp_path / "cam").rglob("*.jpg"))] == [(320, 240)] * 2
    assert loader.build_parser().parse_args(["x"]).camera_size == (4032, 3024)  # 12 MP unless asked
    for size in ("320", "16x12", "320x240x3"):
        line = refused(run(loader.main, ["--camera", "2", "--camera-size", size, str(tmp_path / "bad")]), capsys)
        assert f"'{size}' is not WIDTHxHEIGHT of 32 pixels or more" in line
    assert not (tmp_path / "bad").exists()


@pytest.mark.parametrize("flag", ["--photos", "--camera", "--make-dataset"])
def test_a_loader_benchmark_that_writes_photos_without_scikit_image_is_one_line_before_anything(
        tmp_path, capsys, monkeypatch, flag):
    """`make demo` installs no scikit-image: the flag that needs it says so, and nothing is said or written."""
    from helpers import load_script
    from image_classification.system.cli import run

    monkeypatch.setitem(sys.modules, "skimage", None)  # `import skimage` raises ImportError
    monkeypatch.setitem(sys.modules, "skimage.data", None)
    loader = load_script("benchmark_loader", "benchmarks")
    assert run(loader.main, [flag, "2", "--data-backend", "pytorch", str(tmp_path / "photos")]) == 2
    assert capsys.readouterr() == ("", f"error: {flag} cuts its images from scikit-image's sample photographs, "
                                   "and scikit-image is not installed here: pip install scikit-image "
                                   "(requirements-dev.txt pins it)\n")
    assert not (tmp_path / "photos").exists()


# -- the side by side with timm's train.py ----------------------------------------------------------------
def _fake_sides(calls: list, top1: dict):
    """A stand-in for peer_timm.run_once: the lines each side prints, at made-up times (ours: 2 iterations of
    the last epoch in 1 s; timm's: in 2 s), and ours' raport."""
    def run_once(command, cwd):
        side = "ours" if command[2].endswith("main.py") else "timm"
        seed = int(command[command.index("--seed") + 1])
        calls.append((side, seed))
        if side == "ours":
            records = [{"type": "LOG", "step": [epoch], "data": {"val.top1": top1[side][seed] - 10 * (1 - epoch)}}
                       for epoch in (0, 1)]
            (cwd / "experiment_raport.json").write_text("".join(f"DLLL {json.dumps(r)}\n" for r in records))
            lines = [(0.5, "Epoch 1/2 [3/3] loss 1.0000, 9.0 img/s, lr 0.1"),
                     (1.0, "Epoch 2/2 [1/3] loss 1.0000, 9.0 img/s, lr 0.1"),
                     (1.5, "Epoch 2/2 val [1/1] loss 1.0000, top1 1.00%, 9.0 img/s"),
                     (2.0, "Epoch 2/2 [3/3] loss 0.5000, 9.0 img/s, lr 0.1"), (3.0, "Epoch 2/2: train loss 0.7500")]
        else:
            result = [{"epoch": e, "validation": {"top1": top1[side][seed] - 10 * (1 - e)}} for e in (0, 1)]
            lines = [(1.0, "Train: 1 [   0/3 ( 33%)]  Loss: 1.0"), (3.0, "Train: 1 [   2/3 (100%)]  Loss: 0.5"),
                     (3.5, "--result"), *((3.5, line) for line in json.dumps(result, indent=4).splitlines())]
        return lines, 4.0, 0
    return run_once


def test_the_peer_benchmark_names_the_timm_that_train_py_s_folder_imports_without_importing_it(tmp_path):
    """A clone's own timm package shadows the installed one for its train.py; its version is read from its
    version.py (importing timm imports torch: seconds), from the package where it has none."""
    peer = importlib.import_module("benchmarks.peer_timm")
    package = tmp_path / "timm"
    package.mkdir()
    (tmp_path / "train.py").write_text("")
    (package / "__init__.py").write_text("raise SystemExit('imported')\n")
    (package / "version.py").write_text("__version__ = '9.9.9'\n")
    assert peer.check_timm(str(tmp_path / "train.py")) == "9.9.9"
    (package / "version.py").unlink()
    (package / "__init__.py").write_text("__version__ = '8.8.8'\n")
    assert peer.check_timm(str(tmp_path / "train.py")) == "8.8.8"


def test_the_peer_benchmark_alternates_the_sides_and_compares_what_both_measure_alike(tmp_path, monkeypatch, capsys):
    """Each seed trains both sides, the order alternating; top-1 is the last epoch's, images/s the last epoch's
    from the arrival of its first and last iteration lines (validation lines aside), the same for both."""
    peer = importlib.import_module("benchmarks.peer_timm")
    for split, name in ((s, n) for s in ("train", "val") for n in ("a", "b")):
        (tmp_path / "data" / split / name).mkdir(parents=True)
    (tmp_path / "train.py").write_text("")
    calls, top1 = [], {"ours": {1: 97.0, 2: 99.0}, "timm": {1: 98.0, 2: 99.5}}
    monkeypatch.setattr(peer, "run_once", _fake_sides(calls, top1))
    output = tmp_path / "peer.json"
    assert peer.main([str(tmp_path / "data"), "--timm-train", str(tmp_path / "train.py"), "--seeds", "1", "2",
                      "-o", str(output)]) == 0
    assert calls == [("ours", 1), ("timm", 1), ("timm", 2), ("ours", 2)]
    result = json.loads(output.read_text())
    assert [run["top1"] for run in result["runs"]] == [97.0, 98.0, 99.5, 99.0]
    assert [run["images_per_s"] for run in result["runs"]] == [64.0, 32.0, 32.0, 64.0]
    assert result["images_per_s_ratio"] == {"ratio": 2.0, "spread": 0.0}
    assert result["top1_difference"] == {"points": -0.75, "seeds_spread": 2.0, "within_noise": True}
    assert result["machine"]["cpu_model"] and result["recipe"]["lr"] == 0.1
    assert result["timm_version"] == importlib.metadata.version("timm")  # train.py's folder holds no timm
    assert result["timm"]["top1"]["median"] == 98.75  # timm's side's figures
    out = capsys.readouterr().out
    assert "images/s, ours over timm's: 2.00x" in out
    assert "top-1, ours - timm's: -0.75 points, within the seeds' spread of 2.00" in out


def test_the_benchmarks_take_the_top1_of_the_last_epoch_or_say_it_has_none(tmp_path):
    """An epoch whose validation outputs were not finite records no top-1: the peer and decode-scale benchmarks
    say so, where taking the last top-1 the raport holds would report an earlier epoch's figure as the run's."""
    from benchmarks.common import last_epoch_top1
    from image_classification.errors import UserError

    path = tmp_path / "experiment_raport.json"

    def raport(*epochs):
        lines = [{"type": "LOG", "step": [epoch], "data": data} for epoch, data in enumerate(epochs)]
        path.write_text("".join(f"DLLL {json.dumps(r)}\n" for r in lines))

    raport({"train.loss": 1.0, "val.top1": 60.0}, {"train.loss": 0.5, "val.top1": 90.0})
    assert last_epoch_top1(path) == 90.0
    raport({"train.loss": 1.0, "val.top1": 60.0}, {"train.loss": 0.5, "val.not_finite": 4})
    with pytest.raises(UserError, match=r"no validation top-1 for its last epoch \(2\): its outputs were not finite"):
        last_epoch_top1(path)
    for benchmark in ("peer_timm", "decode_scale_accuracy"):  # both read their runs' top-1 with it
        assert importlib.import_module(f"benchmarks.{benchmark}").last_epoch_top1 is last_epoch_top1


def test_the_peer_benchmark_gives_main_py_timm_s_recipe_written_out():
    """Where our defaults and timm's differ, ours is told timm's: Nesterov, biases not decayed, the last BatchNorm
    at zero, validation at crop_pct 0.95; no warm-up on either side."""
    from image_classification.arguments import parse_args

    peer = importlib.import_module("benchmarks.peer_timm")
    opts = peer.build_parser().parse_args(["/d", "--timm-train", "train.py", "--ours-flags=--epochs 3",
                                           "--timm-flags=--channels-last --pin-mem"])
    args = parse_args(peer.ours_command(opts, 7, "/w", 4)[3:])
    assert args.memory_format == "auto"  # each side keeps its own default layout unless told
    assert (args.nesterov, args.momentum, args.bias_weight_decay, args.norm_weight_decay) == (True, 0.9, 0.0, None)
    assert (args.last_bn_0_init, args.val_resize_size, args.image_size, args.interpolation) == (True, 101, 96,
                                                                                              "bilinear")
    assert (args.lr, args.lr_schedule, args.warmup, args.label_smoothing, args.weight_decay) == (0.1, "cosine", 0,
                                                                                                0.1, 1e-4)
    assert (args.seed, args.epochs, args.batch_size, args.workers, args.device) == (7, 3, 32, 2, "cpu")
    timm = " ".join(peer.timm_command(opts, 7, "/w", 4))
    assert timm.endswith(" --channels-last --pin-mem")  # --timm-flags, last: they win
    for words in ("--opt sgd --momentum 0.9", "--warmup-epochs 0", "--crop-pct 0.95", "--color-jitter 0",
                  "--sched cosine", "--smoothing 0.1", "--weight-decay 1e-4", "--seed 7", "--val-split val"):
        assert words in timm, words


def test_the_peer_benchmark_without_timm_s_train_py_says_where_to_get_it(tmp_path, capsys):
    from helpers import refused
    from image_classification.system.cli import run

    peer = importlib.import_module("benchmarks.peer_timm")
    message = refused(run(peer.main, [str(tmp_path), "--timm-train", str(tmp_path / "missing.py")]), capsys)
    assert "no such file" in message and "github.com/huggingface/pytorch-image-models" in message


def test_the_peer_benchmark_writes_the_photo_set_with_the_loader_benchmark_s_own_function(tmp_path, monkeypatch):
    """``--photos DIR``: the set is cut by benchmarks/benchmark_loader.py's function, imported as a module (the
    one-release forwarder in scripts/ runs the benchmark as a command, with peer_timm's own flags, on import)."""
    loader = importlib.import_module("benchmarks.benchmark_loader")
    peer = importlib.import_module("benchmarks.peer_timm")
    cut = []

    def make_photo_set(root, per_class, size, seed):
        cut.append((root, per_class, seed))
        for label in ("astronaut", "camera"):
            (root / "train" / label).mkdir(parents=True)

    monkeypatch.setattr(loader, "make_photo_set", make_photo_set)
    monkeypatch.setattr(sys, "argv", ["peer_timm.py", "--timm-train", "train.py", "--photos", str(tmp_path)])
    peer.write_photo_set(tmp_path / "photos")
    assert [seed for _, _, seed in cut] == [1, 0] and cut[1][0] == tmp_path / "photos"
    assert sorted(path.name for path in (tmp_path / "photos").iterdir()) == ["train", "val"]


def test_the_decode_scale_benchmark_counts_the_reduced_decodes_the_loader_makes(tmp_path, monkeypatch):
    """Its replay of a run's draws counts the boxes and validation images that the pytorch backend's loader
    decodes at a reduced scale, in the run's own order and crops."""
    pytest.importorskip("skimage")
    from image_classification.arguments import parse_args
    from image_classification.data import get_loaders, reduced
    from image_classification.system.runtime import make_runtime
    from image_classification.arguments.data import data_config

    benchmark = importlib.import_module("benchmarks.decode_scale_accuracy")
    data = tmp_path / "photos"
    benchmark.write_photos(data, 4, 2)
    assert {path.name for path in data.iterdir()} == {"train", "val"}
    assert [len(list((data / split).glob("*/*.jpg"))) for split in ("train", "val")] == [16, 8]
    opts = benchmark.build_parser().parse_args(["--photos", "4", "2", "--image-size", "96", "--epochs", "2", "-b", "3",
                                                str(data)])
    _, arguments = benchmark.run_command(opts, 7, "auto", tmp_path / "run")
    arguments[arguments.index("--workers") + 1] = "0"
    decoded = []
    drafted = reduced.drafted
    monkeypatch.setattr(reduced, "drafted",
                        lambda raw, w, h, scale: decoded.append(scale) or drafted(raw, w, h, scale))
    args = parse_args(arguments)
    train, val = get_loaders(data_config(args, args.image_size), make_runtime("cpu"), want_train=True, want_val=True)
    boxes = 0
    for epoch in range(2):
        train.set_epoch(epoch)
        boxes += sum(len(targets) for _, targets in train)
    reduced_boxes = len(decoded)
    val.set_epoch(0)
    assert sum(len(targets) for _, targets in val) == 8
    assert benchmark.reduced_counts(arguments) == (reduced_boxes, boxes, len(decoded) - reduced_boxes, 8)
    assert boxes == 30 and 0 < reduced_boxes < boxes and len(decoded) - reduced_boxes == 8


@pytest.mark.slow
def test_the_decode_scale_benchmark_alternates_the_scales_seed_by_seed(tmp_path, capsys):
    """Each seed trains with both scales, the order alternating; each run says its top-1 and, with ``auto``, what it
    decoded reduced; the summary gives each scale's spread and the difference seed by seed."""
    import re

    pytest.importorskip("skimage")
    benchmark = importlib.import_module("benchmarks.decode_scale_accuracy")
    argv = ["--photos", "2", "1", "--image-size", "32", "--epochs", "1", "-b", "4", "--seeds", "1", "2",
            "--workspaces", str(tmp_path / "runs"), str(tmp_path / "photos")]
    assert benchmark.main(argv) == 0
    output = capsys.readouterr().out
    runs = re.findall(r"^seed (\d), --decode-scale (\w+): val top-1 [\d.]+%; (.*) \(\d+ s\)$", output, re.M)
    assert [run[:2] for run in runs] == [("1", "auto"), ("1", "full"), ("2", "full"), ("2", "auto")]
    for _, scale, decoded in runs:
        assert decoded == ("every image decoded whole" if scale == "full" else
                           "decoded reduced: 8 of 8 training boxes, 4 of 4 validation images"), decoded
    assert re.search(r"^--decode-scale auto: mean [\d.]+%, sd [\d.]+, min [\d.]+, max [\d.]+$", output, re.M)
    assert re.search(r"^auto - full, seed by seed: [+-][\d.]+, [+-][\d.]+; mean [+-][\d.]+ points, (within|beyond) "
                     r"the runs' noise", output, re.M)


def test_the_dali_validation_benchmark_says_in_one_line_where_dali_is_missing(image_folder, capsys, monkeypatch):
    """A machine without DALI (the GPU machine's image has none): one line and exit code 2, not an import
    traceback."""
    benchmark = importlib.import_module("benchmarks.dali_validation")
    monkeypatch.setitem(sys.modules, "nvidia.dali", None)  # `import nvidia.dali` raises ImportError
    assert run(benchmark.main, ["--image-size", "32", "-b", "4", "--rounds", "1", str(image_folder)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "NVIDIA DALI cannot be imported here" in err


def test_the_dali_validation_benchmark_times_the_window_against_the_whole_image_on_the_same_pixels(
        image_folder, capsys, monkeypatch):
    """Two loaders, one decoding the centre crop's window and one the whole image, give the same batches (within a
    grey level) and alternate their passes; a line a round and the medians with the load average.  The backend's
    own validation decodes the window again afterwards."""
    import re

    pytest.importorskip("nvidia.dali")
    from nvidia.dali import fn

    from image_classification.data import dali_pipeline

    benchmark = importlib.import_module("benchmarks.dali_validation")
    decoders = []
    for name in ("image", "image_slice"):
        monkeypatch.setattr(fn.decoders, name, lambda *args, _name=name, _decode=getattr(fn.decoders, name), **kwargs:
                            decoders.append(_name) or _decode(*args, **kwargs))
    window = dali_pipeline._val_crop
    argv = ["--image-size", "32", "-b", "4", "-j", "1", "--rounds", "2", str(image_folder)]
    assert benchmark.main(argv) == 0
    assert decoders == ["image_slice", "image"] and dali_pipeline._val_crop is window
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("machine: ")
    assert lines[1] == f"12 images of {image_folder / 'val'}, 32 px, batch 4, 1 threads"
    levels = re.fullmatch(r"window against whole image: mean ([\d.]+) grey levels, largest (\d+)", lines[2])
    assert levels and float(levels[1]) < 0.01 and int(levels[2]) <= 1, lines[2]
    number = r"[\d.]+ ms \([\d.]+ CPU ms\)"
    for round_, line in zip((1, 2), lines[3:5], strict=True):
        assert re.fullmatch(rf"round {round_}: window {number}, whole {number} per image; whole / window [\d.]+x", line)
    assert re.fullmatch(rf"median: window {number}, whole {number} per image; whole / window wall [\d.]+x "
                        r"\(rounds [\d.]+-[\d.]+\), cpu [\d.]+x \(rounds [\d.]+-[\d.]+\); load average [\d.]+ / "
                        r"[\d.]+ / [\d.]+", lines[5]) and len(lines) == 6


def test_the_package_path_is_measured_when_named_and_skipped_where_it_cannot_compile(state, tmp_path, monkeypatch):
    import torch._inductor

    if not hasattr(torch._inductor, "aoti_compile_and_package"):
        pytest.skip("torch before 2.6 has no AOTInductor packages")
    assert "aoti" in infer_paths.PATHS and "aoti" not in infer_paths.default_paths(torch.device("cpu"))
    monkeypatch.setattr(shutil, "which", lambda name: None)
    monkeypatch.delenv("CXX", raising=False)
    path = infer_paths.build_path("aoti", state, "resnet18", 10, torch.device("cpu"), 32, tmp_path)
    assert path.skipped.startswith("AOTInductor builds the package with a C++ compiler, and none was found")


@pytest.mark.slow
def test_the_package_path_predicts_what_the_baseline_does(state, tmp_path):
    if not aoti_available():
        pytest.skip("needs torch 2.6 or later and a C++ compiler")
    paths = [infer_paths.build_baseline("resnet18", state, torch.device("cpu")),
             infer_paths.build_path("aoti", state, "resnet18", 10, torch.device("cpu"), 32, tmp_path)]
    infer_timing.measure_paths(paths, [1, 3], 32, torch.device("cpu"), iters=1, warmup=1, repeats=1)
    assert paths[1].skipped is None and paths[1].compared == 4
    assert paths[1].max_abs_diff < 1e-3 and paths[1].agreeing == 4
