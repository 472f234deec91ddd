"""End-to-end behaviour of main.py's training on tiny generated datasets (CPU)."""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import pytest
import torch

from conftest import REPO, write_image_folder
from helpers import refused, run_config, run_script, score_validations
from image_classification.errors import TrainingDiverged
from image_classification.records import checkpoint as ckpt
from image_classification.records.raport import read_raport
from image_classification.records.workspace import Workspace
from image_classification.system.cli import run as cli_run
from image_classification.training import main

# The model is not what these tests are about (where it is, a test names its architecture): the tiny ResNet at
# 32 px trains the colour folder in about a ninth of ResNet-18's time at 64 px, and learns its colours as surely.
pytestmark = pytest.mark.usefixtures("tiny_arch")
TINY = ["-a", "tiny", "--image-size", "32", "-b", "8", "--device", "cpu", "-p", "2", "--lr", "0.02",
        "--num-classes", "3"]


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
    }  # val.top5 would need 5 classes: with 3, the default top-k is top3
    expected = {name.replace("top5", "top3") for name in expected}
    assert expected <= metadata
    steps = {len(r["step"]) for r in records if r["type"] == "LOG" and isinstance(r["step"], list)}
    assert steps == {0, 1, 2, 3}
    final = summary(tmp_path / "experiment_raport.json")
    assert expected <= set(final)
    assert final["train.loss"] == pytest.approx(min(losses))  # the reference reported the worst epoch
    assert (tmp_path / "checkpoint.pth.tar").is_file() and (tmp_path / "model_best.pth.tar").is_file()


@pytest.mark.parametrize("workers", ["0", "2"])
def test_resume_at_an_epoch_boundary_is_bitwise_exact(image_folder, tmp_path, workers, tiny_arch):
    """The loader workers (persistent with -j 2) of the straight run meet the progressive resize's second size
    in epoch 1, where the resumed run starts."""
    common = ["-a", tiny_arch, "--data-backend", "pytorch", "-j", workers, "--epochs", "2", "--seed", "7",
              "--mixup", "0.2", "--label-smoothing", "0.1", "--lr-schedule", "cosine", "--use-ema", "0.9",
              "--progressive-resize", "32", "64", "0", "1"]
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
    for key in ("epoch", "arch", "model_options", "state_dict", "optimizer", "scaler", "best_prec1", "rng", "seed",
                "num_classes", "preprocessing", "classes", "sha256"):
        assert key in state
    assert state["arch"] == "tiny" and state["num_classes"] == 3
    assert state["preprocessing"]["image_size"] == 32
    assert state["preprocessing"]["interpolation"] == "bilinear"
    assert state["classes"] == ["class_00", "class_01", "class_02"]
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


def test_an_evaluation_writes_a_raport_of_its_own_and_says_where(tmp_path, tiny_arch, monkeypatch, capsys):
    """An evaluation never appends to (nor cuts) a raport that holds another run's or evaluation's records:
    the training raport stays byte for byte, each evaluation gets a file of its own, named at the start and
    the end; one without --workspace writes beside the checkpoint, in its run's workspace, and nothing into
    the current folder, where its raport would stop the next run started there."""
    common = ["-a", tiny_arch, "--image-size", "32", "-b", "4", "--device", "cpu", "--data-backend", "synthetic",
              "--prof", "1", "--num-classes", "3", "--seed", "1"]
    run_dir = tmp_path / "run"
    assert main([*common, "--epochs", "1", "--workspace", str(run_dir)]) == 0
    trained = (run_dir / "experiment_raport.json").read_bytes()
    evaluate = [*common, "--evaluate", "--resume", str(run_dir / "model_best.pth.tar")]
    capsys.readouterr()
    assert main([*evaluate, "--workspace", str(run_dir)]) == 0
    with Workspace(run_dir, "checkpoint.pth.tar", "experiment_raport.json"):  # a run training there now
        assert main([*evaluate, "--workspace", str(run_dir)]) == 0  # an evaluation takes no lock
    assert (run_dir / "experiment_raport.json").read_bytes() == trained
    raports = sorted(run_dir.glob("experiment_raport.evaluate-*.json"))
    assert len(raports) == 2
    for raport in raports:
        assert summary(raport)["val.top1"] is not None
        assert sum(r.get("step") == "PARAMETER" and "run_id" in r["data"] for r in read_raport(raport)) == 1
    out = capsys.readouterr().out
    for raport in raports:
        assert f"holds earlier records: this evaluation's raport is {raport}\n" in out
        assert f"raport: {raport}\n" in out

    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    assert main(evaluate) == 0
    assert f"this evaluation's raport is {run_dir}/experiment_raport.evaluate-" in capsys.readouterr().out
    assert len(list(run_dir.glob("experiment_raport.evaluate-*.json"))) == 3 and list(here.iterdir()) == []
    assert main([*common, "--epochs", "1"]) == 0  # a training run here is not refused for an evaluation's raport

    # a name of the user's choosing is never swapped for another: a script would read the earlier numbers
    assert main([*evaluate, "--raport-file", "eval.json"]) == 0
    first = (run_dir / "eval.json").read_bytes()
    line = refused(cli_run(main, [*evaluate, "--raport-file", "eval.json"]), capsys)
    assert f"--raport-file {run_dir / 'eval.json'} already holds records" in line
    assert (run_dir / "eval.json").read_bytes() == first
    # the default's name, typed, is a name of the user's choosing too (it was taken for the default, and swapped)
    line = refused(cli_run(main, [*evaluate, "--raport-file", "experiment_raport.json"]), capsys)
    assert f"--raport-file {run_dir / 'experiment_raport.json'} already holds records" in line


