"""scripts/plot_raport.py: PNGs from the raports of real (tiny) runs, values as the raport has them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import load_script, refused, tiny_registered
from image_classification.system.cli import run as cli_run
from image_classification.training import main as train

TINY = ["-a", "tiny", "--image-size", "32", "-b", "8", "--device", "cpu", "--data-backend", "pytorch",
        "-j", "0", "--num-classes", "3"]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def plot_raport():
    return load_script("plot_raport")


@pytest.fixture(scope="module")
def raports(image_folder, tmp_path_factory) -> dict[str, Path]:
    """Two real runs: 2 epochs with validation, and 1 epoch --training-only (no val metrics)."""
    root = tmp_path_factory.mktemp("runs")
    with tiny_registered():
        assert train([*TINY, "--epochs", "2", "--workspace", str(root / "full"), str(image_folder)]) == 0
        assert train([*TINY, "--epochs", "1", "--training-only", "--workspace", str(root / "train_only"),
                      str(image_folder)]) == 0
    return {name: root / name / "experiment_raport.json" for name in ("full", "train_only")}


def _epoch_values(path: Path, metric: str) -> tuple[list[int], list[float]]:
    """The metric's end-of-epoch values, read straight from the file."""
    points = {}
    for line in path.read_text().splitlines():
        record = json.loads(line.removeprefix("DLLL "))
        if record["type"] == "LOG" and isinstance(record["step"], list) and len(record["step"]) == 1:
            if metric in record["data"]:
                points[record["step"][0]] = record["data"][metric]
    return sorted(points), [points[epoch] for epoch in sorted(points)]


def test_real_runs_give_one_png_per_metric_with_the_raports_values(plot_raport, raports, tmp_path, capsys):
    out = tmp_path / "plots"
    assert cli_run(plot_raport.main, [str(raports["full"]), str(raports["train_only"]), "-o", str(out)]) == 0
    names = {"train_loss.png", "val_loss.png", "val_top1.png", "val_top3.png", "throughput.png"}
    assert {p.name for p in out.iterdir()} == names
    assert all((out / name).read_bytes()[:8] == PNG_MAGIC for name in names)
    assert capsys.readouterr().err == ""

    drawn = plot_raport.plot_raports([raports["full"], raports["train_only"]], tmp_path / "again")
    # both files are experiment_raport.json: the runs are named by their folders
    assert set(drawn["train_loss.png"]) == set(drawn["throughput.png"]) == {"full", "train_only"}
    assert set(drawn["val_top1.png"]) == set(drawn["val_loss.png"]) == {"full"}  # no val in train_only
    metrics = {"train_loss.png": "train.loss", "val_loss.png": "val.loss", "val_top1.png": "val.top1",
               "val_top3.png": "val.top3", "throughput.png": "train.total_ips"}
    for name, metric in metrics.items():
        for label, (epochs, values) in drawn[name].items():
            recorded, recorded_values = _epoch_values(raports[label], metric)
            assert (epochs, values) == ([epoch + 1 for epoch in recorded], recorded_values), (name, label)
    # the epochs as the run's lines count them, from 1: the raport's record [0] is epoch 1
    assert drawn["val_top1.png"]["full"][0] == [1, 2] and drawn["throughput.png"]["train_only"][0] == [1]


