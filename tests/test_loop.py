"""The loop: what its records say and where the run stands after each part of an epoch."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from helpers import run_config, score_validations
from image_classification.records.raport import epoch_records, read_raport
from image_classification.training import main

# The loop is the subject, not the model: every run and build here is of the tiny ResNet (conftest.py), which
# trains, saves and loads in a fraction of ResNet-18's time.
pytestmark = pytest.mark.usefixtures("tiny_arch")


def test_validation_records_carry_the_training_iteration(tmp_path):
    """[epoch, train iteration, val iteration], as NVIDIA's logger writes it: not [epoch, 0, i]."""
    assert main(["--data-backend", "synthetic", "-a", "tiny", "--image-size", "32", "-b", "2", "--prof", "3",
                 "-p", "1", "--epochs", "1", "--num-classes", "4", "--no-checkpoints",
                 "--workspace", str(tmp_path)]) == 0
    steps = [record["step"] for record in read_raport(tmp_path / "experiment_raport.json")
             if record.get("type") == "LOG" and any(key.startswith("val.") for key in record["data"])
             and len(record["step"]) == 3]
    assert steps and all(step[:2] == [0, 3] for step in steps), steps


SYNTHETIC = ["--data-backend", "synthetic", "-a", "tiny", "--image-size", "32", "-b", "4", "--num-classes", "4",
             "--seed", "1", "--lr", "0.01"]


def test_an_early_stopped_run_is_finished_for_a_requeue(tmp_path, capsys):
    """`--resume auto` after early stopping does nothing, however often a requeue loop runs it."""
    run = SYNTHETIC + ["--prof", "2", "--epochs", "10", "--early-stopping-patience", "1", "--resume", "auto",
                       "--workspace", str(tmp_path)]
    with pytest.MonkeyPatch.context() as patch:
        score_validations(patch, 50.0, 10.0)  # the second epoch does not improve: early stopping after it
        assert main(run) == 0
    state = torch.load(tmp_path / "checkpoint.pth.tar", weights_only=True)
    assert state["epoch"] == 2 and state["stopped_early"]
    capsys.readouterr()
    assert main(run) == 0
    assert "early stopping ended: nothing to do" in capsys.readouterr().out
    assert torch.load(tmp_path / "checkpoint.pth.tar", weights_only=True)["epoch"] == 2


def test_a_validation_without_a_figure_does_not_count_toward_early_stopping(tmp_path, monkeypatch, capsys):
    """Epoch 2's validation gives no accuracy (its outputs are not finite, the weights are): it is neither an
    improvement nor the lack of one, so patience 1 ends the run after epoch 3, which does not improve, not
    after epoch 2."""
    from image_classification.train import loop, validation

    real_validate, calls = loop.Loop.validate, []

    def validate(self, *args, **kwargs):
        result = real_validate(self, *args, **kwargs)
        calls.append(result)
        top1 = (50.0, None, 10.0, 90.0)[len(calls) - 1]
        if top1 is None:
            return validation.ValResult(result.top1, float("nan"), result.count, result.count)
        result.top1 = top1
        return result

    monkeypatch.setattr(loop.Loop, "validate", validate)
    run = SYNTHETIC + ["--prof", "2", "--epochs", "4", "--early-stopping-patience", "1", "--workspace", str(tmp_path)]
    assert main(run) == 0
    out = capsys.readouterr().out
    assert "this validation gives no accuracy" in out and "Early stopping: no better top1 for 1 epochs" in out
    state = torch.load(tmp_path / "checkpoint.pth.tar", weights_only=True)
    assert state["epoch"] == 3 and state["stopped_early"] and state["best_epoch"] == 0, state["epoch"]


def test_early_stopping_without_validation_is_refused_as_a_flag():
    from image_classification.arguments import parse_args
    from image_classification.errors import UserError

    with pytest.raises(UserError, match="--early-stopping-patience counts validated epochs"):
        parse_args(SYNTHETIC + ["--early-stopping-patience", "2", "--training-only"])


