"""CUDA paths; run on a GPU machine with ``python -m pytest -m gpu``."""

from pathlib import Path

import numpy as np
import pytest
import torch

from helpers import run_config
from image_classification.records.raport import read_raport
from image_classification.train import engine as engine_module
from image_classification.training import main
from test_optim import assert_resumes_across_layouts

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
    # 20 steps at lr 0.05 leave BatchNorm's running statistics far from the weights: in fp16 the evaluation
    # may overflow (640 of 640 outputs on an H100), which must give no accuracy rather than stop the run
    epoch = next(r["data"] for r in records if r.get("step") == [0] and "val.compute_latency" in r["data"])
    if "val.top1" in epoch:
        assert 0 <= epoch["val.top1"] <= 100 and "val.not_finite" not in epoch
    else:
        assert dtype == torch.float16 and epoch["val.not_finite"] > 0 and "val.top1" not in data
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


@pytest.mark.parametrize("name", ["sgd", "adamw"])
@pytest.mark.parametrize("written_in, resumed_in", [(torch.contiguous_format, torch.channels_last),
                                                    (torch.channels_last, torch.contiguous_format)])
def test_cuda_s_fused_kernels_resume_a_state_written_in_another_layout(name, written_in, resumed_in):
    """CUDA's fused SGD and AdamW stop at a state whose strides are not its parameter's; the resumed state
    takes them, and steps as a same-layout resume (the CPU twin: test_optim)."""
    assert_resumes_across_layouts(name, written_in, resumed_in, device="cuda")


def a_jpeg(path: Path) -> Path:
    """A JPEG to classify: random pixels, as good as a photograph for random weights (and without
    scikit-image, which a GPU machine may lack)."""
    from PIL import Image

    Image.fromarray(np.random.default_rng(0).integers(0, 256, (300, 400, 3), dtype=np.uint8)).save(path)
    return path


def test_classify_on_cuda(tmp_path, capsys):
    from image_classification.deploy.inference import main as classify_main
    from image_classification.system.cli import run

    photo = a_jpeg(tmp_path / "photo.jpg")
    assert run(classify_main, ["--device", "cuda", "--precision", "AMP", "--image", str(photo), "--json"]) == 0
    assert '"predictions"' in capsys.readouterr().out


def test_onnx_export_on_a_cuda_machine(tmp_path):
    pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    from image_classification.deploy.export import model2onnx_main
    from image_classification.system.cli import run

    assert run(model2onnx_main, ["-a", "resnet18", "--output", str(tmp_path / "m.onnx"), "-b", "2",
                                 "--image-size", "64"]) == 0


TINY = ["-a", "resnet18", "--image-size", "32", "-b", "8", "--seed", "1", "--num-classes", "10"]


def test_an_fp16_scale_grows_during_a_run_that_never_overflows(tmp_path):
    """--amp alone scales dynamically: from 1, 110 clean steps double it once (growth every 100)."""
    args = TINY + ["--data-backend", "synthetic", "--device", "cuda", "--amp", "--dynamic-loss-scale",
                   "--static-loss-scale", "1", "--prof", "110", "-p", "110", "--epochs", "1", "--training-only",
                   "--workspace", str(tmp_path)]
    assert main(args) == 0
    state = torch.load(tmp_path / "checkpoint.pth.tar", weights_only=True)
    assert state["scaler"]["scale"] == 2.0 and state["skipped_steps"] == 0


def test_the_cuda_prefetcher_gives_the_cpu_path_s_batches_bitwise(image_folder):
    """Pinned memory, a side stream and record_stream change where the work runs, not one bit of it."""
    from image_classification.data import DataConfig, get_loaders
    from image_classification.system.runtime import Runtime

    config = DataConfig(str(image_folder), "pytorch", image_size=32, batch_size=4, workers=2, seed=3)
    batches = {}
    for device in ("cpu", "cuda"):
        runtime = Runtime(torch.device(device, 0) if device == "cuda" else torch.device(device), None,
                          torch.channels_last)
        train, val = get_loaders(config, runtime, want_train=True, want_val=True)
        batches[device] = []
        for loader in (train, val):
            loader.set_epoch(1)
            batches[device] += [(images.cpu(), targets.cpu()) for images, targets in loader]
    assert len(batches["cpu"]) == len(batches["cuda"]) > 2
    for (a, la), (b, lb) in zip(batches["cpu"], batches["cuda"]):
        assert torch.equal(a, b) and torch.equal(la, lb)
        assert b.is_contiguous(memory_format=torch.channels_last)


