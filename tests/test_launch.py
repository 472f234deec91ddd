"""launch.py and configs.yml: preset resolution, overrides, what --dry-run says this machine makes of a run."""

from __future__ import annotations

import argparse
import itertools
import os
import re
import shlex
import subprocess
import sys
import threading
from typing import NamedTuple, Sequence

import pytest
import yaml

from helpers import REPO, launch_on, refused, run_script
from image_classification import launch
from image_classification.arguments import (build_parser as build_main_parser, parse_args, preset_tokens,
                                            resolve_lr)
from image_classification.arguments.described import VALUES_HEADER
from image_classification.errors import UserError
from image_classification.system import machine
from image_classification.system.cli import run

CONFIG = launch.load_config(REPO / "configs.yml")
MODES = list(CONFIG["mode"])
COMBINATIONS = [
    (model, platform, precision)
    for model, platforms in CONFIG["models"].items()
    for platform, precisions in platforms.items()
    for precision in precisions
]
MODELS = list(CONFIG["models"])


def presets_of(model: str) -> list[tuple[str, str]]:
    """The (platform, precision) pairs configs.yml has for ``model``: a test per model checks each in turn
    (a test per preset, over a thousand of them, cost more in pytest's bookkeeping than in the checks)."""
    return [(platform, precision) for name, platform, precision in COMBINATIONS if name == model]


class DryRun(NamedTuple):
    """What ``launch.py --dry-run`` printed: the preset as written, what this machine makes of it (the line after
    "# on this machine: " and the notes under it), and the class count the run will use."""

    written: argparse.Namespace
    host: str
    notes: list[str]
    text: str
    classes: str


def _main_py(line: str) -> argparse.Namespace:
    assert line.startswith("python main.py "), line
    return parse_args(shlex.split(line)[2:])


def _launch(argv: list[str], cuda_available: bool = True) -> int:
    return launch_on(argv, cuda_available)


def _dry_run(argv: list[str], capsys, cuda_available: bool = True, notes: Sequence[str] = ()) -> DryRun:
    """Run ``launch.py ... --dry-run`` and read back what it prints, all on stdout (stderr: ``notes``)."""
    assert _launch([*argv, "--dry-run"], cuda_available) == 0
    out, err = capsys.readouterr()
    assert err.splitlines() == list(notes)
    out = out.split(VALUES_HEADER)[0]  # every value's source: test_the_dry_run_says_where_every_value_...
    lines = out.splitlines()
    title = next(index for index, line in enumerate(lines) if line.startswith("# ") and "as written" in line)
    assert lines[title + 2].startswith("# on this machine: "), out
    classes = lines.pop()
    assert classes.startswith("# classes: "), out
    below = [line.removeprefix("#   ") for line in lines[title + 3:]]
    assert all(line.startswith("#   ") for line in lines[title + 3:]), out
    return DryRun(_main_py(lines[title + 1]), lines[title + 2].removeprefix("# on this machine: "), below, out,
                  classes)


# ------------------------------------------------------------------------------------------------
# The presets
# ------------------------------------------------------------------------------------------------
def test_the_file_holds_the_reference_presets_and_ours():
    assert set(CONFIG["models"]) == {"resnet50", "resnext101-32x4d", "se-resnext101-32x4d", "efficientnet-b0",
                                     "efficientnet-b4", "efficientnet-widese-b0", "efficientnet-widese-b4"}
    assert set(CONFIG["precision"]) == {"AMP", "BF16", "TF32", "FP32"}
    assert set(CONFIG["platform"]) == {"DGX1V", "DGX1V-16G", "DGX1V-32G", "DGX2V", "DGXA100", "DGXH100", "T4",
                                       "CPU"}
    assert set(MODES) == {"benchmark_training", "benchmark_training_short", "benchmark_inference",
                          "convergence", "evaluate"}
    assert set(CONFIG["models"]["resnet50"]["DGXH100"]) == {"AMP", "BF16", "TF32"}
    assert set(CONFIG["models"]["se-resnext101-32x4d"]["CPU"]) == {"AMP", "FP32"}
    for model in ("efficientnet-b0", "efficientnet-b4", "efficientnet-widese-b0", "efficientnet-widese-b4"):
        assert {platform: set(precisions) for platform, precisions in CONFIG["models"][model].items()} == {
            "T4": {"AMP", "FP32"}, "DGX1V-16G": {"AMP", "FP32"}, "DGX1V-32G": {"AMP", "FP32"},
            "DGXA100": {"AMP", "TF32", "FP32"}, "DGXH100": {"AMP", "BF16", "TF32"}, "CPU": {"AMP", "FP32"}}
    assert len(COMBINATIONS) == 17 + 15 + 15 + 4 * 14


@pytest.mark.parametrize("model", MODELS)
def test_every_preset_resolves_and_reaches_main_py(model):
    for platform, precision in presets_of(model):
        for mode in MODES:
            preset = launch.resolve(model, precision, mode, platform, REPO / "configs.yml")
            args = parse_args(["/imagenet"], defaults=preset)
            for key, value in preset.items():
                assert getattr(args, key) == value, (model, platform, precision, mode, key)
            assert args.arch == model, (platform, precision, mode)
            # the dry-run command line reproduces the run exactly
            assert parse_args(launch.main_py_argv(args, preset)) == args, (platform, precision, mode)


# main.py's defaults as the reference had them (its README's main.py -h, with our additions at their off values):
# written out here, not read from the code, so that a plain run's defaults may change and the presets may not.
# model_config None is the reference's classic: the ResNets' default, unset so that an EfficientNet is not given it.
REFERENCE_MAIN_DEFAULTS = {
    "data": None, "data_backend": None, "workers": 5, "prefetch": 2, "image_size": None, "train_crop_size": None,
    "val_resize_size": None, "val_crop_size": None, "interpolation": None, "augmentation": None,
    "randaugment_magnitude": None, "randaugment_num_ops": None, "random_erase": 0.0, "ra_reps": 1,
    "crop_scale": (0.08, 1.0), "hflip": 0.5, "arch": "resnet50", "model_config": None, "num_classes": None,
    "conv_init": None, "last_bn_0_init": False, "pretrained_weights": None, "jit": "no", "compile": False,
    "epochs": 90, "run_epochs": -1, "early_stopping_patience": -1, "batch_size": 256, "optimizer_batch_size": -1,
    "optimizer": "sgd", "lr": 0.1, "lr_batch": None, "lr_schedule": "step", "end_lr": 0.0, "warmup": 0, "label_smoothing": 0.0,
    "mixup": 0.0, "cutmix": 0.0, "mixup_switch_prob": None, "momentum": 0.9, "weight_decay": 0.0001,
    "bn_weight_decay": False, "norm_weight_decay": None, "bias_weight_decay": None, "nesterov": False,
    "rmsprop_alpha": 0.9, "rmsprop_eps": 0.001, "use_ema": None, "model_ema": False, "model_ema_decay": None,
    "model_ema_steps": None, "model_ema_warmup": False, "device": "auto", "amp": False, "amp_dtype": None,
    "static_loss_scale": None, "dynamic_loss_scale": False, "tf32": True, "memory_format": "nchw",
    "gpu_affinity": "none", "dist_timeout": 300.0, "runtime": "torch", "quantize": None, "calibration_data": None,
    "calibration_images": None, "calibration_method": None, "seed": None, "print_freq": 10, "prof": -1,
    "benchmark_warmup": 0, "evaluate": False, "training_only": False, "topk": None, "resume": None,
    "workspace": "./", "checkpoint_filename": "checkpoint.pth.tar", "overwrite": False, "save_checkpoints": True,
    "checkpoint_interval": None, "gather_checkpoints": 0, "raport_file": None, "tensorboard": None,
}
RECIPES = [None, *CONFIG.get("recipes", {})]


