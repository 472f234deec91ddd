"""AOTInductor packages: model2onnx.py --output M.pt2 compiles one, classify.py --weights M.pt2 and main.py
--evaluate --runtime aoti run one, predicting what PyTorch predicts; a damaged, foreign or misplaced package is
one line.  Compiling takes tens of seconds on two cores: the tests that compile are marked slow and share one
package of the ``tiny`` model at 32 px."""

from __future__ import annotations

import json
import platform
import zipfile
from pathlib import Path

import pytest
import torch

from helpers import aoti_available, refused, tiny_registered
from image_classification.deploy import aoti, export
from image_classification.deploy.export import model2onnx_main
from image_classification.deploy.inference import main as classify_main
from image_classification.models import build_model
from image_classification.models.preprocessing import Preprocessing
from image_classification.records.checkpoint import save_weights
from image_classification.records.raport import read_raport
from image_classification.system.cli import run
from image_classification.training import main as train_main

pytestmark = pytest.mark.skipif(not aoti_available(), reason="needs torch 2.6 or later and a C++ compiler")
SIZE = 32
CLASSES = ["class_00", "class_01", "class_02"]  # image_folder's, which main.py checks recorded names against


def random_weights(seed: int) -> dict[str, torch.Tensor]:
    """A tiny model's weights, every tensor other than a fresh model's (BatchNorm statistics included)."""
    torch.manual_seed(seed)
    model = build_model("tiny", num_classes=3)
    with torch.no_grad():
        for name, tensor in model.state_dict().items():
            if tensor.is_floating_point():
                tensor.copy_(torch.rand_like(tensor) + 0.5 if "running_var" in name else torch.randn_like(tensor) * 0.3)
    return model.state_dict()


@pytest.fixture(scope="module")
def weights(tmp_path_factory) -> Path:
    """Plain weights of ``tiny`` recording their architecture, class names and 32 px preprocessing."""
    path = tmp_path_factory.mktemp("aoti") / "tiny.pth"
    description = {"arch": "tiny", "num_classes": 3, "classes": CLASSES, "preprocessing": Preprocessing(SIZE).to_dict()}
    with tiny_registered():
        save_weights(random_weights(1), description, path)
    return path


@pytest.fixture(scope="module")
def package(weights) -> Path:
    """model2onnx.py --output tiny.pt2 of ``weights``, compiled once for the module."""
    output = weights.with_name("tiny.pt2")
    with tiny_registered():
        assert run(model2onnx_main, ["--weights", str(weights), "--output", str(output), "-b", "3"]) == 0
    return output


def torch_model(weights: Path) -> torch.nn.Module:
    model = build_model("tiny", num_classes=3).eval()
    model.load_state_dict({k: v for k, v in torch.load(weights).items()})
    return model


def predictions(capsys, argv: list[str]) -> tuple[list[dict], str]:
    assert run(classify_main, [*argv, "--json", "--topk", "3"]) == 0, capsys.readouterr().err
    out, err = capsys.readouterr()
    return [json.loads(line) for line in out.splitlines()], err


def val_images(image_folder: Path) -> list[str]:
    return sorted(str(path) for path in image_folder.glob("val/*/*.jpg"))


@pytest.mark.slow
def test_a_package_predicts_what_pytorch_does_with_its_own_classes_and_preprocessing(
        package, weights, image_folder, tiny_arch, capsys):
    images = val_images(image_folder)
    plain, _ = predictions(capsys, ["--weights", str(weights), "--image", *images, "--cpu", "--precision", "FP32",
                                    "--memory-format", "nchw"])
    for chosen in (images, images[:1]):  # a batch of 12 and a batch of 1
        compiled, err = predictions(capsys, ["--weights", str(package), "--image", *chosen])
        assert err == "" and len(compiled) == len(chosen)
        for ours, theirs in zip(compiled, plain):
            assert ours["path"] == theirs["path"]
            assert [p["label"] for p in ours["predictions"]] == [p["label"] for p in theirs["predictions"]]
            assert {p["label"] for p in ours["predictions"]} == set(CLASSES)  # the names it records
            for a, b in zip(ours["predictions"], theirs["predictions"]):
                assert a["probability"] == pytest.approx(b["probability"], abs=1e-4)


@pytest.mark.slow
def test_a_package_reads_channels_last_images_as_the_layout_they_are(package, weights, tiny_arch):
    model = aoti.AotiModel(package)
    images = torch.randn(4, 3, SIZE, SIZE)
    expected = torch_model(weights)(images).detach()
    torch.testing.assert_close(model(images), expected, rtol=0, atol=1e-4)
    torch.testing.assert_close(model(images.to(memory_format=torch.channels_last)), expected, rtol=0, atol=1e-4)
    assert model.description["format"] == "AOTInductor package" and model.description["device"] == "cpu"


