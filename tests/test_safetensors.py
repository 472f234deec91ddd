"""Safetensors weights in and out: ours (checkpoint2model.py --weight-path W.safetensors), timm's layout and
Hugging Face's folders (timm's hub layout, transformers' ResNet) read by classify.py, model2onnx.py and main.py
--pretrained-weights; damaged and foreign files refused in one line."""

from __future__ import annotations

import json
import re
import struct
import sys
from pathlib import Path

import pytest
import torch

from helpers import randomised, refused, torch_export_writes_onnx, write_colour_checkpoint
from image_classification.deploy.export import checkpoint2model_main, model2onnx_main
from image_classification.deploy.inference import load_model
from image_classification.deploy.inference import main as classify_main
from image_classification.errors import UserError
from image_classification.models import build_model
from image_classification.system.cli import run
from image_classification.training import main as train_main

safetensors_torch = pytest.importorskip("safetensors.torch")
SIZE = 32
NAMES = ["red", "green", "blue"]


@pytest.fixture(scope="module")
def ours(image_folder, tmp_path_factory) -> tuple[Path, Path]:
    """(the .pth, the .safetensors) that checkpoint2model.py extracts from one trained, named checkpoint."""
    folder = tmp_path_factory.mktemp("ours")
    checkpoint = write_colour_checkpoint(image_folder, folder / "checkpoint.pth.tar", SIZE)
    state = torch.load(checkpoint, weights_only=True)
    state["classes"], state["num_classes"] = NAMES, 3  # as main.py's checkpoints record them
    state["preprocessing"] = {"image_size": SIZE, "interpolation": "bilinear", "crop_ratio": 0.875,
                              "exif_orientation": True}
    torch.save(state, checkpoint)
    paths = folder / "weights.pth", folder / "weights.safetensors"
    for path in paths:
        assert run(checkpoint2model_main, ["--checkpoint-path", str(checkpoint), "--weight-path", str(path)]) == 0
    return paths


def predictions(capsys, weights: Path, images: Path, *extra: str) -> list[dict]:
    """classify.py --json's records for every image in ``images`` (no --arch, no --image-size: the file's)."""
    assert run(classify_main, ["--weights", str(weights), "--image", str(images), "--json", "--precision", "FP32",
                               "--topk", "3", *extra]) == 0
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def test_checkpoint2model_writes_safetensors_that_classify_reads_as_it_reads_the_pth(ours, image_folder, capsys):
    pth, safetensors = ours
    with open(safetensors, "rb") as handle:  # a plain safetensors file: its header, then the tensors
        header = json.loads(handle.read(struct.unpack("<Q", handle.read(8))[0]))
    metadata = header.pop("__metadata__")
    assert metadata["arch"] == "resnet18" and json.loads(metadata["num_classes"]) == 3
    assert json.loads(metadata["classes"]) == NAMES and json.loads(metadata["preprocessing"])["image_size"] == SIZE
    saved = torch.load(pth, weights_only=True)
    assert set(header) == set(saved)
    loaded = safetensors_torch.load_file(safetensors)
    for name, tensor in saved.items():
        assert torch.equal(loaded[name], tensor), name
    images = image_folder / "val" / "class_02"
    expected = predictions(capsys, pth, images)
    assert predictions(capsys, safetensors, images) == expected
    assert {record["predictions"][0]["label"] for record in expected} == {"blue"}


@pytest.mark.slow  # an ONNX export through torch.export: about 20 s on 2 cores
@pytest.mark.skipif(not torch_export_writes_onnx(), reason="torch.export's ONNX exporter needs torch 2.6 and onnxscript")
def test_model2onnx_exports_our_safetensors_with_their_record(ours, tmp_path, capsys):
    onnx = pytest.importorskip("onnx")
    output = tmp_path / "model.onnx"
    assert run(model2onnx_main, ["--weights", str(ours[1]), "--output", str(output)]) == 0
    properties = {p.key: p.value for p in onnx.load(str(output)).metadata_props}
    assert "resnet18" in json.dumps(properties) and "green" in json.dumps(properties)


@pytest.fixture(scope="module")
def timm_resnet18(tmp_path_factory) -> tuple[torch.nn.Module, Path]:
    """timm's resnet18 (5 classes, random weights, BN statistics too) and its state dict saved as safetensors."""
    timm = pytest.importorskip("timm")
    model = randomised(timm.create_model("resnet18", pretrained=False, num_classes=5), seed=4)
    path = tmp_path_factory.mktemp("timm") / "resnet18.safetensors"
    safetensors_torch.save_file(model.state_dict(), path)
    return model, path