def test_pretrained_weights_with_another_head_are_fine_tuned(image_folder, tmp_path, capsys):
    """1000-class weights fine-tune on 3 classes: the body starts from the weights, the head is fresh."""
    from image_classification.models import build_model

    source = tmp_path / "weights.pth"
    pretrained = build_model("tiny", num_classes=1000).state_dict()
    torch.save(pretrained, source)
    code = train(image_folder, tmp_path / "ws", "--data-backend", "pytorch", "-j", "0", "--epochs", "1", "--prof",
                 "1", "--pretrained-weights", str(source), "--lr", "0", "--momentum", "0", "--weight-decay", "0")
    assert code == 0
    assert "Replaced the classifier head" in capsys.readouterr().out
    tuned = weights(tmp_path / "ws" / "checkpoint.pth.tar")
    assert tuned["fc.weight"].shape == (3, 32)
    for key in ("conv1.weight", "layer4.0.conv2.weight"):  # lr 0: the body is still the pretrained one
        assert torch.equal(tuned[key], pretrained[key]), key


def test_a_fine_tune_is_requeued_with_resume_auto(image_folder, tmp_path, capsys):
    """The same fine-tuning command with --resume auto, run again and again: it starts from the pretrained
    weights while the workspace holds no checkpoint, then continues from its checkpoint, saying which each
    time.  --resume with a path still excludes the weights: two sources of weights for one run."""
    from image_classification.models import build_model

    source, workspace = tmp_path / "weights.pth", tmp_path / "ws"
    torch.save(build_model("tiny", num_classes=1000).state_dict(), source)
    command = ("--data-backend", "pytorch", "-j", "0", "--epochs", "2", "--run-epochs", "1", "--prof", "1",
               "--pretrained-weights", str(source), "--resume", "auto")
    assert train(image_folder, workspace, *command) == 0
    out = capsys.readouterr().out
    assert f"=> --resume auto: no checkpoint in {workspace}; starting from the pretrained weights '{source}'" in out
    assert f"=> loaded pretrained weights '{source}'" in out
    assert train(image_folder, workspace, *command) == 0
    out = capsys.readouterr().out
    assert f"=> --resume auto: loading checkpoint '{workspace / 'checkpoint.pth.tar'}' (the run continues from it; " \
           f"--pretrained-weights '{source}' only started it)" in out
    assert "loaded pretrained weights" not in out
    assert torch.load(workspace / "checkpoint.pth.tar", weights_only=True)["epoch"] == 2
    line = refused(cli_run(main, [*TINY, "--resume", str(workspace / "checkpoint.pth.tar"), "--pretrained-weights",
                                  str(source), str(image_folder)]), capsys)
    assert "and --pretrained-weights exclude each other" in line and "--resume auto takes" in line


def make_engine(model, accumulation: int = 1, **settings):
    """An Engine over ``model`` on the CPU with a plain SGD configuration (no weight decay)."""
    from image_classification.models.preprocessing import Preprocessing
    from image_classification.system.runtime import make_runtime
    from image_classification.train.engine import Engine

    options = dict(arch="tiny", num_classes=3, model_options=(), preprocessing=Preprocessing(32),
                   weight_decay=0.0, accumulation=accumulation, lr=0.5, momentum=0.9)
    options.update(settings)
    return Engine(run_config(**options), make_runtime("cpu"), model, log=lambda *a: None)


def test_gradient_accumulation_matches_the_large_batch():
    """Two accumulated micro-batches of 4 take the same optimizer step as one batch of 8."""
    import copy

    from image_classification.models import build_model

    torch.manual_seed(0)
    images, targets = torch.randn(8, 3, 32, 32), torch.randint(0, 3, (8,))
    results = []
    for accumulation, chunks in ((1, 1), (2, 2)):
        torch.manual_seed(1)
        model = build_model("tiny", num_classes=3).eval()  # eval BN: the batch split cannot matter
        engine = make_engine(model, accumulation, label_smoothing=0.1)
        engine.model.eval()
        for index, part in enumerate(torch.arange(8).chunk(chunks)):
            engine.train_step(images[part], targets[part], accumulation=accumulation,
                              step_now=(index + 1) % accumulation == 0)
        assert engine.progress.optimizer_steps == 1
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


