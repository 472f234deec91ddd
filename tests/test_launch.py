"""launch.py and configs.yml: preset resolution, overrides, host adaptation and the shell recipes."""

from __future__ import annotations

import itertools
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from image_classification import launch
from image_classification.arguments import parse_args
from image_classification.cli import run
from image_classification.errors import UserError

REPO = Path(__file__).resolve().parents[1]
CONFIG = launch.load_config(REPO / "configs.yml")
MODES = list(CONFIG["mode"])
COMBINATIONS = [
    (model, platform, precision)
    for model, platforms in CONFIG["models"].items()
    for platform, precisions in platforms.items()
    for precision in precisions
]


def _dry_run(argv: list[str], capsys, cuda_available: bool = True) -> tuple:
    """Run ``launch.py ... --dry-run``; return the main.py namespace it prints, and stderr."""
    assert launch.main([*argv, "--dry-run"], cuda_available=cuda_available) == 0
    out, err = capsys.readouterr()
    command = [line for line in out.splitlines() if line.startswith("python main.py")]
    assert len(command) == 1, out
    return parse_args(shlex.split(command[0])[2:]), err


# ------------------------------------------------------------------------------------------------
# The presets
# ------------------------------------------------------------------------------------------------
def test_the_file_holds_the_reference_presets_and_ours():
    assert set(CONFIG["models"]) == {"resnet50", "resnext101-32x4d", "se-resnext101-32x4d"}
    assert set(CONFIG["precision"]) == {"AMP", "BF16", "TF32", "FP32"}
    assert set(CONFIG["platform"]) == {"DGX1V", "DGX1V-16G", "DGX1V-32G", "DGX2V", "DGXA100", "DGXH100", "T4",
                                       "CPU"}
    assert set(MODES) == {"benchmark_training", "benchmark_training_short", "benchmark_inference",
                          "convergence", "evaluate"}
    assert set(CONFIG["models"]["resnet50"]["DGXH100"]) == {"AMP", "BF16", "TF32"}
    assert set(CONFIG["models"]["se-resnext101-32x4d"]["CPU"]) == {"AMP", "FP32"}
    assert len(COMBINATIONS) == 17 + 15 + 15


@pytest.mark.parametrize("model,platform,precision", COMBINATIONS)
def test_every_preset_resolves_and_reaches_main_py(model, platform, precision):
    for mode in MODES:
        preset = launch.resolve(model, precision, mode, platform, REPO / "configs.yml")
        args = parse_args(["/imagenet"], defaults=preset)
        for key, value in preset.items():
            assert getattr(args, key) == value, (model, platform, precision, mode, key)
        assert args.arch == model
        # the dry-run command line reproduces the run exactly
        assert parse_args(launch.main_py_argv(args, preset)) == args


@pytest.mark.parametrize("model,platform,precision", COMBINATIONS)
def test_global_batch_is_reachable_with_8_processes(model, platform, precision):
    preset = launch.resolve(model, precision, "convergence", platform, REPO / "configs.yml")
    global_batch = preset.get("optimizer_batch_size", -1)
    if global_batch > 0:
        assert global_batch % (8 * preset["batch_size"]) == 0


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
    assert fp32["amp"] is False and fp32["tf32"] is False and "memory_format" not in fp32
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
    assert (cpu["device"], cpu["amp_dtype"], cpu["gpu_affinity"], cpu["workers"]) == \
        ("cpu", "bfloat16", "none", 2)
    assert "optimizer_batch_size" not in cpu and "print_freq" not in CONFIG["platform"]["CPU"]


def test_modes():
    def mode(name):
        return launch.resolve("resnet50", "AMP", name, "DGXA100", REPO / "configs.yml")

    short = mode("benchmark_training_short")
    assert (short["data_backend"], short["prof"], short["epochs"], short["training_only"],
            short["save_checkpoints"], short["print_freq"]) == ("synthetic", 100, 1, True, False, 1)
    assert mode("benchmark_training")["epochs"] == 3
    assert mode("benchmark_inference")["evaluate"] is True
    assert mode("evaluate")["evaluate"] is True and mode("evaluate")["print_freq"] == 20
    assert mode("convergence")["save_checkpoints"] is True and mode("convergence")["epochs"] == 250


def test_short_benchmark_needs_no_dataset(capsys):
    args, _ = _dry_run(["--model", "resnet50", "--precision", "AMP", "--mode", "benchmark_training_short",
                        "--platform", "DGXA100"], capsys)
    assert args.data is None and args.data_backend == "synthetic"


# ------------------------------------------------------------------------------------------------
# The command line
# ------------------------------------------------------------------------------------------------
RN50_A100 = ["--model", "resnet50", "--precision", "AMP", "--mode", "convergence", "--platform", "DGXA100"]


def test_explicit_flags_beat_the_preset(capsys):
    args, _ = _dry_run([*RN50_A100, "/data", "-b", "64", "--lr", "0.5", "--epochs", "3", "--no-checkpoints",
                        "--memory-format", "nchw", "--workers", "1"], capsys)
    assert (args.batch_size, args.lr, args.epochs, args.save_checkpoints) == (64, 0.5, 3, False)
    assert (args.memory_format, args.workers) == ("nchw", 1)
    assert args.optimizer_batch_size == 2048 and args.label_smoothing == 0.1 and args.data == "/data"


