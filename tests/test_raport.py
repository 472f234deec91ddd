"""The raport's DLLogger format: JSON lines with the reference's records, and what standard output shows of them
(DLLogger's ``DLL`` lines, or a console's)."""

import io
import json

import pytest

from image_classification.records.raport import ACC_META, LOSS_META, PERF_META, Raport, quantile_nearest, read_raport


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
    assert lines[0].startswith("DLL ") and " - Epoch: 1 Iteration: 1 train.loss : 2.00000 train.total_ips" in lines[0]
    assert "train.total_ips : 100.00 images/s" in lines[0]
    assert " - Summary: " in lines[-1]
    json.loads(open(tmp_path / "r.json").readline()[5:])


def _stampless(path) -> list[dict]:
    return [{k: v for k, v in record.items() if k not in ("timestamp", "datetime", "elapsedtime")}
            for record in read_raport(path)]


def test_a_console_chooses_what_standard_output_shows_and_the_file_keeps_every_record(tmp_path):
    """With a console, each record (window, epoch, summary) is one line of its choosing, given the record's
    figures of both levels (the non-finite left out), and nothing else is printed; the file is the one a raport
    without a console writes, record for record."""
    from image_classification.records.raport import TIME_META, VERBOSE

    shown = []

    def console(step, values):
        shown.append((step, values))
        return None if step == [0, 1] else f"line {step}"

    outputs = {}
    for name, chosen in (("plain", None), ("console", console)):
        outputs[name] = out = io.StringIO()
        raport = Raport(tmp_path / f"{name}.json", stdout=out, console=chosen)
        raport.parameters({"lr": 0.1})
        raport.register("train.loss", "loss", LOSS_META)
        raport.register("train.data_time", "perf", TIME_META, VERBOSE)
        raport.register("train.compute_time", "perf", TIME_META, VERBOSE)
        for i, (loss, data_time) in enumerate(((2.0, 0.5), (1.0, float("nan")))):
            raport.record("train.loss", loss, 4)
            raport.record("train.data_time", data_time)
            raport.record("train.compute_time", 0.25)
            raport.log_window("train", [0, i + 1])
        raport.end_epoch(0)
        raport.end()
        raport.close()
    assert _stampless(tmp_path / "plain.json") == _stampless(tmp_path / "console.json")
    assert [step for step, _ in shown] == [[0, 1], [0, 2], [0], []]
    assert shown[1][1] == {"train.loss": 1.0, "train.compute_time": 0.25}  # the NaN left out, as in the record
    assert shown[2][1] == {"train.loss": 1.5, "train.compute_time": 0.25}  # the epoch's figures of both levels
    assert outputs["console"].getvalue().splitlines() == ["line [0, 2]", "line [0]", "line []"]
    assert all(line.startswith("DLL ") for line in outputs["plain"].getvalue().splitlines())


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


def test_records_match_dllogger_1_1(tmp_path):
    """datetime is timezone-aware, timestamp and elapsedtime are strings, METADATA records name their metric."""
    from datetime import datetime

    raport = Raport(tmp_path / "r.json", stdout=io.StringIO())
    raport.register("train.loss", "loss", LOSS_META)
    raport.record("train.loss", 1.0)
    raport.log_window("train", [0, 1])
    raport.close()
    records = read_raport(tmp_path / "r.json")
    for record in records:
        assert isinstance(record["timestamp"], str) and isinstance(record["elapsedtime"], str)
        float(record["timestamp"]), float(record["elapsedtime"])
        assert datetime.fromisoformat(record["datetime"]).tzinfo is not None
    metadata = [r for r in records if r["type"] == "METADATA"]
    assert metadata[0]["metric"] == "train.loss" and metadata[0]["metadata"] == LOSS_META


def test_throughput_aggregates_are_images_over_wall_time(tmp_path):
    """Per-iteration img/s weighted by the iteration's time: the epoch's value is images / total time."""
    raport = Raport(None, stdout=io.StringIO())
    raport.register("train.total_ips", "perf", PERF_META)
    for images, seconds in ((10, 1.0), (10, 9.0)):
        raport.record("train.total_ips", images / seconds, seconds)
    assert raport.end_epoch(0)["train.total_ips"] == 20 / 10.0  # not the mean of 10 and 1.11
    raport.record("train.total_ips", 30.0, 1.0)
    raport.end_epoch(1)
    assert raport.end()["train.total_ips"] == (20 + 30) / (10 + 1)


def test_a_resumed_raport_is_cut_back_and_appended(tmp_path):
    path = tmp_path / "r.json"
    raport = Raport(path, stdout=io.StringIO())
    raport.register("train.loss", "loss", LOSS_META)
    raport.record("train.loss", 1.0)
    raport.log_window("train", [0, 1])
    position = raport.position()
    raport.record("train.loss", 2.0)
    raport.log_window("train", [0, 2])  # written after the checkpoint: a resume must not keep it
    raport.close()
    assert position["file"] == "r.json"
    resumed = Raport(path, stdout=io.StringIO(), resume_offset=position["offset"])
    resumed.register("train.loss", "loss", LOSS_META)
    resumed.record("train.loss", 3.0)
    resumed.log_window("train", [0, 2])
    resumed.close()
    steps = [r["step"] for r in read_raport(path) if r["type"] == "LOG"]
    assert steps == [[0, 1], [0, 2]]
    assert [r["data"]["train.loss"] for r in read_raport(path) if r["type"] == "LOG"] == [1.0, 3.0]


