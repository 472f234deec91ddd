"""int8 through ONNX Runtime: the calibration set, the cached int8 model and its proof, classify.py and
main.py --evaluate on it, model2onnx.py's int8 file and Triton model repository."""

from __future__ import annotations

import ast
import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from helpers import REPO, refused, reuse_exports, tiny_registered
from image_classification.deploy import onnx_runtime, quantization
from image_classification.deploy.export import model2onnx_main
from image_classification.deploy.inference import main as classify_main
from image_classification.deploy.quantization import Int8Request, calibration_groups, spread_evenly
from image_classification.records.raport import read_raport
from image_classification.system.cli import run
from image_classification.training import main as train_main

pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")

SIZE = 32


# -- the calibration set ----------------------------------------------------------------------------------
def test_calibration_images_are_spread_evenly_over_the_classes_without_randomness():
    groups = [[f"a{i}" for i in range(10)], [f"b{i}" for i in range(2)], [f"c{i}" for i in range(6)]]
    chosen = spread_evenly(groups, 9)
    assert chosen == spread_evenly(groups, 9)
    assert [name[0] for name in chosen].count("b") == 2  # all the small class holds
    assert sorted(name[0] for name in chosen) == ["a"] * 4 + ["b"] * 2 + ["c"] * 3
    assert [name for name in chosen if name[0] == "a"] == ["a1", "a3", "a6", "a8"]  # evenly spaced through it
    assert spread_evenly(groups, 100) == [name for group in groups for name in group]  # fewer: all of them


def write_images(folder: Path, count: int, colour: tuple[int, int, int]) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for index in range(count):
        path = folder / f"{index:02d}.jpg"
        Image.new("RGB", (40, 36), colour).save(path)
        paths.append(path)
    return paths


def test_a_calibration_folder_is_a_tree_of_class_folders_or_a_flat_folder_of_images(tmp_path):
    write_images(tmp_path / "tree" / "b", 3, (0, 200, 0))
    write_images(tmp_path / "tree" / "a" / "nested", 2, (200, 0, 0))
    (tmp_path / "tree" / "notes.txt").write_text("not an image")
    flat = write_images(tmp_path / "flat", 4, (0, 0, 200))
    tree = calibration_groups(tmp_path / "tree")
    assert [[Path(path).relative_to(tmp_path / "tree").as_posix() for path in group] for group in tree] == \
        [["a/nested/00.jpg", "a/nested/01.jpg"], ["b/00.jpg", "b/01.jpg", "b/02.jpg"]]
    assert calibration_groups(tmp_path / "flat") == [[str(path) for path in flat]]


def load_plain(path: Path) -> torch.Tensor:
    from image_classification.deploy.inference import image_transform, load_image

    return image_transform(SIZE)(load_image(path))


def test_an_unreadable_calibration_image_is_named_skipped_and_counted(tmp_path):
    write_images(tmp_path / "a", 3, (200, 0, 0))
    (tmp_path / "a" / "01.jpg").write_bytes(b"not a jpeg")
    lines = []
    calibration = quantization.read_calibration(Int8Request(str(tmp_path), 10), load_plain, lines.append,
                                                 reduce_range=False)
    assert (len(calibration.images), calibration.chosen, calibration.skipped) == (2, 3, 1)
    assert lines[0].startswith("warning: skipped: ") and "01.jpg" in lines[0]
    assert lines[1] == (f"note: int8 calibration on 2 images of {tmp_path} (all the folder holds, fewer than "
                        "--calibration-images 10), 1 unreadable skipped, method minmax")


def test_the_calibration_hash_follows_the_pixels(tmp_path):
    write_images(tmp_path / "a", 2, (200, 0, 0))
    request = Int8Request(str(tmp_path), 2)
    first = quantization.read_calibration(request, load_plain, lambda line: None, reduce_range=False)
    assert quantization.read_calibration(request, load_plain, lambda line: None, reduce_range=False).sha256 == \
        first.sha256
    Image.new("RGB", (40, 36), (120, 60, 0)).save(tmp_path / "a" / "01.jpg")
    assert quantization.read_calibration(request, load_plain, lambda line: None, reduce_range=False).sha256 != \
        first.sha256