def _as_lists(namespace: argparse.Namespace) -> dict:
    return {key: list(value) if isinstance(value, tuple) else value for key, value in vars(namespace).items()}


# every preset without a recipe, and every recipe over a GPU's and the CPU's preset (a recipe sets the same values
# over each; the recipes' own values are held against FFCV's below)
def presets_and_recipes(model: str) -> list[tuple[str, str, str | None]]:
    """Each preset of ``model`` without a recipe, and with every recipe over a GPU's and the CPU's preset."""
    return [(platform, precision, None) for platform, precision in presets_of(model)] + [
        (platform, precision, recipe) for recipe in RECIPES[1:] for platform, precision in presets_of(model)
        if (model, platform, precision) in (("resnet50", "DGXA100", "AMP"), ("resnet50", "CPU", "FP32"))]


@pytest.mark.parametrize("model", MODELS)
def test_every_preset_resolves_as_it_did_over_the_reference_main_py_defaults(model, monkeypatch):
    """A plain main.py run's defaults are not the reference's (the learning rate, the last BatchNorm), but
    every preset, with or without a recipe, is the run it was: its values over the reference's defaults."""
    reference = build_main_parser()
    reference.set_defaults(**REFERENCE_MAIN_DEFAULTS)
    for (platform, precision, recipe), mode in itertools.product(presets_and_recipes(model), MODES):
        preset = launch.resolve(model, precision, mode, platform, REPO / "configs.yml", recipe=recipe)
        with monkeypatch.context() as patch:  # the presets file's values alone
            patch.setattr(launch, "REFERENCE_DEFAULTS", {})
            in_file = launch.resolve(model, precision, mode, platform, REPO / "configs.yml", recipe=recipe)
        written = [token for key, value in in_file.items() for token in preset_tokens(reference, key, value)]
        expected = _as_lists(reference.parse_args(written))
        args = _as_lists(parse_args([], defaults=preset, require_data=False))
        assert {key: args[key] for key in REFERENCE_MAIN_DEFAULTS} == \
            {key: expected[key] for key in REFERENCE_MAIN_DEFAULTS}, (model, platform, precision, mode, recipe)


@pytest.mark.parametrize("model", MODELS)
def test_global_batch_is_reachable_with_8_processes(model):
    for platform, precision in presets_of(model):
        preset = launch.resolve(model, precision, "convergence", platform, REPO / "configs.yml")
        global_batch = preset.get("optimizer_batch_size", -1)
        if global_batch > 0:
            assert global_batch % (8 * preset["batch_size"]) == 0, (platform, precision)


def test_reference_values():
    def preset(model, precision, platform, mode="convergence"):
        return launch.resolve(model, precision, mode, platform, REPO / "configs.yml")

    amp = preset("resnet50", "AMP", "DGX1V")
    assert (amp["batch_size"], amp["optimizer_batch_size"], amp["lr"], amp["weight_decay"]) == \
        (256, 2048, 2.048, 3.0517578125e-05)
    assert amp["amp"] and amp["static_loss_scale"] == 128 and amp["dynamic_loss_scale"]
    assert amp["memory_format"] == "nhwc" and amp["gpu_affinity"] == "socket_unique_contiguous"
    assert (amp["label_smoothing"], amp["mixup"], amp["lr_schedule"], amp["momentum"], amp["warmup"],
            amp["epochs"], amp["num_classes"]) == (0.1, 0.2, "cosine", 0.875, 8, 250, 1000)
    fp32 = preset("resnet50", "FP32", "DGX1V")
    assert (fp32["batch_size"], fp32["optimizer_batch_size"], fp32["lr"], fp32["weight_decay"]) == \
        (112, 896, 0.896, 6.103515625e-05)
    assert fp32["amp"] is False and fp32["tf32"] is False and fp32["memory_format"] == "nchw"  # the reference's
    assert preset("resnet50", "FP32", "DGX2V")["optimizer_batch_size"] == 4096
    assert preset("resnet50", "FP32", "T4")["batch_size"] == 128
    assert preset("resnet50", "TF32", "DGXA100")["tf32"] is True
    assert preset("resnet50", "TF32", "DGXA100")["workers"] == 10
    sernxt = preset("se-resnext101-32x4d", "AMP", "DGX1V-16G")
    assert (sernxt["batch_size"], sernxt["optimizer_batch_size"], sernxt["lr"]) == (112, 896, 0.896)
    assert preset("se-resnext101-32x4d", "FP32", "DGX1V")["batch_size"] == 64
    assert preset("resnext101-32x4d", "TF32", "DGXA100")["optimizer_batch_size"] == 1024
    bf16 = preset("resnext101-32x4d", "BF16", "DGXH100")
    assert bf16["amp_dtype"] == "bfloat16" and "static_loss_scale" not in bf16 and bf16["batch_size"] == 128
    cpu = preset("resnet50", "AMP", "CPU")
    assert (cpu["device"], cpu["amp_dtype"], cpu["gpu_affinity"], cpu["workers"], cpu["memory_format"]) == \
        ("cpu", "bfloat16", "none", 2, "auto")
    assert "optimizer_batch_size" not in cpu and "print_freq" not in CONFIG["platform"]["CPU"]


# The reference's configs.yml, per model: (platform, precision) -> batch_size; DGXA100 FP32 and DGXH100 ours
EFFICIENTNET_BATCHES = {
    "b0": {("T4", "AMP"): 128, ("T4", "FP32"): 64, ("DGX1V-16G", "AMP"): 128, ("DGX1V-16G", "FP32"): 64,
           ("DGX1V-32G", "AMP"): 256, ("DGX1V-32G", "FP32"): 128, ("DGXA100", "AMP"): 256,
           ("DGXA100", "TF32"): 256, ("DGXA100", "FP32"): 256, ("DGXH100", "AMP"): 256,
           ("DGXH100", "BF16"): 256, ("DGXH100", "TF32"): 256},
    "b4": {("T4", "AMP"): 32, ("T4", "FP32"): 16, ("DGX1V-16G", "AMP"): 32, ("DGX1V-16G", "FP32"): 16,
           ("DGX1V-32G", "AMP"): 64, ("DGX1V-32G", "FP32"): 32, ("DGXA100", "AMP"): 128,
           ("DGXA100", "TF32"): 64, ("DGXA100", "FP32"): 64, ("DGXH100", "AMP"): 128,
           ("DGXH100", "BF16"): 128, ("DGXH100", "TF32"): 64},
}


@pytest.mark.parametrize("model", ["efficientnet-b0", "efficientnet-b4", "efficientnet-widese-b0",
                                   "efficientnet-widese-b4"])
