"""classify.py --runtime onnxruntime: the same predictions as PyTorch FP32, one export per set of weights."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
import torch
from PIL import Image

from helpers import (refused, reuse_exports, sigterm_during_the_export, sigterm_noted, tiny_registered,
                     torch_export_writes_onnx)
from image_classification.deploy import onnx_runtime
from image_classification.deploy.inference import main as classify_main
from image_classification.models import build_model
from image_classification.records.workspace import writer_stamp
from image_classification.system.cli import run

pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")

TINY_SIZE = 32  # the crop of every test here: the module's tiny model at this size is exported for real once


@pytest.fixture(autouse=True)
def exports_reused(monkeypatch) -> None:
    """Each model is exported for real once in the module, then its file copied (helpers.reuse_exports)."""
    reuse_exports(monkeypatch)


@pytest.fixture
def weights(tmp_path, tiny_arch) -> Path:
    torch.manual_seed(0)
    path = tmp_path / "tiny.pth"
    torch.save(build_model("tiny", num_classes=4).state_dict(), path)
    return path


@pytest.fixture
def images(tmp_path) -> list[str]:
    data = pytest.importorskip("skimage.data")

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


def assert_same_predictions(onnx: list[dict], plain: list[dict]) -> None:
    """ONNX Runtime's predictions are PyTorch FP32's: the same classes, probabilities within 1e-4."""
    assert [p["path"] for p in onnx] == [p["path"] for p in plain]
    for ours, theirs in zip(onnx, plain):
        assert ours["predictions"][0]["index"] == theirs["predictions"][0]["index"]
        for a, b in zip(sorted(ours["predictions"], key=lambda p: p["index"]),
                        sorted(theirs["predictions"], key=lambda p: p["index"])):
            assert a["probability"] == pytest.approx(b["probability"], abs=1e-4)


def no_export(*args, **kwargs):
    raise AssertionError("exported again")


def test_onnxruntime_predicts_what_torch_fp32_does_and_exports_once(weights, images, cache, capsys, monkeypatch):
    common = ["--arch", "tiny", "--weights", str(weights), "--image", *images, "--image-size", str(TINY_SIZE),
              "--topk", "4", "--cpu"]
    plain = predictions(capsys, common + ["--precision", "FP32", "--memory-format", "nchw"])
    onnx = predictions(capsys, common + ["--runtime", "onnxruntime"])
    assert_same_predictions(onnx, plain)
    assert len(list(cache.glob("*.onnx"))) == 1 and not list(cache.glob(".*"))  # no temporary left

    exporter = onnx_runtime.export_onnx
    monkeypatch.setattr(onnx_runtime, "export_onnx", no_export)
    assert predictions(capsys, common + ["--runtime", "onnxruntime"]) == onnx  # the cached file, as is

    changed = build_model("tiny", num_classes=4).state_dict()
    changed["fc.bias"] += 1.0
    torch.save(changed, weights)
    monkeypatch.setattr(onnx_runtime, "export_onnx", exporter)
    predictions(capsys, common + ["--runtime", "onnxruntime"])
    assert len(list(cache.glob("*.onnx"))) == 2  # other weights, another file


def test_onnxruntime_refuses_amp_cuda_without_its_provider_and_an_unwritable_cache(
        weights, images, tmp_path, monkeypatch, capsys):
    common = ["--arch", "tiny", "--weights", str(weights), "--image", images[0], "--image-size", str(TINY_SIZE),
              "--runtime", "onnxruntime"]
    assert run(classify_main, common + ["--precision", "AMP"]) == 2
    assert capsys.readouterr().err.startswith("error: --runtime onnxruntime runs the exported graph as it is")
    import onnxruntime

    with monkeypatch.context() as patch:  # a GPU, and onnxruntime without CUDA
        patch.setattr(torch.cuda, "is_available", lambda: True)
        patch.setattr(onnxruntime, "get_available_providers", lambda: ["CPUExecutionProvider"])
        line = refused(run(classify_main, common + ["--device", "cuda"]), capsys)
    assert line.startswith("error: --runtime onnxruntime on CUDA needs ONNX Runtime's CUDA execution provider")
    assert "pip install onnxruntime-gpu" in line
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv(onnx_runtime.CACHE_ENV, str(blocker))
    assert run(classify_main, common) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: cannot write the ONNX cache") and onnx_runtime.CACHE_ENV in err
    assert len(err.strip().splitlines()) == 1


def test_the_cache_key_follows_every_tensor_and_the_crop_size(tiny_arch):
    model = build_model(tiny_arch, num_classes=4)
    key = onnx_runtime.weights_key(model, 64)
    assert key == onnx_runtime.weights_key(model, 64)
    assert key != onnx_runtime.weights_key(model, 96)
    with torch.no_grad():
        model.bn1.running_mean[0] += 1e-3  # a buffer, not a parameter
    assert key != onnx_runtime.weights_key(model, 64)


def test_a_damaged_cache_file_is_exported_again(weights, images, cache, capsys):
    common = ["--arch", "tiny", "--weights", str(weights), "--image", images[0], "--image-size", str(TINY_SIZE),
              "--runtime", "onnxruntime"]
    first = predictions(capsys, common)
    (cached,) = cache.glob("*.onnx")
    cached.write_bytes(cached.read_bytes()[:1000])  # truncated after it was written
    assert run(classify_main, common + ["--json"]) == 0
    out, err = capsys.readouterr()
    assert "does not match these weights" in err and "exporting again" in err
    assert [json.loads(line) for line in out.splitlines()] == first
    assert cached.stat().st_size > 1000


# -- a cached model proves it is the export of these weights ------------------------------------------------


@dataclasses.dataclass
class TinyCache:
    weights: Path  # a tiny model's weights
    folder: Path  # a cache holding their export, <key>.onnx and its record <key>.json, and another model's
    key: str
    other_key: str  # the other model's: the same architecture, other weights

    def file(self, key: str, suffix: str = ".onnx") -> Path:
        return self.folder / f"{key}{suffix}"


@pytest.fixture(scope="module")
def tiny_cache(tmp_path_factory) -> TinyCache:
    """Exported once for the module; each test gets a copy (the ``tiny`` fixture)."""
    root = tmp_path_factory.mktemp("tiny-cache")
    keys = []
    with tiny_registered(), pytest.MonkeyPatch.context() as patch:
        patch.setenv(onnx_runtime.CACHE_ENV, str(root / "cache"))
        reuse_exports(patch)
        for seed, name in ((0, "tiny.pth"), (1, "other.pth")):
            torch.manual_seed(seed)
            model = build_model("tiny", num_classes=4).eval()
            torch.save(model.state_dict(), root / name)
            onnx_runtime.OnnxModel(model, TINY_SIZE, log=lambda line: None)
            keys.append(onnx_runtime.weights_key(model, TINY_SIZE))
    return TinyCache(root / "tiny.pth", root / "cache" / "onnx", *keys)


@pytest.fixture
def tiny(tiny_cache, tiny_arch, tmp_path, monkeypatch) -> TinyCache:
    """A copy of the module's cache, the one classify.py uses in this test."""
    folder = tmp_path / "cache" / "onnx"
    shutil.copytree(tiny_cache.folder, folder)
    monkeypatch.setenv(onnx_runtime.CACHE_ENV, str(folder.parent))
    return dataclasses.replace(tiny_cache, folder=folder)