def test_timm_resnet18_weights_compute_what_timm_computes(timm_resnet18):
    model, path = timm_resnet18
    loaded = load_model(None, str(path))  # no --arch: the layout names the architecture
    assert (loaded.arch, loaded.num_classes) == ("resnet18", 5)
    images = torch.randn(2, 3, SIZE, SIZE, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(loaded.model(images), model(images), rtol=0, atol=0)


def test_a_timm_hub_folder_gives_its_architecture_classes_and_preprocessing(tmp_path, image_folder, capsys):
    timm = pytest.importorskip("timm")
    from timm.models._hub import save_for_hf

    model = randomised(timm.create_model("resnet18", pretrained=False, num_classes=3), seed=5)
    folder = tmp_path / "hub"
    save_for_hf(model, folder, model_config={"label_names": NAMES}, safe_serialization=True)
    loaded = load_model(None, str(folder))
    assert (loaded.arch, loaded.class_names) == ("resnet18", NAMES)
    timm_cfg = json.loads((folder / "config.json").read_text())["pretrained_cfg"]
    assert (loaded.preprocessing.image_size, loaded.preprocessing.interpolation, loaded.preprocessing.crop_ratio) \
        == (timm_cfg["input_size"][2], timm_cfg["interpolation"], timm_cfg["crop_pct"])
    images = torch.randn(2, 3, SIZE, SIZE, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(loaded.model(images), model(images), rtol=0, atol=0)
    by_folder = predictions(capsys, folder, image_folder / "val" / "class_00", "--image-size", str(SIZE))
    assert by_folder == predictions(capsys, folder / "model.safetensors", image_folder / "val" / "class_00",
                                    "--image-size", str(SIZE))
    assert {p["label"] for record in by_folder for p in record["predictions"]} == set(NAMES)


def transformers_names(state: dict) -> dict:
    """Our ResNet's tensors under the names transformers' ResNetForImageClassification gives them
    (modeling_resnet.py: an embedder, stages of layers whose convs are layer.N, a shortcut, classifier.1)."""
    renamed = {}
    for key, tensor in state.items():
        name = re.sub(r"^conv1\.", "resnet.embedder.embedder.convolution.", key)
        name = re.sub(r"^bn1\.", "resnet.embedder.embedder.normalization.", name)
        name = re.sub(r"^fc\.", "classifier.1.", name)
        if match := re.match(r"layer(\d)\.(\d+)\.(?:downsample\.(\d)|conv(\d)|bn(\d))\.(.+)", key):
            stage, block, shortcut, conv, bn, rest = match.groups()
            part = (("shortcut.convolution", "shortcut.normalization")[int(shortcut)] if shortcut is not None
                    else f"layer.{int(conv) - 1}.convolution" if conv else f"layer.{int(bn) - 1}.normalization")
            name = f"resnet.encoder.stages.{int(stage) - 1}.layers.{block}.{part}.{rest}"
        renamed[name] = tensor
    return renamed


def transformers_folder(folder: Path, model: torch.nn.Module, names: list[str]) -> Path:
    """``folder`` holding ``model`` (our resnet18) as transformers' save_pretrained writes a ResNet-18."""
    folder.mkdir()
    safetensors_torch.save_file(transformers_names(model.state_dict()), folder / "model.safetensors",
                                metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps({
        "architectures": ["ResNetForImageClassification"], "model_type": "resnet", "layer_type": "basic",
        "depths": [2, 2, 2, 2], "hidden_sizes": [64, 128, 256, 512], "embedding_size": 64, "hidden_act": "relu",
        "downsample_in_first_stage": False, "downsample_in_bottleneck": False,
        "id2label": {str(index): name for index, name in enumerate(names)}}))
    return folder


def test_a_transformers_resnet_folder_computes_what_our_resnet_does(tmp_path):
    model = randomised(build_model("resnet18", num_classes=3), seed=6)
    state = transformers_names(model.state_dict())
    assert "resnet.encoder.stages.1.layers.0.shortcut.convolution.weight" in state and "classifier.1.bias" in state
    folder = transformers_folder(tmp_path / "microsoft-resnet-18", model, NAMES)
    loaded = load_model(None, str(folder))
    assert (loaded.arch, loaded.class_names) == ("resnet18", NAMES)
    images = torch.randn(2, 3, SIZE, SIZE, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        torch.testing.assert_close(loaded.model(images), model(images), rtol=0, atol=0)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "downsample_in_bottleneck": True}))
    with pytest.raises(UserError, match="downsample_in_bottleneck True, where this toolkit's ResNets have False"):
        load_model(None, str(folder))


def test_hugging_face_weights_fine_tune_with_a_new_head(image_folder, tmp_path, capsys):
    model = randomised(build_model("resnet18", num_classes=5), seed=7)
    folder = transformers_folder(tmp_path / "hf", model, ["a", "b", "c", "d", "e"])
    assert train_main(["-a", "resnet18", "--pretrained-weights", str(folder), "--image-size", str(SIZE), "-b", "8",
                       "--device", "cpu", "--epochs", "1", "--prof", "1", "--data-backend", "pytorch", "-j", "0",
                       "--lr", "0", "--momentum", "0", "--weight-decay", "0", "--workspace", str(tmp_path / "ws"),
                       str(image_folder)]) == 0
    assert "Replaced the classifier head: the weights have 5 classes, the model 3" in capsys.readouterr().out
    tuned = torch.load(tmp_path / "ws" / "checkpoint.pth.tar", weights_only=True)["state_dict"]
    assert tuned["fc.weight"].shape == (3, 512)
    assert torch.equal(tuned["layer4.1.conv2.weight"], model.state_dict()["layer4.1.conv2.weight"])


