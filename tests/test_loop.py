"""The loop: what its records say and where the run stands after each part of an epoch."""

from __future__ import annotations

from image_classification.raport import read_raport
from image_classification.training import main


def test_validation_records_carry_the_training_iteration(tmp_path):
    """[epoch, train iteration, val iteration], as NVIDIA's logger writes it: not [epoch, 0, i]."""
    assert main(["--data-backend", "synthetic", "-a", "resnet18", "--image-size", "32", "-b", "2", "--prof", "3",
                 "-p", "1", "--epochs", "1", "--num-classes", "4", "--no-checkpoints",
                 "--workspace", str(tmp_path)]) == 0
    steps = [record["step"] for record in read_raport(tmp_path / "experiment_raport.json")
             if record.get("type") == "LOG" and any(key.startswith("val.") for key in record["data"])
             and len(record["step"]) == 3]
    assert steps and all(step[:2] == [0, 3] for step in steps), steps