def test_efficientnet_presets_are_the_references(model):
    """RMSprop (alpha 0.9, eps 0.01, momentum 0.9), lr 0.08 / 0.16 for 4096 images, weight decay 1e-5 / 5e-6,
    cosine after 16 warm-up epochs, 400 epochs, AutoAugment, bicubic, 224 / 380 px validated at the crop
    + 32."""
    size = model[-2:]
    lr, weight_decay, image_size = {"b0": (0.08, 1e-05, 224), "b4": (0.16, 5e-06, 380)}[size]
    for (platform, precision), batch in EFFICIENTNET_BATCHES[size].items():
        args = parse_args(["/imagenet"], defaults=launch.resolve(model, precision, "convergence", platform,
                                                                  REPO / "configs.yml"))
        assert (args.arch, args.batch_size, args.optimizer_batch_size) == (model, batch, 4096), platform
        assert (args.optimizer, args.rmsprop_alpha, args.rmsprop_eps, args.momentum) == \
            ("rmsprop", 0.9, 0.01, 0.9)
        assert (args.lr, args.lr_batch, args.weight_decay) == (lr, 4096, weight_decay)
        assert (args.lr_schedule, args.warmup, args.epochs, args.label_smoothing, args.mixup) == \
            ("cosine", 16, 400, 0.1, 0.2)
        assert (args.augmentation, args.interpolation, args.image_size, args.val_resize_size) == \
            ("autoaugment", "bicubic", image_size, image_size + 32)
        assert args.memory_format == ("nhwc" if precision in ("AMP", "BF16") else "nchw")
        assert args.data_backend is None and not args.bn_weight_decay  # no weight decay on BatchNorm: theirs
    cpu_preset = launch.resolve(model, "FP32", "convergence", "CPU", REPO / "configs.yml")
    cpu = parse_args(["/imagenet"], defaults=cpu_preset)
    assert (cpu.device, cpu.optimizer_batch_size, cpu.batch_size) == ("cpu", -1, {"b0": 32, "b4": 16}[size])
    assert resolve_lr(cpu.lr, cpu.lr_batch, cpu.batch_size, optimizer="rmsprop", warmup=16)[0] == \
        pytest.approx(lr * cpu.batch_size / 4096)


def test_modes():
    def mode(name):
        return launch.resolve("resnet50", "AMP", name, "DGXA100", REPO / "configs.yml")

    short = mode("benchmark_training_short")
    assert (short["data_backend"], short["prof"], short["epochs"], short["training_only"],
            short["save_checkpoints"], short["print_freq"]) == ("synthetic", 100, 1, True, False, 1)
    assert mode("benchmark_training")["epochs"] == 3
    assert mode("benchmark_inference")["evaluate"] is True
    # NVIDIA's figures leave out the start-up: the benchmarks' throughput leaves out 20 warm-up iterations
    assert {mode(name).get("benchmark_warmup") for name in ("benchmark_training", "benchmark_training_short",
                                                            "benchmark_inference", "convergence")} == {20, None}
    assert mode("evaluate")["evaluate"] is True and mode("evaluate")["print_freq"] == 20
    assert mode("convergence")["save_checkpoints"] is True and mode("convergence")["epochs"] == 250


def test_short_benchmark_needs_no_dataset(capsys):
    dry = _dry_run(["--model", "resnet50", "--precision", "AMP", "--mode", "benchmark_training_short",
                    "--platform", "DGXA100"], capsys)
    assert dry.written.data is None and dry.written.data_backend == "synthetic"
    assert "DIR" not in dry.text


# ------------------------------------------------------------------------------------------------
# The command line
# ------------------------------------------------------------------------------------------------
RN50_A100 = ["--model", "resnet50", "--precision", "AMP", "--mode", "convergence", "--platform", "DGXA100"]


def test_explicit_flags_beat_the_preset(capsys):
    args = _dry_run([*RN50_A100, "/data", "-b", "64", "--lr", "0.5", "--epochs", "3", "--no-checkpoints",
                     "--memory-format", "nchw", "--workers", "1"], capsys).written
    assert (args.batch_size, args.lr, args.epochs, args.save_checkpoints) == (64, 0.5, 3, False)
    assert (args.memory_format, args.workers) == ("nchw", 1)
    assert args.optimizer_batch_size == 2048 and args.label_smoothing == 0.1 and args.data == "/data"


def test_flags_may_come_before_the_launch_flags(capsys):
    args = _dry_run(["/data", "--epochs", "5", *RN50_A100], capsys).written
    assert args.epochs == 5 and args.arch == "resnet50"


def test_the_dry_run_shows_the_class_count_the_run_will_use(image_folder, tmp_path, capsys, monkeypatch):
    """The presets' num_classes 1000 is ImageNet's default: on a 3-class dataset the run takes the dataset's
    count, and the dry run says so instead of printing --num-classes=1000."""
    seen = {}
    monkeypatch.setattr("image_classification.training.train", lambda args, **kw: seen.setdefault("args", args) and 0)
    argv = [*RN50_A100, str(image_folder)]
    dry = _dry_run(argv, capsys)
    assert "--num-classes" not in dry.text and dry.written.num_classes is None
    assert dry.classes == f"# classes: 3, one per class folder of {image_folder}"
    assert _launch(argv, True) == 0
    assert seen.pop("args").num_classes == dry.written.num_classes  # main.py then counts the 3 folders

    prefix = _dry_run([*argv, "--num-class", "1000"], capsys,  # said once, however often launch.py parses it
                      notes=["note: --num-class is read as --num-classes, the one flag it begins"])
    assert prefix.classes == "# classes: 1000 (--num-classes)"
    assert _dry_run(RN50_A100, capsys).classes == "# classes: one per class folder of DIR"
    missing = _dry_run([*RN50_A100, str(tmp_path / "nowhere")], capsys).classes
    assert missing.endswith(f"main.py would stop here: dataset directory {tmp_path / 'nowhere'} does not exist")
    resumed = _dry_run([*argv, "--resume", "auto"], capsys).classes
    assert resumed.startswith("# classes: the checkpoint's (--resume)")


def test_the_dry_run_s_class_count_is_the_run_s_own_rule(capsys):
    """The dry run reads the order of startup.class_count_sources, which the run follows: after a checkpoint that
    records no count, synthetic data has 1000 classes, not one per class folder of a dataset it has none of."""
    import argparse

    from image_classification.train.plan import resolve_num_classes

    argv = [*RN50_A100, "--data-backend", "synthetic", "--resume", "auto"]
    dry = _dry_run(argv, capsys)
    assert dry.classes == "# classes: the checkpoint's (--resume), else 1000 (synthetic data)"
    assert resolve_num_classes(dry.written, None, [], print) == 1000  # --resume auto found no checkpoint
    evaluated = _dry_run([*RN50_A100, "--evaluate", "--pretrained-weights", "w.pth", "/data"], capsys).classes
    assert evaluated == "# classes: the weights' (--pretrained-weights), else one per class folder of the dataset"
    assert resolve_num_classes(argparse.Namespace(num_classes=None, resume=None, evaluate=True, pretrained_weights="w",
                                                  data_backend=None), None, ["a", "b"], print) == 2


def test_yaml_num_classes_reaches_the_run(tmp_path, capsys, monkeypatch):
    config = yaml.safe_load((REPO / "configs.yml").read_text())
    config["models"]["resnet50"]["CPU"]["FP32"]["num_classes"] = 7
    cfg_file = tmp_path / "configs.yml"
    cfg_file.write_text(yaml.safe_dump(config))
    argv = ["--model", "resnet50", "--precision", "FP32", "--mode", "convergence", "--platform", "CPU",
            "--cfg_file", str(cfg_file), "/data"]
    assert _dry_run(argv, capsys).written.num_classes == 7

    seen = {}

    def fake_train(args, **kw):
        seen["args"] = args
        return 0

    monkeypatch.setattr("image_classification.training.train", fake_train)
    monkeypatch.setattr("image_classification.train.startup.preflight", lambda args, **kw: [])  # no /data here
    assert _launch(argv, False) == 0
    assert seen["args"].num_classes == 7 and seen["args"].arch == "resnet50"