def damaged(case: str, good: bytes, tmp_path: Path) -> Path:
    """A copy of ``good`` (a safetensors file) damaged as ``case`` says."""
    length = struct.unpack("<Q", good[:8])[0]
    header = json.loads(good[8:8 + length])
    if case == "truncated":
        data = good[:len(good) // 2]
    elif case == "header length past the end":
        data = struct.pack("<Q", len(good)) + good[8:]
    elif case == "header not JSON":
        data = good[:8] + b"#" * length + good[8 + length:]
    elif case == "offsets past the end":
        name = next(key for key in header if key != "__metadata__")
        header[name]["data_offsets"][1] = len(good)  # past the data, which starts after the header
        text = json.dumps(header).encode()
        data = struct.pack("<Q", len(text)) + text + good[8 + length:]
    elif case == "metadata that does not match the hash":
        header["__metadata__"]["arch"] = "resnet34"
        text = json.dumps(header).encode()
        data = struct.pack("<Q", len(text)) + text + good[8 + length:]
    else:
        raise ValueError(case)
    path = tmp_path / "damaged.safetensors"
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("case, words", [
    ("truncated", "is damaged or truncated: the tensor"),
    ("header length past the end", "its header length"),
    ("header not JSON", "its header is not JSON"),
    ("offsets past the end", "is damaged or truncated: the tensor"),
    ("metadata that does not match the hash", "does not match the hash recorded"),
])
def test_a_damaged_safetensors_file_is_one_line_and_exit_2(ours, tmp_path, photo_like, capsys, case, words):
    path = damaged(case, ours[1].read_bytes(), tmp_path)
    line = refused(run(classify_main, ["--weights", str(path), "--image", str(photo_like)]), capsys)
    assert words in line and f"'{path}'" in line, line


@pytest.fixture(scope="module")
def photo_like(image_folder) -> Path:
    return next((image_folder / "val" / "class_00").iterdir())


@pytest.mark.parametrize("case, words", [
    ("a text model", "tensors whose names match no architecture of this toolkit (embeddings.word_embeddings"),
    ("another timm architecture", "names timm's vit_base_patch16_224, which this toolkit does not build"),
    ("another transformers model", "describes a transformers bert model (['BertForMaskedLM']), not a ResNet"),
    ("our file, another --arch", "holds a resnet18 checkpoint, not resnet34; pass --arch resnet18"),
    ("a config naming another architecture", "names timm's resnet34, but its tensors have the layout of resnet18"),
    ("a folder of a sharded checkpoint", "a sharded checkpoint, which this toolkit does not read"),
])
def test_a_foreign_or_contradicted_file_is_one_line_and_exit_2(ours, tmp_path, photo_like, capsys, case, words):
    folder, arch = tmp_path / "model", []
    folder.mkdir()
    text_model = {"embeddings.word_embeddings.weight": torch.zeros(10, 4), "encoder.layer.0.weight": torch.zeros(4)}
    if case == "a text model":
        safetensors_torch.save_file(text_model, folder / "model.safetensors")
    elif case in ("another timm architecture", "another transformers model"):
        safetensors_torch.save_file(text_model, folder / "model.safetensors")
        config = {"architecture": "vit_base_patch16_224", "num_classes": 10} if "timm" in case else \
            {"model_type": "bert", "architectures": ["BertForMaskedLM"]}
        (folder / "config.json").write_text(json.dumps(config))
    elif case == "a config naming another architecture":
        safetensors_torch.save_file(build_model("resnet18", num_classes=3).state_dict(), folder / "model.safetensors")
        (folder / "config.json").write_text(json.dumps({"architecture": "resnet34.a1_in1k", "num_classes": 3}))
    elif case == "our file, another --arch":
        folder, arch = ours[1], ["-a", "resnet34"]
    else:
        (folder / "model.safetensors.index.json").write_text("{}")
    line = refused(run(classify_main, ["--weights", str(folder), *arch, "--image", str(photo_like)]), capsys)
    assert words in line, line


def test_safetensors_weights_are_no_training_checkpoint_to_resume(ours, tmp_path, image_folder, capsys):
    line = refused(run(train_main, ["-a", "resnet18", "--resume", str(ours[1]), "--workspace", str(tmp_path / "ws"),
                                    "--device", "cpu", str(image_folder)]), capsys)
    assert "is a safetensors file: it holds weights, not a training checkpoint; pass it as --pretrained-weights" \
        in line, line


def test_without_the_package_a_safetensors_file_says_how_to_install_it(ours, photo_like, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "safetensors", None)
    monkeypatch.setitem(sys.modules, "safetensors.torch", None)
    line = refused(run(classify_main, ["--weights", str(ours[1]), "--image", str(photo_like)]), capsys)
    assert line == ("error: reading and writing .safetensors weights needs the safetensors package: "
                    "pip install safetensors==0.8.*")
