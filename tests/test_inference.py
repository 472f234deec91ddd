"""classify.py (preprocessing, predictions, class names, bad input) and benchmarks/inference_benchmark.py."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from PIL import Image

from conftest import load_script
from helpers import Result, patient, refused, run_script, write_colour_checkpoint
from image_classification.arguments import parse_args
from image_classification.arguments.tools import classify_parser
from image_classification.deploy import inference
from image_classification.deploy.inference import image_transform, imagenet_class_names
from image_classification.deploy.inference import main as classify_main
from image_classification.models import build_model
from image_classification.system import machine
from image_classification.system.cli import run
from image_classification.system.runtime import Runtime

REPO = Path(__file__).resolve().parents[1]
CLASSES = ["class_00", "class_01", "class_02"]
SIZE = 32


def classify(*args: str) -> Result:
    """``python classify.py ARGS``, run in this process (helpers.run_script): a fresh interpreter imports
    torch for seconds, a minute on a loaded machine; the one test of the script's wiring starts a process."""
    return run_script([REPO / "classify.py", *map(str, args)], cwd=REPO)


def classify_process(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "classify.py", *map(str, args)], cwd=REPO, capture_output=True,
                          text=True, timeout=patient(120))


def percent_lines(stdout: str) -> list[tuple[str, float]]:
    """(label, percent) of every ``label: 12.3%`` line."""
    rows = []
    for line in stdout.splitlines():
        if line.endswith("%") and ": " in line:
            label, value = line.rsplit(": ", 1)
            rows.append((label, float(value[:-1])))
    return rows


@pytest.fixture(scope="module")
def photo(tmp_path_factory) -> Path:
    """A real photograph (scikit-image's cat, Chelsea) as a JPEG."""
    data = pytest.importorskip("skimage.data")

    path = tmp_path_factory.mktemp("photo") / "chelsea.jpg"
    Image.fromarray(data.chelsea()).save(path, quality=90)
    return path


@pytest.fixture(scope="module")
def colour_checkpoint(image_folder, tmp_path_factory) -> Path:
    """A resnet18 trained for a few SGD steps on the colour dataset, saved as a training checkpoint."""
    return write_colour_checkpoint(image_folder, tmp_path_factory.mktemp("trained") / "checkpoint.pth.tar", SIZE)