def record_first_convolution(monkeypatch) -> list[tuple[torch.dtype, bool, bool]]:
    """Each training step's (dtype of the first convolution's output, whether its input and its weight are
    channels-last), appended to the list returned."""
    from image_classification.train import engine as engine_module

    seen = []
    original = engine_module.Engine.train_step

    def recording_step(self, images, targets, **kwargs):
        first = next(m for m in self.base_model.modules() if isinstance(m, torch.nn.Conv2d))
        handle = first.register_forward_hook(
            lambda module, inputs, output: seen.append((output.dtype, inputs[0].is_contiguous(
                memory_format=torch.channels_last), module.weight.is_contiguous(memory_format=torch.channels_last))))
        try:
            return original(self, images, targets, **kwargs)
        finally:
            handle.remove()

    monkeypatch.setattr(engine_module.Engine, "train_step", recording_step)
    return seen


def test_amp_on_cpu_runs_in_bfloat16_and_nhwc(image_folder, tmp_path, monkeypatch):
    """--amp on the CPU computes the convolutions in bf16 on channels-last batches, and still learns."""
    seen = record_first_convolution(monkeypatch)
    code = train(image_folder, tmp_path, "--data-backend", "pytorch", "-j", "0", "--epochs", "1", "--prof", "2",
                 "--amp", "--memory-format", "nhwc")
    assert code == 0
    assert seen and all(record == (torch.bfloat16, True, True) for record in seen), seen
    state = torch.load(tmp_path / "checkpoint.pth.tar", weights_only=True)
    assert state["scaler"] is None  # bf16 needs no loss scaling
    assert all(v.dtype != torch.bfloat16 for v in state["state_dict"].values())  # the weights stay fp32


@pytest.mark.parametrize("arch, flags, avx512, channels_last", [
    ("resnet50", [], True, True), ("resnet18", [], True, False), ("resnet50", ["--memory-format", "nchw"], True, False),
    ("resnet18", ["--memory-format", "nhwc"], True, True), ("efficientnet-b0", [], True, True),
    ("resnet50", [], False, False), ("efficientnet-b0", [], False, False), ("resnet50", ["--memory-format", "nhwc"],
                                                                            False, True),
])
def test_the_default_layout_on_the_cpu_is_channels_last_for_the_bottleneck_models(
        image_folder, tmp_path, monkeypatch, capsys, arch, flags, avx512, channels_last):
    """Without --memory-format, a CPU run with AVX512 kernels trains ResNet-50 (bottleneck blocks) and
    EfficientNet-B0 (depthwise convolutions), faster so there, in channels-last and ResNet-18 (basic blocks, slower
    so at small sizes) in NCHW; an AVX2 CPU trains them all in NCHW (the layouts measured alike there); the run says
    the channels-last choice, and records the layout it took, not ``auto``; a typed layout wins.  A CPU run keeps
    its freed activations in the heap (tests/test_host_memory.py)."""
    import image_classification.training as training
    from image_classification.system import machine

    monkeypatch.setattr(machine, "cpu_kernels_avx512", lambda: avx512)
    seen, kept = record_first_convolution(monkeypatch), []
    monkeypatch.setattr(training, "keep_freed_memory", lambda: kept.append(True))
    code = train(image_folder, tmp_path, "--data-backend", "pytorch", "-j", "0", "--epochs", "1", "--prof", "1",
                 "--training-only", "--no-checkpoints", "-a", arch, "--image-size", "32", *flags)
    assert code == 0
    assert seen and all(record == (torch.float32, channels_last, channels_last) for record in seen), seen
    said = "=> memory format nhwc: channels-last, in which this model trains faster on this CPU (AVX512)" in \
        capsys.readouterr().out
    assert said == (channels_last and not flags)
    parameters = next(r["data"] for r in read_raport(tmp_path / "experiment_raport.json") if r["step"] == "PARAMETER")
    assert parameters["memory_format"] == ("nhwc" if channels_last else "nchw")
    assert kept == [True]


def test_auto_memory_format_is_channels_last_under_autocast_on_cuda_and_the_reference_s_nchw_otherwise():
    """On CUDA, fp16 and bf16 autocast train in channels-last (their convolutions' tensor-core layout, as NVIDIA's
    AMP presets choose), TF32 and FP32 in NCHW, the reference's; on the CPU the architecture's rule decides."""
    from image_classification.system.host import auto_memory_format

    for dtype in ("float16", "bfloat16"):
        assert auto_memory_format(True, dtype, cpu_channels_last=False)[0] == "nhwc"
        assert "tensor cores" in auto_memory_format(True, dtype, cpu_channels_last=False)[1]
    assert auto_memory_format(True, None, cpu_channels_last=True)[0] == "nchw"
    assert auto_memory_format(False, "bfloat16", cpu_channels_last=False)[0] == "nchw"
    assert auto_memory_format(False, None, cpu_channels_last=True)[0] == "nhwc"


def test_cpu_runs_repeat_bitwise(image_folder, tmp_path):
    for name in ("a", "b"):
        assert train(image_folder, tmp_path / name, "--data-backend", "pytorch", "-j", "0", "--epochs", "1",
                     "--seed", "5", "--mixup", "0.3") == 0
    assert_same_weights(weights(tmp_path / "a" / "checkpoint.pth.tar"), weights(tmp_path / "b" / "checkpoint.pth.tar"))


