"""checkpoint2model.py (plain weights out of a training checkpoint) and model2onnx.py (ONNX round trip)."""

from __future__ import annotations

import errno
import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from helpers import (REPO, one_error_line, randomised, refused, run_script, sigterm_during_the_export,
                     sigterm_noted, torch_export_writes_onnx)
from image_classification.deploy import export
from image_classification.models import build_model, load_weights
from image_classification.system.cli import run


@pytest.fixture
def script(capsys):
    """``python NAME ARGS`` in the repository, run in this process (see helpers.run_script)."""
    return lambda name, *args: run_script([name, *args], capsys, cwd=REPO)


@pytest.fixture(scope="module")
def training_checkpoint(tmp_path_factory) -> tuple[Path, dict, dict]:
    """A checkpoint in the training layout, with different model and EMA weights."""
    weights = randomised(build_model("resnet18", num_classes=4), seed=1).state_dict()
    ema = randomised(build_model("resnet18", num_classes=4), seed=2).state_dict()
    path = tmp_path_factory.mktemp("ckpt") / "checkpoint.pth.tar"
    torch.save({"epoch": 7, "arch": "resnet18", "model_options": {"num_classes": 4}, "best_prec1": 61.25,
                "state_dict": weights, "state_dict_ema": ema, "optimizer": {"state": {}, "param_groups": []}},
               path)
    return path, weights, ema


@pytest.mark.parametrize("use_ema", [False, True])
def test_checkpoint2model_extracts_model_or_ema_weights(training_checkpoint, tmp_path, use_ema, script):
    path, weights, ema = training_checkpoint
    target = tmp_path / "weights.pth"
    result = script("checkpoint2model.py", "--checkpoint-path", path, "--weight-path", target,
                    *(["--ema"] if use_ema else []))
    assert result.returncode == 0, result.stderr
    assert "epoch 7" in result.stdout and "61.25" in result.stdout
    saved = torch.load(target, weights_only=True)
    expected = ema if use_ema else weights
    assert list(saved) == list(expected)
    for key in expected:
        torch.testing.assert_close(saved[key], expected[key], rtol=0, atol=0)
    model = build_model("resnet18", num_classes=4)
    load_weights(model, target)  # a plain state dict in the native layout


def test_checkpoint2model_strips_the_ddp_prefix(training_checkpoint, tmp_path):
    _, weights, _ = training_checkpoint
    source = tmp_path / "ddp.pth.tar"
    ddp_weights = {f"module.{k}": v for k, v in weights.items()}
    torch.save({"epoch": 3, "best_prec1": 10.0, "state_dict": ddp_weights}, source)
    target = tmp_path / "weights.pth"
    assert export.checkpoint2model_main(["--checkpoint-path", str(source), "--weight-path", str(target)]) == 0
    assert list(torch.load(target, weights_only=True)) == list(weights)


@pytest.mark.parametrize("case", ["ema missing", "not a checkpoint", "garbage"])
def test_checkpoint2model_failures_leave_the_target_alone(tmp_path, case, script):
    source = tmp_path / "source.pth"
    if case == "ema missing":
        state = build_model("resnet18").state_dict()
        torch.save({"epoch": 1, "best_prec1": 0.0, "state_dict": state}, source)
    elif case == "not a checkpoint":
        torch.save(build_model("resnet18").state_dict(), source)
    else:
        source.write_bytes(b"\x00garbage" * 100)
    target = tmp_path / "weights.pth"
    target.write_bytes(b"previous weights")
    result = script("checkpoint2model.py", "--checkpoint-path", source, "--weight-path", target, "--ema")
    one_error_line(result)
    assert target.read_bytes() == b"previous weights"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["source.pth", "weights.pth"]


def onnx_logits(path: Path, images: torch.Tensor) -> np.ndarray:
    onnxruntime = pytest.importorskip("onnxruntime")
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {"input": images.numpy()})[0]


@pytest.mark.skipif(not torch_export_writes_onnx(), reason="torch.export's ONNX exporter needs torch 2.6 and onnxscript")
@pytest.mark.parametrize("arch, layout", [  # the real architectures' exports take 10 to 40 s on 2 cores
    ("tiny", "channels-last"),
    *(pytest.param(arch, "nchw", marks=pytest.mark.slow) for arch in ("resnet18", "efficientnet-b0"))])