def rewritten(source: Path, target: Path, change) -> Path:
    """A copy of the package whose metadata members pass through ``change`` (a dict -> None)."""
    with zipfile.ZipFile(source) as original, zipfile.ZipFile(target, "w") as copy:
        for info in original.infolist():
            data = original.read(info)
            if info.filename.endswith("_metadata.json"):
                metadata = json.loads(data)
                change(metadata)
                data = json.dumps(metadata).encode()
            copy.writestr(info, data)
    return target


def other_probe_logits(metadata: dict) -> None:
    record = json.loads(metadata["image_classification"])
    record["probe_logits"] = [[value + 1.0 for value in record["probe_logits"][0]]]
    metadata["image_classification"] = json.dumps(record)


@pytest.mark.slow
def test_a_damaged_package_or_one_whose_record_is_not_its_own_is_one_line(package, tmp_path, tiny_arch, capsys,
                                                                         image_folder):
    data = bytearray(package.read_bytes())
    data[len(data) // 2] ^= 0x40  # inside the compiled library or its weights
    flipped = tmp_path / "flipped.pt2"
    flipped.write_bytes(bytes(data))
    image = val_images(image_folder)[0]
    line = refused(run(classify_main, ["--weights", str(flipped), "--image", image]), capsys)
    assert line.startswith(f"error: '{flipped}' is damaged: its member ") and "fails its CRC check" in line, line
    forged = rewritten(package, tmp_path / "forged.pt2", other_probe_logits)
    line = refused(run(classify_main, ["--weights", str(forged), "--image", image]), capsys)
    assert line.startswith(f"error: '{forged}' does not compute what its record says: its logits on the probe image "
                           "differ from PyTorch's, recorded at its compilation, by 1 (limit"), line


@pytest.mark.slow
def test_evaluate_validates_the_compiled_package_through_the_same_loop(weights, image_folder, tmp_path, tiny_arch,
                                                                       capsys):
    common = ["--data-backend", "pytorch", "-a", "tiny", "-b", "5", "-j", "0", "--evaluate", "--pretrained-weights",
              str(weights), "--image-size", str(SIZE)]
    results = {}
    for runtime in ("torch", "aoti"):
        workspace = tmp_path / runtime
        assert train_main([*common, "--runtime", runtime, "--workspace", str(workspace), str(image_folder)]) == 0
        records = read_raport(workspace / "experiment_raport.json")
        summary = {k: v for r in records if r.get("type") == "LOG" and r["step"] == [] for k, v in r["data"].items()}
        parameters = {k: v for r in records if r.get("step") == "PARAMETER" for k, v in r["data"].items()}
        results[runtime] = summary, parameters
    (plain, _), (compiled, parameters) = results["torch"], results["aoti"]
    assert compiled["val.top1"] == plain["val.top1"] and compiled["val.loss"] == pytest.approx(plain["val.loss"], abs=1e-5)
    assert parameters["runtime"] == "aoti" and parameters["aoti.val"]["format"] == "AOTInductor package"
    assert "note: compiling the model into an AOTInductor package for cpu" in capsys.readouterr().out


# -- refused before anything is compiled or loaded ---------------------------------------------------------
def fake_package(path: Path, metadata: dict | None) -> Path:
    """A zip laid out as a package, with ``metadata`` as its model's metadata file (None: none) and no code."""
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("model/archive_format", "pt2")
        if metadata is not None:
            archive.writestr("model/data/aotinductor/model/abc.wrapper_metadata.json", json.dumps(metadata))
    return path


def record_of(**changes) -> dict:
    record = {"format": 1, "image_size": SIZE, "arch": "tiny", "num_classes": 3, "classes": CLASSES,
              "preprocessing": Preprocessing(SIZE).to_dict(), "probe_logits": [[0.0, 0.0, 0.0]]}
    metadata = {"image_classification": json.dumps(record), "AOTI_DEVICE_KEY": "cpu",
                "AOTI_MACHINE": platform.machine(), "AOTI_CPU_ISA": "AVX2"}
    metadata.update(changes)
    return metadata


@pytest.mark.parametrize("case, metadata, message", [
    ("not a zip", None, "is not a readable .pt2 package"),
    ("no record", {}, "is a .pt2 file without this toolkit's record"),
    ("another machine", record_of(AOTI_MACHINE="riscv64"), "cannot run here: it was compiled for riscv64, and this "
                                                          f"machine is {platform.machine()}"),
    ("another CPU", record_of(AOTI_CPU_ISA="SVE2048"), "cannot run here: it was compiled for CPUs with SVE2048, which "
                                                      "this CPU lacks"),
    ("CUDA", record_of(AOTI_DEVICE_KEY="cuda"), "cannot run here: it was compiled for CUDA, and no CUDA device is "
                                                "available"),
    ("damaged record", record_of(image_classification="{not json"), "holds a damaged record of this toolkit"),
])
def test_a_foreign_or_misplaced_package_is_one_line_before_it_is_loaded(tmp_path, image_folder, capsys, monkeypatch,
                                                                         case, metadata, message):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch._inductor, "aoti_load_package", lambda *args: pytest.fail("loaded"))
    path = tmp_path / "model.pt2"
    if metadata is None:
        path.write_bytes(b"\x00 not a zip " * 100)
    else:
        fake_package(path, metadata if case != "no record" else None)
    line = refused(run(classify_main, ["--weights", str(path), "--image", val_images(image_folder)[0]]), capsys)
    assert line.startswith(f"error: '{path}' ") and message in line, line