def test_tensorboard_mirrors_windows_epochs_and_parameters(tmp_path):
    accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")

    from image_classification.training import main

    logs = tmp_path / "tb"
    assert main(["-a", "resnet18", "--image-size", "32", "-b", "4", "--device", "cpu", "--data-backend",
                 "synthetic", "--prof", "2", "-p", "1", "--epochs", "2", "--num-classes", "3", "--seed", "1",
                 "--lr", "0.01", "--tensorboard", str(logs), "--workspace", str(tmp_path / "ws")]) == 0
    events = accumulator.EventAccumulator(str(logs))
    events.Reload()
    scalars = set(events.Tags()["scalars"])
    assert {"train.loss", "train.total_ips", "epoch/train.loss", "epoch/val.top1", "epoch/val.loss"} <= scalars
    assert [e.step for e in events.Scalars("train.loss")] == [1, 2, 3, 4]  # the run's iterations
    assert [e.step for e in events.Scalars("epoch/val.top1")] == [2, 4]  # one step axis: iterations
    raport = read_raport(tmp_path / "ws" / "experiment_raport.json")
    epoch_losses = [r["data"]["train.loss"] for r in raport if r.get("step") in ([0], [1]) and "train.loss" in r["data"]]
    assert [e.value for e in events.Scalars("epoch/train.loss")] == pytest.approx(epoch_losses, rel=1e-6)
    hparams = [p for p in logs.rglob("events.out.tfevents.*")]
    assert len(hparams) >= 2  # the scalars and the hyperparameters written once at the end


@pytest.mark.slow
def test_tensorboard_shows_each_step_once_after_a_resume_from_an_earlier_checkpoint(tmp_path):
    """What a killed run logged after its checkpoint is hidden (purge_step), not shown twice."""
    accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")

    from image_classification.training import main

    logs, ws = tmp_path / "tb", tmp_path / "ws"
    run = ["-a", "resnet18", "--image-size", "32", "-b", "4", "--data-backend", "synthetic", "--prof", "2",
           "-p", "1", "--epochs", "2", "--num-classes", "3", "--seed", "1", "--lr", "0.01", "--tensorboard",
           str(logs), "--workspace", str(ws), "--gather-checkpoints"]
    assert main(run) == 0  # steps 1-4; then go back to the end of epoch 0, as a kill after it would
    assert main(run + ["--resume", str(ws / "checkpoint_0000.pth.tar")]) == 0
    events = accumulator.EventAccumulator(str(logs))
    events.Reload()
    assert [e.step for e in events.Scalars("train.loss")] == [1, 2, 3, 4]


@pytest.mark.parametrize("make", ["file", "read-only"])
def test_a_tensorboard_folder_that_cannot_be_written_is_one_line_before_the_workspace_is_made(
        tmp_path, capsys, make, read_only_folder):
    """Refused with the other checks of the start: no workspace, no lock, no empty raport left behind."""
    from image_classification.system.cli import run
    from image_classification.training import main

    target = tmp_path / "tb"
    if make == "file":
        target.write_text("not a folder")
    else:
        folder, seal = read_only_folder
        target = folder / "tb"
        seal()
    code = run(main, ["-a", "resnet18", "--image-size", "32", "-b", "4", "--data-backend", "synthetic",
                      "--prof", "1", "--epochs", "1", "--tensorboard", str(target), "--workspace",
                      str(tmp_path / "ws")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith(f"error: --tensorboard {target}"), err
    assert ("read-only" if make == "read-only" else "not a folder") in err[0], err
    assert not (tmp_path / "ws").exists()


def test_a_running_metric_s_window_is_the_figure_so_far_and_is_logged_once(tmp_path, capsys):
    """A validation's window line shows its accuracy so far (readers take it for that), not the last few
    batches' (0.00% after an unlucky window); a window with nothing new is not logged again."""
    raport = Raport(tmp_path / "r.json")
    raport.register("val.top1", "acc", ACC_META, running=True)
    raport.register("val.total_ips", "perf", PERF_META)
    for top1, ips in ((100.0, 10.0), (0.0, 30.0)):
        raport.record("val.top1", top1, 8, epoch=False)
        raport.record("val.total_ips", ips)
        raport.log_window("val", [0, 5, 1])
    raport.log_window("val", [0, 5, 2])  # nothing recorded since: no line
    raport.end_epoch(0)
    lines = [line for line in capsys.readouterr().out.splitlines() if "Validation Iteration" in line]
    assert len(lines) == 2
    assert "val.top1 : 100.00 %" in lines[0] and "val.total_ips : 10.00" in lines[0]
    assert "val.top1 : 50.00 %" in lines[1] and "val.total_ips : 30.00" in lines[1]
    raport.record("val.top1", 25.0, 4, epoch=False)  # a new epoch starts from nothing
    raport.log_window("val", [1, 5, 1])
    assert "val.top1 : 25.00 %" in capsys.readouterr().out