def test_a_training_batch_of_one_is_trained_not_a_batchnorm_traceback():
    """Skipped unreadable images can leave one image in a batch; BatchNorm cannot normalise it alone."""
    from image_classification.models import build_model
    from image_classification.models.preprocessing import Preprocessing
    from image_classification.system.runtime import Runtime
    from image_classification.train.engine import Engine

    model = build_model("tiny", num_classes=4)
    config = run_config(arch="tiny", num_classes=4, model_options=(), preprocessing=Preprocessing(32))
    engine = Engine(config, Runtime(torch.device("cpu"), None, torch.contiguous_format), model, log=print)
    before = model.fc.weight.detach().clone()
    engine.train_step(torch.randn(1, 3, 32, 32), torch.tensor([2]), accumulation=1, step_now=True)
    reading = engine.read_window("here")
    assert reading.images == 1 and reading.loss > 0
    assert not torch.equal(model.fc.weight, before) and engine.progress.batch == 1


def test_val_loss_is_the_same_plain_cross_entropy_in_training_and_evaluation(tmp_path):
    """Label smoothing changes the training loss only: one checkpoint, one val.loss."""
    base = SYNTHETIC + ["--prof", "2", "--label-smoothing", "0.3"]
    assert main(base + ["--epochs", "1", "--workspace", str(tmp_path / "train")]) == 0
    assert main(base + ["--evaluate", "--resume", str(tmp_path / "train" / "checkpoint.pth.tar"),
                        "--label-smoothing", "0", "--workspace", str(tmp_path / "eval")]) == 0
    losses = [[r["data"]["val.loss"] for r in read_raport(tmp_path / run / "experiment_raport.json")
               if r.get("type") == "LOG" and r["step"] == [] and "val.loss" in r["data"]] for run in ("train", "eval")]
    assert losses[0] == pytest.approx(losses[1], rel=1e-5)


def test_quiet_runs_say_nothing_about_what_did_not_happen(tmp_path, capsys):
    """--evaluate says nothing about weight decay; no null metrics; no -j notice for the default -j."""
    assert main(SYNTHETIC + ["--prof", "1", "--epochs", "1", "--workspace", str(tmp_path)]) == 0
    assert main(SYNTHETIC + ["--prof", "1", "--evaluate", "--resume", str(tmp_path / "checkpoint.pth.tar"),
                             "--workspace", str(tmp_path / "eval")]) == 0
    out = capsys.readouterr().out
    assert out.count("weight decay") == 1  # the training run's line only
    assert "None" not in out and "loader workers" not in out