def test_flags_may_come_before_the_launch_flags(capsys):
    args, _ = _dry_run(["/data", "--epochs", "5", *RN50_A100], capsys)
    assert args.epochs == 5 and args.arch == "resnet50"


def test_yaml_num_classes_reaches_the_run(tmp_path, capsys, monkeypatch):
    config = yaml.safe_load((REPO / "configs.yml").read_text())
    config["models"]["resnet50"]["CPU"]["FP32"]["num_classes"] = 7
    cfg_file = tmp_path / "configs.yml"
    cfg_file.write_text(yaml.safe_dump(config))
    argv = ["--model", "resnet50", "--precision", "FP32", "--mode", "convergence", "--platform", "CPU",
            "--cfg_file", str(cfg_file), "/data"]
    args, _ = _dry_run(argv, capsys)
    assert args.num_classes == 7

    seen = {}

    def fake_train(rest, defaults):
        seen["args"] = parse_args(rest, defaults=defaults)
        return 0

    monkeypatch.setattr("image_classification.training.main", fake_train)
    assert launch.main(argv, cuda_available=False) == 0
    assert seen["args"].num_classes == 7 and seen["args"].arch == "resnet50"


def test_unknown_config_key_is_one_line_naming_it(tmp_path, capsys):
    config = yaml.safe_load((REPO / "configs.yml").read_text())
    config["models"]["resnet50"]["CPU"]["FP32"]["bogus_key"] = 1
    cfg_file = tmp_path / "configs.yml"
    cfg_file.write_text(yaml.safe_dump(config))
    code = run(launch.main, ["--model", "resnet50", "--precision", "FP32", "--mode", "convergence",
                             "--platform", "CPU", "--cfg_file", str(cfg_file), "/data", "--dry-run"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "bogus_key" in err and err.startswith("error:")


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
    assert run(launch.main, [*argv, "/data", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert needle in err and choice in err and err.count("\n") == 1


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
    with pytest.raises(UserError, match="cannot read"):
        launch.load_config(tmp_path / "missing.yml")
    partial = tmp_path / "partial.yml"
    partial.write_text("precision: {}\n")
    with pytest.raises(UserError, match="platform, mode, models"):
        launch.load_config(partial)


def test_list_shows_the_presets(capsys):
    assert launch.main(["--list"]) == 0
    out = capsys.readouterr().out
    assert "DGXH100: AMP, BF16, TF32" in out and "benchmark_training_short" in out


# ------------------------------------------------------------------------------------------------
# Presets on a machine that lacks what they ask for
# ------------------------------------------------------------------------------------------------
def test_gpu_preset_without_cuda_runs_on_the_cpu_with_notices(capsys):
    args, err = _dry_run([*RN50_A100, "/data"], capsys, cuda_available=False)
    assert (args.device, args.amp, args.amp_dtype, args.gpu_affinity) == ("cpu", True, "bfloat16", "none")
    notices = err.strip().splitlines()
    assert len(notices) == 3 and all(line.startswith("launch.py: ") for line in notices)
    assert "bf16" in err and "gpu_affinity" in err and "CPU" in err


def test_gpu_preset_with_cuda_is_unchanged(capsys):
    args, err = _dry_run([*RN50_A100, "/data"], capsys, cuda_available=True)
    assert (args.device, args.amp_dtype, args.gpu_affinity) == ("auto", "float16", "socket_unique_contiguous")
    assert err == ""


def test_explicit_cpu_device_adapts_a_gpu_preset_even_with_cuda(capsys):
    args, err = _dry_run([*RN50_A100, "/data", "--device", "cpu"], capsys, cuda_available=True)
    assert (args.device, args.amp_dtype, args.gpu_affinity) == ("cpu", "bfloat16", "none")
    assert "no CUDA" not in err and "bf16" in err


def test_cpu_platform_needs_no_adaptation(capsys):
    args, err = _dry_run(["--model", "resnet50", "--precision", "AMP", "--mode", "convergence",
                          "--platform", "CPU", "/data"], capsys, cuda_available=False)
    assert (args.device, args.amp_dtype, args.batch_size) == ("cpu", "bfloat16", 32) and err == ""


def test_adapt_to_host_is_pure():
    preset = {"amp": True, "amp_dtype": "float16", "gpu_affinity": "socket"}
    adapted, notices = launch.adapt_to_host(preset, "auto", cuda_available=False)
    assert preset == {"amp": True, "amp_dtype": "float16", "gpu_affinity": "socket"}
    assert adapted == {"amp": True, "amp_dtype": "bfloat16", "gpu_affinity": "none", "device": "cpu"}
    assert len(notices) == 3
    assert launch.adapt_to_host(preset, "cuda", cuda_available=False) == (preset, [])
    fp32, _ = launch.adapt_to_host({"amp": False}, "auto", cuda_available=False)
    assert fp32 == {"amp": False, "device": "cpu"}


def test_launch_runs_a_tiny_benchmark_end_to_end(tmp_path):
    """The real thing, on the CPU: a preset plus overrides small enough for a test."""
    workspace = tmp_path / "ws"
    result = subprocess.run(
        [sys.executable, str(REPO / "launch.py"), "--model", "resnet50", "--precision", "FP32",
         "--mode", "benchmark_training_short", "--platform", "CPU", "--arch", "resnet18",
         "--image-size", "32", "-b", "2", "--prof", "2", "-j", "0", "--num-classes", "5",
         "--workspace", str(workspace)],
        capture_output=True, text=True, timeout=300, cwd=tmp_path, env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    raport = (workspace / "experiment_raport.json").read_text()
    assert '"num_classes": 5' in raport and '"data_backend": "synthetic"' in raport
    assert '"tf32": false' in raport and '"device": "cpu"' in raport


# ------------------------------------------------------------------------------------------------
# Shell recipes
# ------------------------------------------------------------------------------------------------
RECIPES = sorted(p for folder in ("resnet50v1.5", "resnext101-32x4d", "se-resnext101-32x4d")
                 for p in (REPO / folder / "training").rglob("*.sh"))
MODEL_OF_FOLDER = {"resnet50v1.5": "resnet50", "resnext101-32x4d": "resnext101-32x4d",
                   "se-resnext101-32x4d": "se-resnext101-32x4d"}


def _expected_recipe_names() -> set[str]:
    names = set()
    reference = {
        "resnet50": ["AMP/DGX1V", "AMP/DGX2V", "AMP/DGXA100", "FP32/DGX1V", "FP32/DGX2V", "TF32/DGXA100"],
    }
    reference["resnext101-32x4d"] = reference["se-resnext101-32x4d"] = \
        ["AMP/DGX1V", "AMP/DGXA100", "FP32/DGX1V", "TF32/DGXA100"]
    folders = {model: folder for folder, model in MODEL_OF_FOLDER.items()}
    for model, combos in reference.items():
        for combo, epochs in itertools.product(combos + ["AMP/DGXH100", "BF16/DGXH100", "TF32/DGXH100"],
                                               ("90E", "250E")):
            precision, platform = combo.split("/")
            names.add(f"{folders[model]}/training/{precision}/{platform}_{model}_{precision}_{epochs}.sh")
    return names


def test_recipe_files_are_the_reference_ones_plus_h100():
    assert {str(p.relative_to(REPO)) for p in RECIPES} == _expected_recipe_names()
    assert len(RECIPES) == 12 + 8 + 8 + 3 * 6
    assert all(os.access(p, os.X_OK) for p in RECIPES)


def _recipe_argv(recipe: Path, tmp_path: Path, *args: str) -> list[str]:
    """Run the recipe with a stand-in interpreter that prints its arguments instead of training."""
    shim = tmp_path / "print_args.sh"
    shim.write_text('#!/bin/sh\nprintf "%s\\0" "$@"\n')
    shim.chmod(0o755)
    result = subprocess.run(["bash", str(recipe), *args], capture_output=True, cwd=tmp_path, timeout=30,
                            env={**os.environ, "PYTHON": str(shim)})
    assert result.returncode == 0, result.stderr.decode()
    return result.stdout.decode().split("\0")[:-1]


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.name)
def test_recipe_resolves_to_a_valid_run(recipe, tmp_path, capsys):
    argv = _recipe_argv(recipe, tmp_path, "my_ws", "/data/imagenet")
    assert argv[:6] == [str(REPO / "multiproc.py"), "--nproc_per_node", "8", "--log_dir", "my_ws",
                        str(REPO / "launch.py")]
    launch_argv = argv[6:]
    platform, model, precision, epochs = recipe.stem.split("_")
    assert model == MODEL_OF_FOLDER[recipe.parents[2].name] and precision == recipe.parent.name
    args, _ = _dry_run(launch_argv, capsys)
    preset = launch.resolve(model, precision, "convergence", platform, REPO / "configs.yml")
    assert args.arch == model and args.batch_size == preset["batch_size"]
    assert args.optimizer_batch_size == preset["optimizer_batch_size"] and args.lr == preset["lr"]
    assert (args.data, args.workspace, args.raport_file) == ("/data/imagenet", "my_ws", "raport.json")
    assert args.save_checkpoints and not args.evaluate and args.label_smoothing == 0.1
    assert (args.epochs, args.mixup) == ((90, 0.0) if epochs == "90E" else (250, 0.2))
    assert args.amp == (precision in ("AMP", "BF16"))
    assert args.amp_dtype == {"AMP": "float16", "BF16": "bfloat16"}.get(precision)
    assert args.tf32 == (precision != "FP32")


def test_recipe_defaults_are_the_references(tmp_path, capsys):
    recipe = REPO / "resnet50v1.5/training/AMP/DGX1V_resnet50_AMP_250E.sh"
    argv = _recipe_argv(recipe, tmp_path)
    args, _ = _dry_run(argv[6:], capsys)
    assert (args.workspace, args.data) == ("./", "/imagenet") and argv[4] == "./"