@pytest.mark.slow  # faults/test_signals.py stops runs mid-epoch by every signal and resumes them exactly
def test_sigterm_saves_mid_epoch_and_resume_finishes_it_exactly(image_folder, tmp_path):
    """A stop mid-epoch is saved as such (never as a finished epoch) and resumes where it stopped."""
    import signal

    from image_classification.errors import EXIT_PREEMPTED

    common = ["--data-backend", "pytorch", "-j", "0", "--epochs", "1", "--seed", "11", "-p", "1", "-b", "4"]
    assert train(image_folder, tmp_path / "straight", *common) == 0
    with signalled_at_step(3, signal.SIGTERM):
        assert train(image_folder, tmp_path / "stopped", *common) == EXIT_PREEMPTED
    partial = torch.load(tmp_path / "stopped" / "checkpoint.pth.tar", weights_only=True)
    assert partial["epoch"] == 0 and partial["batch"] == 3
    assert train(image_folder, tmp_path / "stopped", *common, "--resume",
                 str(tmp_path / "stopped" / "checkpoint.pth.tar")) == 0
    assert_same_weights(weights(tmp_path / "straight" / "checkpoint.pth.tar"),
                        weights(tmp_path / "stopped" / "checkpoint.pth.tar"))


def signalled_at_step(step: int, *signals: int):
    """``Engine.train_step`` patched to send this process ``signals`` right after its ``step``-th call."""
    from unittest import mock

    from image_classification.train import engine as engine_module

    original, calls = engine_module.Engine.train_step, [0]

    def stepping_then_signalled(self, *args, **kwargs):
        original(self, *args, **kwargs)
        calls[0] += 1
        if calls[0] == step:
            for number in signals:
                os.kill(os.getpid(), number)

    return mock.patch.object(engine_module.Engine, "train_step", stepping_then_signalled)


def test_ctrl_c_stops_like_sigterm_and_the_same_command_offers_to_resume(image_folder, tmp_path, capsys):
    """Ctrl-C (SIGINT) mid-epoch: a checkpoint of that step and exit 75, as SIGTERM; the same command again is
    refused with --resume auto first, and with it finishes the epoch."""
    import signal

    from image_classification.errors import EXIT_PREEMPTED

    argv = TINY + ["--data-backend", "pytorch", "-j", "0", "--epochs", "1", "--seed", "11", "-p", "1", "-b", "4",
                   "--workspace", str(tmp_path), str(image_folder)]
    with signalled_at_step(3, signal.SIGINT):
        assert cli_run(main, argv) == EXIT_PREEMPTED
    out, err = capsys.readouterr()
    assert "Stopped by SIGINT after 3 batches of epoch 1" in out and "Ctrl-C again" in err
    partial = torch.load(tmp_path / "checkpoint.pth.tar", weights_only=True)
    assert (partial["epoch"], partial["batch"]) == (0, 3)
    assert "pass --resume auto to continue it" in refused(cli_run(main, argv), capsys)
    assert cli_run(main, argv + ["--resume", "auto"]) == 0
    assert torch.load(tmp_path / "checkpoint.pth.tar", weights_only=True)["epoch"] == 1


def test_a_second_ctrl_c_stops_at_once_without_saving(image_folder, tmp_path, capsys):
    import signal

    argv = TINY + ["--data-backend", "pytorch", "-j", "0", "--epochs", "1", "--seed", "11", "-p", "1", "-b", "4",
                   "--workspace", str(tmp_path), str(image_folder)]
    before = signal.getsignal(signal.SIGINT)
    with signalled_at_step(2, signal.SIGINT, signal.SIGINT):
        assert cli_run(main, argv) == 130
    assert "Received SIGINT again: stopping at once, without saving" in capsys.readouterr().err
    assert not (tmp_path / "checkpoint.pth.tar").exists()
    assert signal.getsignal(signal.SIGINT) is before  # the run's handler is gone with it


def test_a_second_ctrl_c_during_the_save_stops_once_it_is_written_not_as_a_full_disk(image_folder, tmp_path, capsys,
                                                                                    monkeypatch):
    """The first Ctrl-C's save is under way when the second comes: raised inside torch.save's zip writer, the
    interrupt surfaced as the writer's RuntimeError, and the run ended with exit 4, "is the disk full?".  It is
    the interrupt, acted on once the checkpoint is in place: exit 130, no temporary file left."""
    import signal

    real_save = torch.save

    class Interrupting:
        """A file whose third write (the zip writer's, from C++) is where the second Ctrl-C arrives."""

        def __init__(self, handle):
            self.handle, self.writes = handle, 0

        def write(self, data):
            self.writes += 1
            if self.writes == 3:
                os.kill(os.getpid(), signal.SIGINT)
            return self.handle.write(data)

        def __getattr__(self, name):
            return getattr(self.handle, name)

    monkeypatch.setattr(torch, "save", lambda obj, handle, *args, **kwargs: real_save(obj, Interrupting(handle),
                                                                                       *args, **kwargs))
    argv = TINY + ["--data-backend", "pytorch", "-j", "0", "--epochs", "1", "--seed", "11", "-p", "1", "-b", "4",
                   "--workspace", str(tmp_path), str(image_folder)]
    with signalled_at_step(2, signal.SIGINT):
        assert cli_run(main, argv) == 130
    err = capsys.readouterr().err
    assert "Received SIGINT again: stopping at once, without saving" in err and "disk" not in err, err
    assert sorted(path.name for path in tmp_path.iterdir()) == [".workspace.lock", "checkpoint.pth.tar",
                                                                "experiment_raport.json"]
    from image_classification.records.checkpoint import load_checkpoint

    assert load_checkpoint(tmp_path / "checkpoint.pth.tar")["batch"] == 2  # the first Ctrl-C's, complete