def test_a_training_only_run_alone_skips_the_val_plots(plot_raport, raports, tmp_path, capsys):
    assert cli_run(plot_raport.main, [str(raports["train_only"]), "-o", str(tmp_path)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["throughput.png", "train_loss.png"]
    out = capsys.readouterr().out
    assert "val_loss.png: skipped, no raport has val.loss" in out


def test_labels_are_file_names_unless_they_repeat(plot_raport):
    assert plot_raport.run_labels([Path("a/rn50_amp.json"), Path("a/rn_fp32.json")]) == ["rn50_amp", "rn_fp32"]
    assert plot_raport.run_labels([Path("amp/raport.json"), Path("fp32/raport.json")]) == ["amp", "fp32"]


@pytest.mark.parametrize("content,words", [
    (b"epoch 1 loss 0.5\n", "no 'DLLL {json}' lines"),
    (b'DLLL {"type": "LOG", "step": [0\n', "a 'DLLL ' line is not JSON"),
    (b"DLLL " + b"[" * 100_000 + b"\n", "a 'DLLL ' line nests its values more than 32 levels deep"),
    (b"\x89PNG\r\n\x1a\n\xff\xfe\x00", "not a text file"),
    (None, "cannot read"),
])
def test_a_file_that_is_not_a_raport_is_one_error_line(plot_raport, raports, tmp_path, capsys, content,
                                                        words):
    bad = tmp_path / "bad.json"
    if content is not None:
        bad.write_bytes(content)
    code = cli_run(plot_raport.main, [str(raports["full"]), str(bad), "-o", str(tmp_path / "out")])
    err = refused(code, capsys)
    assert words in err, err
    assert str(bad) in err and not (tmp_path / "out").exists()  # nothing drawn


def test_a_raport_without_finished_epochs_is_nothing_to_plot(plot_raport, tmp_path, capsys):
    started = tmp_path / "raport.json"
    started.write_text('DLLL {"type": "LOG", "step": "PARAMETER", "data": {"lr": 0.1}}\n'
                       'DLLL {"type": "LOG", "step": [0, 10], "data": {"train.loss": 6.9}}\n')
    assert cli_run(plot_raport.main, [str(started), "-o", str(tmp_path / "out")]) == 2
    assert "nothing to plot" in capsys.readouterr().err


def test_odd_records_and_values_that_are_not_finite_are_left_out_with_a_note(plot_raport, tmp_path, capsys):
    odd = tmp_path / "raport.json"
    odd.write_text('DLLL {"type": "LOG", "step": [0], "data": {"train.loss": 2.0, "val.loss": Infinity}}\n'
                   'DLLL [1, 2]\nDLLL 5\nDLLL "text"\nDLLL null\n'
                   'DLLL {"type": "LOG", "step": [Infinity], "data": {"train.loss": 1.0}}\n'
                   'DLLL {"type": "LOG", "step": [NaN], "data": {"train.loss": 1.0}}\n'
                   'DLLL {"type": "LOG", "step": [1], "data": [1.0]}\n'
                   'DLLL {"type": "LOG", "step": [2], "data": {"train.loss": 1.5, "val.loss": -Infinity}}\n'
                   'DLLL {"type": "LOG", "step": [3], "data": {"train.loss": NaN, "val.loss": 0.5}}\n')
    out = tmp_path / "out"
    assert cli_run(plot_raport.main, [str(odd), "-o", str(out)]) == 0
    err = capsys.readouterr().err
    assert err == (f"note: {odd}: left out records that are not JSON objects (4), end-of-epoch records that do "
                   "not hold an epoch number and an object of values (3), values that are not finite numbers "
                   "(3)\n")
    drawn = plot_raport.plot_raports([odd], tmp_path / "again")
    assert drawn["train_loss.png"] == {"raport": ([1, 3], [2.0, 1.5])}
    assert drawn["val_loss.png"] == {"raport": ([4], [0.5])}


def test_epochs_are_counted_from_1_as_the_run_said_them_and_an_evaluations_as_it_is(plot_raport, tmp_path):
    """A training's record [0] is its epoch 1 (``Epoch: 1`` on the console); an evaluation's step is the count of
    epochs its weights trained, which its line shows as it is."""
    training, evaluation = tmp_path / "training.json", tmp_path / "evaluation.json"
    training.write_text('DLLL {"type": "LOG", "step": "PARAMETER", "data": {"evaluate": false}}\n'
                        'DLLL {"type": "LOG", "step": [0], "data": {"val.top1": 40.0}}\n'
                        'DLLL {"type": "LOG", "step": [1], "data": {"val.top1": 60.0}}\n')
    evaluation.write_text('DLLL {"type": "LOG", "step": "PARAMETER", "data": {"evaluate": true}}\n'
                          'DLLL {"type": "LOG", "step": [2], "data": {"val.top1": 60.0}}\n')
    drawn = plot_raport.plot_raports([training, evaluation], tmp_path / "out")
    assert drawn["val_top1.png"] == {"training": ([1, 2], [40.0, 60.0]), "evaluation": ([2], [60.0])}


def test_loss_charts_use_a_log_scale_and_say_so(plot_raport):
    """A first epoch's loss many times the later ones would flatten them on a linear axis."""
    runs = [plot_raport.Run("run", {"val.loss": {0: 40.0, 1: 1.2, 2: 1.1, 3: 1.05}, "val.top1": {0: 10.0, 1: 60.0}})]
    plots = {plot.metric: plot for plot in plot_raport.plots_for({"val.loss", "val.top1"})}
    loss = plot_raport.chart(runs, plots["val.loss"]).axes[0]
    assert loss.get_yscale() == "log" and "log scale" in loss.get_ylabel()
    top1 = plot_raport.chart(runs, plots["val.top1"]).axes[0]
    assert top1.get_yscale() == "linear" and "log" not in top1.get_ylabel()
    zero = [plot_raport.Run("run", {"val.loss": {0: 2.0, 1: 0.0}})]  # nothing a log axis could show
    flat = plot_raport.chart(zero, plots["val.loss"]).axes[0]
    assert flat.get_yscale() == "linear" and flat.get_ylabel() == "loss"