def tiny_argv(tiny: TinyCache, images: list[str]) -> list[str]:
    return ["--arch", "tiny", "--weights", str(tiny.weights), "--image", *images, "--image-size", str(TINY_SIZE),
            "--topk", "4", "--cpu"]


def torch_predictions(capsys, argv: list[str]) -> list[dict]:
    return predictions(capsys, argv + ["--precision", "FP32", "--memory-format", "nchw"])


def flip_exponent_bit(path: Path) -> None:
    """Flip the highest exponent bit of one weight inside the file: still a valid graph, other numbers."""
    import onnx

    data = bytearray(path.read_bytes())
    weight = max(onnx.load(str(path)).graph.initializer, key=lambda tensor: len(tensor.raw_data)).raw_data
    offset = data.find(weight)
    assert offset > 0 and data.count(weight) == 1
    data[offset + 3] ^= 0x40  # a little-endian float32's last byte holds bit 30, the exponent's highest
    path.write_bytes(bytes(data))


def other_model_copied(tiny: TinyCache) -> None:
    shutil.copyfile(tiny.file(tiny.other_key), tiny.file(tiny.key))


def other_export_copied_with_its_record(tiny: TinyCache) -> None:
    for suffix in (".onnx", ".json"):
        shutil.copyfile(tiny.file(tiny.other_key, suffix), tiny.file(tiny.key, suffix))