def test_a_run_stopped_before_its_first_checkpoint_is_offered_resume_auto(tmp_path, capsys):
    """A run stopped during its start-up (exit 75) leaves its raport and no checkpoint: the same command again
    names --resume auto first, which runs it again."""
    import signal

    from image_classification.system import signals

    argv = ["--data-backend", "synthetic", "-a", "tiny", "--image-size", "32", "-b", "4", "--prof", "1",
            "--epochs", "1", "--num-classes", "4", "--seed", "1", "--lr", "0.01", "--workspace", str(tmp_path)]
    signals.catch_early()  # main.py's first line
    try:
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C during the imports
    except KeyboardInterrupt:
        pytest.fail("SIGINT was not caught")
    assert cli_run(main, argv) == 75
    assert "Stopped by SIGINT before the first step" in capsys.readouterr().out
    assert not (tmp_path / "checkpoint.pth.tar").exists() and (tmp_path / "experiment_raport.json").stat().st_size
    line = refused(cli_run(main, argv), capsys)
    assert "stopped before its first checkpoint; pass --resume auto to run it again" in line, line
    assert cli_run(main, argv + ["--resume", "auto"]) == 0


def test_corrupt_image_is_skipped_with_a_warning(tmp_path, capsys):
    data = write_image_folder(tmp_path / "data")
    (data / "train" / "class_00" / "broken.jpg").write_bytes(b"not a jpeg at all")
    code = train(data, tmp_path / "ws", "--data-backend", "pytorch", "-j", "0", "--epochs", "1", "--seed", "1")
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

    wrong_arch = tmp_path / "resnet18.pth"  # TINY trains the tiny ResNet
    torch.save(build_model("resnet18", num_classes=3).state_dict(), wrong_arch)
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
        "fewer images than a batch": TINY + ["--data-backend", "pytorch", "-j", "0", "-b", "64", ok],
    }


def test_bad_inputs_give_one_line_and_exit_2_and_leave_no_workspace(tmp_path, image_folder, capsys):
    """Every check comes before the workspace is created or locked: a refused start leaves nothing behind,
    in a new workspace folder (not made) or in an existing one (no lock file)."""
    existing = tmp_path / "existing"
    existing.mkdir()
    for name, argv in _bad(tmp_path, image_folder).items():
        for workspace in (tmp_path / "ws", existing):
            code = cli_run(main, argv + ["--workspace", str(workspace)])
            err = capsys.readouterr().err.strip().splitlines()
            assert code == 2, name
            assert len(err) == 1 and err[0].startswith("error: "), (name, err)
        assert not (tmp_path / "ws").exists() and list(existing.iterdir()) == [], name


def test_main_py_prints_no_traceback_for_a_user_error(tmp_path):
    """main.py as a script (in this process, helpers.run_script: a fresh interpreter adds only imports)."""
    result = run_script([REPO / "main.py", "--data-backend", "pytorch", str(tmp_path / "nowhere")], cwd=REPO)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().startswith("error: ") and "does not exist" in result.stderr


def test_nothing_is_overwritten_when_a_save_fails(tmp_path, monkeypatch):
    from image_classification.errors import StorageError

    target = tmp_path / "checkpoint.pth.tar"
    ckpt.save_checkpoint({"epoch": 1, "state_dict": {}}, target)

    def explode(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch, "save", explode)
    with pytest.raises(StorageError, match="No space left on device"):
        ckpt.save_checkpoint({"epoch": 2, "state_dict": {}}, target)
    assert ckpt.load_checkpoint(target)["epoch"] == 1
    assert not list(tmp_path.glob(".*.tmp"))


@pytest.mark.slow
def test_later_reference_features_run_together(image_folder, tmp_path, capsys, recwarn):
    """The reference's later flags in one run; torch's deprecation of TorchScript (2.14) is one line of the run's
    output, not a Python warning."""
    code = train(image_folder, tmp_path, "--data-backend", "pytorch", "-j", "1", "--epochs", "2", "--prof", "2",
                 "--augmentation", "autoaugment", "--interpolation", "triangular", "--optimizer", "rmsprop",
                 "--jit", "script", "--use-ema", "0.99", "--topk", "2", "--early-stopping-patience", "1",
                 "--lr-schedule", "linear", "--warmup", "1")
    assert code == 0
    data = summary(tmp_path / "experiment_raport.json")
    assert "val_ema.top1" in data and "val.top2" in data
    assert not [w for w in recwarn if issubclass(w.category, FutureWarning) and "jit" in str(w.message)]
    deprecated = [line for line in capsys.readouterr().out.splitlines() if line.startswith("=> --jit script: ")]
    with warnings.catch_warnings(record=True) as caught:  # does this torch deprecate it?
        warnings.simplefilter("always", FutureWarning)
        torch.jit.script(torch.nn.Linear(1, 1))
    assert len(deprecated) == (1 if any(issubclass(w.category, FutureWarning) for w in caught) else 0), deprecated