def test_onnx_through_torch_export_runs_any_batch_and_carries_the_model_record(tmp_path, script, tiny_arch, arch,
                                                                               layout):
    """The default export: torch.export's exporter, opset 18, the batch free (-b sizes only the example: batch 1
    and 5 run), PyTorch's logits; a checkpoint saved from a channels-last model exports the same."""
    onnx = pytest.importorskip("onnx")
    weights = tmp_path / "model.pth"
    model = randomised(build_model(arch, num_classes=10), seed=3).eval()
    state = model.to(memory_format=torch.channels_last).state_dict() if layout == "channels-last" else model.state_dict()
    first = next(name for name, tensor in state.items() if tensor.dim() == 4)  # the stem's convolution
    assert state[first].is_contiguous() == (layout == "nchw")
    torch.save(state, weights)
    output = tmp_path / "out" / "model.onnx"
    result = script("model2onnx.py", "--arch", arch, "--weights", weights, "--output", output, "--image-size",
                    "64", "-b", "3")
    assert result.returncode == 0, result.stderr
    assert f"Exporting {arch} (10 classes) at 64x64, batch dynamic, opset 18" in result.stdout
    assert "at batch 3 and 1:" in result.stdout and "exported through torch.export)" in result.stdout
    assert "TorchScript" not in result.stdout + result.stderr and "Warning" not in result.stderr
    graph = onnx.load(str(output))
    assert graph.opset_import[0].version == 18
    assert graph.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"
    record = json.loads({entry.key: entry.value for entry in graph.metadata_props}["image_classification"])
    assert (record["arch"], record["num_classes"], record["classes"]) == (arch, 10, [str(i) for i in range(10)])
    assert record["preprocessing"]["image_size"] == 64
    model = model.to(memory_format=torch.contiguous_format)
    for batch in (1, 5):
        images = torch.randn(batch, 3, 64, 64)
        with torch.no_grad():
            expected = model(images).numpy()
        got = onnx_logits(output, images)
        assert got.shape == (batch, 10) and np.abs(got - expected).max() < 1e-4


def test_no_dynamic_batch_fixes_the_batch_to_b(tiny_weights, tmp_path, script):
    onnx = pytest.importorskip("onnx")
    output = tmp_path / "fixed.onnx"
    result = script("model2onnx.py", *tiny_weights[:-2], "-b", "4", "--no-dynamic-batch", "--output", output)
    assert result.returncode == 0, result.stderr
    assert "batch 4, opset 18" in result.stdout and "at batch 4:" in result.stdout
    assert onnx.load(str(output)).graph.input[0].type.tensor_type.shape.dim[0].dim_value == 4


@pytest.mark.skipif(not torch_export_writes_onnx(), reason="torch.export's ONNX exporter needs torch 2.6 and onnxscript")
def test_where_torch_export_fails_for_a_model_the_torchscript_exporter_writes_it_said_in_one_line(
        tiny_weights, tmp_path, monkeypatch, script):
    pytest.importorskip("onnx")
    from image_classification.deploy import torch_export

    def fails(*args, **kwargs):
        raise RuntimeError("Could not guard on data-dependent expression u0 > 0\n(a long explanation)")

    monkeypatch.setattr(torch_export, "_export_through_torch_export", fails)
    output = tmp_path / "fallback.onnx"
    result = script("model2onnx.py", *tiny_weights, "--output", output)
    assert result.returncode == 0, result.stderr
    assert result.stderr.splitlines() == [
        "note: ONNX through the TorchScript-based exporter: torch.export's exporter failed for this model "
        "(RuntimeError: Could not guard on data-dependent expression u0 > 0)"]
    assert "exported through TorchScript)" in result.stdout and "at batch 2 and 1:" in result.stdout
    assert onnx_logits(output, torch.zeros(3, 3, 32, 32)).shape == (3, 3)  # its batch is free too


@pytest.mark.skipif(not torch_export_writes_onnx(), reason="torch.export's ONNX exporter needs torch 2.6 and onnxscript")
@pytest.mark.parametrize("argv, message", [
    (["--opset", "17"], "note: ONNX through the TorchScript-based exporter: opset 17 was asked for, and "
                        "torch.export's exporter writes opset 18 and later"),
])
def test_an_opset_below_18_is_written_by_the_torchscript_exporter_said_in_one_line(tiny_weights, tmp_path, script,
                                                                                    argv, message):
    onnx = pytest.importorskip("onnx")
    output = tmp_path / "old.onnx"
    result = script("model2onnx.py", *tiny_weights, *argv, "--output", output)
    assert result.returncode == 0 and result.stderr.splitlines() == [message], result.stderr
    assert onnx.load(str(output)).opset_import[0].version == 17