@pytest.mark.parametrize("flags, reduce_range", [({"avx2", "avx512f", "avx512_vnni"}, False), ({"avx2", "avx_vnni"}, False),
                                                 ({"avx2", "amx_int8"}, False), ({"avx2", "fma"}, True), (None, True)])
def test_reduce_range_where_the_cpu_lacks_int8_dot_products(monkeypatch, flags, reduce_range):
    monkeypatch.setattr(quantization.machine, "_cpu_flags", lambda: flags)
    assert quantization.reduce_range_here() is reduce_range


# -- a trained tiny model and its int8 exports ------------------------------------------------------------
@dataclasses.dataclass
class Trained:
    checkpoint: Path  # tiny, 3 colour classes, 32 px, trained on image_folder, with an EMA of its weights
    data: Path  # image_folder: train/ and val/ of 3 colour classes
    cache: Path  # the ONNX cache the module's exports went to (tests copy it)


@pytest.fixture(scope="module")
def trained(image_folder, tmp_path_factory) -> Trained:
    root = tmp_path_factory.mktemp("int8")
    with tiny_registered(), pytest.MonkeyPatch.context() as patch:
        patch.setenv(onnx_runtime.CACHE_ENV, str(root / "cache"))
        assert train_main(["--data-backend", "pytorch", "-a", "tiny", "--image-size", str(SIZE), "-b", "8",
                           "--epochs", "6", "--lr", "0.05", "-j", "0", "--seed", "1", "--use-ema", "0.5", "--workspace",
                           str(root / "run"), str(image_folder)]) == 0
    return Trained(root / "run" / "checkpoint.pth.tar", image_folder, root / "cache")


@pytest.fixture(autouse=True)
def exports_reused(monkeypatch) -> None:
    """Each FP32 graph is exported for real once in the module, then its file copied (helpers.reuse_exports);
    the int8 quantization runs every time."""
    reuse_exports(monkeypatch)


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    folder = tmp_path / "cache"
    monkeypatch.setenv(onnx_runtime.CACHE_ENV, str(folder))
    return folder / "onnx"


def classify_argv(trained: Trained, *extra: str) -> list[str]:
    return ["--weights", str(trained.checkpoint), "--image", *sorted(str(p) for p in trained.data.glob("val/*")),
            "--json", "--cpu", "--topk", "3", *extra]


INT8 = ["--runtime", "onnxruntime", "--quantize", "int8"]


def predictions(capsys, argv: list[str]) -> tuple[list[dict], str]:
    assert run(classify_main, argv) == 0, capsys.readouterr().err
    out, err = capsys.readouterr()
    return [json.loads(line) for line in out.splitlines()], err


def no_work(*args, **kwargs):
    raise AssertionError("exported or quantized again")


def test_classify_int8_predicts_what_fp32_does_and_quantizes_once_per_calibration(trained, tiny_arch, cache,
                                                                                  capsys, monkeypatch):
    calibration = ["--calibration-data", str(trained.data / "train"), "--calibration-images", "9"]
    fp32, _ = predictions(capsys, classify_argv(trained, "--precision", "FP32", "--memory-format", "nchw"))
    int8, err = predictions(capsys, classify_argv(trained, *INT8, *calibration))
    assert [p["predictions"][0]["index"] for p in int8] == [p["predictions"][0]["index"] for p in fp32]
    assert len(int8) == 12 and "note: int8 calibration on 9 images" in err and "quantizing it to int8 once" in err
    (model,) = cache.glob("*.onnx")
    record = json.loads(model.with_suffix(".json").read_text())["exported"]
    import onnxruntime

    assert record["kind"] == "int8" and record["int8"]["calibration"]["images"] == 9
    assert record["int8"]["calibration"]["method"] == "minmax" and record["int8"]["onnxruntime"] == onnxruntime.__version__
    assert record["int8"]["reduce_range"] is quantization.reduce_range_here()
    import onnx

    assert "QuantizeLinear" in {node.op_type for node in onnx.load(str(model)).graph.node}

    with monkeypatch.context() as patch:
        patch.setattr(onnx_runtime, "export_onnx", no_work)
        patch.setattr(onnx_runtime, "quantize", no_work)
        again, err = predictions(capsys, classify_argv(trained, *INT8, *calibration))
    assert again == int8 and "exporting" not in err  # the cached file, proven
    for other in (["--calibration-method", "percentile"], ["--calibration-images", "6"]):
        predictions(capsys, classify_argv(trained, *INT8, *calibration, *other))
    assert len(list(cache.glob("*.onnx"))) == 3  # another method, another set: other files


