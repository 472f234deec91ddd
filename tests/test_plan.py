"""Set-up: what a run decides from its flags before the first step."""

from __future__ import annotations

import pytest
import torch

from helpers import launch_on, refused, tiny_registered
from image_classification.arguments.precision import DEFAULT_LOSS_SCALE, PrecisionConfig

# What a run decides is the subject, not its model: the runs here train the tiny ResNet (conftest.py), in a
# fraction of ResNet-18's time.  launch.py's presets keep their models, and so do the runs that stop before
# they build one.
pytestmark = pytest.mark.usefixtures("tiny_arch")

FP16, BF16 = "float16", "bfloat16"  # the autocast dtypes, as the flags name them


@pytest.mark.parametrize("amp_dtype, static, dynamic, expected", [
    # --amp alone in fp16: dynamic, from torch's usual start (the reference's scaler was always dynamic too)
    (FP16, None, False, (DEFAULT_LOSS_SCALE, True)),
    (FP16, None, True, (DEFAULT_LOSS_SCALE, True)),
    (FP16, 128.0, True, (128.0, True)),  # the AMP presets: dynamic from 128
    (FP16, 256.0, False, (256.0, False)),  # asked for explicitly: fixed, and said so
])
def test_fp16_loss_scale_follows_the_flags(amp_dtype, static, dynamic, expected):
    scale, is_dynamic, notice = PrecisionConfig(static_loss_scale=static, dynamic_loss_scale=dynamic).choose_loss_scale(amp_dtype)
    assert (scale, is_dynamic) == expected
    assert (notice is not None) == (not is_dynamic)
    if notice:
        assert "fixed at 256" in notice and "--dynamic-loss-scale" in notice


@pytest.mark.parametrize("amp_dtype", [None, BF16])
def test_scale_flags_without_fp16_are_ignored_aloud(amp_dtype):
    assert PrecisionConfig().choose_loss_scale(amp_dtype)[2] is None
    for static, dynamic in ((128.0, False), (None, True)):
        notice = PrecisionConfig(static_loss_scale=static, dynamic_loss_scale=dynamic).choose_loss_scale(amp_dtype)[2]
        assert notice is not None and "ignored" in notice


def test_a_new_run_never_silently_replaces_the_run_in_its_workspace(tmp_path, capsys):
    """The second model's run in the same workspace stops with one line; --overwrite or --resume auto go on."""
    from image_classification.system.cli import run
    from image_classification.training import main

    def train(*extra):
        return run(main, ["--data-backend", "synthetic", "-a", "tiny", "--image-size", "32", "-b", "4",
                          "--prof", "1", "--epochs", "1", "--num-classes", "4", "--seed", "1", "--lr", "0.01",
                          "--workspace", str(tmp_path), *extra])

    assert train() == 0
    before = (tmp_path / "checkpoint.pth.tar").read_bytes()
    capsys.readouterr()
    assert train("--epochs", "2") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "already holds another run" in err[0] and "--resume auto" in err[0]
    assert (tmp_path / "checkpoint.pth.tar").read_bytes() == before
    assert train("--epochs", "2", "--resume", "auto") == 0
    assert train("--overwrite") == 0 and "replaces the one in" in capsys.readouterr().out


def test_a_new_run_never_silently_replaces_the_raport_in_its_workspace(tmp_path, capsys):
    """A run without checkpoints leaves only its raport: the next new run there, with or without checkpoints,
    stops with one line (before writing anything) instead of overwriting it; --overwrite replaces it, another
    --raport-file goes beside it, and --resume auto (a restart, with no checkpoint to continue) goes on."""
    from image_classification.system.cli import run
    from image_classification.training import main

    def train(seed: int, *extra):
        return run(main, ["--data-backend", "synthetic", "-a", "tiny", "--image-size", "32", "-b", "4",
                          "--prof", "1", "--epochs", "1", "--num-classes", "4", "--lr", "0.01", "--seed", str(seed),
                          "--workspace", str(tmp_path), *extra])

    raport = tmp_path / "experiment_raport.json"
    assert train(1, "--no-checkpoints") == 0
    before, files = raport.read_bytes(), sorted(tmp_path.iterdir())
    capsys.readouterr()
    for extra in (["--no-checkpoints"], []):
        assert refused(train(2, *extra), capsys) == (
            f"error: --raport-file {raport} already holds another run's records; give this run another "
            "--raport-file or a new --workspace, or pass --overwrite to replace them")
        assert raport.read_bytes() == before and sorted(tmp_path.iterdir()) == files
    assert train(2, "--no-checkpoints", "--raport-file", "second.json") == 0 and raport.read_bytes() == before
    assert train(2, "--no-checkpoints", "--resume", "auto") == 0
    capsys.readouterr()
    assert train(3, "--no-checkpoints", "--overwrite") == 0
    assert f"=> --overwrite: this run replaces the one in {tmp_path} (experiment_raport.json)" in capsys.readouterr().out
    assert '"seed": 3' in raport.read_text() and '"seed": 2' not in raport.read_text()