def test_the_cuda_prefetcher_keeps_one_side_stream_for_every_pass(image_folder, monkeypatch):
    """Three passes of the pytorch backend's loader make one side stream, whose cached blocks every pass reuses
    (the CPU twin: tests/test_data_files.py)."""
    from image_classification.data import DataConfig, get_loaders
    from image_classification.system.runtime import Runtime

    from image_classification.data.common import SideStream

    made = []  # the side streams the loader makes: torch's own calls (current_stream, ...) are not counted
    making = SideStream.__init__

    def counted(self, device):
        making(self, device)
        made.append(self.stream)

    monkeypatch.setattr(SideStream, "__init__", counted)
    config = DataConfig(str(image_folder), "pytorch", image_size=32, batch_size=4, workers=0, seed=3)
    train, _ = get_loaders(config, Runtime(torch.device("cuda", 0), None, torch.contiguous_format),
                           want_train=True, want_val=False)
    for epoch in range(3):
        train.set_epoch(epoch)
        assert sum(len(targets) for _, targets in train) > 0
    assert len(made) == 1 and isinstance(made[0], torch.cuda.Stream)


def test_dali_gpu_trains_and_validates_on_a_jpeg_folder(image_folder, tmp_path):
    pytest.importorskip("nvidia.dali")
    args = TINY + ["--data-backend", "dali-gpu", "--num-classes", "3", "--epochs", "2", "-p", "1",
                   "--workspace", str(tmp_path), str(image_folder)]
    assert main(args) == 0
    data = _summary(read_raport(tmp_path / "experiment_raport.json"))
    assert 0 <= data["val.top1"] <= 100 and data["val.loss"] == data["val.loss"]


def test_dali_gpu_crops_depend_on_the_epoch_and_position_alone(image_folder):
    """As on dali-cpu (nvJPEG's cropping decoder draws from the fed states too): a pipeline that has made a
    whole epoch and one built to start an epoch part-way, as a resume does, give bitwise the same batches."""
    pytest.importorskip("nvidia.dali")
    from image_classification.data import DataConfig, get_loaders
    from image_classification.system.runtime import Runtime

    config = DataConfig(str(image_folder), "dali-gpu", image_size=32, batch_size=4, workers=2, seed=3)
    runtime = Runtime(torch.device("cuda", 0), None, torch.channels_last)
    straight = get_loaders(config, runtime, want_train=True, want_val=False)[0]
    straight.set_epoch(0)
    assert sum(1 for _ in straight) == 6
    straight.set_epoch(1)
    expected = [(images.cpu(), targets.cpu()) for images, targets in straight]
    resumed = get_loaders(config, runtime, want_train=True, want_val=False)[0]
    resumed.set_epoch(1, start_batch=2)
    batches = [(images.cpu(), targets.cpu()) for images, targets in resumed]
    assert len(batches) == 4
    for (images, targets), (ref_images, ref_targets) in zip(batches, expected[2:], strict=True):
        assert torch.equal(targets, ref_targets) and torch.equal(images, ref_images)