def test_a_stop_signal_during_start_up_stops_before_the_first_step_with_75(tmp_path, monkeypatch, capsys):
    """SIGTERM while the dataset is scanned or a checkpoint loads: no traceback, no step, exit 75."""
    import os
    import signal

    from image_classification import training

    real = training.resolve_run

    def signalled(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        return real(*args, **kwargs)

    monkeypatch.setattr(training, "resolve_run", signalled)
    assert main(SYNTHETIC + ["--prof", "2", "--epochs", "1", "--workspace", str(tmp_path)]) == 75
    out = capsys.readouterr().out
    assert "Stopped by SIGTERM before the first step" in out and "RUNNING EPOCHS" not in out
    assert not (tmp_path / "checkpoint.pth.tar").exists()
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the run gives the handlers back


def test_a_failed_copy_of_the_best_model_keeps_the_epoch_and_the_resumed_run_writes_it_first(tmp_path, monkeypatch,
                                                                                            capsys):
    """The latest checkpoint is written first: a full disk on model_best's copy ends the run (exit 4) with the
    epoch saved, and the resumed run writes model_best from it before it trains on, redoing nothing."""
    from image_classification.errors import StorageError
    from image_classification.records import checkpoint as ckpt
    from image_classification.system.cli import run

    score_validations(monkeypatch, 50.0, 10.0)  # epoch 0 is the best; epoch 1 is not
    real_write = ckpt.write_atomic

    def full_disk_on_best(target, write):
        if Path(target).name == ckpt.BEST_NAME:
            raise StorageError(f"could not write {target}: No space left on device")
        return real_write(target, write)

    monkeypatch.setattr(ckpt, "write_atomic", full_disk_on_best)
    run_args = SYNTHETIC + ["--prof", "1", "--epochs", "2", "--resume", "auto", "--workspace", str(tmp_path)]
    assert run(main, run_args) == 4
    assert torch.load(tmp_path / "checkpoint.pth.tar", weights_only=True)["epoch"] == 1  # the epoch is kept
    assert not (tmp_path / ckpt.BEST_NAME).exists()
    monkeypatch.setattr(ckpt, "write_atomic", real_write)
    capsys.readouterr()
    assert run(main, run_args) == 0
    out = capsys.readouterr().out
    assert f"=> writing {ckpt.BEST_NAME} from {tmp_path / 'checkpoint.pth.tar'}: the save of end of epoch 1" in out
    assert "RUNNING EPOCHS FROM 2 TO 2" in out  # epoch 1 is not trained again
    best = torch.load(tmp_path / ckpt.BEST_NAME, weights_only=True)
    assert best["epoch"] == 1 and best["best_epoch"] == 0
    assert torch.load(tmp_path / "checkpoint.pth.tar", weights_only=True)["epoch"] == 2


def test_a_finished_run_whose_last_copy_failed_gets_it_from_the_requeue(tmp_path, monkeypatch, capsys):
    """The last epoch's best model, left unwritten (a kill after the latest checkpoint), is written by the requeue
    that finds nothing else to do; a requeue with nothing owed writes nothing."""
    from image_classification.records import checkpoint as ckpt

    score_validations(monkeypatch, 10.0, 50.0)  # the last epoch is the best
    run_args = SYNTHETIC + ["--prof", "1", "--epochs", "2", "--resume", "auto", "--gather-checkpoints",
                            "--workspace", str(tmp_path)]
    assert main(run_args) == 0
    latest, best = tmp_path / "checkpoint.pth.tar", tmp_path / ckpt.BEST_NAME
    last = tmp_path / "checkpoint_0001.pth.tar"
    assert best.read_bytes() == latest.read_bytes() == last.read_bytes()
    ckpt.copy_atomic(tmp_path / "checkpoint_0000.pth.tar", best)  # the best model as epoch 1 left it
    last.unlink()
    capsys.readouterr()
    assert main(run_args) == 0
    out = capsys.readouterr().out
    assert "already finished all 2 epochs: nothing to do" in out
    assert f"=> writing {last.name} and {best.name} from {latest}: the save of end of epoch 2" in out
    assert best.read_bytes() == latest.read_bytes() == last.read_bytes()
    before = {path.name: path.stat().st_mtime_ns for path in tmp_path.iterdir()}
    assert main(run_args) == 0
    assert "=> writing" not in capsys.readouterr().out
    assert {path.name: path.stat().st_mtime_ns for path in tmp_path.iterdir()} == before


@pytest.mark.parametrize("name,flags", [("model_best.pth.tar", []),
                                        ("checkpoint_0003.pth.tar", ["--gather-checkpoints", "2"])])
def test_a_folder_named_like_a_copy_of_the_checkpoint_is_refused_before_the_first_step(tmp_path, capsys, name,
                                                                                     flags):
    """Its copy would fail at the end of every epoch: one line and exit 2, before anything is trained or written."""
    from helpers import refused
    from image_classification.system.cli import run

    (tmp_path / name).mkdir()
    line = refused(run(main, SYNTHETIC + ["--prof", "1", "--epochs", "1", "--workspace", str(tmp_path), *flags]),
                   capsys)
    what = "the best model" if name == "model_best.pth.tar" else "a per-epoch checkpoint (--gather-checkpoints)"
    assert line == f"error: {tmp_path / name} is a folder, where the run writes {what} as a file; remove it or " \
        "move it away"
    assert sorted(path.name for path in tmp_path.iterdir()) == [name]


def test_resuming_another_run_s_checkpoint_never_cuts_this_workspace_s_raport(tmp_path):
    """The raport is cut back only when the checkpoint's run wrote it (its run id); else appended to."""
    run = SYNTHETIC + ["--prof", "2", "-p", "1", "--epochs", "1"]
    assert main(run + ["--epochs", "2", "--workspace", str(tmp_path / "a")]) == 0  # a longer raport than
    assert main(run + ["--workspace", str(tmp_path / "b")]) == 0  # the offset b's checkpoint records
    raport = tmp_path / "a" / "experiment_raport.json"
    before = raport.read_text()
    other = tmp_path / "b" / "checkpoint_other.pth.tar"
    (tmp_path / "b" / "checkpoint.pth.tar").rename(other)
    assert main(run + ["--epochs", "3", "--resume", str(other), "--workspace", str(tmp_path / "a")]) == 0
    after = raport.read_text()
    assert after.startswith(before)  # nothing of this workspace's run was cut
    records = read_raport(raport)
    assert any("resumed_from" in r.get("data", {}) for r in records if r.get("step") == "PARAMETER")


def test_a_resumed_run_cuts_its_own_raport_back_to_its_checkpoint(tmp_path):
    run = SYNTHETIC + ["--prof", "2", "-p", "1", "--workspace", str(tmp_path), "--gather-checkpoints"]
    assert main(run + ["--epochs", "2"]) == 0
    assert main(run + ["--epochs", "2", "--resume", str(tmp_path / "checkpoint_0000.pth.tar")]) == 0
    steps = [tuple(r["step"]) for r in read_raport(tmp_path / "experiment_raport.json")
             if r.get("type") == "LOG" and isinstance(r.get("step"), list) and len(r["step"]) == 2
             and "train.loss" in r["data"]]
    assert steps == [(0, 1), (0, 2), (1, 1), (1, 2)]  # epoch 1 logged once, by the resumed run


class ScriptedClock:
    """The loop's clock, moved on only by the scripted durations of the training steps and the validation
    forwards: every throughput and latency is then exact."""

    def __init__(self, monkeypatch, steps: list[float], forwards: list[float]):
        from image_classification.train import loop
        from image_classification.train.engine import Engine

        self.now = 0.0
        monkeypatch.setattr(loop, "time", self)
        train_step, timed_forward = Engine.train_step, loop.Loop._timed_forward

        def step(engine, *args, **kwargs):
            train_step(engine, *args, **kwargs)
            self.now += steps.pop(0)

        def forward(trainer, model, images):
            _, logits, averaged = timed_forward(trainer, model, images)
            latency = forwards.pop(0)
            self.now += latency
            return latency, logits, averaged

        monkeypatch.setattr(Engine, "train_step", step)
        monkeypatch.setattr(loop.Loop, "_timed_forward", forward)

    def perf_counter(self) -> float:
        return self.now

    monotonic = perf_counter


def test_the_benchmark_warmup_is_left_out_of_the_summary_and_kept_in_the_wall_figure(tmp_path, monkeypatch, capsys):
    """Two slow first iterations (cuDNN's autotuning on a GPU) would drag the summary down; with
    --benchmark-warmup 2 the summary's throughput and latency are the later iterations', the windows still
    show the warm-up, and *.wall_ips is every iteration's images over their whole time."""
    ScriptedClock(monkeypatch, steps=[1.0, 1.0, 0.1, 0.1], forwards=[2.0, 2.0, 0.2, 0.2])
    assert main(SYNTHETIC + ["--prof", "4", "-p", "1", "--epochs", "1", "--benchmark-warmup", "2",
                             "--no-checkpoints", "--workspace", str(tmp_path)]) == 0
    assert "leave out the first 2 iterations of training and of each validation" in capsys.readouterr().out
    records = read_raport(tmp_path / "experiment_raport.json")
    summary = {k: v for r in records if r.get("step") == [] for k, v in r["data"].items()}
    assert summary["train.total_ips"] == pytest.approx(4 / 0.1)
    assert summary["train.wall_ips"] == pytest.approx(16 / 2.2)
    assert summary["val.total_ips"] == pytest.approx(4 / 0.2) and summary["val.compute_latency_at100"] == 0.2
    assert summary["val.wall_ips"] == pytest.approx(16 / 4.4)
    windows = [r["data"]["train.total_ips"] for r in records if len(r.get("step", "")) == 2
               and "train.total_ips" in r["data"]]
    assert windows == pytest.approx([4.0, 4.0, 40.0, 40.0])


def test_throughput_counts_the_time_spent_logging(tmp_path, monkeypatch):
    """Each iteration is timed wall clock to wall clock: a slow log window shows in the images/s.  The clock
    moves only for the steps (no time) and each window's logging (0.5 s): 4 batches of 4 whose windows 1-3
    are logged inside iterations 2-4 give 16 images in 1.5 s."""
    from image_classification.records.raport import Raport

    clock = ScriptedClock(monkeypatch, steps=[0.0] * 4, forwards=[])
    original = Raport.log_window

    def slow_log_window(self, *args, **kwargs):
        clock.now += 0.5
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Raport, "log_window", slow_log_window)
    assert main(SYNTHETIC + ["--prof", "4", "-p", "1", "--epochs", "1", "--training-only", "--no-checkpoints",
                             "--workspace", str(tmp_path)]) == 0
    summary = {k: v for r in read_raport(tmp_path / "experiment_raport.json") if r.get("step") == []
               for k, v in r["data"].items()}
    assert summary["train.total_ips"] == pytest.approx(16 / 1.5)