def test_unknown_config_key_is_one_line_naming_it(tmp_path, capsys):
    config = yaml.safe_load((REPO / "configs.yml").read_text())
    config["models"]["resnet50"]["CPU"]["FP32"]["bogus_key"] = 1
    cfg_file = tmp_path / "configs.yml"
    cfg_file.write_text(yaml.safe_dump(config))
    code = run(launch.main, ["--model", "resnet50", "--precision", "FP32", "--mode", "convergence",
                             "--platform", "CPU", "--cfg_file", str(cfg_file), "/data", "--dry-run"])
    assert "bogus_key" in refused(code, capsys)


@pytest.mark.parametrize("change,needle,choice", [
    ({"--model": "resnet51"}, "unknown model 'resnet51'", "se-resnext101-32x4d"),
    ({"--platform": "DGX3"}, "unknown platform 'DGX3'", "DGXH100"),
    ({"--precision": "FP16"}, "unknown precision 'FP16'", "BF16"),
    ({"--mode": "fast"}, "unknown mode 'fast'", "benchmark_training_short"),
    ({"--precision": "FP32"}, "resnet50 on DGXA100 has no FP32 preset", "TF32"),
    ({"--model": "resnext101-32x4d", "--platform": "DGX2V"},
     "resnext101-32x4d has no presets for platform DGX2V", "DGXA100"),
])
def test_unknown_choices_list_the_valid_ones(change, needle, choice, capsys):
    argv = list(RN50_A100)
    for flag, value in change.items():
        argv[argv.index(flag) + 1] = value
    err = refused(run(launch.main, [*argv, "/data", "--dry-run"]), capsys)
    assert needle in err and choice in err


def test_missing_launch_flag_and_unknown_main_flag(capsys):
    assert run(launch.main, ["--model", "resnet50", "--mode", "convergence", "--platform", "CPU", "/d"]) == 2
    assert "--precision" in capsys.readouterr().err
    assert run(launch.main, [*RN50_A100, "/d", "--no-such-flag", "--dry-run"]) == 2
    assert "--no-such-flag" in capsys.readouterr().err


def test_bad_presets_file_is_a_user_error(tmp_path):
    broken = tmp_path / "broken.yml"
    broken.write_text("precision: [\n")
    with pytest.raises(UserError, match="not valid YAML"):
        launch.load_config(broken)
    with pytest.raises(UserError, match="missing.yml does not exist"):
        launch.load_config(tmp_path / "missing.yml")
    partial = tmp_path / "partial.yml"
    partial.write_text("precision: {}\n")
    with pytest.raises(UserError, match="platform, mode, models"):
        launch.load_config(partial)


@pytest.mark.parametrize("value", ["!!python/object/apply:os.system ['touch pwned']",
                                   "!!python/object/new:subprocess.Popen [[touch, pwned]]"])
def test_a_presets_file_cannot_build_python_objects(tmp_path, monkeypatch, value):
    monkeypatch.chdir(tmp_path)
    cfg_file = tmp_path / "tags.yml"
    cfg_file.write_text(_presets_with(value, 1, 0))
    with pytest.raises(UserError, match=r"not valid YAML \(line 3\): could not determine a constructor"):
        launch.load_config(cfg_file)
    assert not (tmp_path / "pwned").exists()


def _presets_with(value_yaml: str, width: int, levels: int) -> str:
    """A presets file whose CPU FP32 batch_size is ``value_yaml``, after an alias bomb: ``levels``
    anchors, each a list of ``width`` aliases of the one before (``width ** levels`` values in all)."""
    bomb = ["bomb:", "  - &a0 [lol]"]
    bomb += [f"  - &a{i} [{', '.join([f'*a{i - 1}'] * width)}]" for i in range(1, levels + 1)]
    return "\n".join([*bomb, "precision: {FP32: {batch_size: " + value_yaml + "}}", "platform: {CPU: {}}",
                      "mode: {convergence: {}}", "models: {resnet50: {CPU: {FP32: {}}}}", ""])


LAUNCH_CPU = ["--model", "resnet50", "--precision", "FP32", "--mode", "convergence", "--platform", "CPU"]


def _refused_presets(cfg_file, capsys) -> str:
    """The one line ``launch.py`` prints for the presets file ``cfg_file`` (exit 2)."""
    return refused(run(launch.main, [*LAUNCH_CPU, "--cfg_file", str(cfg_file), "/data", "--dry-run"]), capsys)


def test_a_presets_file_past_a_megabyte_or_not_a_regular_file_is_refused_before_it_is_read(tmp_path, capsys):
    """``--cfg_file /dev/zero`` (or a 10 GB file) was read whole; a FIFO would wait for a writer forever."""
    large = tmp_path / "large.yml"
    with open(large, "wb") as handle:
        handle.truncate(launch.MAX_CFG_BYTES + 1)  # sparse: no disk used
    assert _refused_presets(large, capsys) == f"error: {large} holds more than 1,048,576 bytes: it is not a presets " \
                                              "file"
    fifo = tmp_path / "fifo.yml"
    os.mkfifo(fifo)
    for special in ("/dev/null", tmp_path, fifo):
        outcome = []  # in a thread: a regression that blocks on the FIFO fails here, instead of hanging
        reading = threading.Thread(target=lambda: outcome.append(_refused_presets(special, capsys)), daemon=True)
        reading.start()
        reading.join(timeout=30)
        assert outcome == [f"error: {special} is not a regular file (a folder, a device or a pipe): it is not a "
                           "presets file"]
    assert launch.MAX_CFG_BYTES > 20 * (REPO / "configs.yml").stat().st_size  # far above the real file


@pytest.mark.parametrize("value,width,levels", [("*a9", 9, 9), ("*a6", 10, 6), ("&self [*self]", 2, 1)],
                         ids=["billion-laughs", "a-million", "holds-itself"])
def test_a_yaml_alias_bomb_as_a_preset_value_is_one_short_line(tmp_path, capsys, value, width, levels):
    """YAML's aliases share what they name, so a bomb is read at once; as a flag's value it is one line, cut short
    (a bomb nothing reads costs nothing)."""
    cfg_file = tmp_path / "bomb.yml"
    cfg_file.write_text(_presets_with(value, width, levels))
    message = _refused_presets(cfg_file, capsys)
    assert message.startswith("error: preset value batch_size: [") and len(message) < 300
    assert "expected a single value" in message


def test_a_presets_file_that_is_not_utf8_is_one_line_naming_it(tmp_path, capsys):
    cfg_file = tmp_path / "latin1.yml"
    cfg_file.write_bytes(_presets_with("256", 1, 0).replace("bomb:", "# caf\u00e9\nbomb:").encode("latin-1"))
    assert _refused_presets(cfg_file, capsys) == f"error: {cfg_file} is not UTF-8 text (byte 6 is not): it is not " \
                                                 "a presets file"


@pytest.mark.parametrize("nested", ["[" * 30_000 + "]" * 30_000, "{a: " * 30_000 + "1" + "}" * 30_000,
                                    "\n  " + "- " * 30_000 + "1"], ids=["lists", "mappings", "block-lists"])