def test_a_preset_s_imagenet_class_count_gives_way_to_the_dataset_s(image_folder, monkeypatch):
    """launch.py's presets carry num_classes 1000, ImageNet's; on a 3-class dataset the folders decide."""
    from image_classification import launch

    seen = {}
    monkeypatch.setattr("image_classification.training.train", lambda args, **kw: seen.setdefault("args", args) and 0)
    preset = ["--model", "resnet50", "--precision", "FP32", "--mode", "convergence", "--platform", "CPU"]
    assert launch_on([*preset, str(image_folder)], False) == 0
    assert seen.pop("args").num_classes is None  # plan.py then takes the dataset's 3, and says so
    assert launch_on([*preset, "--num-classes", "1000", str(image_folder)], False) == 0
    assert seen["args"].num_classes == 1000  # typed: kept


def test_a_head_larger_than_the_dataset_is_said(image_folder, capsys):
    import argparse

    from image_classification.train.plan import resolve_num_classes

    args = argparse.Namespace(num_classes=1000, evaluate=True)
    assert resolve_num_classes(args, None, ["a", "b", "c"], print) == 1000
    assert "a 1000-class head for the dataset's 3 class folders" in capsys.readouterr().out


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A checkpoint of one short synthetic run (of the tiny ResNet: the tests resume it with ``-a tiny``)."""
    from image_classification.training import main

    workspace = tmp_path_factory.mktemp("trained")
    with tiny_registered():
        assert main(["--data-backend", "synthetic", "-a", "tiny", "--image-size", "32", "-b", "4",
                     "--prof", "1", "--epochs", "1", "--num-classes", "4", "--seed", "1", "--lr", "0.01",
                     "--workspace", str(workspace)]) == 0
    return workspace / "checkpoint.pth.tar"


def _crafted(trained, tmp_path, change) -> str:
    """The trained checkpoint with ``change`` applied and sealed again: its hash matches."""
    from image_classification.records import checkpoint as ckpt

    state = ckpt.load_checkpoint(trained)
    state.pop("sha256")
    change(state)
    path = tmp_path / "crafted.pth.tar"
    ckpt.save_checkpoint(state, path)
    return str(path)


@pytest.mark.parametrize("name, change", [
    ("image size", lambda s: s["preprocessing"].update(image_size=10**9)),
    ("crop ratio", lambda s: s["preprocessing"].update(crop_ratio=1e-9)),
    ("epoch", lambda s: s.update(epoch=-5)),
    ("seed", lambda s: s.update(seed=2**80)),
    ("random state", lambda s: s["rng"][0].update(numpy="garbage")),
])
def test_a_crafted_checkpoint_with_a_valid_hash_is_one_line(trained, tmp_path, capsys, name, change):
    from image_classification.system.cli import run
    from image_classification.training import main

    path = _crafted(trained, tmp_path, change)
    code = run(main, ["--data-backend", "synthetic", "-a", "tiny", "-b", "4", "--prof", "1", "--epochs", "3",
                      "--resume", path, "--workspace", str(tmp_path / "ws")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("error: "), err


def test_evaluate_normalises_and_crops_as_the_weights_recorded(trained, tmp_path):
    """--evaluate takes the checkpoint's mean, std and crop ratio, as classify.py does."""
    from image_classification.arguments import parse_args, raport_file
    from image_classification.records.workspace import Workspace
    from image_classification.system.runtime import make_runtime
    from image_classification.train.plan import resolve_run

    recorded = {"mean": [1.0, 2.0, 3.0], "std": [4.0, 5.0, 6.0], "crop_ratio": 0.5}
    path = _crafted(trained, tmp_path, lambda s: s["preprocessing"].update(recorded))
    args = parse_args(["--data-backend", "synthetic", "-a", "tiny", "-b", "4", "--evaluate", "--resume", path,
                       "--workspace", str(tmp_path / "ws")])
    plan = resolve_run(args, make_runtime("cpu"), Workspace(args.workspace, args.checkpoint_filename,
                                                               raport_file(args)), [], log=lambda *_: None)
    preprocessing = plan.data.preprocessing  # what the data backends read
    assert (preprocessing.mean, preprocessing.std, preprocessing.crop_ratio) == ((1.0, 2.0, 3.0), (4.0, 5.0, 6.0), 0.5)


