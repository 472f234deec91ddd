"""benchmarks/resize_timing.py: alternating fixed-size and progressive runs, and its table (tiny runs; the figures
of docs/performance.md come from the same script at full length)."""

from __future__ import annotations

import json
import re

import pytest

from helpers import load_script


@pytest.mark.slow  # four main.py processes
def test_the_script_alternates_the_runs_and_reports_time_to_the_target(tmp_path, capsys):
    timing = load_script("resize_timing", "benchmarks")
    data = tmp_path / "digits"
    code = timing.main([str(data), "--make", "digits", "--fixed", "64", "--ramp", "32", "64", "0", "1", "--epochs",
                        "2", "--seeds", "1", "2", "--workspace", str(tmp_path / "runs"), "--json",
                        str(tmp_path / "runs.json"), "--", "-a", "resnet18", "--num-classes", "10", "-b", "8",
                        "--prof", "2", "-j", "0", "--data-backend", "pytorch", "--lr", "0.01"])
    assert code == 0
    out = capsys.readouterr().out
    assert [line.split(":")[0] for line in out.splitlines() if line.startswith("seed ")] == \
        ["seed 1, fixed", "seed 1, progressive", "seed 2, progressive", "seed 2, fixed"]  # alternating
    rows = [line for line in out.splitlines() if re.match(r"\| [12] \| ", line)]
    assert len(rows) == 4 and sum("--progressive-resize 32 64 0 1" in row for row in rows) == 2
    assert "| 32 px | 2 |" in out and "| 64 px | 6 |" in out  # epoch 0 of the ramp at 32, the rest at 64
    assert "Measured on " in out and "OMP_NUM_THREADS=1" in out
    runs = json.loads((tmp_path / "runs.json").read_text())
    assert [[epoch["size"] for epoch in run["epochs"]] for run in runs] == [[64, 64], [32, 64], [32, 64], [64, 64]]
    assert (data / "val").is_dir() and len(list((data / "train").iterdir())) == 10


def test_the_target_is_the_fixed_runs_mean_final_top1_within_the_margin():
    timing = load_script("resize_timing", "benchmarks")
    epochs = lambda *top1: [{"top1": t, "train_s": 10.0, "val_s": 1.0, "size": 32, "compute_s": 0.1,  # noqa: E731
                             "data_s": 0.0} for t in top1]
    runs = [timing.Run(1, "fixed", 100, (1, 1, 1), (1, 1, 1), epochs(80, 90, 96)),
            timing.Run(1, "progressive", 60, (1, 1, 1), (1, 1, 1), epochs(70, 95.6, 97)),
            timing.Run(2, "fixed", 100, (1, 1, 1), (1, 1, 1), epochs(85, 95, 94)),
            timing.Run(2, "progressive", 60, (1, 1, 1), (1, 1, 1), epochs(60, 70, 80))]

    class Options:
        fixed, ramp, within, threads = 64, [32, 64, 0, 1], 0.5, 1

    text = "\n".join(timing.report(runs, Options))
    assert "mean final val top-1 less 0.5 points = 94.50%" in text  # (96 + 94) / 2 - 0.5
    assert "| 1 | 64 px | 96.00% | 2 | 30 |" in text and "| 1 | --progressive-resize 32 64 0 1 | 97.00% | 1 | 20 |" in text
    assert "| 2 | --progressive-resize 32 64 0 1 | 80.00% | - | not reached |" in text
    assert "training time to the target, per seed: 0.67 (mean 0.67)" in text  # seed 2's pair did not both reach it
    assert "training time of all epochs, per seed: 1.00, 1.00" in text
