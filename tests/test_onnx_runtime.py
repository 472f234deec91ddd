"""classify.py --runtime onnxruntime: the same predictions as PyTorch FP32, one export per set of weights."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from PIL import Image

from image_classification import onnx_runtime
from image_classification.cli import run
from image_classification.inference import main as classify_main
from image_classification.models import build_model

pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")


@pytest.fixture
def weights(tmp_path) -> Path:
    torch.manual_seed(0)
    path = tmp_path / "tiny.pth"
    torch.save(build_model("resnet18", num_classes=4).state_dict(), path)
    return path


@pytest.fixture
def images(tmp_path) -> list[str]:
    from skimage import data

    paths = []
    for name in ("chelsea", "coffee", "astronaut"):
        path = tmp_path / f"{name}.jpg"
        Image.fromarray(getattr(data, name)()).save(path, quality=90)
        paths.append(str(path))
    return paths


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv(onnx_runtime.CACHE_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache" / "onnx"


def predictions(capsys, argv: list[str]) -> list[dict]:
    assert run(classify_main, argv + ["--json"]) == 0, capsys.readouterr().err
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def test_onnxruntime_predicts_what_torch_fp32_does_and_exports_once(weights, images, cache, capsys, monkeypatch):
    common = ["--arch", "resnet18", "--weights", str(weights), "--image", *images, "--image-size", "64",
              "--topk", "4", "--cpu"]
    plain = predictions(capsys, common + ["--precision", "FP32", "--memory-format", "nchw"])
    onnx = predictions(capsys, common + ["--runtime", "onnxruntime"])
    assert [p["path"] for p in onnx] == [p["path"] for p in plain]
    for ours, theirs in zip(onnx, plain):
        assert ours["predictions"][0]["index"] == theirs["predictions"][0]["index"]
        for a, b in zip(sorted(ours["predictions"], key=lambda p: p["index"]),
                        sorted(theirs["predictions"], key=lambda p: p["index"])):
            assert a["probability"] == pytest.approx(b["probability"], abs=1e-4)
    assert len(list(cache.glob("*.onnx"))) == 1 and not list(cache.glob(".*"))  # no temporary left

    from image_classification import export

    def no_export(*args, **kwargs):
        raise AssertionError("exported again")

    exporter = export.export_onnx
    monkeypatch.setattr(export, "export_onnx", no_export)
    assert predictions(capsys, common + ["--runtime", "onnxruntime"]) == onnx  # the cached file, as is

    changed = build_model("resnet18", num_classes=4).state_dict()
    changed["fc.bias"] += 1.0
    torch.save(changed, weights)
    monkeypatch.setattr(export, "export_onnx", exporter)
    predictions(capsys, common + ["--runtime", "onnxruntime"])
    assert len(list(cache.glob("*.onnx"))) == 2  # other weights, another file


def test_onnxruntime_refuses_cuda_and_amp_and_an_unwritable_cache(weights, images, tmp_path, monkeypatch, capsys):
    common = ["--arch", "resnet18", "--weights", str(weights), "--image", images[0], "--image-size", "64",
              "--runtime", "onnxruntime"]
    for extra in (["--device", "cuda"], ["--precision", "AMP"]):
        assert run(classify_main, common + extra) == 2
        assert capsys.readouterr().err.startswith("error: --runtime onnxruntime runs FP32 on the CPU")
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv(onnx_runtime.CACHE_ENV, str(blocker))
    assert run(classify_main, common) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: cannot write the ONNX cache") and onnx_runtime.CACHE_ENV in err
    assert len(err.strip().splitlines()) == 1


def test_the_cache_key_follows_every_tensor_and_the_crop_size():
    model = build_model("resnet18", num_classes=4)
    key = onnx_runtime.weights_key(model, 64)
    assert key == onnx_runtime.weights_key(model, 64)
    assert key != onnx_runtime.weights_key(model, 96)
    with torch.no_grad():
        model.bn1.running_mean[0] += 1e-3  # a buffer, not a parameter
    assert key != onnx_runtime.weights_key(model, 64)


def test_a_damaged_cache_file_is_exported_again(weights, images, cache, capsys):
    common = ["--arch", "resnet18", "--weights", str(weights), "--image", images[0], "--image-size", "64",
              "--runtime", "onnxruntime"]
    first = predictions(capsys, common)
    (cached,) = cache.glob("*.onnx")
    cached.write_bytes(cached.read_bytes()[:1000])  # truncated after it was written
    assert run(classify_main, common + ["--json"]) == 0
    out, err = capsys.readouterr()
    assert "does not load" in err and "exporting it again" in err
    assert [json.loads(line) for line in out.splitlines()] == first
    assert cached.stat().st_size > 1000