@pytest.fixture(scope="module")
def int8_cache(trained, tmp_path_factory) -> dict:
    """The trained model's int8 export and another model's (other weights), cached once for the module."""
    from image_classification.deploy.inference import calibrate, load_model

    folder = tmp_path_factory.mktemp("int8-cache")
    with tiny_registered(), pytest.MonkeyPatch.context() as patch:
        patch.setenv(onnx_runtime.CACHE_ENV, str(folder))
        reuse_exports(patch)
        loaded = load_model(None, str(trained.checkpoint))
        preprocessing = loaded.resolve_preprocessing(None, log=lambda line: None)
        calibration = calibrate(Int8Request(str(trained.data / "train"), 9), preprocessing, log=lambda line: None)
        other = load_model(None, str(trained.checkpoint)).model
        with torch.no_grad():
            other.fc.bias.copy_(torch.tensor([4.0, -4.0, 0.0]))  # another head: other predictions
        keys = []
        for model in (loaded.model, other):
            onnx_runtime.OnnxModel(model, SIZE, lambda line: None, calibration)
            keys.append(onnx_runtime.weights_key(model, SIZE, calibration))
    return {"folder": folder / "onnx", "key": keys[0], "other": keys[1]}


def int8_file(folder: Path, key: str, suffix: str = ".onnx") -> Path:
    return folder / f"{key}{suffix}"


# Each damage: (cache folder, our key, the other model's key)
def other_int8_model_copied(folder: Path, key: str, other: str) -> None:
    shutil.copyfile(int8_file(folder, other), int8_file(folder, key))


def other_int8_export_with_its_record(folder: Path, key: str, other: str) -> None:
    for suffix in (".onnx", ".json"):
        shutil.copyfile(int8_file(folder, other, suffix), int8_file(folder, key, suffix))


def other_int8_export_with_a_record_forged_for_ours(folder: Path, key: str, other: str) -> None:
    """Its record names our key and description, with its own hash and logits: only PyTorch's logits tell."""
    ours = json.loads(int8_file(folder, key, ".json").read_text())
    other_int8_export_with_its_record(folder, key, other)
    record = json.loads(int8_file(folder, key, ".json").read_text())
    record.update(key=ours["key"], exported=ours["exported"])
    int8_file(folder, key, ".json").write_text(json.dumps(record))


def int8_weight_byte_flipped(folder: Path, key: str, other: str) -> None:
    """One int8 weight of the largest initializer changed inside the file: a valid graph, another model."""
    import onnx

    path = int8_file(folder, key)
    data = bytearray(path.read_bytes())
    weight = max(onnx.load(str(path)).graph.initializer, key=lambda tensor: len(tensor.raw_data)).raw_data
    offset = data.find(weight)
    assert offset > 0
    data[offset] ^= 0x40
    path.write_bytes(bytes(data))


def int8_record_lost(folder: Path, key: str, other: str) -> None:
    int8_file(folder, key, ".json").unlink()


@pytest.mark.parametrize("damage", [other_int8_model_copied, other_int8_export_with_its_record,
                                    other_int8_export_with_a_record_forged_for_ours, int8_weight_byte_flipped,
                                    int8_record_lost], ids=lambda damage: damage.__name__)