def other_export_with_a_record_forged_for_ours(tiny: TinyCache) -> None:
    """Only the probe image tells this one: its record names our key and description, and its hash is right."""
    other_export_copied_with_its_record(tiny)
    ours = json.loads(tiny.file(tiny.key, ".json").read_text())
    record = json.loads(tiny.file(tiny.other_key, ".json").read_text())
    record.update(key=ours["key"], exported=ours["exported"], probe_logits=ours["probe_logits"])
    tiny.file(tiny.key, ".json").write_text(json.dumps(record))


def link_to_another_model(tiny: TinyCache) -> None:
    elsewhere = tiny.folder.parent.parent / "elsewhere.onnx"
    shutil.copyfile(tiny.file(tiny.other_key), elsewhere)
    tiny.file(tiny.key).unlink()
    tiny.file(tiny.key).symlink_to(elsewhere)


def bit_flipped(tiny: TinyCache) -> None:
    flip_exponent_bit(tiny.file(tiny.key))


def record_lost(tiny: TinyCache) -> None:
    tiny.file(tiny.key, ".json").unlink()


def record_nested_100000_deep(tiny: TinyCache) -> None:
    """A RecursionError before, in this run and every later one until the file was removed by hand."""
    tiny.file(tiny.key, ".json").write_text("[" * 100_000)


@pytest.mark.parametrize("damage", [other_model_copied, link_to_another_model, bit_flipped,
                                    other_export_copied_with_its_record, other_export_with_a_record_forged_for_ours,
                                    record_lost, record_nested_100000_deep], ids=lambda damage: damage.__name__)
def test_a_cached_model_that_is_not_the_export_of_these_weights_is_said_once_and_exported_again(
        tiny, images, capsys, monkeypatch, damage):
    argv = tiny_argv(tiny, images)
    plain = torch_predictions(capsys, argv)
    damage(tiny)
    elsewhere = tiny.folder.parent.parent / "elsewhere.onnx"
    linked = elsewhere.read_bytes() if elsewhere.exists() else None
    assert run(classify_main, argv + ["--runtime", "onnxruntime", "--json"]) == 0
    out, err = capsys.readouterr()
    assert err.startswith(f"note: cached ONNX model {tiny.file(tiny.key)} does not match these weights (")
    assert err.endswith("); exporting again\n") and err.count("\n") == 1, err
    assert_same_predictions([json.loads(line) for line in out.splitlines()], plain)
    assert not tiny.file(tiny.key).is_symlink() and not list(tiny.folder.glob(".*"))
    if linked is not None:
        assert elsewhere.read_bytes() == linked  # the link was replaced, not written through

    monkeypatch.setattr(onnx_runtime, "export_onnx", no_export)
    assert predictions(capsys, argv + ["--runtime", "onnxruntime"]) != []  # now proven: used as it is
    assert capsys.readouterr().err == ""