def test_classify_photo_without_weights_prints_falling_percentages(photo):
    result = classify("--image", photo)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == str(photo)
    rows = percent_lines(result.stdout)
    assert len(rows) == 5 == len(lines) - 1
    percents = [p for _, p in rows]
    assert percents == sorted(percents, reverse=True)
    assert 0 <= sum(percents) <= 100.0 + 0.05 * len(percents)  # each is rounded to 0.1
    names = set(imagenet_class_names())
    assert all(label in names for label, _ in rows)
    assert "untrained" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_folder_with_unreadable_images_still_gets_its_predictions(colour_checkpoint, image_folder, tmp_path,
                                                                    capsys):
    """As training does: each unreadable image (no image at all, or a body cut short behind a good header) is
    named on stderr and left out, the others are classified; only a folder of none readable is an error."""
    folder = tmp_path / "photos"
    folder.mkdir()
    good = sorted((image_folder / "val" / "class_02").iterdir())[:2]
    for path in good:
        (folder / path.name).write_bytes(path.read_bytes())
    (folder / "a_garbage.jpg").write_bytes(b"not a jpeg at all")
    whole = good[0].read_bytes()
    (folder / "z_cut.jpg").write_bytes(whole[:len(whole) // 2])  # the header reads, the pixels do not
    argv = ["--weights", str(colour_checkpoint), "--precision", "FP32", "--json"]
    assert run(classify_main, [*argv, "--image", str(folder)]) == 0
    out, err = capsys.readouterr()
    assert [json.loads(line)["path"] for line in out.splitlines()] == [str(folder / p.name) for p in good]
    assert [line.split(": ")[:2] for line in err.splitlines()] == [["warning", "skipped"]] * 2, err
    assert "a_garbage.jpg" in err and "z_cut.jpg" in err

    for path in good:
        (folder / path.name).unlink()
    assert run(classify_main, [*argv, "--image", str(folder)]) == 2
    out, err = capsys.readouterr()
    *skips, last = err.splitlines()
    assert out == "" and last == "error: none of the images could be read (each is named above)"
    assert len(skips) == 2 and "a_garbage.jpg" in skips[0] and "z_cut.jpg" in skips[1]  # cut: found decoding
    assert "error: " in refused(run(classify_main, [*argv, "--image", str(folder / "a_garbage.jpg")]), capsys)


def test_an_image_too_elongated_to_resize_is_refused_in_one_line_or_skipped(colour_checkpoint, tmp_path, capsys):
    """The weights record no size: 224 px crops of a 256 px short side.  A 1,366 x 1 strip passes the size rule,
    but its resize would make 89,522,176 pixels (a 200,000 x 1 one, 13 billion: a MemoryError); it is named from
    its header before any prediction, alone in one line, in a folder as a skipped image."""
    Image.new("L", (1366, 1)).save(tmp_path / "past.png")
    Image.new("L", (1365, 1)).save(tmp_path / "within.png")
    argv = ["--weights", str(colour_checkpoint), "--precision", "FP32", "--topk", "1", "--json", "--image"]
    error = refused(run(classify_main, [*argv, str(tmp_path / "past.png")]), capsys)
    assert error == (f"error: {tmp_path / 'past.png'} could not be read as an image (more than 89,478,485 pixels "
                     "once resized to a 256 px short side (a 349,696 px long side))")
    assert run(classify_main, [*argv, str(tmp_path)]) == 0
    out, err = capsys.readouterr()
    assert [json.loads(line)["path"] for line in out.splitlines()] == [str(tmp_path / "within.png")]
    assert err.splitlines() == [f"warning: skipped: {tmp_path / 'past.png'} could not be read as an image (more "
                                "than 89,478,485 pixels once resized to a 256 px short side (a 349,696 px long side))"]


def test_classify_names_the_trained_class(colour_checkpoint, image_folder, tmp_path):
    labels = tmp_path / "labels.txt"
    labels.write_text("red\ngreen\nblue\n")
    blue = sorted((image_folder / "val" / "class_02").iterdir())
    result = classify("--weights", colour_checkpoint, "--image", blue[0], "--image-size", SIZE,
                      "--precision", "FP32", "--labels", labels, "--topk", "3")
    assert result.returncode == 0, result.stderr
    rows = percent_lines(result.stdout)
    assert [label for label, _ in rows][0] == "blue"  # arch and class count come from the checkpoint
    assert sorted(label for label, _ in rows) == ["blue", "green", "red"]
    assert result.stderr == ""

    # A folder means every image in it; --json gives one object per image; no labels: class indices.
    red = image_folder / "val" / "class_00"
    result = classify("--weights", colour_checkpoint, "-a", "resnet18", "--image", red,
                      "--image-size", SIZE, "--precision", "FP32", "--json", "--topk", "2")
    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in result.stdout.splitlines()]
    assert [Path(r["path"]).name for r in records] == sorted(p.name for p in red.iterdir())
    for record in records:
        best = record["predictions"][0]
        assert (best["label"], best["index"]) == ("0", 0)
        assert len(record["predictions"]) == 2 and 0.0 <= best["probability"] <= 1.0


def test_class_names_recorded_in_a_checkpoint_are_used(colour_checkpoint, image_folder, tmp_path, capsys):
    checkpoint = torch.load(colour_checkpoint, weights_only=True)
    checkpoint["classes"] = ["red", "green", "blue"]
    named = tmp_path / "named.pth.tar"
    torch.save(checkpoint, named)
    green = sorted((image_folder / "val" / "class_01").iterdir())[0]
    argv = ["--weights", str(named), "--image", str(green), "--image-size", str(SIZE), "--precision", "FP32"]
    assert run(classify_main, argv) == 0
    assert [label for label, _ in percent_lines(capsys.readouterr().out)][0] == "green"


def json_predictions(capsys, argv: list[str]) -> list[dict]:
    assert run(classify_main, argv + ["--json"]) == 0
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


@pytest.mark.slow
def test_an_efficientnet_trained_by_main_py_is_exported_and_classified_as_pytorch_computes_it(
        image_folder, tmp_path, capsys):
    """main.py trains efficientnet-b0 for an epoch at 32 px; model2onnx.py exports its checkpoint (the arch and
    the class count read from it) and onnxruntime gives PyTorch's logits; classify.py gives PyTorch's
    probabilities for every validation image."""
    from helpers import run_script
    from image_classification.models import load_weights
    from image_classification.training import main as train_main

    onnxruntime = pytest.importorskip("onnxruntime")
    workspace = tmp_path / "run"
    assert run(train_main, ["-a", "efficientnet-b0", "--image-size", str(SIZE), "-b", "8", "--epochs", "1",
                            "--device", "cpu", "--data-backend", "pytorch", "-j", "0", "--lr", "0.02",
                            "--workspace", str(workspace), str(image_folder)]) == 0
    checkpoint = workspace / "checkpoint.pth.tar"
    assert torch.load(checkpoint, weights_only=True)["arch"] == "efficientnet-b0"
    onnx_file = tmp_path / "b0.onnx"
    exported = run_script(["model2onnx.py", "--weights", checkpoint, "--output", onnx_file, "-b", "2"], capsys,
                          cwd=REPO)
    assert exported.returncode == 0, exported.stderr

    model = build_model("efficientnet-b0", num_classes=3)
    load_weights(model, str(checkpoint))
    model.eval()
    paths = sorted((image_folder / "val").glob("*/*.jpg"))
    transform = image_transform(SIZE)
    images = torch.stack([transform(Image.open(path).convert("RGB")) for path in paths])
    with torch.no_grad():
        logits = model(images)
    session = onnxruntime.InferenceSession(str(onnx_file), providers=["CPUExecutionProvider"])
    for start in range(0, len(paths), 2):  # batches of 2 (the export takes any)
        (got,) = session.run(None, {"input": images[start:start + 2].numpy()})
        assert abs(got - logits[start:start + 2].numpy()).max() < 1e-3
    predictions = json_predictions(capsys, ["--weights", str(checkpoint), "--image", *map(str, paths), "--topk", "3",
                                            "--precision", "FP32", "--memory-format", "nchw"])
    probabilities = torch.softmax(logits, 1)
    assert [record["path"] for record in predictions] == list(map(str, paths))
    for record, expected in zip(predictions, probabilities):
        for prediction in record["predictions"]:
            assert prediction["probability"] == pytest.approx(expected[prediction["index"]].item(), abs=1e-5)


@pytest.mark.parametrize("precision", [[], ["--precision", "AMP"]], ids=["default", "AMP"])
def test_fast_paths_predict_what_the_plain_fp32_path_does(colour_checkpoint, image_folder, capsys, precision):
    """The default (channels-last; bf16 autocast where the CPU has native bf16, else FP32) and channels-last
    bf16 autocast against NCHW FP32 eager: the same top-1 class for every image, every probability within 0.02."""
    images = [str(path) for path in sorted((image_folder / "val").glob("*/*.jpg"))]
    common = ["--weights", str(colour_checkpoint), "--image", *images, "--image-size", str(SIZE), "--topk", "3"]
    fast = json_predictions(capsys, common + precision)
    plain = json_predictions(capsys, common + ["--precision", "FP32", "--memory-format", "nchw"])
    assert len(fast) == len(plain) == 12
    for ours, reference in zip(fast, plain):
        assert ours["path"] == reference["path"]
        assert ours["predictions"][0]["index"] == reference["predictions"][0]["index"]
        got = {p["index"]: p["probability"] for p in ours["predictions"]}
        for prediction in reference["predictions"]:
            assert got[prediction["index"]] == pytest.approx(prediction["probability"], abs=0.02)
    assert {r["predictions"][0]["index"] for r in plain} == {0, 1, 2}  # a trained model, not a constant


def classify_runtime_of(monkeypatch, photo, argv: list[str], native: bool, flags: set[str] | None = None,
                        vendor: str = "GenuineIntel") -> Runtime:
    """The runtime classify.py's main classifies with, on an x86 CPU made by ``vendor`` whose /proc/cpuinfo lists
    ``flags`` (by default AVX512-BF16 and AMX-BF16 where ``native``, else AVX2 alone: what the help reads) and
    whose bf16 oneDNN computes natively or not (``native``: what the run asks)."""
    monkeypatch.setattr(machine, "cpu_bf16_is_native", lambda: native)
    monkeypatch.setattr(machine, "_is_x86", lambda: True)
    flags = ({"avx512f", "avx512_bf16", "amx_bf16"} if native else {"avx2"}) if flags is None else flags
    monkeypatch.setattr(machine, "_cpu_flags", lambda: flags)
    monkeypatch.setattr(machine, "cpu_vendor", lambda: vendor)
    seen = []
    monkeypatch.setattr(inference, "classify_paths",
                        lambda model, paths, runtime, *rest: seen.append(runtime) or [(paths[0], [])])
    assert classify_main(["-a", "resnet18", "--num-classes", "3", "--image", str(photo), "--cpu", *argv]) == 0
    return seen[0]


def _help() -> str:
    return " ".join(classify_parser().format_help().split())


AVX512_BF16 = {"avx512f", "avx512_bf16"}


@pytest.mark.parametrize("native, flags, vendor, dtype, words", [
    (True, None, "GenuineIntel", torch.bfloat16,  # AMX
     "here AMP where this torch's oneDNN computes bf16: this CPU lists AVX512-BF16, AMX-BF16)"),
    (True, AVX512_BF16, "AuthenticAMD", torch.bfloat16,
     "here AMP where this torch's oneDNN computes bf16: this CPU lists AVX512-BF16)"),
    (True, AVX512_BF16, "GenuineIntel", None,  # measured no faster than FP32
     "here FP32: this CPU lists AVX512-BF16 but no AMX, and computes bf16 no faster than FP32)"),
    (False, None, "AuthenticAMD", None,
     "here FP32: this CPU lists no bf16 instructions and would emulate bf16, slower than FP32)"),
])
def test_cpu_default_is_bf16_only_where_it_is_faster(monkeypatch, photo, native, flags, vendor, dtype, words, capsys):
    """Emulated bf16 (an AVX2 CPU), and native bf16 without AMX on an Intel CPU, run slower than FP32, so the
    CPU default is FP32 channels-last there; the help says which default this machine gets and why."""
    runtime = classify_runtime_of(monkeypatch, photo, [], native, flags, vendor)
    assert (runtime.device.type, runtime.amp_dtype, runtime.memory_format) == ("cpu", dtype, torch.channels_last)
    assert words in _help() and "note:" not in capsys.readouterr().err


def test_a_bf16_cpu_under_a_torch_without_onednn_bf16_runs_fp32_as_the_help_allows_and_says_so(monkeypatch, photo,
                                                                                             capsys):
    """The help reads /proc/cpuinfo only (no torch): on a CPU whose bf16 runs faster it promises AMP where oneDNN
    computes bf16.  Under a torch build whose oneDNN does not, the run takes FP32, and says why, on stderr."""
    runtime = classify_runtime_of(monkeypatch, photo, [], native=False, flags=AVX512_BF16, vendor="AuthenticAMD")
    assert runtime.amp_dtype is None
    assert "here AMP where this torch's oneDNN computes bf16: this CPU lists AVX512-BF16)" in _help()
    assert ("note: FP32 by default: this CPU lists AVX512-BF16, but this torch's oneDNN computes no bf16 with it "
            "(--precision AMP would emulate bf16, slower than FP32)") in capsys.readouterr().err.splitlines()


def test_an_explicit_precision_or_layout_wins_over_the_cpu_default(monkeypatch, photo, capsys):
    runtime = classify_runtime_of(monkeypatch, photo, ["--precision", "AMP"], native=False)
    assert runtime.amp_dtype == torch.bfloat16
    assert "emulates bf16: --precision AMP runs slower than FP32 here" in capsys.readouterr().err
    runtime = classify_runtime_of(monkeypatch, photo, ["--precision", "AMP"], native=True, flags=AVX512_BF16)
    assert runtime.amp_dtype == torch.bfloat16
    assert "no AMX) computes bf16 no faster than FP32: --precision AMP runs slower" in capsys.readouterr().err
    runtime = classify_runtime_of(monkeypatch, photo, ["--precision", "FP32", "--memory-format", "nchw"], native=True)
    assert (runtime.amp_dtype, runtime.memory_format) == (None, torch.contiguous_format)


def test_classify_turns_cudnn_autotuning_off(monkeypatch):
    """A one-off run would re-tune cuDNN at every new batch shape; make_runtime turns it on for training."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: None)
    flags = [(torch.backends.cudnn, "benchmark"), (torch.backends.cudnn, "allow_tf32"),
             (torch.backends.cuda.matmul, "allow_tf32")]
    saved = [getattr(owner, name) for owner, name in flags]
    try:
        runtime = inference.classify_runtime("auto", None, "nhwc")
        assert (runtime.device.type, runtime.amp_dtype) == ("cuda", torch.float16)
        assert torch.backends.cudnn.benchmark is False
    finally:
        for (owner, name), value in zip(flags, saved):
            setattr(owner, name, value)


@pytest.fixture(scope="module")
def bad_inputs(tmp_path_factory, photo, colour_checkpoint) -> dict[str, list[str]]:
    root = tmp_path_factory.mktemp("bad")
    text = root / "notes.jpg"
    text.write_text("this is not a picture\n")
    garbage = root / "garbage.pth"
    garbage.write_bytes(bytes(range(256)) * 8)
    resnet18_weights = root / "resnet18.pth"
    torch.save(build_model("resnet18", num_classes=3).state_dict(), resnet18_weights)
    return {
        "missing image": ["--image", str(root / "nowhere.jpg")],
        "text as image": ["--image", str(text)],
        "weights of another arch": ["-a", "resnet34", "--weights", str(resnet18_weights),
                                    "--image", str(photo)],
        "checkpoint of another arch": ["-a", "resnet34", "--weights", str(colour_checkpoint),
                                       "--image", str(photo)],
        "another class count": ["-a", "resnet18", "--num-classes", "10", "--weights", str(resnet18_weights),
                                "--image", str(photo)],
        "garbage as weights": ["--weights", str(garbage), "--image", str(photo)],
        "missing weights": ["--weights", str(root / "nowhere.pth"), "--image", str(photo)],
    }


@pytest.mark.parametrize("name", ["model.onnx", "model.pth"])
def test_an_onnx_model_given_as_weights_is_named_so_with_the_command_that_runs_one(tmp_path, photo, capsys, name):
    """Named .onnx, or told by its first bytes (a protobuf ModelProto's), not by torch's "Unsupported operand 8"."""
    pytest.importorskip("onnx")
    from image_classification.deploy.onnx_runtime import OPSET, export_onnx

    path = tmp_path / name
    export_onnx(torch.nn.Linear(2, 2).eval(), torch.zeros(1, 2), path, dynamic_batch=False, opset=OPSET)
    line = refused(run(classify_main, ["--weights", str(path), "--image", str(photo)]), capsys)
    assert line.startswith(f"error: '{path}' is an ONNX model, not PyTorch weights: pass the weights it was exported "
                           "from and --runtime onnxruntime"), line
    assert "e.g. classify.py --weights model.pth --runtime onnxruntime --image IMAGE;" in line


@pytest.mark.parametrize("case", ["missing image", "text as image", "garbage as weights"])
def test_bad_input_is_one_line_and_exit_2(bad_inputs, case):
    run = classify_process if case == "missing image" else classify  # the script's wiring, once
    result = run(*bad_inputs[case])
    assert result.returncode == 2, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert result.stdout == ""


@pytest.mark.parametrize("case", ["missing image", "pipe as image", "missing labels"])
def test_a_path_that_names_nothing_readable_is_refused_before_the_classifier_is_imported(tmp_path, photo, monkeypatch,
                                                                                       capsys, case):
    """classify.py's --image and --labels are checked as soon as they are parsed: a typo answers in a fraction of a
    second, before the seconds of torch's import, in the words the classification would use."""
    import os
    from types import SimpleNamespace

    from image_classification import commands

    pipe = tmp_path / "pipe.jpg"
    os.mkfifo(pipe)
    argv, said = {
        "missing image": (["--image", str(photo), str(tmp_path / "nowhere.jpg")],
                          f"error: image file {tmp_path / 'nowhere.jpg'} does not exist"),
        "pipe as image": (["--image", str(pipe)], f"error: image file {pipe} is a pipe, not a regular file"),
        "missing labels": (["--image", str(tmp_path), "--labels", str(tmp_path / "labels.txt")],
                           f"error: labels file {tmp_path / 'labels.txt'} does not exist"),
    }[case]

    def imported(name: str):
        raise AssertionError(f"{name} was imported")

    monkeypatch.setattr(commands, "importlib", SimpleNamespace(import_module=imported))
    monkeypatch.setattr(sys, "argv", ["classify.py", *argv])
    assert commands.classify() == 2
    assert capsys.readouterr().err == said + "\n"


@pytest.mark.parametrize("case, words", [
    ("weights of another arch", "resnet34"), ("checkpoint of another arch", "pass --arch resnet18"),
    ("another class count", "pass --num-classes 3"), ("missing weights", "does not exist"),
])
def test_weights_that_do_not_fit_are_one_line_and_exit_2(bad_inputs, case, words, capsys):
    """The same entry point as classify.py, called in this process (the subprocess wiring is tested above)."""
    assert run(classify_main, bad_inputs[case]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and words in lines[0], captured.err
    assert captured.out == ""


def test_a_fifo_given_as_the_image_or_the_labels_is_named_so_without_waiting(tmp_path, photo, capsys):
    """A FIFO is not "missing", and reading it would wait for a writer for good: one line naming what it is."""
    import os

    fifo = tmp_path / "pipe.jpg"
    os.mkfifo(fifo)
    cases = ((["--image", str(fifo)], f"image file {fifo} is a pipe"),
             (["--image", str(photo), "--labels", str(fifo)], f"labels file {fifo} is a pipe"),
             (["--image", str(photo), "--labels", str(tmp_path)], f"labels file {tmp_path} is a folder"))
    for argv, said in cases:
        assert run(classify_main, ["-a", "resnet18", *argv]) == 2
        assert capsys.readouterr().err == f"error: {said}, not a regular file\n"


# ------------------------------------------------------------------------------------------------
# benchmarks/inference_benchmark.py
# ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def benchmark():
    return load_script("inference_benchmark", "benchmarks")


def fake_main(fail_from_batch: int | None = None):
    """Stands in for training.main: checks the command line with main.py's parser and writes a raport
    whose latency is 1 ms per image."""
    calls = []

    def runner(argv: list[str]) -> int:
        args = parse_args(argv)
        calls.append(args)
        assert args.evaluate and args.data_backend == "synthetic"
        if fail_from_batch is not None and args.batch_size >= fail_from_batch:
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
        latency = 1e-3 * args.batch_size
        ips = args.batch_size / latency
        data = {"val.top1": 0.1, "val.total_ips": ips, "val.compute_ips": ips, "val.compute_latency": latency}
        data.update({f"val.compute_latency_at{q}": latency * (1 + q / 1000) for q in (90, 95, 99, 100)})
        record = {"type": "LOG", "step": [], "data": data}
        Path(args.workspace, args.raport_file).write_text(
            'DLLL {"type": "LOG", "step": [0], "data": {}}\nDLLL ' + json.dumps(record) + "\n")
        return 0

    runner.calls = calls
    return runner


def test_benchmark_writes_markdown_csv_and_png(benchmark, tmp_path):
    runner = fake_main()
    code = benchmark.main(["-a", "resnet50", "--device", "cpu", "--batch-sizes", "1", "2",
                           "--iterations", "7", "--output-dir", str(tmp_path)], runner=runner)
    assert code == 0
    assert [(a.amp, a.memory_format, a.batch_size, a.prof) for a in runner.calls] == [
        (False, "nchw", 1, 5), (False, "nchw", 1, 7), (False, "nchw", 2, 5), (False, "nchw", 2, 7),
        (True, "nhwc", 1, 5), (True, "nhwc", 1, 7), (True, "nhwc", 2, 5), (True, "nhwc", 2, 7),
    ]  # a discarded 5-batch warm-up run before every measured point
    report = (tmp_path / "inference_resnet50_cpu.md").read_text()
    assert "| Batch Size | Throughput | Avg Latency | Latency 90% | Latency 95% | Latency 99% |" in report
    assert "#### FP32 Inference Latency" in report and "Mixed Precision" in report
    assert "| 2 | 1000 img/s | 2.00 ms | 2.18 ms | 2.19 ms | 2.20 ms |" in report
    assert "Intel" in report or "torch" in report
    assert f"* Machine: {machine.description()}; " in report and "bf16" in report.splitlines()[2]
    rows = list(csv.DictReader(open(tmp_path / "inference_resnet50_cpu.csv")))
    assert [(r["precision"], r["batch_size"]) for r in rows] == [
        ("FP32", "1"), ("FP32", "2"), ("AMP", "1"), ("AMP", "2")]
    assert float(rows[1]["latency_p99_ms"]) == pytest.approx(2.198)
    assert (tmp_path / "inference_resnet50_cpu.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_benchmark_stops_a_precision_at_the_first_failure(benchmark, tmp_path, capsys):
    argv = ["--device", "cpu", "--precisions", "FP32", "--max-batch-size", "8", "--warmup", "0",
            "--output-dir", str(tmp_path)]
    code = benchmark.main(argv, runner=fake_main(fail_from_batch=4))
    assert code == 1
    report = (tmp_path / "inference_resnet50_cpu.md").read_text()
    assert "| 2 |" in report and "| 4 |" not in report and "| 8 |" not in report
    assert "out of memory" in capsys.readouterr().err


def test_benchmark_runs_main_for_real(benchmark, tmp_path):
    (tmp_path / "runs").mkdir()
    for stale in ("resnet18_FP32_b1.json", "resnet18_AMP_b2_warmup.json"):  # an earlier sweep's, measured again
        (tmp_path / "runs" / stale).write_text("DLLL {}\n")
    code = benchmark.main(["-a", "resnet18", "--device", "cpu", "--batch-sizes", "1", "2",
                           "--iterations", "2", "--warmup", "1", "--image-size", "32", "--num-classes", "10",
                           "--output-dir", str(tmp_path)])
    assert code == 0
    rows = list(csv.DictReader(open(tmp_path / "inference_resnet18_cpu.csv")))
    assert len(rows) == 4
    for row in rows:
        assert float(row["throughput_img_s"]) > 0
        assert 0 < float(row["latency_avg_ms"]) <= float(row["latency_max_ms"])
    assert (tmp_path / "inference_resnet18_cpu.png").exists()


@pytest.mark.parametrize("arch, kernels, flags, native", [
    ("x86_64", None, {"avx2"}, False),  # a torch build without oneDNN's bf16 check
    ("x86_64", False, {"avx2"}, False),  # the AVX2 EPYC: oneDNN has no bf16 kernels
    ("x86_64", True, {"avx512f", "avx512bw"}, False),  # AVX512 alone: oneDNN emulates bf16
    ("x86_64", True, {"avx512f", "avx512_bf16"}, True),
    ("x86_64", True, {"avx512f", "amx_tile", "amx_bf16"}, True),
    ("aarch64", True, {"fp", "asimd", "bf16"}, True),  # oneDNN's check is the BF16 extension itself
    ("aarch64", True, {"fp", "asimd"}, False),
    ("x86_64", True, None, True),  # no /proc/cpuinfo to read: oneDNN's word
])
def test_cpu_bf16_is_native_needs_bf16_hardware(monkeypatch, arch, kernels, flags, native):
    from types import SimpleNamespace

    namespace = SimpleNamespace() if kernels is None else SimpleNamespace(_is_mkldnn_bf16_supported=lambda: kernels)
    monkeypatch.setattr(torch.ops, "mkldnn", namespace)
    monkeypatch.setattr(machine.platform, "machine", lambda: arch)
    monkeypatch.setattr(machine, "_cpu_flags", lambda: flags)
    assert machine.cpu_bf16_is_native() is native


@pytest.mark.parametrize("arch, native, flags, vendor, faster", [
    ("x86_64", False, {"avx2"}, "AuthenticAMD", False),  # the AVX2 EPYC: emulated
    ("x86_64", True, {"avx512f", "avx512_bf16"}, "AuthenticAMD", True),  # the AVX512-BF16 EPYC
    ("x86_64", True, {"avx512f", "avx512_bf16", "avx512_fp16"}, "GenuineIntel", False),  # the Xeon, AMX hidden
    ("x86_64", True, {"avx512f", "avx512_bf16", "amx_tile", "amx_bf16"}, "GenuineIntel", True),
    ("aarch64", True, {"asimd", "bf16"}, None, True),
])
def test_bf16_is_the_faster_cpu_precision_where_it_was_measured_so(monkeypatch, arch, native, flags, vendor, faster):
    monkeypatch.setattr(machine, "cpu_bf16_is_native", lambda: native)
    monkeypatch.setattr(machine.platform, "machine", lambda: arch)
    monkeypatch.setattr(machine, "_cpu_flags", lambda: flags)
    monkeypatch.setattr(machine, "cpu_vendor", lambda: vendor)
    assert machine.cpu_bf16_is_faster() is faster