def test_a_cached_int8_model_that_is_not_this_one_is_said_once_and_quantized_again(
        trained, int8_cache, tiny_arch, cache, capsys, damage):
    shutil.copytree(int8_cache["folder"], cache)
    key = int8_cache["key"]
    argv = classify_argv(trained, *INT8, "--calibration-data", str(trained.data / "train"), "--calibration-images",
                         "9")
    expected, _ = predictions(capsys, argv)
    damage(cache, key, int8_cache["other"])
    got, err = predictions(capsys, argv)
    notes = [line for line in err.splitlines() if not line.startswith("note: int8 calibration")]
    assert len(notes) == 1 and notes[0].startswith(f"note: cached ONNX model {int8_file(cache, key)} does not match "
                                                   "these weights (") and notes[0].endswith("); exporting again")
    assert got == expected


def test_an_int8_model_that_strays_from_pytorch_is_refused_and_not_cached(trained, int8_cache, tiny_arch, cache,
                                                                         capsys, monkeypatch):
    other = int8_file(int8_cache["folder"], int8_cache["other"]).read_bytes()
    monkeypatch.setattr(onnx_runtime, "quantize", lambda source, target, *_: Path(target).write_bytes(other))
    assert run(classify_main, classify_argv(trained, *INT8, "--calibration-data", str(trained.data / "train"),
                                            "--calibration-images", "9")) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.splitlines()[-1].startswith(
        "error: the int8 model loses too much: its logits on the first calibration image differ from PyTorch's by ")
    assert "Traceback" not in err and list(cache.iterdir()) == []


# -- flags ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("argv, message", [
    (["--calibration-data", "d"], "error: --calibration-data calibrates an int8 model: it needs --quantize int8"),
    (["--runtime", "onnxruntime", "--calibration-method", "entropy"],
     "error: --calibration-method calibrates an int8 model: it needs --quantize int8"),
    (["--quantize", "int8", "--calibration-data", "d"],
     "error: --quantize int8 runs the model with ONNX Runtime: it needs --runtime onnxruntime"),
    (["--runtime", "onnxruntime", "--quantize", "int8"], "error: --quantize int8 needs --calibration-data DIR"),
])
def test_int8_flags_without_what_they_need_are_refused_before_any_work(trained, tiny_arch, argv, message, capsys,
                                                                       cache):
    line = refused(run(classify_main, classify_argv(trained, *argv)), capsys)
    assert line.startswith(message)
    assert not cache.exists()


@pytest.mark.parametrize("folder", ["missing", "empty", "unreadable"])
def test_a_calibration_folder_without_readable_images_is_one_line(trained, tiny_arch, tmp_path, folder, capsys, cache):
    path = tmp_path / folder
    if folder != "missing":
        (path / "a").mkdir(parents=True)
    if folder == "unreadable":
        (path / "a" / "broken.jpg").write_bytes(b"not a jpeg")
    line = refused(run(classify_main, classify_argv(trained, *INT8, "--calibration-data", str(path))), capsys)
    assert line == {"missing": f"error: --calibration-data {path} is not a folder",
                    "empty": f"error: --calibration-data {path} holds no images (image files, directly or in class "
                             "folders) to calibrate the int8 model with",
                    "unreadable": f"error: none of the 1 calibration images in {path} could be read: {path}/a/broken.jpg "
                                  "could not be read as an image (cannot identify image file)"}[folder]
    assert not cache.exists()


def test_int8_without_onnxruntime_is_one_line(trained, tiny_arch, monkeypatch, capsys, cache):
    import sys

    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # import onnxruntime raises ImportError
    line = refused(run(classify_main, classify_argv(trained, *INT8, "--calibration-data", str(trained.data))), capsys)
    assert line.startswith("error: --runtime onnxruntime needs the onnx extra (")