def test_a_one_process_nccl_ddp_run_with_amp_and_accumulation(monkeypatch):
    """DDP's path (bucket views, no_sync on accumulation steps, the window's all-reduce) on a real NCCL
    group of one, against the same steps without DDP."""
    import copy

    import torch.distributed as dist

    from image_classification.models import build_model
    from image_classification.models.preprocessing import Preprocessing
    from image_classification.system.runtime import Runtime
    from image_classification.train.engine import Engine

    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29533")
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda", 0))
    try:
        config = run_config(arch="resnet18", num_classes=10, model_options=(), preprocessing=Preprocessing(32),
                           accumulation=2, lr=0.05)
        torch.manual_seed(0)
        model = build_model("resnet18", num_classes=10).cuda()
        twin = copy.deepcopy(model)
        generator = torch.Generator(device="cuda").manual_seed(0)
        batches = [(torch.randn(8, 3, 32, 32, device="cuda", generator=generator),
                    torch.randint(0, 10, (8,), device="cuda", generator=generator)) for _ in range(4)]
        losses = {}
        for name, net, joined in (("ddp", model, True), ("plain", twin, False)):
            runtime = Runtime(torch.device("cuda", 0), torch.float16, torch.contiguous_format,
                              process_group=joined)
            engine = Engine(config, runtime, net, log=lambda *_: None)
            assert isinstance(engine.model, torch.nn.parallel.DistributedDataParallel) == joined
            for index, (images, targets) in enumerate(batches):
                engine.train_step(images, targets, accumulation=2, step_now=index % 2 == 1)
            losses[name] = engine.read_window("the test").loss
            assert engine.progress.optimizer_steps == 2
        assert losses["ddp"] == pytest.approx(losses["plain"], rel=1e-3)
        for a, b in zip(model.state_dict().values(), twin.state_dict().values()):
            if a.is_floating_point():
                torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-4)
    finally:
        dist.destroy_process_group()


def test_compiled_training_on_cuda_and_classify_of_its_checkpoint(tmp_path, capsys):
    from image_classification.deploy.inference import main as classify_main
    from image_classification.system.cli import run

    args = TINY + ["--data-backend", "synthetic", "--device", "cuda", "--compile", "--amp", "--prof", "6",
                   "--epochs", "1", "--workspace", str(tmp_path)]
    assert main(args) == 0
    photo = a_jpeg(tmp_path / "photo.jpg")
    assert run(classify_main, ["--device", "cuda", "--weights", str(tmp_path / "checkpoint.pth.tar"),
                               "--image", str(photo), "--json"]) == 0
    assert '"predictions"' in capsys.readouterr().out


def test_a_cpu_checkpoint_resumes_on_cuda_and_evaluates_alike(image_folder, tmp_path, capsys):
    """At the default lr 0.1, three steps leave BatchNorm's running statistics (three momentum updates from
    mean 0, variance 1) so far from the weights that each eval-mode block multiplies its input's size about
    tenfold: a val loss of 4.1e9, where two devices' rounding differs by more than any tolerance means.  At
    lr 0.01 the model evaluates as trained (a val loss near 1), and the comparison says something."""
    cpu_run = TINY + ["--data-backend", "pytorch", "--num-classes", "3", "--epochs", "1", "--device", "cpu",
                      "--lr", "0.01", "--workspace", str(tmp_path / "cpu"), str(image_folder)]
    assert main(cpu_run) == 0
    checkpoint = str(tmp_path / "cpu" / "checkpoint.pth.tar")
    results = {}
    for device in ("cpu", "cuda"):
        evaluate = TINY + ["--data-backend", "pytorch", "--num-classes", "3", "--device", device, "--evaluate",
                           "--resume", checkpoint, "--no-tf32", "--workspace", str(tmp_path / f"eval-{device}"),
                           str(image_folder)]
        assert main(evaluate) == 0
        results[device] = _summary(read_raport(tmp_path / f"eval-{device}" / "experiment_raport.json"))
    assert results["cpu"]["val.loss"] < 10  # a model whose evaluation is well conditioned (see above)
    assert results["cuda"]["val.top1"] == results["cpu"]["val.top1"]
    assert results["cuda"]["val.loss"] == pytest.approx(results["cpu"]["val.loss"], rel=1e-4, abs=1e-4)
    resumed = TINY + ["--data-backend", "pytorch", "--num-classes", "3", "--epochs", "2", "--device", "cuda",
                      "--resume", checkpoint, "--workspace", str(tmp_path / "cuda"), str(image_folder)]
    assert main(resumed) == 0
    assert torch.load(tmp_path / "cuda" / "checkpoint.pth.tar", weights_only=True)["epoch"] == 2