def test_the_measured_time_starts_after_the_device_has_finished_the_warm_up(tmp_path, monkeypatch):
    """A GPU runs behind the host: the warm-up's last iteration waits for the device before the measured
    iterations' clock starts, once per process (not again in the second epoch), and never without a warm-up."""
    from image_classification.system.runtime import Runtime
    from image_classification.train.engine import Engine

    steps, synchronised = [], []
    train_step = Engine.train_step
    monkeypatch.setattr(Engine, "train_step", lambda engine, *args, **kwargs: steps.append(1) or
                        train_step(engine, *args, **kwargs))
    monkeypatch.setattr(Runtime, "synchronize", lambda runtime: synchronised.append(len(steps)))
    for warmup, expected in (("3", [3]), ("0", [])):
        steps.clear(), synchronised.clear()
        assert main(SYNTHETIC + ["--prof", "4", "-p", "2", "--epochs", "2", "--benchmark-warmup", warmup,
                                 "--no-checkpoints", "--workspace", str(tmp_path / warmup)]) == 0
        assert len(steps) == 8 and synchronised == expected


def test_a_run_with_no_iteration_after_its_warmup_prints_no_throughput(tmp_path, monkeypatch, capsys):
    ScriptedClock(monkeypatch, steps=[1.0, 1.0], forwards=[1.0, 1.0])
    assert main(SYNTHETIC + ["--prof", "2", "-p", "1", "--epochs", "1", "--benchmark-warmup", "5",
                             "--no-checkpoints", "--workspace", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "train: no throughput or latency figure: all 2 iterations were warm-up (--benchmark-warmup 5)" in out
    assert "val: no throughput or latency figure: all 2 iterations were warm-up" in out
    summary = {k: v for r in read_raport(tmp_path / "experiment_raport.json") if r.get("step") == []
               for k, v in r["data"].items()}
    assert "train.total_ips" not in summary and "val.compute_latency" not in summary
    assert summary["train.wall_ips"] == pytest.approx(4.0) and "train.loss" in summary
    summary = next(line for line in out.splitlines() if line.startswith("Summary"))
    assert "train loss " in summary and "img/s" not in summary, summary


def test_a_log_file_gets_a_line_with_a_time_left_while_a_pass_lasts(tmp_path, monkeypatch, capsys):
    """Output to a file (no progress bar): an epoch of 5 iterations with -p 10 says how far it is and how long
    it has left before its window line (every HEARTBEAT_SECONDS; here at once); the save names the epoch
    whose lines it follows."""
    from image_classification.train import progress

    monkeypatch.setattr(progress, "HEARTBEAT_SECONDS", 0.0)
    assert main(SYNTHETIC + ["--prof", "5", "-p", "10", "--epochs", "1", "--workspace", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    beats = [index for index, line in enumerate(lines) if line.startswith("epoch 1: ")]
    window = next(index for index, line in enumerate(lines) if line.startswith("Epoch 1/1 [5/5] loss "))
    assert [lines[index].split(",")[0] for index in beats] == [f"epoch 1: {n}/5 iterations" for n in range(1, 5)]
    assert beats[-1] < window and " so far, about " in lines[beats[-1]] and lines[beats[-1]].endswith(" left")
    assert any(line.startswith("val 1: 1/5 iterations") for line in lines)
    saving = next(line for line in lines if line.startswith("SAVING"))
    assert saving.endswith("(end of epoch 1)"), saving


def test_a_validation_window_line_shows_the_accuracy_so_far(image_folder, tmp_path, monkeypatch, capsys):
    """12 val images in batches of 8 and 4, the first all right, the second all wrong: the last window line
    says 66.67%, as the epoch's does, not the last window's 0.00%."""
    from image_classification.train import validation

    def first_batch_right(logits, targets, ks):
        right = float(len(targets)) if len(targets) == 8 else 0.0
        return torch.tensor([right] * len(ks))

    monkeypatch.setattr(validation, "correct_counts", first_batch_right)
    assert main(["-a", "tiny", "--image-size", "32", "-b", "8", "--device", "cpu", "--data-backend", "pytorch",
                 "-j", "0", "-p", "1", "--epochs", "1", "--no-checkpoints", "--workspace",
                 str(tmp_path), str(image_folder)]) == 0
    top1 = re.findall(r"^Epoch 1/1(?: val \[\d/2\]|: .*; val) loss [\d.]+, top1 ([\d.]+)%",
                      capsys.readouterr().out, re.M)
    assert top1 == ["100.00", "66.67", "66.67"]  # the windows so far, then the epoch


def test_the_summary_gives_the_last_epoch_s_top1_and_the_best_with_its_epoch(tmp_path, monkeypatch, capsys):
    """The summary's accuracy is the last epoch's, the weights `checkpoint:` names below it, and the best beside
    it with its epoch and file: never the best alone as if it were the last.  An evaluation has one figure."""
    with pytest.MonkeyPatch.context() as patch:
        score_validations(patch, 50.0, 100.0, 73.33)
        assert main(SYNTHETIC + ["--prof", "1", "--epochs", "3", "--workspace", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "val top1: last 73.33% (epoch 3), best 100.00% (epoch 2, model_best.pth.tar)" in lines
    assert lines[lines.index("val top1: last 73.33% (epoch 3), best 100.00% (epoch 2, model_best.pth.tar)") + 1] \
        == f"checkpoint: {tmp_path / 'checkpoint.pth.tar'}"
    score_validations(monkeypatch, 60.0)
    assert main(SYNTHETIC + ["--prof", "1", "--evaluate", "--resume", str(tmp_path / "model_best.pth.tar")]) == 0
    assert "val top1: 60.00%" in capsys.readouterr().out.splitlines()


def test_what_a_run_says_counts_epochs_from_1_and_its_records_keep_the_reference_s_index(tmp_path, capsys):
    """A run of 2 epochs says epochs 1 and 2 everywhere a person reads (the start, each log line, each save, the
    resume, checkpoint2model.py) while the raport's steps stay [0], [1] as the reference's DLLogger wrote them."""
    import sys
    from unittest import mock

    from image_classification import commands

    run = SYNTHETIC + ["--prof", "1", "-p", "1", "--workspace", str(tmp_path)]
    assert main(run + ["--epochs", "2"]) == 0
    out = capsys.readouterr().out
    assert "RUNNING EPOCHS FROM 1 TO 2" in out
    assert re.findall(r"^(Epoch \d+/\d+ \[1/1\]) loss ", out, re.M) == ["Epoch 1/2 [1/1]", "Epoch 2/2 [1/1]"]
    assert [line.split(":")[0] for line in out.splitlines() if line.startswith("Epoch") and ": train " in line] \
        == ["Epoch 1/2", "Epoch 2/2"]
    assert [line.split("(")[-1] for line in out.splitlines() if line.startswith("SAVING")] == \
        ["end of epoch 1)", "end of epoch 2)"]
    steps = [r["step"] for r in read_raport(tmp_path / "experiment_raport.json") if isinstance(r.get("step"), list)]
    assert sorted({tuple(step) for step in steps if len(step) == 1}) == [(0,), (1,)] and [0, 1] in steps
    assert main(run + ["--epochs", "3", "--resume", "auto"]) == 0
    out = capsys.readouterr().out
    assert "=> loaded checkpoint (end of epoch 2)" in out and "RUNNING EPOCHS FROM 3 TO 3" in out
    assert torch.load(tmp_path / "checkpoint.pth.tar", weights_only=True)["epoch"] == 3  # the key: epochs finished
    argv = ["checkpoint2model.py", "--checkpoint-path", str(tmp_path / "checkpoint.pth.tar"), "--weight-path",
            str(tmp_path / "weights.pth")]
    with mock.patch.object(sys, "argv", argv):
        assert commands.checkpoint2model() == 0
    assert ", end of epoch 3, best top1 " in capsys.readouterr().out
    assert main(SYNTHETIC + ["--prof", "1", "--evaluate", "--resume", str(tmp_path / "checkpoint.pth.tar")]) == 0
    evaluated = [line for line in capsys.readouterr().out.splitlines() if line.startswith(("Evaluation", "Epoch"))]
    assert evaluated and all(line.startswith("Evaluation (weights of epoch 3)") for line in evaluated)  # its weights'


def test_the_summary_line_of_a_last_validation_without_a_figure_says_so():
    from image_classification.train.validation import ValResult
    from image_classification.training import top1_summary

    nan = float("nan")
    assert top1_summary((3, ValResult(nan, nan, 4, 4)), 50.0, 1, evaluation=False, best_file="model_best.pth.tar") \
        == "val top1: last none (epoch 3: its outputs were not finite), best 50.00% (epoch 2, model_best.pth.tar)"
    assert top1_summary((1, ValResult(nan, nan, 4, 4)), 0.0, -1, evaluation=False, best_file=None) == \
        "val top1: last none (epoch 1: its outputs were not finite)"  # no finite validation yet: no best
    assert top1_summary(None, 0.0, -1, evaluation=False, best_file=None) is None  # --training-only


def test_a_run_prints_one_short_line_per_window_and_per_epoch_and_its_raport_keeps_every_record(tmp_path, capsys):
    """What a person reads: no DLL line, no FP32 loss scale, no ema figures without an EMA; one line a print window
    and one an epoch, short; the raport still records the loss scale and the epoch's VERBOSE figures."""
    assert main(SYNTHETIC + ["--prof", "2", "-p", "1", "--epochs", "2", "--no-checkpoints",
                             "--workspace", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert not [line for line in lines if line.startswith("DLL") or "scale" in line or "val_ema" in line]
    progress = [re.sub(r"\d[\d,]*\.\d+|\b\d{1,3}(?:,\d{3})+\b|\b\d+(?= img/s)", "#", line) for line in lines
                if line.startswith(("Epoch ", "Summary"))]
    assert progress[:5] == [
        "Epoch 1/2 [1/2] loss #, # img/s, lr #", "Epoch 1/2 [2/2] loss #, # img/s, lr #",
        "Epoch 1/2 val [1/2] loss #, top1 #%, top4 #%, # img/s", "Epoch 1/2 val [2/2] loss #, top1 #%, top4 #%, # img/s",
        "Epoch 1/2: train loss #, # img/s, lr #; val loss #, top1 #%, top4 #%"]
    assert progress[-1] == "Summary (each figure's best epoch; throughput over the run): train loss #, # img/s; " \
        "val loss #, top1 #%, top4 #%"
    assert len(progress) == 11 and max(map(len, progress)) < 120
    for figures in epoch_records(tmp_path / "experiment_raport.json").values():
        assert {"train.grad_scale", "train.image_size", "train.data_time", "val.compute_latency_at99"} <= set(figures)


def test_an_fp16_run_shows_its_loss_scale_in_each_window(tmp_path, capsys):
    assert main(["--data-backend", "synthetic", "-a", "tiny", "--image-size", "32", "-b", "2", "--num-classes",
                 "4", "--prof", "2", "-p", "1", "--epochs", "1", "--training-only", "--no-checkpoints", "--amp",
                 "--amp-dtype", "float16", "--static-loss-scale", "128", "--workspace", str(tmp_path)]) == 0
    windows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("Epoch 1/1 [")]
    assert len(windows) == 2 and all(line.endswith(", loss scale 128") for line in windows), windows
