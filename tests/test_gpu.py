"""CUDA paths; run on a GPU machine with ``python -m pytest -m gpu``."""

import pytest
import torch

from image_classification import engine as engine_module
from image_classification.raport import read_raport
from image_classification.training import main

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

BASE = ["-a", "resnet50", "--data-backend", "synthetic", "--device", "cuda", "-b", "32", "--image-size", "128",
        "--prof", "20", "--epochs", "1", "--num-classes", "100", "-p", "5", "--seed", "1", "--lr", "0.05"]


def _summary(records):
    merged = {}
    for record in records:
        if record.get("step") == []:
            merged.update(record["data"])
    return merged


@pytest.mark.parametrize("precision, dtype", [
    ([], torch.float32), (["--amp", "--static-loss-scale", "128"], torch.float16),
    (["--amp", "--dynamic-loss-scale", "--static-loss-scale", "128"], torch.float16),
    (["--amp", "--amp-dtype", "bfloat16"], torch.bfloat16), (["--no-tf32"], torch.float32),
])
@pytest.mark.parametrize("memory_format", ["nchw", "nhwc"])
def test_cuda_training_runs_in_every_precision_and_layout(tmp_path, monkeypatch, precision, dtype, memory_format):
    """The synthetic batch is fixed, so a working step memorises it: the loss must fall; the convolutions
    must compute in the asked dtype on the asked layout."""
    seen = []
    original = engine_module.Engine.train_step

    def recording_step(self, images, targets, **kwargs):
        handle = self.base_model.conv1.register_forward_hook(
            lambda module, inputs, output: seen.append(
                (output.dtype, inputs[0].is_contiguous(memory_format=torch.channels_last))))
        try:
            return original(self, images, targets, **kwargs)
        finally:
            handle.remove()

    monkeypatch.setattr(engine_module.Engine, "train_step", recording_step)
    code = main(BASE + precision + ["--memory-format", memory_format, "--workspace", str(tmp_path)])
    assert code == 0
    assert seen and all(record == (dtype, memory_format == "nhwc") for record in seen), seen[:3]
    records = read_raport(tmp_path / "experiment_raport.json")
    losses = [r["data"]["train.loss"] for r in records if isinstance(r.get("step"), list) and len(r["step"]) == 2
              and "train.loss" in r["data"]]
    assert len(losses) == 4 and losses[-1] < losses[0], losses
    data = _summary(records)
    latencies = [data[f"val.compute_latency_at{q}"] for q in (90, 95, 99, 100)]
    assert 0 < latencies[0] <= latencies[1] <= latencies[2] <= latencies[3]
    state = torch.load(tmp_path / "checkpoint.pth.tar", weights_only=True)
    assert all(torch.isfinite(v).all() for v in state["state_dict"].values() if v.is_floating_point())
    assert (state["scaler"] is not None) == (dtype == torch.float16)


def test_cuda_checkpoint_resumes_on_the_cpu(tmp_path):
    assert main(BASE + ["--amp", "--dynamic-loss-scale", "--workspace", str(tmp_path)]) == 0
    cpu = ["--device", "cpu", "-b", "2", "--prof", "2", "--epochs", "2"]
    assert main(BASE + cpu + ["--workspace", str(tmp_path / "cpu"), "--resume",
                              str(tmp_path / "checkpoint.pth.tar")]) == 0
    state = torch.load(tmp_path / "cpu" / "checkpoint.pth.tar", weights_only=True)
    assert state["epoch"] == 2


def test_classify_and_onnx_export_on_cuda(tmp_path, capsys):
    from PIL import Image
    from skimage import data

    from image_classification.cli import run
    from image_classification.export import model2onnx_main
    from image_classification.inference import main as classify_main

    photo = tmp_path / "chelsea.jpg"
    Image.fromarray(data.chelsea()).save(photo)
    assert run(classify_main, ["--device", "cuda", "--precision", "AMP", "--image", str(photo), "--json"]) == 0
    assert '"predictions"' in capsys.readouterr().out
    assert run(model2onnx_main, ["-a", "resnet18", "--output", str(tmp_path / "m.onnx"), "-b", "2",
                                 "--image-size", "64"]) == 0
