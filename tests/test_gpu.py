"""CUDA paths; run on a GPU machine with ``python -m pytest -m gpu``."""

import pytest
import torch

from image_classification.raport import read_raport
from image_classification.training import main

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

BASE = ["-a", "resnet50", "--data-backend", "synthetic", "--device", "cuda", "-b", "32", "--image-size", "128",
        "--prof", "20", "--epochs", "1", "--num-classes", "100", "-p", "5"]


def _summary(path):
    merged = {}
    for record in read_raport(path):
        if record.get("step") == []:
            merged.update(record["data"])
    return merged


@pytest.mark.parametrize("precision", [
    [], ["--amp", "--static-loss-scale", "128"], ["--amp", "--dynamic-loss-scale", "--static-loss-scale", "128"],
    ["--amp", "--amp-dtype", "bfloat16"], ["--no-tf32"],
])
@pytest.mark.parametrize("memory_format", ["nchw", "nhwc"])
def test_cuda_training_runs_in_every_precision_and_layout(tmp_path, precision, memory_format):
    code = main(BASE + precision + ["--memory-format", memory_format, "--workspace", str(tmp_path)])
    assert code == 0
    data = _summary(tmp_path / "experiment_raport.json")
    assert data["train.total_ips"] > 0 and data["val.compute_latency_at99"] > 0
    state = torch.load(tmp_path / "checkpoint.pth.tar", weights_only=True)
    assert all(torch.isfinite(v).all() for v in state["state_dict"].values() if v.is_floating_point())


def test_cuda_checkpoint_resumes_on_the_cpu(tmp_path):
    assert main(BASE + ["--amp", "--dynamic-loss-scale", "--workspace", str(tmp_path)]) == 0
    cpu = ["--device", "cpu", "-b", "2", "--prof", "2", "--epochs", "2"]
    assert main(BASE + cpu + ["--workspace", str(tmp_path / "cpu"), "--resume",
                              str(tmp_path / "checkpoint.pth.tar")]) == 0