def test_a_mixup_alpha_too_small_to_draw_is_refused_as_a_flag():
    from image_classification.arguments import parse_args
    from image_classification.errors import UserError

    with pytest.raises(UserError, match="argument --mixup: must be 0 or from 1.175e-38"):
        parse_args(["--mixup", "1e-320", "/data"])  # a subnormal in float32
    with pytest.raises(UserError, match="--mixup must be 0 .off. or at least 0.001"):
        parse_args(["--mixup", "1e-5", "/data"])
    assert parse_args(["--mixup", "0", "/data"]).mixup == 0 and parse_args(["--mixup", "0.2", "/data"]).mixup == 0.2


def test_installed_commands_name_themselves(capsys):
    """`ic-train -h` says ic-train, and `ic-launch --dry-run` prints a command that runs where it is installed."""
    from image_classification import launch
    from image_classification.system.cli import run
    from image_classification.training import main

    with pytest.raises(SystemExit):
        main(["-h"], prog="ic-train")
    assert capsys.readouterr().out.startswith("usage: ic-train ")
    assert launch_on(["--model", "resnet50", "--precision", "FP32", "--mode", "convergence", "--platform", "CPU",
                      "--dry-run"], False, prog="ic-launch") == 0
    commands = [line for line in capsys.readouterr().out.splitlines() if not line.startswith("#")]
    assert commands and all(line.startswith("ic-train ") for line in commands)


def test_torch_s_no_cuda_runtime_warning_is_not_printed():
    import logging

    import image_classification.system.runtime  # noqa: F401

    assert logging.getLogger("torch.utils.cpp_extension").getEffectiveLevel() >= logging.ERROR


@pytest.mark.parametrize("native", [False, True])
def test_amp_on_a_cpu_without_bf16_hardware_says_it_is_slower_once(monkeypatch, native):
    from image_classification.system import machine
    from image_classification.system.runtime import make_runtime

    monkeypatch.setattr(machine, "cpu_bf16_is_native", lambda: native)
    lines = []
    runtime = make_runtime("cpu", amp=True, log=lines.append)
    assert runtime.amp_dtype == torch.bfloat16
    assert sum("emulated" in line for line in lines) == (0 if native else 1)


@pytest.mark.parametrize("dali, backend", [(True, "dali-cpu"), (False, "pytorch")])
def test_a_run_without_data_backend_says_which_it_uses(dali, backend, image_folder, tmp_path, monkeypatch, capsys):
    """The default depends on whether DALI is installed: said at start-up, not only in the raport."""
    from image_classification.errors import UserError
    from image_classification.system.cli import run
    from image_classification.training import main

    def stop(*args, **kwargs):
        raise UserError("stopped here")

    monkeypatch.setattr("image_classification.data.dali_available", lambda: dali)
    monkeypatch.setattr("image_classification.train.plan.check_backend", lambda *args, **kwargs: None)
    monkeypatch.setattr("image_classification.train.plan.find_resume_checkpoint", stop)
    assert run(main, ["-a", "resnet18", "--device", "cpu", "--workspace", str(tmp_path), str(image_folder)]) == 2
    assert f"=> data backend: {backend}, the default " in capsys.readouterr().out
    assert run(main, ["-a", "resnet18", "--device", "cpu", "--data-backend", backend, "--workspace", str(tmp_path),
                      str(image_folder)]) == 2
    assert "data backend" not in capsys.readouterr().out  # asked for: nothing to say