def test_a_read_only_cache_holding_a_damaged_model_runs_from_a_temporary_export(
        tiny, images, capsys, monkeypatch, read_only_folder):
    argv = tiny_argv(tiny, images)
    plain = torch_predictions(capsys, argv)
    folder, seal = read_only_folder
    shutil.copytree(tiny.folder, folder / "onnx")
    cached = folder / "onnx" / f"{tiny.key}.onnx"
    cached.write_bytes(cached.read_bytes()[:1000])  # truncated
    monkeypatch.setenv(onnx_runtime.CACHE_ENV, str(folder))
    seal()
    assert run(classify_main, argv + ["--runtime", "onnxruntime", "--json"]) == 0
    out, err = capsys.readouterr()
    assert err.startswith(f"note: cached ONNX model {cached} does not match these weights (") and err.count("\n") == 1
    assert "to a temporary folder for this run: the cache cannot be written (Read-only file system)" in err, err
    assert_same_predictions([json.loads(line) for line in out.splitlines()], plain)
    assert cached.stat().st_size == 1000  # nothing was removed or replaced


def test_temporaries_of_dead_writers_are_removed_and_those_of_live_writers_kept(tiny, images, capsys):
    pid, start, machine = writer_stamp().split("-")
    stamps = {f"{pid}-{int(start) + 1}-{machine}": False,  # this pid, reused by a writer that died
              writer_stamp(): True,  # a live writer: this process
              f"{pid}-{int(start) + 1}-{'0' * 12}": True}  # another machine's: cannot tell
    files = {tiny.folder / f".{tiny.key}.{stamp}.{index:08x}{suffix}": kept
             for index, (stamp, kept) in enumerate(stamps.items()) for suffix in (".onnx.tmp", ".json.tmp")}
    for path in files:
        path.write_bytes(b"partial")
    predictions(capsys, tiny_argv(tiny, images) + ["--runtime", "onnxruntime"])
    assert {path: path.exists() for path in files} == files


def test_sigterm_during_the_export_stops_with_exit_75_and_leaves_no_temporary(
        tiny, images, capsys, monkeypatch):
    shutil.rmtree(tiny.folder)
    sigterm_during_the_export(monkeypatch)
    with sigterm_noted() as unhandled:
        assert run(classify_main, tiny_argv(tiny, images) + ["--runtime", "onnxruntime"]) == 75
    out, err = capsys.readouterr()
    assert err.endswith("\nStopped by SIGTERM while exporting the model to ONNX; nothing was cached (exit code 75)\n")
    assert out == "" and "Traceback" not in err and list(tiny.folder.iterdir()) == [] and unhandled == []


def test_an_export_that_disagrees_with_pytorch_is_refused_and_not_cached(tiny, images, capsys, monkeypatch):
    other = tiny.file(tiny.other_key).read_bytes()
    shutil.rmtree(tiny.folder)
    monkeypatch.setattr(onnx_runtime, "export_onnx", lambda model, example, path, **_: Path(path).write_bytes(other))
    assert run(classify_main, tiny_argv(tiny, images) + ["--runtime", "onnxruntime"]) == 2
    err = capsys.readouterr().err
    assert err.splitlines()[-1].startswith("error: the ONNX export of this model does not compute what PyTorch does (its logits")
    assert list(tiny.folder.iterdir()) == []


def test_weights_whose_logits_overflow_are_refused_before_any_export(tiny, images, capsys, monkeypatch, tmp_path):
    state = torch.load(tiny.weights)
    state["fc.weight"].fill_(3e38)  # finite weights (loading refuses NaN), logits beyond float32
    torch.save(state, tmp_path / "huge.pth")
    argv = tiny_argv(dataclasses.replace(tiny, weights=tmp_path / "huge.pth"), images)
    monkeypatch.setattr(onnx_runtime, "export_onnx", no_export)
    line = refused(run(classify_main, argv + ["--runtime", "onnxruntime"]), capsys)
    assert line == "error: the model's outputs are NaN or inf on a probe image; its predictions would mean nothing"