def test_a_presets_file_nested_30000_deep_is_one_line(nested, tmp_path, capsys):
    """The safe loader composes a nested value recursively: past Python's recursion limit it is one line, not a
    crash (libyaml's C composer died with a segfault there, which is why launch.py reads with PyYAML's own)."""
    cfg_file = tmp_path / "deep.yml"
    cfg_file.write_text(_presets_with("256", 1, 0).replace("bomb:", "deep: " + nested + "\nbomb:"))
    assert _refused_presets(cfg_file, capsys) == f"error: {cfg_file} nests its values too deeply: it is not a " \
                                                 "presets file"


@pytest.mark.parametrize("entry, said", [
    ('workspace: "a\\0b"', "preset value workspace: 'a\\x00b' is not valid: it holds a NUL byte"),
    ('crop_scale: [0.2, "1\\0"]', "preset value crop_scale: "),
    ('"work\\0space": 1', "unknown configuration key: 'work\\x00space'"),
])
def test_a_nul_byte_in_a_presets_file_is_one_line_naming_the_key(entry, said, tmp_path, capsys):
    """A NUL byte reached the file system as a --workspace (ValueError: embedded null byte)."""
    cfg_file = tmp_path / "nul.yml"
    cfg_file.write_text(_presets_with("256", 1, 0).replace("{batch_size: 256}", "{" + entry + "}"))
    assert _refused_presets(cfg_file, capsys).startswith(f"error: {said}")