@pytest.mark.parametrize("change", ["renamed", "removed"])
def test_a_resume_onto_class_folders_that_moved_is_refused_naming_them(image_folder, tmp_path, tiny_arch, capsys,
                                                                        change):
    """Labels follow the class folders' sorted names: renaming class_00 to class_zz (or removing it) gives every
    class another label, and each would train (or be scored on) another class's output.  The resume, and an
    evaluation, are refused in one line naming the classes that moved; --allow-class-changes goes on, said."""
    import shutil

    from image_classification.system.cli import run
    from image_classification.training import main

    data, workspace = tmp_path / "data", tmp_path / "ws"
    shutil.copytree(image_folder, data)
    common = ["-a", tiny_arch, "--data-backend", "pytorch", "-j", "0", "--image-size", "32", "-b", "4",
              "--prof", "1", "--num-classes", "3", "--workspace", str(workspace), str(data)]
    assert run(main, [*common, "--epochs", "1"]) == 0
    for split in ("train", "val"):
        if change == "renamed":
            (data / split / "class_00").rename(data / split / "class_zz")
        else:
            shutil.rmtree(data / split / "class_00")
    before = (workspace / "checkpoint.pth.tar").read_bytes()
    capsys.readouterr()
    evaluate = ["--evaluate", "--resume", str(workspace / "checkpoint.pth.tar"), "--workspace", str(tmp_path / "eval")]
    for extra in (["--epochs", "2", "--resume", "auto"], evaluate):
        line = refused(run(main, [*common, *extra]), capsys)
        assert "class_01 from label 1 to 0" in line and "class_02 from label 2 to 1" in line, line
        assert ("class_zz (new) at class_02's label 2" in line) == (change == "renamed"), line
        assert "class_00 is gone" in line, line
        assert "--allow-class-changes" in line
    assert (workspace / "checkpoint.pth.tar").read_bytes() == before
    assert run(main, [*common, "--epochs", "2", "--resume", "auto", "--allow-class-changes"]) == 0
    assert "=> --allow-class-changes: " in capsys.readouterr().out


# -- the learning rate of a plain run ---------------------------------------------------------------
@pytest.mark.parametrize("global_batch, expected", [(256, 0.1), (32, 0.0125), (1024, 0.4)])
def test_without_lr_the_rate_is_0_1_per_256_images_of_the_global_batch(global_batch, expected):
    """timm's --lr-base 0.1 at --lr-base-size 256, and the reference's lr 0.1 at its -b 256: a plain run at -b 32
    no longer trains at 8 times the reference's default rate per image."""
    from image_classification.arguments import resolve_lr

    lr, line = resolve_lr(None, None, global_batch, optimizer="sgd", warmup=0)
    assert lr == pytest.approx(expected)
    assert line == (f"=> learning rate {expected:g}: 0.1 per 256 images of the global batch of {global_batch} (the "
                    "linear scaling rule; --lr sets another)")


def test_a_given_sgd_rate_far_above_the_reference_s_per_image_without_warm_up_is_said_in_one_line():
    """--lr 0.1 at -b 32 is 0.0031 per image, 3.1x the reference's 0.001 (0.256 per 256), and without a warm-up
    such a run lost its first epoch; the line says so and what to do.  Within twice the reference's rate, with a
    warm-up, or with another optimizer (whose rates are on other scales) nothing is said; a given rate is kept."""
    from image_classification.arguments import resolve_lr

    lr, line = resolve_lr(0.1, None, 32, optimizer="sgd", warmup=0)
    assert lr == 0.1
    assert line == ("=> --lr 0.1 is 0.0031 per image of the global batch of 32, 3.1x the reference's 0.001, with no "
                    "--warmup: the first epoch may diverge; leave --lr out for 0.0125 (0.1 per 256 images), or add "
                    "--warmup E (epoch e < E trains at (e + 1) / E of the rate)")
    assert resolve_lr(0.1, None, 64, optimizer="sgd", warmup=0) == (0.1, None)  # 1.6x
    assert resolve_lr(0.1, None, 32, optimizer="sgd", warmup=1) == (0.1, None)
    assert resolve_lr(0.1, None, 32, optimizer="adamw", warmup=0) == (0.1, None)
    assert resolve_lr(2.048, None, 2048, optimizer="sgd", warmup=0) == (2.048, None)  # the reference's rate itself