# -- main.py --evaluate --runtime onnxruntime -------------------------------------------------------------
def evaluate_argv(trained: Trained, workspace: Path, *extra: str) -> list[str]:
    return ["--data-backend", "pytorch", "-a", "tiny", "-b", "5", "-j", "0", "--evaluate", "--resume",
            str(trained.checkpoint), "--use-ema", "0.5", "--workspace", str(workspace), *extra, str(trained.data)]


def evaluation(workspace: Path) -> tuple[dict, dict]:
    """The summary of an evaluation's raport and its parameters."""
    records = read_raport(workspace / "experiment_raport.json")
    summary = {k: v for r in records if r.get("type") == "LOG" and r["step"] == [] for k, v in r["data"].items()}
    parameters = {k: v for r in records if r.get("step") == "PARAMETER" for k, v in r["data"].items()}
    return summary, parameters


def test_evaluate_validates_the_exported_model_through_the_same_loop(trained, tiny_arch, tmp_path, cache, capsys):
    assert train_main(evaluate_argv(trained, tmp_path / "torch")) == 0
    assert train_main(evaluate_argv(trained, tmp_path / "fp32", "--runtime", "onnxruntime")) == 0
    assert train_main(evaluate_argv(trained, tmp_path / "int8", *INT8, "--calibration-data",
                                    str(trained.data / "train"))) == 0
    (torch_run, _), (fp32, fp32_parameters), (int8, int8_parameters) = (
        evaluation(tmp_path / name) for name in ("torch", "fp32", "int8"))
    for prefix in ("val", "val_ema"):  # the EMA's weights are exported and validated too
        assert fp32[f"{prefix}.top1"] == torch_run[f"{prefix}.top1"]
        assert fp32[f"{prefix}.top3"] == torch_run[f"{prefix}.top3"]
        assert fp32[f"{prefix}.loss"] == pytest.approx(torch_run[f"{prefix}.loss"], abs=1e-5)
    assert fp32_parameters["onnx.val"]["kind"] == fp32_parameters["onnx.val_ema"]["kind"] == "fp32"
    assert abs(int8["val.top1"] - fp32["val.top1"]) <= 0.5 and int8["val.loss"] == pytest.approx(fp32["val.loss"], abs=0.05)
    assert (fp32_parameters["runtime"], fp32_parameters["onnx.val"]["kind"]) == ("onnxruntime", "fp32")
    assert int8_parameters["quantize"] == "int8" and int8_parameters["onnx.val"]["kind"] == "int8"
    assert int8_parameters["onnx.val"]["int8"]["calibration"]["images"] == 24  # all 24 training images
    assert int8_parameters["onnx.val"]["device"] == "cpu"


@pytest.mark.parametrize("argv, message", [
    (["--runtime", "onnxruntime"], "error: --runtime onnxruntime validates an exported model: it needs --evaluate"),
    (["--evaluate", "--runtime", "onnxruntime", "--amp"],
     "error: --runtime onnxruntime runs the exported graph as it is (FP32, or int8 with --quantize int8); leave out "
     "--amp"),
    (["--evaluate", "--quantize", "int8", "--calibration-data", "d"],
     "error: --quantize int8 runs the model with ONNX Runtime: it needs --runtime onnxruntime"),
])
def test_main_refuses_runtime_flags_that_do_not_fit_in_one_line(argv, message, capsys):
    line = refused(run(train_main, ["--data-backend", "synthetic", *argv]), capsys)
    assert line == message


def test_an_evaluation_whose_calibration_set_is_unreadable_writes_nothing(trained, tiny_arch, tmp_path, cache, capsys):
    (tmp_path / "calibration").mkdir()
    workspace = tmp_path / "eval"
    line = refused(run(train_main, evaluate_argv(trained, workspace, *INT8, "--calibration-data",
                                                 str(tmp_path / "calibration"))), capsys)
    assert line.startswith(f"error: --calibration-data {tmp_path / 'calibration'} holds no images")
    assert not workspace.exists() and not cache.exists()