def test_a_large_preset_value_is_cut_short_in_its_message(tmp_path, capsys):
    cfg_file = tmp_path / "large.yml"
    cfg_file.write_text(_presets_with("*a4", 10, 4))  # 10,000 values: a presets file may hold that many
    code = run(launch.main, ["--model", "resnet50", "--precision", "FP32", "--mode", "convergence",
                             "--platform", "CPU", "--cfg_file", str(cfg_file), "/data", "--dry-run"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: preset value batch_size: [[[...], ") and len(err) < 300, err[:500]


def test_list_shows_the_presets(capsys):
    assert launch.main(["--list"]) == 0
    out = capsys.readouterr().out
    assert "DGXH100: AMP, BF16, TF32" in out and "benchmark_training_short" in out


# ------------------------------------------------------------------------------------------------
# What this machine makes of a preset: the runtime's decisions, which --dry-run states
# ------------------------------------------------------------------------------------------------
EFFNET_A100 = ["--model", "efficientnet-b0", "--precision", "AMP", "--mode", "convergence",
               "--platform", "DGXA100"]


def test_the_reference_s_efficientnet_command_dry_runs_to_its_run(capsys):
    """``launch.py --model efficientnet-b0 --precision AMP --mode convergence --platform DGXA100 /imagenet``,
    as a reference user types it: on a machine without CUDA --dry-run shows the run it stands for."""
    dry = _dry_run([*EFFNET_A100, "/imagenet"], capsys, cuda_available=False)
    written = dry.written
    assert (written.arch, written.batch_size, written.optimizer_batch_size, written.optimizer, written.lr,
            written.lr_batch, written.data) == \
        ("efficientnet-b0", 256, 4096, "rmsprop", 0.08, 4096, "/imagenet")
    assert (written.augmentation, written.interpolation, written.val_resize_size) == \
        ("autoaugment", "bicubic", 256)
    assert dry.host == "the CPU, bfloat16 autocast, memory format nhwc"
    assert any(note.startswith("--augmentation autoaugment: ") for note in dry.notes)


@pytest.mark.parametrize("backend, place", [("pytorch", "torchvision's, on the CPU in the loader workers"),
                                            ("dali-cpu", "DALI's auto_aug, on the CPU in DALI's threads")])
def test_the_dry_run_says_whose_autoaugment_runs_where(backend, place, capsys):
    dry = _dry_run([*EFFNET_A100, "/imagenet", "--data-backend", backend], capsys, cuda_available=False)
    assert any(note.startswith(f"--augmentation autoaugment: {place}") for note in dry.notes), dry.notes
    evaluate = _dry_run([*EFFNET_A100, "/imagenet", "--data-backend", backend, "--evaluate"], capsys,
                        cuda_available=False)
    assert not any("--augmentation" in note for note in evaluate.notes)  # nothing is augmented


def test_the_presets_validation_resize_gives_way_to_a_typed_crop():
    """412 is B4's 380 px crop + 32: with another crop typed main.py resizes to that crop / 0.875 instead."""
    b4 = ["--model", "efficientnet-b4", "--precision", "TF32", "--mode", "convergence",
          "--platform", "DGXA100"]
    assert launch.preset_run([*b4, "/imagenet"], "launch.py")[1].val_resize_size == 412
    for typed in (["--image-size", "300"], ["--val-crop-size", "300"]):
        assert launch.preset_run([*b4, "/imagenet", *typed], "launch.py")[1].val_resize_size is None
    typed = ["--image-size", "300", "--val-resize-size", "332"]
    assert launch.preset_run([*b4, "/imagenet", *typed], "launch.py")[1].val_resize_size == 332


def test_a_gpu_preset_without_cuda_is_said_to_run_on_the_cpu_in_bf16(capsys):
    """The preset is written as it is (the machine changes no flag); the dry run says what the runtime will make of
    it: the CPU, --amp's bf16 there, the layout --memory-format asks, GPU affinity ignored."""
    dry = _dry_run([*RN50_A100, "/data"], capsys, cuda_available=False)
    assert (dry.written.device, dry.written.amp, dry.written.amp_dtype) == ("auto", True, None)
    assert dry.written.gpu_affinity == "socket_unique_contiguous"
    assert dry.host == "the CPU, bfloat16 autocast, memory format nhwc"
    assert dry.notes[0] == "--amp on the CPU: bf16 autocast, no loss scaling"
    assert any("--gpu-affinity socket_unique_contiguous pins processes to a GPU's cores" in note for note in dry.notes)


def test_a_launched_run_takes_the_preset_as_written_and_the_runtime_chooses(capsys, monkeypatch):
    """launch.py hands main.py the preset as written; the runtime then takes the CPU and bf16 (and says so at
    start-up, as for any main.py run), and the preflight checks the dataset and the workspace before torch."""
    from image_classification.system.runtime import make_runtime

    seen = {}
    monkeypatch.setattr("image_classification.training.train", lambda args, **kw: seen.setdefault("args", args) and 0)
    monkeypatch.setattr("image_classification.train.startup.preflight",
                        lambda args, **kw: seen.setdefault("checked", args) and [])
    assert _launch([*RN50_A100, "/data"], cuda_available=False) == 0
    assert seen["checked"].data == "/data"  # the dataset and the workspace, checked before torch is imported
    args = seen["args"]
    assert (args.device, args.amp, args.amp_dtype, args.gpu_affinity) == ("auto", True, None,
                                                                           "socket_unique_contiguous")
    lines = []
    runtime = make_runtime("cpu", args.amp, args.amp_dtype, "nchw", gpu_affinity=args.gpu_affinity, log=lines.append)
    assert str(runtime.amp_dtype) == "torch.bfloat16" and not runtime.needs_loss_scaling
    assert any("bf16 autocast, no loss scaling" in line for line in lines)
    assert any("there is no GPU: ignored" in line for line in lines)


def test_whether_cuda_is_there_is_asked_of_torch_only_where_nvidia_s_driver_is(monkeypatch):
    """machine.cuda_available, the one place that asks: before torch is imported, only where NVIDIA's driver
    answers (without one torch finds none, and importing it takes seconds: a dry run on a machine without a GPU
    takes about as long as --list); under --device cpu nothing is asked."""
    import torch

    from image_classification.system import host

    def asked():
        raise AssertionError("torch was asked")

    monkeypatch.setattr(torch.cuda, "is_available", asked)
    monkeypatch.setattr(machine, "gpu_driver", lambda: None)
    monkeypatch.delitem(sys.modules, "torch")  # as in a process that has not imported it
    assert machine.cuda_available() is False
    monkeypatch.setitem(sys.modules, "torch", torch)
    assert host.use_cuda("cpu") is False
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert host.use_cuda("auto") is True


def test_a_dry_run_imports_no_torch_on_a_machine_without_nvidia_s_driver(tmp_path):
    if machine.gpu_driver() is not None:
        pytest.skip("NVIDIA's driver is here: the dry run asks torch whether CUDA works")
    code = ("import sys; from image_classification import commands; code = commands.launch('launch.py'); "
            "print('torch imported:', 'torch' in sys.modules); sys.exit(code)")
    result = subprocess.run([sys.executable, "-c", code, *RN50_A100, "--dry-run", str(tmp_path)], capture_output=True,
                            text=True, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=600)
    assert result.returncode == 0 and result.stdout.endswith("torch imported: False\n"), result
    assert "# on this machine: the CPU, bfloat16 autocast" in result.stdout


def test_a_gpu_preset_with_cuda_runs_in_fp16_on_cuda(capsys):
    dry = _dry_run([*RN50_A100, "/data"], capsys, cuda_available=True)
    assert dry.host == "CUDA, float16 autocast, memory format nhwc" and dry.notes == []
    assert dry.written.gpu_affinity == "socket_unique_contiguous"


def test_device_cpu_runs_a_gpu_preset_on_the_cpu_even_with_cuda(capsys):
    dry = _dry_run([*RN50_A100, "/data", "--device", "cpu"], capsys, cuda_available=True)
    assert dry.host == "the CPU, bfloat16 autocast, memory format nhwc"


def test_the_cpu_platform_s_amp_is_bf16_as_written(capsys):
    dry = _dry_run(["--model", "resnet50", "--precision", "AMP", "--mode", "convergence",
                    "--platform", "CPU", "/data"], capsys, cuda_available=False)
    assert (dry.written.device, dry.written.amp_dtype, dry.written.batch_size) == ("cpu", "bfloat16", 32)
    assert dry.host.startswith("the CPU, bfloat16 autocast, memory format ")
    assert not any("--amp on the CPU" in note for note in dry.notes)  # the preset says bf16 itself


# ------------------------------------------------------------------------------------------------
# --dry-run
# ------------------------------------------------------------------------------------------------
def test_dry_run_needs_no_dataset_folder(capsys):
    dry = _dry_run(RN50_A100, capsys, cuda_available=False)
    assert dry.written.data == "DIR"  # a placeholder, named in the header
    assert "(DIR: the dataset folder)" in dry.text.splitlines()[0]
    # a real run still needs one
    assert _launch(RN50_A100, True) == 2
    assert "DIR is required" in capsys.readouterr().err


def test_dry_run_prints_the_preset_as_written_on_any_machine(capsys):
    on_gpu = _dry_run([*RN50_A100, "/data", "-b", "64"], capsys, cuda_available=True)
    on_cpu = _dry_run([*RN50_A100, "/data", "-b", "64"], capsys, cuda_available=False)
    assert on_gpu.text.splitlines()[:2] == on_cpu.text.splitlines()[:2]
    preset = launch.resolve("resnet50", "AMP", "convergence", "DGXA100", REPO / "configs.yml")
    del preset["num_classes"]  # ImageNet's count gives way to the dataset's, as in the run
    assert parse_args(["/data", "-b", "64"], defaults=preset) == on_cpu.written
    assert on_cpu.written.amp_dtype is None and on_cpu.written.gpu_affinity == "socket_unique_contiguous"
    assert on_cpu.written.device == "auto" and on_cpu.written.batch_size == 64


def test_the_host_choice_is_pure_and_follows_the_flags():
    from image_classification.system import host

    gpu = host.choose("auto", True, None, "auto", cuda=True)
    assert (gpu.cuda, gpu.amp_dtype, gpu.memory_format) == (True, "float16", "nhwc") and "tensor cores" in gpu.notes[0]
    cpu = host.choose("auto", True, None, "nchw", cuda=False, bf16_native=lambda: True)
    assert (cpu.cuda, cpu.amp_dtype, cpu.memory_format) == (False, "bfloat16", "nchw") and len(cpu.notes) == 1
    emulated = host.choose("cpu", True, "bfloat16", "nchw", cuda=False, bf16_native=lambda: False)
    assert any("emulated" in note for note in emulated.notes)
    fp16 = host.choose("cpu", True, "float16", "nchw", cuda=False)
    assert fp16.amp_dtype == "float16" and host.scales_loss(fp16.amp_dtype) and "fp16 path" in fp16.notes[0]
    assert host.choose("auto", False, None, "auto", cuda=True) == host.HostChoice(True, None, "nchw")


def test_launch_runs_a_tiny_benchmark_end_to_end(tmp_path, capsys):
    """The real thing, on the CPU: a preset plus overrides small enough for a test (``python launch.py``,
    run in this process: see helpers.run_script)."""
    workspace = tmp_path / "ws"
    result = run_script(
        [REPO / "launch.py", "--model", "resnet50", "--precision", "FP32",
         "--mode", "benchmark_training_short", "--platform", "CPU", "--arch", "resnet18",
         "--image-size", "32", "-b", "2", "--prof", "2", "-j", "0", "--num-classes", "5",
         "--workspace", workspace], capsys, cwd=tmp_path, threads=1)
    assert result.returncode == 0, result.stderr[-3000:]
    raport = (workspace / "experiment_raport.json").read_text()
    assert '"num_classes": 5' in raport and '"data_backend": "synthetic"' in raport
    assert '"tf32": false' in raport and '"device": "cpu"' in raport


# ------------------------------------------------------------------------------------------------
# Recipes
# ------------------------------------------------------------------------------------------------
# torchvision's ResNet-50 IMAGENET1K_V2 recipe as published (torchvision's references/classification, 8 GPUs):
# torchrun --nproc_per_node=8 train.py --model resnet50 --batch-size 128 --lr 0.5 --lr-scheduler cosineannealinglr
# --lr-warmup-epochs 5 --lr-warmup-method linear --auto-augment ta_wide --epochs 600 --random-erase 0.1
# --weight-decay 0.00002 --norm-weight-decay 0.0 --label-smoothing 0.1 --mixup-alpha 0.2 --cutmix-alpha 1.0
# --train-crop-size 176 --model-ema --val-resize-size 232 --ra-sampler --ra-reps 4
# (train.py's defaults: momentum 0.9, --model-ema-steps 32, --model-ema-decay 0.99998, val crop 224, bilinear)
TORCHVISION_V2 = {
    "epochs": 600, "batch_size": 128, "optimizer_batch_size": 8 * 128, "optimizer": "sgd", "lr": 0.5,
    "momentum": 0.9, "lr_schedule": "cosine", "warmup": 5, "augmentation": "trivialaugment", "random_erase": 0.1,
    "weight_decay": 2e-5, "norm_weight_decay": 0.0, "label_smoothing": 0.1, "mixup": 0.2, "cutmix": 1.0,
    "model_ema": True, "model_ema_steps": 32, "model_ema_decay": 0.99998, "ra_reps": 4,
    "train_crop_size": 176, "val_resize_size": 232, "val_crop_size": 224, "interpolation": "bilinear",
}


@pytest.mark.parametrize("model", MODELS)
def test_the_torchvision_recipe_applies_to_every_preset(model):
    for platform, precision in presets_of(model):
        preset = launch.resolve(model, precision, "convergence", platform, REPO / "configs.yml",
                                recipe="torchvision-v2")
        args = parse_args(["/imagenet"], defaults=preset)
        where = (platform, precision)
        assert {key: getattr(args, key) for key in TORCHVISION_V2} == TORCHVISION_V2, where
        assert args.arch == model and preset["optimizer_batch_size"] % (8 * preset["batch_size"]) == 0, where
        assert args.lr_batch is None, where  # 0.5 is for its own 1024 images: not scaled from an EfficientNet's 4096
        assert parse_args(launch.main_py_argv(args, preset)) == args, where


def test_the_torchvision_recipe_dry_run_prints_the_published_values(capsys):
    dry = _dry_run(["--model", "resnet50", "--precision", "AMP", "--mode", "convergence", "--platform", "DGXA100",
                    "--recipe", "torchvision-v2"], capsys)
    assert "--recipe torchvision-v2" in dry.text.splitlines()[0]
    assert {key: getattr(dry.written, key) for key in TORCHVISION_V2} == TORCHVISION_V2
    command = dry.text.splitlines()[1]
    for token in ("--epochs=600", "--lr=0.5", "--warmup=5", "--lr-schedule=cosine", "--momentum=0.9",
                  "--weight-decay=2e-05", "--norm-weight-decay=0.0", "--label-smoothing=0.1", "--mixup=0.2",
                  "--cutmix=1.0", "--augmentation=trivialaugment", "--random-erase=0.1", "--model-ema",
                  "--model-ema-steps=32", "--model-ema-decay=0.99998", "--ra-reps=4", "--train-crop-size=176",
                  "--val-resize-size=232", "--val-crop-size=224", "--batch-size=128",
                  "--optimizer-batch-size=1024"):
        assert token in command.split(), token
    # without --recipe the model's own (NVIDIA's) hyperparameters stay
    nvidia = launch.resolve("resnet50", "AMP", "convergence", "DGXA100", REPO / "configs.yml")
    assert (nvidia["epochs"], nvidia["lr"], nvidia["momentum"]) == (250, 2.048, 0.875) and "cutmix" not in nvidia


def test_an_unknown_recipe_is_one_line_naming_the_recipes(capsys):
    argv = ["--model", "resnet50", "--precision", "AMP", "--mode", "convergence", "--platform", "DGXA100",
            "--recipe", "torchvision-v3", "--dry-run"]
    message = refused(_launch(argv, True), capsys)
    assert "unknown recipe 'torchvision-v3'" in message and "torchvision-v2" in message


def _recipe_run(tmp_path, data, *extra: str) -> list[str]:
    return ["--model", "resnet50", "--precision", "FP32", "--mode", "convergence", "--platform", "CPU",
            "--recipe", "torchvision-v2", "--num-classes", "10", "--seed", "1", "--workers", "0",
            "--workspace", str(tmp_path), *extra, str(data)]


@pytest.mark.slow
def test_the_torchvision_recipe_trains_end_to_end(tiny_arch, image_folder, tmp_path, capsys):
    """Every technique of the recipe at once, shrunk to a few tiny steps: it trains and records FixRes sizes."""
    import torch

    from image_classification.records.integrity import recorded_description

    argv = _recipe_run(tmp_path, image_folder, "-a", tiny_arch, "--num-classes", "3", "--train-crop-size", "32",
                       "--val-resize-size", "40", "--val-crop-size", "36", "-b", "4", "--optimizer-batch-size", "-1",
                       "--epochs", "1", "--warmup", "0", "--model-ema-steps", "2")
    assert _launch(argv, False) == 0
    checkpoint = torch.load(tmp_path / "checkpoint.pth.tar", weights_only=True)
    record = recorded_description(checkpoint)["preprocessing"]
    assert (record["train_crop_size"], record["image_size"], round(36 / record["crop_ratio"])) == (32, 36, 40)
    assert checkpoint["state_dict_ema"] is not None and checkpoint["ema_updates"] > 0
    assert re.search(r"^Epoch 1/1: .*; val_ema loss [\d.]+, top1 [\d.]+%", capsys.readouterr().out, re.M)


# ------------------------------------------------------------------------------------------------
# --recipe fast-N: FFCV's ResNet-50 configs
# ------------------------------------------------------------------------------------------------
# libffcv/ffcv-imagenet rn50_configs/rn50_{E}_epochs.yaml: E -> (start_ramp, end_ramp); min_res 160, max_res 192
FFCV_RAMPS = {16: (11, 13), 24: (17, 20), 32: (23, 27), 40: (29, 34), 56: (41, 48), 88: (65, 76)}
FFCV_LR, FFCV_GLOBAL_BATCH = 1.7, 8 * 512  # lr: 1.7; batch_size: 512 per process; world_size: 8


@pytest.mark.parametrize("epochs", sorted(FFCV_RAMPS))
@pytest.mark.parametrize("model", MODELS)
def test_the_fast_recipes_are_ffcv_s_configs_scaled_to_each_preset_s_batch(model, epochs):
    for platform, precision in presets_of(model):
        try:
            _check_fast_recipe(model, platform, precision, epochs)
        except AssertionError as error:  # which preset, then pytest's account of the assertion
            raise AssertionError(f"{model} {platform} {precision} --recipe fast-{epochs}: {error}") from error


def _check_fast_recipe(model: str, platform: str, precision: str, epochs: int) -> None:
    from image_classification.arguments import resolve_lr

    preset = launch.resolve(model, precision, "convergence", platform, REPO / "configs.yml", recipe=f"fast-{epochs}")
    args = parse_args(["/imagenet"], defaults=preset)
    start, end = FFCV_RAMPS[epochs]
    assert (args.epochs, args.progressive_resize, args.lr_schedule, args.lr_peak_epoch, args.warmup) == \
        (epochs, [160, 192, start, end], "triangular", 2, 0)
    assert (args.optimizer, args.momentum, args.weight_decay, args.norm_weight_decay, args.label_smoothing,
            args.mixup, args.nesterov, args.augmentation) == ("sgd", 0.9, 1e-4, 0.0, 0.1, 0.0, False, None)
    assert (args.val_crop_size, args.val_resize_size, args.image_size, args.train_crop_size, args.val_tta) == \
        (256, None, None, None, "flip")  # 256 px validation crops of a 0.875 centre crop: FFCV's
    nvidia = launch.resolve(model, precision, "convergence", platform, REPO / "configs.yml")
    assert (args.batch_size, args.optimizer_batch_size) == (nvidia["batch_size"], nvidia.get("optimizer_batch_size", -1))
    assert (args.lr, args.lr_batch) == (FFCV_LR, FFCV_GLOBAL_BATCH)  # main.py scales it to the run's batch
    batch = args.optimizer_batch_size if args.optimizer_batch_size > 0 else args.batch_size  # CPU: one process
    scaled = resolve_lr(args.lr, args.lr_batch, batch, optimizer=args.optimizer, warmup=args.warmup)[0]
    assert scaled == pytest.approx(FFCV_LR * batch / FFCV_GLOBAL_BATCH, rel=1e-12) and args.arch == model
    assert parse_args(launch.main_py_argv(args, preset)) == args


def test_the_recipe_s_lr_follows_the_typed_batch_and_the_processes_and_a_typed_lr_wins(monkeypatch):
    """FFCV's rate is stated for 4096 images (lr_batch): main.py scales it to the run's global batch, the typed -b
    and the job's processes included; a typed --lr replaces the preset's rate and the batch it was stated for."""
    from image_classification.arguments import global_batch, resolve_lr

    def lr(platform: str, *typed: str, world_size: int = 1) -> float:
        args = launch.run_arguments(["--model", "resnet50", "--precision", "FP32", "--mode", "convergence",
                                     "--platform", platform, "--recipe", "fast-16", "/data", *typed])
        batch = global_batch(args.batch_size, world_size, args.optimizer_batch_size)
        return resolve_lr(args.lr, args.lr_batch, batch, optimizer=args.optimizer, warmup=args.warmup)[0]

    assert lr("CPU") == pytest.approx(1.7 * 32 / 4096)
    assert lr("CPU", "-b", "64") == pytest.approx(1.7 * 64 / 4096)
    assert lr("CPU", "--batch-size=128", world_size=4) == pytest.approx(1.7 * 512 / 4096)
    assert lr("CPU", "--optimizer-batch-size", "1024", "-b", "64") == pytest.approx(1.7 * 1024 / 4096)
    assert lr("DGX1V") == pytest.approx(1.7 * 896 / 4096)  # FP32: 8 x 112
    assert lr("DGX1V", world_size=2) == pytest.approx(1.7 * 896 / 4096)  # the global batch is the preset's
    assert lr("CPU", "--lr", "0.5") == 0.5  # the typed 0.5 as it is: the preset's lr_batch went with its lr
    assert lr("CPU", "--lr", "0.5", "--lr-batch", "16") == pytest.approx(0.5 * 32 / 16)  # unless one is typed too


def test_a_bad_lr_batch_is_one_line_naming_it(tmp_path, capsys):
    config = yaml.safe_load((REPO / "configs.yml").read_text())
    config["recipes"]["fast-16"]["lr_batch"] = 0
    cfg = tmp_path / "bad.yml"
    cfg.write_text(yaml.safe_dump(config))
    argv = ["--cfg_file", str(cfg), "--model", "resnet50", "--precision", "FP32", "--mode", "convergence",
            "--platform", "CPU", "--recipe", "fast-16", "--dry-run"]
    message = refused(_launch(argv, False), capsys)
    assert message.startswith("error: preset value lr_batch: 0 is not valid") and "--lr-batch" in message


def test_the_dry_run_says_where_every_value_comes_from(capsys):
    argv = ["--model", "resnet50", "--precision", "AMP", "--mode", "convergence", "--platform", "DGXA100",
            "--recipe", "fast-88", "--seed", "3", "/data", "--dry-run"]
    assert _launch(argv, True) == 0
    out = capsys.readouterr().out
    block = out.split(VALUES_HEADER + "\n", 1)[1].splitlines()
    defaults_at = block.index("# main.py's defaults for the rest:")
    sources = dict(line.removeprefix("#   ").split(": ", 1) for line in block[:defaults_at])
    assert sources["--seed 3"] == sources["DIR /data"] == "typed"
    assert sources["--progressive-resize 160 192 65 76"] == sources["--epochs 88"] == "recipes.fast-88"
    assert sources["--val-tta flip"] == sources["--val-crop-size 256"] == "recipes.fast-88"
    assert sources["--batch-size 256"] == sources["--optimizer-batch-size 2048"] == "models.resnet50.DGXA100.AMP"
    assert sources["--amp on"] == "precision.AMP" and sources["--workers 10"] == "platform.DGXA100"
    assert sources["--print-freq 20"] == "mode.convergence"
    assert sources["--lr 1.7"] == sources["--lr-batch 4096"] == "recipes.fast-88"
    assert "#   learning rate 0.85: --lr 1.7 for a global batch of 4096 (--lr-batch), scaled to this run's 2048" in \
        out.split(VALUES_HEADER)[0]
    defaults = [item for row in block[defaults_at + 1:] for item in row.removeprefix("#   ").split(", ")]
    assert {"--hflip 0.5", "--tf32 on", "--compile off", "--num-classes none"} <= set(defaults)
    options = [action for action in build_main_parser()._actions if action.dest != "help"]
    named = [line.split(" ", 1)[0] for line in sources] + [item.split(" ", 1)[0] for item in defaults]
    assert len(named) == len(set(named)) == len(options)  # every option once: set, or at its default


def test_the_fast_recipe_trains_end_to_end(tiny_arch, image_folder, tmp_path, capsys):
    """The recipe shrunk to a few tiny steps: the ramp, the triangular schedule and flip TTA in one run."""
    import torch

    argv = ["--model", "resnet50", "--precision", "FP32", "--mode", "convergence", "--platform", "CPU",
            "--recipe", "fast-16", "-a", tiny_arch, "--num-classes", "3", "--seed", "1", "--workers", "0",
            "--epochs", "2", "--lr-peak-epoch", "0", "--progressive-resize", "32", "64", "0", "1",
            "--val-crop-size", "48", "-b", "4", "--workspace", str(tmp_path), str(image_folder)]
    assert _launch(argv, False) == 0
    out = capsys.readouterr().out
    assert "=> epoch 2: training crops of 64 px (from 32 px)" in out and ", flip TTA top1 " in out
    checkpoint = torch.load(tmp_path / "checkpoint.pth.tar", weights_only=True)
    assert checkpoint["preprocessing"]["train_schedule"] == {"min_size": 32, "max_size": 64, "start": 0, "end": 1}
    assert checkpoint["preprocessing"]["image_size"] == 48


@pytest.mark.parametrize("mode", ["evaluate", "benchmark_training", "benchmark_training_short", "benchmark_inference"])
def test_a_fast_recipe_fits_the_modes_that_run_fewer_epochs_than_its_schedule(mode, capsys):
    """fast-16 resizes from epoch 11 to 13 and peaks its rate at epoch 2: a mode of 1 to 3 epochs trains at the
    schedule's first crop and peaks by its last epoch, each change said in a line, instead of being refused."""
    argv = ["--model", "resnet50", "--precision", "AMP", "--mode", mode, "--platform", "DGX1V", "--recipe", "fast-16",
            "/data", "--dry-run"]
    assert run(launch.main, argv) == 0
    output = capsys.readouterr().out
    assert f"# mode.{mode} runs " in output and "they train at its 160 px (train_crop_size)" in output
    assert "--train-crop-size=160" in output and "--progressive-resize=" not in output
    assert f"--train-crop-size 160: recipes.fast-16 fitted to mode.{mode}" in output
    epochs = launch.resolve("resnet50", "AMP", mode, "DGX1V", REPO / "configs.yml", recipe="fast-16")["epochs"]
    assert f"--lr-peak-epoch={min(2, epochs - 1)}" in output
    assert ("the triangular rate peaks at the start of epoch 1 (lr_peak_epoch 0 for 2)" in output) == (epochs == 1)
    convergence = launch.resolve("resnet50", "AMP", "convergence", "DGX1V", REPO / "configs.yml", recipe="fast-16")
    assert convergence["progressive_resize"] == [160, 192, 11, 13] and convergence["lr_peak_epoch"] == 2