def test_a_plain_run_scales_its_rate_to_the_global_batch_and_says_so(tmp_path, capsys):
    """Every process and every accumulated micro-batch counts: -b 4 with --optimizer-batch-size 8 trains at
    0.1 x 8 / 256, and the raport records that rate."""
    import json

    from image_classification.system.cli import run
    from image_classification.training import main

    assert run(main, ["--data-backend", "synthetic", "-a", "tiny", "--image-size", "32", "-b", "4",
                      "--optimizer-batch-size", "8", "--prof", "2", "--epochs", "1", "--num-classes", "4", "--seed",
                      "1", "--no-checkpoints", "--workspace", str(tmp_path)]) == 0
    assert "=> learning rate 0.003125: 0.1 per 256 images of the global batch of 8" in capsys.readouterr().out
    records = [json.loads(line.split(" ", 1)[1]) for line in (tmp_path / "experiment_raport.json").open()]
    parameters = next(record["data"] for record in records if record["step"] == "PARAMETER")
    assert parameters["lr"] == 0.003125
    lrs = [record["data"]["train.lr"] for record in records if "train.lr" in record.get("data", {})]
    assert lrs and set(lrs) == {0.003125}


def test_a_warm_up_as_long_as_the_run_and_a_resume_with_other_epochs_are_said():
    """A preset's 8 warm-up epochs over --epochs 2 never reach --lr; a resume with more --epochs than the
    checkpoint's run stretches the schedule: the rate the next epoch starts at, against the old schedule's."""
    from helpers import run_config
    from image_classification.train.plan import schedule_notices

    short = run_config(epochs=2, warmup=8, lr=0.5, lr_schedule="cosine")
    (line,) = schedule_notices(short, None)
    assert line.startswith("=> --warmup 8 is as long as --epochs 2") and "never reaches --lr 0.5" in line
    longer = run_config(epochs=8, lr=0.4, lr_schedule="cosine")
    (line,) = schedule_notices(longer, {"epoch": 4, "epochs": 4})
    assert line.startswith("=> --epochs 8, where the checkpoint's run had 4: the cosine schedule now spans 8 epochs")
    assert f"epoch 5 starts at lr {longer.lr_at(4):.6g} (at 0 in the 4-epoch schedule)" in line
    assert schedule_notices(longer, {"epoch": 4, "epochs": 8}) == [] == schedule_notices(longer, {"epoch": 4})


def test_a_fine_tune_at_another_size_than_its_weights_were_trained_at_says_so():
    from image_classification.models.preprocessing import Preprocessing
    from image_classification.train.plan import fine_tune_notice

    weights = {"state_dict": {}, "arch": "resnet18", "preprocessing": Preprocessing(32).to_dict()}
    line = fine_tune_notice(weights, Preprocessing(224), "w.pth")
    assert line == ("=> w.pth were trained on 32 px crops; this fine-tune trains on 224 px crops (--image-size or "
                    "--train-crop-size sets another)")
    assert fine_tune_notice(weights, Preprocessing(32), "w.pth") is None
    assert fine_tune_notice({"state_dict": {}}, Preprocessing(224), "w.pth") is None  # NGC's: nothing recorded


def test_a_batch_larger_than_the_training_set_is_refused_naming_the_batch_that_fits(image_folder, tmp_path, capsys):
    from image_classification.system.cli import run
    from image_classification.training import main

    argv = ["-a", "tiny", "--device", "cpu", "--epochs", "1", "--image-size", "32", "-j", "0",
            "--workspace", str(tmp_path), str(image_folder)]
    line = refused(run(main, argv), capsys)  # -b 256 over 24 training images
    assert line == "error: train/ holds 24 images, fewer than one batch of 256 per process: lower -b/--batch-size; " \
                   "-b 16 fits"
