"""benchmarks/: each script runs end to end at tiny sizes and writes the JSON its figures are read from."""

from __future__ import annotations

import importlib
import json
import time

import pytest
import torch


def test_train_throughput_writes_both_sides_and_their_ratio(tmp_path):
    benchmark = importlib.import_module("benchmarks.train_throughput")
    output = tmp_path / "train.json"
    argv = ["-a", "resnet18", "--image-size", "32", "-b", "4", "--num-classes", "10", "--iters", "2",
            "--warmup", "1", "--repeats", "2", "--device", "cpu", "--label-smoothing", "0.1", "-o", str(output)]
    assert benchmark.main(argv) == 0
    result = json.loads(output.read_text())
    assert {"command", "config", "environment", "warmup_seconds", "ours", "plain", "ratio"} <= result.keys()
    assert result["config"]["label_smoothing"] == 0.1 and result["config"]["precision"] == "fp32"
    assert {"cpu_model", "cpu_cores", "torch", "torchvision"} <= result["environment"].keys()
    for side in ("ours", "plain"):
        stats = result[side]
        assert len(stats["values"]) == 2 and all(value > 0 for value in stats["values"])
        assert stats["min"] <= stats["median"] <= stats["max"]
        assert result["warmup_seconds"][side] > 0
    assert result["ratio"] == pytest.approx(result["ours"]["median"] / result["plain"]["median"])


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
    assert paths["eager"]["max_abs_diff"] < 1e-4 and paths["eager"]["top1_agreement"] == 1.0  # same weights
    assert paths["bf16"]["max_abs_diff"] > 0  # bfloat16 rounds; it is measured, not assumed
    assert set(result["best"]) == {"1", "2"} and result["best"]["1"] in paths
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_path_that_compiles_on_its_first_call_never_times_that_call():
    benchmark = importlib.import_module("benchmarks.infer_throughput")
    calls = []

    def compiling(images):
        calls.append(len(images))
        if len(calls) == 1:
            time.sleep(0.3)  # the compilation
        return images

    path = benchmark.Path_("compile", compiling, min_warmup=1)
    benchmark.measure_paths([path], [2], 8, torch.device("cpu"), iters=2, warmup=0, repeats=1)
    assert len(calls) == 3 and len(path.latencies[2]) == 2
    assert max(path.latencies[2]) < 0.2 <= path.warmup_seconds[2]
