"""The raport's DLLogger format: JSON lines with the reference's records, and the ``DLL`` stdout lines."""

import io
import json

from image_classification.raport import LOSS_META, PERF_META, Raport, quantile_nearest, read_raport


def test_records_and_stdout_follow_dllogger(tmp_path):
    out = io.StringIO()
    raport = Raport(tmp_path / "r.json", stdout=out)
    raport.parameters({"lr": 0.1})
    raport.register("train.loss", "loss", LOSS_META)
    raport.register("train.total_ips", "perf", PERF_META)
    for epoch, losses in enumerate(([2.0, 1.0], [0.5, 0.7])):
        for i, loss in enumerate(losses):
            raport.record("train.loss", loss, 4)
            raport.record("train.total_ips", 100.0 + i)
            raport.log_window("train", [epoch, i + 1])
        raport.end_epoch(epoch)
    final = raport.end()
    raport.close()
    records = read_raport(tmp_path / "r.json")
    assert records[0]["step"] == "PARAMETER" and records[0]["data"] == {"lr": 0.1}
    assert [r["metric"] for r in records if r["type"] == "METADATA"] == ["train.loss", "train.total_ips"]
    assert {"timestamp", "datetime", "elapsedtime", "type", "step", "data"} <= set(records[-1])
    assert [r["step"] for r in records if r["type"] == "LOG"][1:] == [[0, 1], [0, 2], [0], [1, 1], [1, 2], [1], []]
    assert final["train.loss"] == 0.6  # the best epoch: min of 1.5 and 0.6
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("DLL ") and " - Epoch: 0 Iteration: 1 train.loss : 2.00000 None" in lines[0]
    assert "train.total_ips : 100.00 images/s" in lines[0]
    assert " - Summary: " in lines[-1]
    json.loads(open(tmp_path / "r.json").readline()[5:])


def test_quantile_is_numpy_nearest():
    import numpy as np

    values = [0.3, 0.1, 0.7, 0.2, 0.9, 0.4]
    for q in (0.9, 0.95, 0.99, 1.0, 0.5):
        assert quantile_nearest(values, q) == np.quantile(values, q, method="nearest")


def test_disabled_raport_writes_nothing(tmp_path):
    raport = Raport(tmp_path / "r.json", enabled=False)
    raport.register("val.top1", "acc", {})
    raport.record("val.top1", 50.0)
    raport.end()
    assert not (tmp_path / "r.json").exists()