# -- the exporter -----------------------------------------------------------------------------------------
@pytest.mark.skipif(not torch_export_writes_onnx(), reason="torch.export's ONNX exporter needs torch 2.6 and onnxscript")
def test_the_cache_holds_exports_of_torch_export_and_never_reads_those_of_the_old_exporter(tiny, monkeypatch):
    """The record says which exporter wrote the file; the key covers the opset and the exporter tried first, so a
    file the TorchScript-based exporter wrote at opset 17 (before torch.export's was the default) is never read."""
    record = json.loads(tiny.file(tiny.key, ".json").read_text())
    assert record["format"] == 2 and record["written_by"] == "torch.export"
    assert (record["exported"]["exporter"], record["exported"]["opset"]) == ("torch.export", 18)
    model = build_model("tiny", num_classes=4)
    model.load_state_dict(torch.load(tiny.weights))
    assert onnx_runtime.weights_key(model, TINY_SIZE) == tiny.key
    monkeypatch.setattr(onnx_runtime, "OPSET", 17)
    assert onnx_runtime.weights_key(model, TINY_SIZE) != tiny.key
    monkeypatch.setattr(onnx_runtime, "OPSET", 18)
    monkeypatch.setattr(onnx_runtime, "torch_export_unavailable", lambda opset: "onnxscript is not installed")
    assert onnx_runtime.weights_key(model, TINY_SIZE) != tiny.key


@pytest.mark.skipif(not torch_export_writes_onnx(), reason="torch.export's ONNX exporter needs torch 2.6 and onnxscript")
def test_a_model_torch_export_fails_for_is_cached_from_the_torchscript_exporter_and_then_read_back(
        tiny, images, capsys, monkeypatch):
    from image_classification.deploy import torch_export

    def fails(*args, **kwargs):
        raise RuntimeError("Dynamic control flow is not supported")

    argv = tiny_argv(tiny, images)
    plain = torch_predictions(capsys, argv)
    shutil.rmtree(tiny.folder)
    monkeypatch.setattr(torch_export, "_export_through_torch_export", fails)
    assert run(classify_main, argv + ["--runtime", "onnxruntime", "--json"]) == 0
    out, err = capsys.readouterr()
    assert err.splitlines() == [f"note: exporting the model to ONNX once, cached as {tiny.file(tiny.key)}",
                                "note: ONNX through the TorchScript-based exporter: torch.export's exporter failed "
                                "for this model (RuntimeError: Dynamic control flow is not supported)"]
    assert_same_predictions([json.loads(line) for line in out.splitlines()], plain)
    record = json.loads(tiny.file(tiny.key, ".json").read_text())
    assert (record["written_by"], record["exported"]["exporter"]) == ("TorchScript", "torch.export")
    monkeypatch.setattr(onnx_runtime, "export_onnx", no_export)
    assert run(classify_main, argv + ["--runtime", "onnxruntime", "--json"]) == 0
    assert capsys.readouterr().err == ""  # proven and used: no export through torch.export tried again


@pytest.mark.slow
def test_a_channels_last_model_exports_what_its_nchw_twin_computes(tiny, capsys):
    torch.manual_seed(5)
    model = build_model("tiny", num_classes=4).eval()
    with torch.no_grad():
        for name, tensor in model.state_dict().items():
            if tensor.is_floating_point():  # every weight and statistic other than a fresh model's
                tensor.copy_(torch.rand_like(tensor) + 0.5 if "running_var" in name else torch.randn_like(tensor) * 0.2)
    twin = build_model("tiny", num_classes=4).eval()
    twin.load_state_dict(model.state_dict())
    model = model.to(memory_format=torch.channels_last)
    assert not model.conv1.weight.is_contiguous()
    assert onnx_runtime.weights_key(model, TINY_SIZE) == onnx_runtime.weights_key(twin, TINY_SIZE)
    exported = onnx_runtime.OnnxModel(model, TINY_SIZE, log=lambda line: None)
    images = torch.randn(5, 3, TINY_SIZE, TINY_SIZE).to(memory_format=torch.channels_last)
    with torch.no_grad():
        torch.testing.assert_close(exported(images), twin(images.contiguous()), rtol=0, atol=1e-4)