def test_an_exported_program_saved_by_torch_is_no_package_of_ours(tmp_path, image_folder, capsys):
    path = tmp_path / "program.pt2"
    model = torch.nn.Linear(4, 2).eval()
    torch.export.save(torch.export.export(model, (torch.randn(2, 4),)), str(path))
    assert aoti.is_package(path) and aoti.is_package(path.rename(tmp_path / "renamed.bin"))
    line = refused(run(classify_main, ["--weights", str(tmp_path / "renamed.bin"), "--image",
                                       val_images(image_folder)[0]]), capsys)
    assert line.startswith(f"error: '{tmp_path / 'renamed.bin'}' is a .pt2 file without this toolkit's record")


def test_a_checkpoint_is_no_package(tmp_path):
    torch.save({"w": torch.zeros(2)}, tmp_path / "weights.pth")  # a zip too
    assert not aoti.is_package(tmp_path / "weights.pth")


@pytest.mark.parametrize("argv, message", [
    (["--runtime", "onnxruntime"], "is an AOTInductor package: it runs as compiled (--runtime aoti, the default for a "
                                   ".pt2 file); leave out --runtime onnxruntime"),
    (["--precision", "AMP"], "--runtime aoti runs the compiled package as it is (FP32); leave out --precision AMP"),
])
def test_classify_refuses_what_a_package_cannot_do_in_one_line(tmp_path, image_folder, capsys, argv, message):
    path = fake_package(tmp_path / "model.pt2", record_of())
    line = refused(run(classify_main, ["--weights", str(path), "--image", val_images(image_folder)[0], *argv]), capsys)
    assert message in line, line


@pytest.mark.parametrize("argv, message", [
    (["--output", "m.pt2", "--quantize", "int8", "--calibration-data", "d"], "error: --quantize is for ONNX files"),
    (["--output", "m.pt2", "--opset", "18"], "error: --opset is for ONNX files"),
    (["--format", "pt2", "--output", "m.onnx"], "error: --output m.onnx is not named as a .pt2 package (--format pt2)"),
    (["--format", "onnx", "--output", "m.pt2"], "error: --output m.pt2 is not named as an ONNX file (--format onnx)"),
    (["--output", "m.onnx", "--device", "cuda"], "error: --device picks what a .pt2 package is compiled for"),
])
def test_model2onnx_refuses_flags_of_the_other_format_in_one_line(argv, message, capsys, monkeypatch):
    monkeypatch.setattr(export, "write_package", lambda *args, **kwargs: pytest.fail("compiled"))
    line = refused(run(model2onnx_main, ["-a", "resnet18", "--image-size", "32", *argv]), capsys)
    assert line.startswith(message), line


@pytest.mark.parametrize("argv, message", [
    (["--runtime", "aoti"], "error: --runtime aoti validates an exported model: it needs --evaluate"),
    (["--evaluate", "--runtime", "aoti", "--compile"],
     "error: --runtime aoti runs the compiled package as it is (FP32); leave out --compile"),
])
def test_main_refuses_runtime_aoti_flags_that_do_not_fit_in_one_line(argv, message, capsys):
    assert refused(run(train_main, ["--data-backend", "synthetic", *argv]), capsys) == message


def test_weights_given_as_a_package_to_model2onnx_are_named_so(tmp_path, capsys):
    path = fake_package(tmp_path / "model.pt2", record_of())
    line = refused(run(model2onnx_main, ["--weights", str(path), "--output", str(tmp_path / "m.onnx")]), capsys)
    assert line.startswith(f"error: '{path}' is an AOTInductor package (.pt2), not PyTorch weights: classify.py "
                           f"--weights {path} runs it")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")  # before the module's fixtures compile
def test_a_package_compiled_for_cuda_predicts_what_the_cpu_one_does(weights, package, tmp_path, tiny_arch):
    output = tmp_path / "cuda.pt2"
    assert run(model2onnx_main, ["--weights", str(weights), "--output", str(output), "--device", "cuda"]) == 0
    on_cuda, on_cpu = aoti.AotiModel(output), aoti.AotiModel(package)
    images = torch.randn(5, 3, SIZE, SIZE)
    got = on_cuda(images.cuda())
    assert got.device.type == "cuda" and on_cuda.description["device"] == "cuda"
    torch.testing.assert_close(got.cpu(), on_cpu(images), rtol=1e-2, atol=1e-2)