@pytest.mark.parametrize("precision, reads_per_step", [([], 0), (["--amp"], 1), (["--amp", "--amp-dtype", "bfloat16"], 0)])
def test_no_host_sync_between_print_windows_on_cuda(tmp_path, monkeypatch, precision, reads_per_step):
    """CUDA's sync debug mode warns at any synchronisation inside the training steps (the windows' reads are
    outside them): none in FP32 and bf16; in fp16 (--amp) one per optimizer step, the read of the loss
    scaler's inf flag that decides whether the step is taken.  MixUp with CutMix, random erasing, label
    smoothing, the EMA, channels-last and accumulation (an optimizer step every second micro-batch) included."""
    from helpers import count_step_syncs

    syncs = count_step_syncs(monkeypatch)
    args = TINY + ["--data-backend", "synthetic", "--device", "cuda", "--prof", "8", "-p", "4", "--epochs", "1",
                   "--mixup", "0.2", "--cutmix", "1.0", "--random-erase", "0.25", "--use-ema", "0.9",
                   "--label-smoothing", "0.1", "--memory-format", "nhwc", "--optimizer-batch-size", "16",
                   "--training-only", "--no-checkpoints", "--workspace", str(tmp_path)] + precision
    assert main(args) == 0
    expected = [reads_per_step * (step % 2 == 1) for step in range(8)]  # -b 8 in TINY: steps at 2, 4, 6, 8
    assert syncs[1:] == expected[1:], syncs  # the first step may set things up


def test_a_cuda_checkpoint_is_copied_to_the_host_once(tmp_path, monkeypatch):
    """Hashing and torch.save read one pinned host copy: no tensor is copied from the GPU twice."""
    from image_classification.records import checkpoint as ckpt

    state = {"a": torch.randn(64, 64, device="cuda"), "nested": [torch.ones(3, device="cuda"), 1.5],
             "host": torch.zeros(2)}
    device_to_host = []
    for name in ("to", "cpu", "copy_"):
        original = getattr(torch.Tensor, name)

        def counted(self, *args, _original=original, _name=name, **kwargs):
            result = _original(self, *args, **kwargs)
            source = args[0] if _name == "copy_" else self
            if isinstance(source, torch.Tensor) and source.is_cuda and not result.is_cuda:
                device_to_host.append(_name)
            return result

        monkeypatch.setattr(torch.Tensor, name, counted)
    ckpt.save_checkpoint(state, tmp_path / "c.pth.tar")
    monkeypatch.undo()
    assert device_to_host == ["copy_", "copy_"]
    loaded = ckpt.load_checkpoint_file(tmp_path / "c.pth.tar")  # any dict: load_checkpoint wants a training one
    assert torch.equal(loaded["a"], state["a"].cpu())


@pytest.mark.parametrize("backend", ["pytorch-gpu", "dali-gpu", "dali-cpu", "pytorch"])
def test_progressive_resize_on_cuda_follows_the_schedule_in_fp16_channels_last(backend, image_folder, tmp_path):
    """Every backend on CUDA with fp16 autocast and channels-last: each epoch's crops are the schedule's size,
    in the asked layout, and the run says each change (test_progressive_resize.py holds the CPU twins)."""
    if backend.startswith("dali"):
        pytest.importorskip("nvidia.dali")
    sizes = []
    original = engine_module.Engine.train_step

    def recording_step(self, images, targets, **kwargs):
        sizes.append((images.shape[-1], images.is_cuda, images.is_contiguous(memory_format=torch.channels_last)))
        return original(self, images, targets, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(engine_module.Engine, "train_step", recording_step)
        assert main(["-a", "resnet18", "--device", "cuda", "--data-backend", backend, "-b", "4", "-j", "2",
                     "--num-classes", "3", "--epochs", "3", "--seed", "1", "--amp", "--memory-format", "nhwc",
                     "--progressive-resize", "32", "64", "0", "2", "--val-crop-size", "48", "--val-tta", "flip",
                     "--workspace", str(tmp_path), str(image_folder)]) == 0
    per_epoch = len(sizes) // 3
    assert [size for size, _, _ in sizes[::per_epoch]] == [32, 64, 64]
    assert all(on_cuda and channels_last for _, on_cuda, channels_last in sizes)
    epochs = [r["data"] for r in read_raport(tmp_path / "experiment_raport.json")
              if r.get("step") in ([0], [1], [2]) and "train.image_size" in r["data"]]
    assert [epoch["train.image_size"] for epoch in epochs] == [32, 64, 64]