def test_onnx_mismatch_fails_and_writes_nothing(tmp_path, monkeypatch, capsys):
    def fake_export(model, example, path, **_):
        Path(path).write_bytes(b"onnx")

    monkeypatch.setattr(export, "export_onnx", fake_export)
    monkeypatch.setattr(export, "onnx_agreement", lambda *_: [export.Agreement(0.5, 20.0, 1, 1)])  # limit 0.02
    output = tmp_path / "model.onnx"
    argv = ["-a", "resnet18", "--output", str(output), "-b", "1", "--image-size", "32"]
    code = export.model2onnx_main(argv)
    assert code == 1
    assert "differ" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_sigterm_during_model2onnx_stops_with_exit_75_and_writes_nothing(tmp_path, tiny_arch, monkeypatch, capsys):
    sigterm_during_the_export(monkeypatch)
    output = tmp_path / "out" / "tiny.onnx"
    with sigterm_noted() as unhandled:
        code = run(export.model2onnx_main, ["-a", tiny_arch, "--num-classes", "4", "--output", str(output), "-b", "1",
                                            "--image-size", "32"])
    err = capsys.readouterr().err
    assert code == 75 and unhandled == [] and "Traceback" not in err
    assert err.endswith(f"\nStopped by SIGTERM while exporting the model to ONNX; {output} was not written "
                        "(exit code 75)\n")
    assert "TorchScript" not in err  # stopped inside torch.export, not taken for its failure
    assert list(output.parent.iterdir()) == []  # neither the file nor its temporary


def test_default_onnx_path():
    ngc = "w/nvidia_resnet50_200821.pth.tar"
    assert export.default_onnx_path(ngc, "resnet50") == Path("w/nvidia_resnet50_200821.onnx")
    assert export.default_onnx_path("pth_models/model.pt", "resnet50") == Path("pth_models/model.onnx")
    assert export.default_onnx_path(None, "resnet18") == Path("resnet18.onnx")
    assert export.default_onnx_path(ngc, "resnet50", extension=".pt2") == Path("w/nvidia_resnet50_200821.pt2")


@pytest.mark.parametrize("missing", ["onnx", "onnxruntime"])
def test_model2onnx_without_the_onnx_extra_is_one_line_naming_it(tmp_path, monkeypatch, capsys, missing):
    monkeypatch.setitem(sys.modules, missing, None)  # what `import` finds when the package is not installed
    output = tmp_path / "model.onnx"
    code = run(export.model2onnx_main, ["-a", "resnet18", "--output", str(output), "--image-size", "32"])
    out, err = capsys.readouterr()
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith("error: model2onnx needs the onnx extra"), err
    assert "pip install .[onnx]" in err and missing in err and "Exporting" not in out
    assert list(tmp_path.iterdir()) == []


def test_a_nan_on_either_side_of_the_onnx_check_fails_it(tmp_path):
    """max() passes over a NaN: logits that are NaN in PyTorch are refused, and NaN from the graph counts as
    the largest difference, so model2onnx.py never writes such a model as agreeing."""
    pytest.importorskip("onnxruntime")
    from image_classification.deploy.onnx_runtime import OPSET, export_onnx
    from image_classification.errors import UserError

    def linear(bias: float) -> torch.nn.Module:
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 3).eval()
        with torch.no_grad():
            model.bias.fill_(bias)
        return model

    inputs = [torch.randn(2, 4)]
    path = tmp_path / "nan.onnx"
    export_onnx(linear(float("nan")), inputs[0], path, dynamic_batch=True, opset=OPSET)
    (found,) = export.onnx_agreement(path, linear(0.0), inputs)
    assert found.max_difference == float("inf")
    with pytest.raises(UserError, match="NaN or inf"):
        export.onnx_agreement(path, linear(float("nan")), inputs)


@pytest.fixture
def tiny_weights(tmp_path, tiny_arch) -> list[str]:
    """model2onnx.py's flags for a tiny model's weights, at 32 px."""
    torch.manual_seed(0)
    path = tmp_path / "tiny.pth"
    torch.save(build_model(tiny_arch, num_classes=3).state_dict(), path)
    return ["-a", tiny_arch, "--weights", str(path), "--image-size", "32", "-b", "1"]


