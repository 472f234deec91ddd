"""End-to-end behaviour of main.py's training on tiny generated datasets (CPU)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import REPO, write_image_folder
from image_classification import checkpoint as ckpt
from image_classification.cli import run as cli_run
from image_classification.raport import read_raport
from image_classification.training import main

TINY = ["-a", "resnet18", "--image-size", "64", "-b", "8", "--device", "cpu", "-p", "2", "--lr", "0.02", "--num-classes", "3"]


def train(data: Path, workspace: Path, *extra: str) -> int:
    return main(TINY + ["--workspace", str(workspace), *extra, str(data)])


def weights(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=True)["state_dict"]


def assert_same_weights(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


def summary(raport: Path) -> dict:
    """The run summary: every ``step == []`` record merged (DEFAULT and VERBOSE metrics)."""
    merged = {}
    for record in read_raport(raport):
        if record.get("step") == []:
            merged.update(record["data"])
    return merged


def test_loss_falls_and_raport_holds_the_metrics(image_folder, tmp_path):
    code = train(image_folder, tmp_path, "--data-backend", "pytorch", "-j", "0", "--epochs", "3",
                 "--seed", "3", "--crop-scale", "0.5", "1")
    assert code == 0
    records = read_raport(tmp_path / "experiment_raport.json")
    epochs = [r["data"] for r in records if r["type"] == "LOG" and isinstance(r["step"], list) and len(r["step"]) == 1]
    losses = [e["train.loss"] for e in epochs if "train.loss" in e]
    assert losses[-1] < losses[0]
    assert any(r["step"] == "PARAMETER" for r in records)
    metadata = {r["metric"] for r in records if r["type"] == "METADATA"}
    expected = {
        "train.loss", "train.total_ips", "train.compute_ips", "train.data_time", "train.compute_time", "train.lr",
        "train.grad_scale", "val.loss", "val.top1", "val.top5", "val.total_ips", "val.compute_ips",
        "val.data_time", "val.compute_time", "val.compute_latency", "val.compute_latency_at90",
        "val.compute_latency_at95", "val.compute_latency_at99", "val.compute_latency_at100",
    }
    assert expected <= metadata
    steps = {len(r["step"]) for r in records if r["type"] == "LOG" and isinstance(r["step"], list)}
    assert steps == {0, 1, 2, 3}
    final = summary(tmp_path / "experiment_raport.json")
    assert expected <= set(final)
    assert final["train.loss"] == pytest.approx(min(losses))  # the reference reported the worst epoch
    assert (tmp_path / "checkpoint.pth.tar").is_file() and (tmp_path / "model_best.pth.tar").is_file()


@pytest.mark.parametrize("workers", ["0", "2"])
def test_resume_at_an_epoch_boundary_is_bitwise_exact(image_folder, tmp_path, workers):
    common = ["--data-backend", "pytorch", "-j", workers, "--epochs", "2", "--seed", "7", "--mixup", "0.2",
              "--label-smoothing", "0.1", "--lr-schedule", "cosine", "--use-ema", "0.9"]
    assert train(image_folder, tmp_path / "straight", *common) == 0
    assert train(image_folder, tmp_path / "staged", *common, "--run-epochs", "1") == 0
    first = torch.load(tmp_path / "staged" / "checkpoint.pth.tar", weights_only=True)
    assert first["epoch"] == 1
    assert train(image_folder, tmp_path / "staged", *common, "--resume",
                 str(tmp_path / "staged" / "checkpoint.pth.tar")) == 0
    straight = torch.load(tmp_path / "straight" / "checkpoint.pth.tar", weights_only=True)
    staged = torch.load(tmp_path / "staged" / "checkpoint.pth.tar", weights_only=True)
    assert staged["epoch"] == straight["epoch"] == 2
    assert_same_weights(straight["state_dict"], staged["state_dict"])
    assert_same_weights(straight["state_dict_ema"], staged["state_dict_ema"])


def test_checkpoint_contents_and_gathering(image_folder, tmp_path):
    code = train(image_folder, tmp_path, "--data-backend", "pytorch", "-j", "0", "--epochs", "3", "--seed", "1",
                 "--gather-checkpoints", "2", "--checkpoint-filename", "last.pth.tar")
    assert code == 0
    state = torch.load(tmp_path / "last.pth.tar", weights_only=True)
    for key in ("epoch", "arch", "model_options", "state_dict", "optimizer", "scaler", "best_prec1", "rng", "seed"):
        assert key in state
    assert state["arch"] == "resnet18" and state["model_options"]["num_classes"] == 3
    assert not any(k.startswith("module.") for k in state["state_dict"])
    kept = sorted(p.name for p in tmp_path.glob("checkpoint_*.pth.tar"))
    assert kept == ["checkpoint_0001.pth.tar", "checkpoint_0002.pth.tar"]
    assert not list(tmp_path.glob(".*.tmp"))


def test_gather_checkpoints_flag_alone_keeps_every_epoch(image_folder, tmp_path):
    assert train(image_folder, tmp_path, "--data-backend", "pytorch", "-j", "0", "--epochs", "2", "--prof", "1",
                 "--gather-checkpoints") == 0
    assert sorted(p.name for p in tmp_path.glob("checkpoint_*.pth.tar")) == [
        "checkpoint_0000.pth.tar", "checkpoint_0001.pth.tar"]


def test_default_keeps_only_latest_and_best(image_folder, tmp_path):
    assert train(image_folder, tmp_path, "--data-backend", "pytorch", "-j", "0", "--epochs", "2", "--prof", "1") == 0
    assert not list(tmp_path.glob("checkpoint_*.pth.tar"))


def test_evaluate_a_checkpoint_exits_zero(image_folder, tmp_path):
    assert train(image_folder, tmp_path, "--data-backend", "pytorch", "-j", "0", "--epochs", "1") == 0
    evaluation = tmp_path / "eval"
    code = train(image_folder, evaluation, "--data-backend", "pytorch", "-j", "0", "--evaluate", "--epochs", "1",
                 "--resume", str(tmp_path / "checkpoint.pth.tar"))
    assert code == 0
    data = summary(evaluation / "experiment_raport.json")
    assert data["val.top1"] is not None and "train.loss" not in data
    assert not (evaluation / "checkpoint.pth.tar").exists()


def test_pretrained_weights_with_another_head_are_fine_tuned(image_folder, tmp_path, capsys):
    from image_classification.models import build_model

    source = tmp_path / "weights.pth"
    torch.save(build_model("resnet18", num_classes=1000).state_dict(), source)
    code = train(image_folder, tmp_path / "ws", "--data-backend", "pytorch", "-j", "0", "--epochs", "1", "--prof",
                 "1", "--pretrained-weights", str(source))
    assert code == 0
    assert "fc" in capsys.readouterr().out


def test_gradient_accumulation_matches_the_large_batch():
    """Two accumulated micro-batches of 4 take the same optimizer step as one batch of 8."""
    import argparse
    import copy

    from image_classification.models import build_model
    from image_classification.runtime import make_runtime
    from image_classification.training import Trainer, TrainState

    torch.manual_seed(0)
    runtime = make_runtime("cpu")
    args = argparse.Namespace(mixup=0.0, label_smoothing=0.1, dynamic_loss_scale=False, static_loss_scale=1.0,
                              num_classes=3)
    images, targets = torch.randn(8, 3, 32, 32), torch.randint(0, 3, (8,))
    results = []
    for accumulation, chunks in ((1, 1), (2, 2)):
        torch.manual_seed(1)
        model = build_model("resnet18", num_classes=3).eval()  # eval BN: the batch split cannot matter
        optimizer = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
        trainer = Trainer(args, runtime, model, model, optimizer, None, None, None, TrainState(), accumulation)
        skipped = torch.zeros(())
        for index, part in enumerate(torch.arange(8).chunk(chunks)):
            trainer._train_step(images[part], targets[part], index, skipped)
        assert trainer.state.optimizer_steps == 1
        results.append(copy.deepcopy(model.state_dict()))
    for key in results[0]:
        torch.testing.assert_close(results[0][key], results[1][key], rtol=1e-4, atol=1e-6, msg=key)


def test_optimizer_batch_size_steps_once_per_global_batch(image_folder, tmp_path):
    code = train(image_folder, tmp_path, "--data-backend", "pytorch", "-j", "0", "--epochs", "1",
                 "-b", "4", "--optimizer-batch-size", "8", "--training-only")
    assert code == 0
    state = torch.load(tmp_path / "checkpoint.pth.tar", weights_only=True)
    assert state["optimizer_steps"] == (24 // 4) // 2


def test_synthetic_backend_needs_no_dataset(tmp_path):
    code = main(TINY + ["--data-backend", "syntetic", "--prof", "3", "--epochs", "1", "--workspace", str(tmp_path)])
    assert code == 0
    assert summary(tmp_path / "experiment_raport.json")["train.total_ips"] > 0


def test_amp_on_cpu_runs_in_bfloat16_and_nhwc(image_folder, tmp_path, capsys):
    code = train(image_folder, tmp_path, "--data-backend", "pytorch", "-j", "0", "--epochs", "1", "--prof", "2",
                 "--amp", "--memory-format", "nhwc")
    assert code == 0
    assert "bf16" in capsys.readouterr().out


def test_cpu_runs_repeat_bitwise(image_folder, tmp_path):
    for name in ("a", "b"):
        assert train(image_folder, tmp_path / name, "--data-backend", "pytorch", "-j", "0", "--epochs", "1",
                     "--seed", "5", "--mixup", "0.3") == 0
    assert_same_weights(weights(tmp_path / "a" / "checkpoint.pth.tar"), weights(tmp_path / "b" / "checkpoint.pth.tar"))


def test_sigterm_saves_mid_epoch_and_resume_finishes_it_exactly(image_folder, tmp_path):
    """A stop mid-epoch is saved as such (never as a finished epoch) and resumes where it stopped."""
    import signal

    from image_classification import training

    common = ["--data-backend", "pytorch", "-j", "0", "--epochs", "1", "--seed", "11", "-p", "1", "-b", "4"]
    assert train(image_folder, tmp_path / "straight", *common) == 0

    original = training.Trainer._train_step
    calls = {"n": 0}

    def stepping_then_signalled(self, *args, **kwargs):
        loss = original(self, *args, **kwargs)
        calls["n"] += 1
        if calls["n"] == 3:
            os.kill(os.getpid(), signal.SIGTERM)
        return loss

    training.Trainer._train_step = stepping_then_signalled
    try:
        assert train(image_folder, tmp_path / "stopped", *common) == 0
    finally:
        training.Trainer._train_step = original
    partial = torch.load(tmp_path / "stopped" / "checkpoint.pth.tar", weights_only=True)
    assert partial["epoch"] == 0 and partial["batch"] == 3
    assert train(image_folder, tmp_path / "stopped", *common, "--resume",
                 str(tmp_path / "stopped" / "checkpoint.pth.tar")) == 0
    assert_same_weights(weights(tmp_path / "straight" / "checkpoint.pth.tar"),
                        weights(tmp_path / "stopped" / "checkpoint.pth.tar"))


def test_corrupt_image_is_skipped_with_a_warning(tmp_path, capsys):
    data = write_image_folder(tmp_path / "data")
    (data / "train" / "class_00" / "broken.jpg").write_bytes(b"not a jpeg at all")
    code = train(data, tmp_path / "ws", "--data-backend", "pytorch", "-j", "0", "--epochs", "1")
    assert code == 0
    out = capsys.readouterr()
    assert "broken.jpg" in out.err
    assert "skipped unreadable images: 1" in out.out


# -- bad input: one line on stderr, exit code 2 -------------------------------------------------------
def _bad(tmp_path, image_folder):
    other = write_image_folder(tmp_path / "mismatch")
    (other / "val" / "class_02").rename(other / "val" / "class_09")
    empty_class = write_image_folder(tmp_path / "empty_class")
    for image in (empty_class / "train" / "class_01").iterdir():
        image.unlink()
    no_val = write_image_folder(tmp_path / "no_val")
    for image in (no_val / "val").rglob("*.jpg"):
        image.unlink()
    garbage = tmp_path / "garbage.pth.tar"
    garbage.write_text("this is not a checkpoint")
    from image_classification.models import build_model

    wrong_arch = tmp_path / "resnet34.pth"
    torch.save(build_model("resnet34", num_classes=3).state_dict(), wrong_arch)
    ok = str(image_folder)
    return {
        "missing DIR": TINY + ["--data-backend", "pytorch"],
        "DIR does not exist": TINY + ["--data-backend", "pytorch", str(tmp_path / "nowhere")],
        "no val": TINY + ["--data-backend", "pytorch", str(tmp_path / "no_val" / "train")],
        "classes differ": TINY + ["--data-backend", "pytorch", str(other)],
        "empty class": TINY + ["--data-backend", "pytorch", str(empty_class)],
        "too few classes": TINY[:-2] + ["--num-classes", "2", "--data-backend", "pytorch", ok],
        "unknown arch": ["-a", "resnet99", ok],
        "unknown backend": ["--data-backend", "tfrecord", ok],
        "unknown schedule": ["--lr-schedule", "exp", ok],
        "unknown memory format": ["--memory-format", "nwhc", ok],
        "batch below 1": ["-b", "0", ok],
        "epochs below 1": ["--epochs", "0", ok],
        "weights of another arch": TINY + ["--data-backend", "pytorch", "--pretrained-weights", str(wrong_arch), ok],
        "not a checkpoint": TINY + ["--data-backend", "pytorch", "--resume", str(garbage), ok],
        "bad accumulation": TINY + ["--data-backend", "pytorch", "--optimizer-batch-size", "12", ok],
    }


def test_bad_inputs_give_one_line_and_exit_2(tmp_path, image_folder, capsys):
    for name, argv in _bad(tmp_path, image_folder).items():
        code = cli_run(main, argv + ["--workspace", str(tmp_path / "ws")])
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2, name
        assert len(err) == 1 and err[0].startswith("error: "), (name, err)


def test_main_py_prints_no_traceback_for_a_user_error(tmp_path):
    result = subprocess.run([sys.executable, "main.py", "--data-backend", "pytorch", str(tmp_path / "nowhere")],
                            cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().startswith("error: ") and "does not exist" in result.stderr


def test_nothing_is_overwritten_when_a_save_fails(tmp_path, monkeypatch):
    target = tmp_path / "checkpoint.pth.tar"
    ckpt.save_atomic({"epoch": 1, "state_dict": {}}, target)

    def explode(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", explode)
    with pytest.raises(OSError):
        ckpt.save_atomic({"epoch": 2, "state_dict": {}}, target)
    assert torch.load(target, weights_only=True)["epoch"] == 1
    assert not list(tmp_path.glob(".*.tmp"))


def test_later_reference_features_run_together(image_folder, tmp_path):
    code = train(image_folder, tmp_path, "--data-backend", "pytorch", "-j", "1", "--epochs", "2", "--prof", "2",
                 "--augmentation", "autoaugment", "--interpolation", "triangular", "--optimizer", "rmsprop",
                 "--jit", "script", "--use-ema", "0.99", "--topk", "2", "--early-stopping-patience", "1",
                 "--lr-schedule", "linear", "--warmup", "1")
    assert code == 0
    data = summary(tmp_path / "experiment_raport.json")
    assert "val_ema.top1" in data and "val.top2" in data


@pytest.mark.parametrize("dynamic", [False, True])
def test_loss_scaling_skips_overflowing_steps_static_keeps_its_scale(dynamic):
    """An inf gradient skips the step and is counted; a static scale stays, a dynamic one halves."""
    import argparse

    from image_classification.runtime import make_runtime
    from image_classification.training import Trainer, TrainState

    runtime = make_runtime("cpu")
    args = argparse.Namespace(mixup=0.0, label_smoothing=0.0, dynamic_loss_scale=dynamic, static_loss_scale=128.0,
                              num_classes=2)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4, 2))
    before = model[1].weight.detach().clone()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=128.0, growth_interval=100 if dynamic else 2**31 - 1)
    trainer = Trainer(args, runtime, model, model, optimizer, scaler, None, None, TrainState(), 1)
    skipped = torch.zeros(())
    images = torch.full((2, 1, 2, 2), float("inf"))
    trainer._train_step(images, torch.tensor([0, 1]), 0, skipped)
    assert skipped.item() == 1
    assert torch.equal(model[1].weight, before)
    assert scaler.get_scale() == (64.0 if dynamic else 128.0)
    trainer._train_step(torch.ones(2, 1, 2, 2), torch.tensor([0, 1]), 1, skipped)
    assert skipped.item() == 1 and not torch.equal(model[1].weight, before)


def test_a_benchmark_shorter_than_one_accumulation_still_trains(tmp_path):
    """The presets' large --optimizer-batch-size with a short --prof still runs its iterations."""
    code = main(TINY + ["--data-backend", "synthetic", "--prof", "3", "--epochs", "1", "-b", "2",
                        "--optimizer-batch-size", "16", "--training-only", "--workspace", str(tmp_path)])
    assert code == 0
    records = read_raport(tmp_path / "experiment_raport.json")
    assert [r["step"] for r in records if r["type"] == "LOG" and isinstance(r["step"], list)
            and len(r["step"]) == 2][-1] == [0, 3]