# -- model2onnx.py ----------------------------------------------------------------------------------------
def test_model2onnx_writes_an_int8_model_and_says_how_it_agrees(trained, tiny_arch, tmp_path, capsys):
    output = tmp_path / "out" / "tiny_int8.onnx"
    assert run(model2onnx_main, ["--weights", str(trained.checkpoint), "--quantize", "int8", "--calibration-data",
                                 str(trained.data / "train"), "--output", str(output), "-b", "2"]) == 0
    out = capsys.readouterr().out
    assert "int8 vs PyTorch FP32 on the 24 calibration images: top-1 agreement 100.0%" in out
    assert out.endswith(f"Saved {output}\n") and [p.name for p in output.parent.iterdir()] == ["tiny_int8.onnx"]
    import onnx
    import onnxruntime

    assert "QuantizeLinear" in {node.op_type for node in onnx.load(str(output)).graph.node}
    session = onnxruntime.InferenceSession(str(output), providers=["CPUExecutionProvider"])
    assert session.run(None, {"input": np.zeros((3, 3, SIZE, SIZE), np.float32)})[0].shape == (3, 3)


def parsed_config(path: Path):
    text_format = pytest.importorskip("google.protobuf.text_format")
    model_config = pytest.importorskip("tritonclient.grpc.model_config_pb2")
    return text_format.Parse(path.read_text(), model_config.ModelConfig()), model_config


@pytest.mark.parametrize("quantize", [[], ["--quantize", "int8"]], ids=["fp32", "int8"])
def test_a_triton_model_repository_describes_the_graph_it_holds(trained, tiny_arch, tmp_path, capsys, quantize):
    extra = quantize + (["--calibration-data", str(trained.data / "train")] if quantize else [])
    repository = tmp_path / "models"
    assert run(model2onnx_main, ["--weights", str(trained.checkpoint), "--triton-repository", str(repository),
                                 "--max-batch-size", "8", "-b", "1", *extra]) == 0
    name = "tiny_int8" if quantize else "tiny"
    assert sorted(p.relative_to(repository).as_posix() for p in repository.rglob("*")) == \
        [name, f"{name}/1", f"{name}/1/model.onnx", f"{name}/config.pbtxt", f"{name}/labels.txt"]
    config, model_config = parsed_config(repository / name / "config.pbtxt")
    import onnx

    graph = onnx.load(str(repository / name / "1" / "model.onnx")).graph
    assert (config.name, config.platform, config.max_batch_size) == (name, "onnxruntime_onnx", 8)
    assert config.HasField("dynamic_batching")
    for declared, tensors in ((config.input, graph.input), (config.output, graph.output)):
        assert [t.name for t in declared] == [t.name for t in tensors]
        for entry, tensor in zip(declared, tensors):
            shape = tensor.type.tensor_type.shape.dim
            assert shape[0].dim_param  # the batch dimension is free in the graph: Triton's
            assert list(entry.dims) == [dim.dim_value for dim in shape[1:]]
            assert model_config.DataType.Name(entry.data_type) == "TYPE_FP32" == \
                "TYPE_" + {1: "FP32"}[tensor.type.tensor_type.elem_type]
    assert list(config.input[0].dims) == [3, SIZE, SIZE] and list(config.output[0].dims) == [3]
    assert config.output[0].label_filename == "labels.txt"
    assert (repository / name / "labels.txt").read_text().splitlines() == ["class_00", "class_01", "class_02"]
    assert ("QuantizeLinear" in {node.op_type for node in graph.node}) == bool(quantize)