@pytest.mark.parametrize("flag", ["--output", "--triton-repository"])
def test_model2onnx_into_a_read_only_folder_is_one_line_before_any_work(tiny_weights, read_only_folder, capsys, flag,
                                                                        monkeypatch):
    folder, seal = read_only_folder
    seal()
    target = str(folder / "m.onnx") if flag == "--output" else str(folder)
    monkeypatch.setattr(export, "export_onnx", lambda *args, **kwargs: pytest.fail("exported"))
    line = refused(run(export.model2onnx_main, [*tiny_weights, flag, target]), capsys)
    assert line.startswith("error: ") and " cannot be written" in line and str(folder) in line, line
    assert list(folder.iterdir()) == []


@pytest.mark.parametrize("flag", ["--output", "--triton-repository"])
def test_model2onnx_below_a_file_is_one_line(tiny_weights, tmp_path, capsys, flag):
    (tmp_path / "file").write_text("kept")
    target = str(tmp_path / "file" / "m.onnx") if flag == "--output" else str(tmp_path / "file" / "models")
    line = refused(run(export.model2onnx_main, [*tiny_weights, flag, target]), capsys)
    assert line.endswith(f" cannot be written: {tmp_path / 'file'} is a file, not a folder"), line
    assert (tmp_path / "file").read_text() == "kept"


@pytest.mark.parametrize("error, code", [(errno.EROFS, 2), (errno.ENOSPC, 4)], ids=["read-only", "disk full"])
@pytest.mark.parametrize("flag", ["--output", "--triton-repository"])
def test_a_write_that_fails_during_the_export_is_one_line_and_leaves_nothing(tiny_weights, tmp_path, capsys,
                                                                             monkeypatch, flag, error, code):
    def failing_export(model, example, path, **kwargs):
        Path(path).write_bytes(b"partial")
        raise OSError(error, os.strerror(error), str(path))

    monkeypatch.setattr(export, "export_onnx", failing_export)
    folder = tmp_path / "out"
    target = str(folder / "m.onnx") if flag == "--output" else str(folder)
    line = refused(run(export.model2onnx_main, [*tiny_weights, flag, target]), capsys, code)
    what = str(folder / "m.onnx") if flag == "--output" else f"the Triton model {folder / 'tiny'}"
    assert line.startswith(f"error: {what} ") and line.endswith(f"({os.strerror(error)}); nothing was written")
    assert list(folder.iterdir()) == []


def test_a_max_batch_size_that_config_pbtxt_cannot_hold_is_refused(tiny_weights, tmp_path, capsys):
    """max_batch_size is an int32 in Triton's ModelConfig: a larger one wrote a config Triton cannot parse."""
    for too_large in ("2147483648", "100000000000000000000"):
        line = refused(run(export.model2onnx_main, [*tiny_weights, "--triton-repository", str(tmp_path / "models"),
                                                    "--max-batch-size", too_large]), capsys)
        assert line == (f"error: model2onnx.py: argument --max-batch-size: must be at most 2147483647 (config.pbtxt "
                        f"holds it as a 32-bit integer; Triton would not load the model), got {too_large}")
    assert not (tmp_path / "models").exists()

    text_format = pytest.importorskip("google.protobuf.text_format")
    model_config = pytest.importorskip("tritonclient.grpc.model_config_pb2")
    onnx = pytest.importorskip("onnx")
    TensorProto, helper = onnx.TensorProto, onnx.helper

    from image_classification.arguments.tools import LARGEST_MAX_BATCH_SIZE
    from image_classification.deploy.triton_repository import config_text

    values = [helper.make_tensor_value_info(name, TensorProto.FLOAT, ["batch", 3]) for name in ("input", "output")]
    graph = helper.make_graph([helper.make_node("Identity", ["input"], ["output"])], "g", values[:1], values[1:])
    graph_bytes = helper.make_model(graph).SerializeToString()
    config = config_text(graph_bytes, "m", LARGEST_MAX_BATCH_SIZE)
    assert text_format.Parse(config, model_config.ModelConfig()).max_batch_size == LARGEST_MAX_BATCH_SIZE
    with pytest.raises(text_format.ParseError, match="out of range"):  # the bound is the format's own
        text_format.Parse(config_text(graph_bytes, "m", LARGEST_MAX_BATCH_SIZE + 1), model_config.ModelConfig())