@pytest.mark.parametrize("dynamic", [False, True])
def test_loss_scaling_skips_overflowing_steps_static_keeps_its_scale(dynamic):
    """An inf gradient skips the step and is counted; a static scale stays, a dynamic one halves."""
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4, 2))
    before = model[1].weight.detach().clone()
    engine = make_engine(model, num_classes=2, lr=0.1, momentum=0.0, loss_scale=128.0,
                         dynamic_loss_scale=dynamic)
    engine.scaler = torch.amp.GradScaler("cpu", init_scale=128.0, growth_interval=100 if dynamic else 2**31 - 1)
    engine.train_step(torch.full((2, 1, 2, 2), float("inf")), torch.tensor([0, 1]), accumulation=1, step_now=True)
    assert torch.equal(model[1].weight, before)
    assert engine.scaler.get_scale() == (64.0 if dynamic else 128.0)
    with pytest.raises(TrainingDiverged):  # the inf loss itself is a divergence at the window's read
        engine.read_window("here")
    assert engine.progress.skipped_steps == 1
    engine.train_step(torch.ones(2, 1, 2, 2), torch.tensor([0, 1]), accumulation=1, step_now=True)
    assert engine.read_window("there").loss > 0
    assert engine.progress.skipped_steps == 1 and not torch.equal(model[1].weight, before)


def test_a_benchmark_shorter_than_one_accumulation_still_trains(tmp_path):
    """The presets' large --optimizer-batch-size with a short --prof: the optimizer still steps."""
    from image_classification.models import build_model

    code = main(TINY + ["--data-backend", "synthetic", "--prof", "3", "--epochs", "1", "-b", "2", "--seed", "4",
                        "--optimizer-batch-size", "16", "--training-only", "--workspace", str(tmp_path)])
    assert code == 0
    records = read_raport(tmp_path / "experiment_raport.json")
    assert [r["step"] for r in records if r["type"] == "LOG" and isinstance(r["step"], list)
            and len(r["step"]) == 2][-1] == [0, 3]
    state = torch.load(tmp_path / "checkpoint.pth.tar", weights_only=True)
    assert state["optimizer_steps"] == 1
    torch.manual_seed(4)  # the initial weights of a run with --seed 4 on one process
    initial = build_model("tiny", num_classes=3).state_dict()
    assert not torch.equal(state["state_dict"]["fc.weight"], initial["fc.weight"])


# -- no silent wrong results ----------------------------------------------------------------------------
def test_a_diverging_run_stops_within_a_window_and_writes_nothing(tmp_path, capsys):
    code = cli_run(main, TINY + ["--data-backend", "synthetic", "--prof", "10", "-p", "1", "--epochs", "2",
                                 "--lr", "1e6", "--seed", "1", "--workspace", str(tmp_path)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 3
    assert len(err) == 1 and err[0].startswith("error: training diverged at epoch 1, iteration "), err
    assert not (tmp_path / "checkpoint.pth.tar").exists() and not (tmp_path / "model_best.pth.tar").exists()


def test_diverging_from_a_healthy_checkpoint_leaves_it_and_the_best_untouched(image_folder, tmp_path, capsys):
    common = ["--data-backend", "pytorch", "-j", "0", "--seed", "1"]
    assert train(image_folder, tmp_path, *common, "--epochs", "1") == 0
    saved = {name: (tmp_path / name).read_bytes() for name in ("checkpoint.pth.tar", "model_best.pth.tar")}
    capsys.readouterr()
    code = cli_run(main, TINY + common + ["--epochs", "3", "--lr", "1e6", "--resume",
                                          str(tmp_path / "checkpoint.pth.tar"), "--workspace", str(tmp_path),
                                          str(image_folder)])
    # Where it shows first depends on the CPU's kernels: the training loss, or the weights at validation.
    err = capsys.readouterr().err
    assert code == 3 and ("the training loss became nan" in err or "the weights hold NaN or inf" in err), err
    for name, content in saved.items():
        assert (tmp_path / name).read_bytes() == content, name


@pytest.mark.parametrize("adapts", [False, True])
def test_a_long_stretch_of_overflowing_steps_stops_the_run(adapts):
    """Gradients that always overflow: each step is skipped and counted, and after MAX_OVERFLOW_RUN of them
    in a row the run stops (the loss itself stays finite, so only the skipped steps can tell); at a fixed scale
    the message names the scale as the likelier cause, and the flags that change it."""
    from image_classification.train.engine import MAX_OVERFLOW_RUN

    class OverflowingGradient(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, grad):
            return grad * float("inf")

    class Overflowing(torch.nn.Module):
        def forward(self, x):
            return OverflowingGradient.apply(x)

    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4, 2), Overflowing())
    engine = make_engine(model, num_classes=2, loss_scale=128.0, dynamic_loss_scale=adapts)
    engine.scaler = torch.amp.GradScaler("cpu", init_scale=128.0, growth_interval=2**31 - 1)
    images, targets = torch.ones(2, 1, 2, 2), torch.tensor([0, 1])
    for _ in range(MAX_OVERFLOW_RUN - 1):
        engine.train_step(images, targets, accumulation=1, step_now=True)
    assert engine.read_window("a").loss > 0 and engine.progress.skipped_steps == MAX_OVERFLOW_RUN - 1
    for _ in range(MAX_OVERFLOW_RUN):
        engine.train_step(images, targets, accumulation=1, step_now=True)
    with pytest.raises(TrainingDiverged, match=f"skipped {2 * MAX_OVERFLOW_RUN - 1} optimizer steps in a row") as raised:
        engine.read_window("b")
    fixed = "at the fixed loss scale 128 (--static-loss-scale without --dynamic-loss-scale: lower it, or add " \
            "--dynamic-loss-scale); no checkpoint was written from these weights"
    assert (fixed in str(raised.value)) == (not adapts), raised.value
    assert adapts == ("(loss scale now " in str(raised.value))