def test_a_triton_model_is_never_written_over_another(trained, tiny_arch, tmp_path, capsys):
    repository = tmp_path / "models"
    (repository / "tiny" / "1").mkdir(parents=True)
    (repository / "tiny" / "config.pbtxt").write_text("kept")
    argv = ["--weights", str(trained.checkpoint), "--triton-repository", str(repository), "-b", "1"]
    line = refused(run(model2onnx_main, argv), capsys)
    assert line == (f"error: {repository / 'tiny'} already exists; choose another --model-name or "
                    "--triton-repository, or remove it first")
    assert (repository / "tiny" / "config.pbtxt").read_text() == "kept"
    for extra, message in ((["--model-name", "../escape"], "error: --model-name '../escape' is not a model name"),
                           (["--output", str(tmp_path / "x.onnx")], "error: --triton-repository writes the model "
                                                                    "into DIR/NAME/1/model.onnx: leave out --output")):
        assert refused(run(model2onnx_main, argv + extra), capsys).startswith(message)
    line = refused(run(model2onnx_main, ["--weights", str(trained.checkpoint), "--max-batch-size", "4"]), capsys)
    assert line == ("error: --max-batch-size describes a model of Triton's model repository: it needs "
                    "--triton-repository DIR")
    assert sorted(p.name for p in repository.iterdir()) == ["tiny"]


# -- the modules' order -----------------------------------------------------------------------------------
def test_the_deployment_modules_import_only_downward():
    """export -> inference -> aoti -> onnx_runtime -> quantization -> torch_export: none imports one above it, even
    inside a function."""
    order = ["export", "inference", "aoti", "onnx_runtime", "quantization", "torch_export"]
    for position, name in enumerate(order):
        tree = ast.parse((REPO / "image_classification" / "deploy" / f"{name}.py").read_text())
        imported = {node.module.lstrip(".").split(".")[0] for node in ast.walk(tree)
                    if isinstance(node, ast.ImportFrom) and node.level and node.module}
        imported |= {alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.level
                     and not node.module for alias in node.names}
        assert not imported & set(order[:position + 1]), (name, imported & set(order[:position + 1]))


# -- CUDA -------------------------------------------------------------------------------------------------
def _cuda_provider() -> bool:
    import onnxruntime

    return torch.cuda.is_available() and "CUDAExecutionProvider" in onnxruntime.get_available_providers()


# a mark, decided as the tests are collected: a skip inside the test would come after the module's ``trained``
# fixture had trained its model (pytest sets up wider-scoped fixtures first)
needs_cuda_provider = pytest.mark.skipif(not _cuda_provider(), reason="needs a GPU and onnxruntime-gpu")


@pytest.mark.gpu
@needs_cuda_provider
def test_onnxruntime_on_cuda_predicts_what_the_cpu_does(trained, tiny_arch, cache):
    from image_classification.deploy.inference import load_model

    model = load_model(None, str(trained.checkpoint)).model
    images = torch.randn(4, 3, SIZE, SIZE)
    on_cpu = onnx_runtime.OnnxModel(model, SIZE, lambda line: None)(images)
    on_cuda = onnx_runtime.OnnxModel(model, SIZE, lambda line: None, device=onnx_runtime.onnx_device("cuda"))
    got = on_cuda(images.cuda())
    assert got.device.type == "cuda" and on_cuda.description["device"] == "cuda"
    # CUDA's provider computes FP32 without TF32; TensorRT's, where it takes the graph, may use TF32
    torch.testing.assert_close(got.cpu(), on_cpu, rtol=1e-2, atol=1e-2)
    assert torch.equal(got.argmax(1).cpu(), on_cpu.argmax(1))
    assert len(list(cache.glob("*.onnx"))) == 1  # the same cached file, proven on the CPU


@pytest.mark.gpu
@needs_cuda_provider
def test_evaluate_runs_the_exported_model_on_cuda(trained, tiny_arch, tmp_path, cache):
    assert train_main(evaluate_argv(trained, tmp_path / "torch", "--device", "cuda")) == 0
    assert train_main(evaluate_argv(trained, tmp_path / "onnx", "--device", "cuda", "--runtime", "onnxruntime")) == 0
    (torch_run, _), (onnx_run, parameters) = evaluation(tmp_path / "torch"), evaluation(tmp_path / "onnx")
    assert onnx_run["val.top1"] == torch_run["val.top1"] and parameters["onnx.val"]["device"] == "cuda"