def test_a_model_with_non_finite_validation_outputs_is_never_the_best(image_folder, tmp_path, capsys):
    """Finite weights whose BatchNorm variance went negative give NaN in eval: NaN logits would pick class 0
    and score its share of the images.  The validation gives no accuracy and no best model, says so in one
    line, and training (whose weights are finite) goes on; an evaluation of those weights ends with exit 3."""
    from image_classification.models import build_model

    torch.manual_seed(0)
    state = build_model("tiny", num_classes=3).state_dict()
    state["layer4.0.bn2.running_var"].fill_(-100.0)
    source = tmp_path / "broken.pth"
    torch.save(state, source)
    code = cli_run(main, TINY + ["--data-backend", "pytorch", "-j", "0", "--epochs", "1", "--lr", "0",
                                 "--pretrained-weights", str(source), "--workspace", str(tmp_path / "ws"),
                                 str(image_folder)])
    out = capsys.readouterr().out
    assert code == 0 and "after epoch 1: the outputs are NaN or inf for 12 of 12 val images although the " \
        "weights are finite" in out, out
    assert not (tmp_path / "ws" / "model_best.pth.tar").exists()
    records = read_raport(tmp_path / "ws" / "experiment_raport.json")
    epoch = next(r["data"] for r in records if r.get("step") == [0] and "val.not_finite" in r["data"])
    assert epoch["val.not_finite"] == 12 and "val.top1" not in epoch and "val.loss" not in epoch
    windows = [r["data"] for r in records if isinstance(r.get("step"), list) and len(r["step"]) == 3]
    assert windows and not any(key in window for window in windows for key in ("val.top1", "val.top3", "val.loss"))
    for line in (tmp_path / "ws" / "experiment_raport.json").read_text().splitlines():  # strict JSON: no NaN
        json.loads(line[len("DLLL "):], parse_constant=lambda name: pytest.fail(f"{name} in {line}"))
    assert "val.top1" not in summary(tmp_path / "ws" / "experiment_raport.json")
    code = cli_run(main, TINY + ["--data-backend", "pytorch", "-j", "0", "--evaluate", "--resume",
                                 str(tmp_path / "ws" / "checkpoint.pth.tar"), "--workspace", str(tmp_path / "ev"),
                                 str(image_folder)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 3 and len(err) == 1 and "outputs are NaN or inf for 12 of 12 val images" in err[0], err


def test_the_first_validated_epoch_gives_a_best_model_even_at_zero_top1(image_folder, tmp_path, monkeypatch):
    """The reference writes model_best only for top1 > 0; a run whose first epoch scores 0% left none,
    and the README's `--resume model_best.pth.tar` had nothing to load."""
    score_validations(monkeypatch, 0.0, 0.0)
    assert train(image_folder, tmp_path, "--data-backend", "pytorch", "-j", "0", "--epochs", "2") == 0
    best = torch.load(tmp_path / "model_best.pth.tar", map_location="cpu", weights_only=True)
    latest = torch.load(tmp_path / "checkpoint.pth.tar", map_location="cpu", weights_only=True)
    assert best["epoch"] == 1 and best["best_epoch"] == 0  # epoch 2 did not beat 0%: the best stays epoch 1's
    assert latest["epoch"] == 2 and latest["best_epoch"] == 0 and latest["epochs_without_improvement"] == 1


HOST_READS = ("item", "tolist", "__bool__", "cpu", "numpy", "__float__", "__int__")
RECIPE = ["--mixup", "0.2", "--cutmix", "1.0", "--random-erase", "0.25", "--label-smoothing", "0.1", "--use-ema",
          "0.9", "--optimizer-batch-size", "8", "--memory-format", "nhwc", "--checkpoint-interval", "60m"]
needs_dali = pytest.mark.skipif(not __import__("image_classification.data", fromlist=["x"]).dali_available(),
                                reason="needs NVIDIA DALI")


def expected_reads(steps: int, print_freq: int, accumulation: int, fp16: bool) -> str:
    """The loop's steps (s) and host reads (r): one per print window, and in fp16 one per optimizer step."""
    events = ""
    for step in range(1, steps + 1):
        events += "s" + ("r" if fp16 and step % accumulation == 0 else "")
        events += "r" if step % print_freq == 0 or step == steps else ""
    return events


@pytest.mark.parametrize("backend", ["synthetic", "pytorch", "pytorch-gpu", pytest.param("dali-cpu", marks=needs_dali)])
@pytest.mark.parametrize("precision, options", [
    ([], RECIPE), (["--amp", "--amp-dtype", "float16"], RECIPE),
    pytest.param(["--amp", "--amp-dtype", "bfloat16"], RECIPE, marks=pytest.mark.slow),
    pytest.param([], [], marks=pytest.mark.slow), pytest.param(["--amp", "--amp-dtype", "float16"], [],
                                                                marks=pytest.mark.slow),
])
def test_the_training_loop_reads_the_device_once_per_print_window(image_folder, tmp_path, monkeypatch, tiny_arch,
                                                                  backend, precision, options):
    """Between two print windows the training process never waits for the device: no Tensor.item/tolist/bool/cpu
    in any of its threads (the loop's, and pytorch-gpu's background thread) while an epoch trains, whatever the
    backend and the recipe: ``--augmentation`` (not on synthetic data), MixUp with CutMix, random erasing, label
    smoothing, EMA, accumulation, channels-last, an interval check.  On a GPU each read is a host-device
    synchronisation that stalls the queue of kernels; the one read per window is Engine.read_window's, and fp16
    adds one per optimizer step (every second micro-batch here): the loss scaler's inf flag.  CutMix's and random
    erasing's boxes are drawn on the host, from torch's CPU generator, and so are a pass's order and the
    DataLoader's seed; DALI's size-rule flags are a CPU output on every device: the reads inside ``cutmix_box``,
    ``erase_box``, the sampler's permutation, the DataLoader's start and ``dali.all_fit`` are of host tensors, not
    counted (the CPU twin of the GPU tests, which count CUDA's synchronisations, where those make none).  Loader
    workers are processes of their own: -j 1."""
    from torch.utils.data import DataLoader

    from image_classification.data.common import ShardSampler
    from image_classification.train import batch_augment
    from image_classification.train.engine import Engine
    from image_classification.train.loop import Loop as Trainer

    events: list[str] = []
    counting = [False]
    for name in HOST_READS:
        original = getattr(torch.Tensor, name)

        def counted(self, *args, _original=original, _name=name, **kwargs):
            if counting[0]:
                events.append(_name)
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counted)

    def uncounted(function):
        def call(*args, **kwargs):
            was, counting[0] = counting[0], False
            try:
                return function(*args, **kwargs)
            finally:
                counting[0] = was
        return call

    for host_draw in ("cutmix_box", "erase_box"):
        monkeypatch.setattr(batch_augment, host_draw, uncounted(getattr(batch_augment, host_draw)))
    # a pass's start on the host: the sampler's permutation and the DataLoader's seed, both drawn on the CPU
    monkeypatch.setattr(ShardSampler, "_permutation", uncounted(ShardSampler._permutation))
    monkeypatch.setattr(DataLoader, "__iter__", uncounted(DataLoader.__iter__))
    if backend.startswith("dali"):  # DALI's size-rule flags: a CPU output whatever the device
        from image_classification.data import dali

        monkeypatch.setattr(dali, "all_fit", uncounted(dali.all_fit))
    train_step, train_epoch = Engine.train_step, Trainer.train_epoch

    def step(self, *args, **kwargs):
        events.append("step")
        return train_step(self, *args, **kwargs)

    def epoch(self, *args, **kwargs):
        counting[0] = True
        try:
            return train_epoch(self, *args, **kwargs)
        finally:
            counting[0] = False

    monkeypatch.setattr(Engine, "train_step", step)
    monkeypatch.setattr(Trainer, "train_epoch", epoch)
    monkeypatch.setattr("image_classification.train.plan.check_backend", lambda *args, **kwargs: None)  # pytorch-gpu's twin
    data = ["--prof", "6"] if backend == "synthetic" else ["-j", "1", str(image_folder)]
    augmentation = ["--augmentation", "trivialaugment"] if options and backend != "synthetic" else []
    code = main(["--data-backend", backend, "-a", tiny_arch, "--num-classes", "3", "--image-size", "32", "-b", "4",
                 "--print-freq", "2", "--epochs", "1", "--training-only", "--no-checkpoints", "--device", "cpu",
                 "--workspace", str(tmp_path), *options, *augmentation, *precision, *data])
    assert code == 0
    windows = "".join("s" if event == "step" else "r" for event in events)
    fp16 = "float16" in precision
    assert windows == expected_reads(6, 2, 2 if options else 1, fp16), events


def test_jit_script_says_in_its_help_that_it_keeps_torchscript_which_torch_deprecates():
    """--jit script keeps the reference's meaning (TorchScript, for training and validation): the help says so,
    and names what serves the purposes torch.export and torch.compile took over."""
    from image_classification.arguments import build_parser

    (action,) = [a for a in build_parser()._actions if "--jit" in a.option_strings]
    words = " ".join(action.help.split())
    assert "scripted with TorchScript (torch.jit.script)" in words and "torch deprecates TorchScript" in words
    assert "--compile" in words and "torch.export" in words and action.choices == ("no", "script")
