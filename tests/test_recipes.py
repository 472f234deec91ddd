"""The shell recipes: names, syntax, the interpreter they pick, their arguments and the run they stand for.

Every recipe runs for real, with a stand-in interpreter that prints the arguments it was given.
"""

from __future__ import annotations

import argparse
import itertools
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from helpers import REPO, Result, one_error_line, patient
from image_classification import launch
from image_classification.arguments import parse_args

MODEL_OF_FOLDER = {"resnet50v1.5": "resnet50", "resnext101-32x4d": "resnext101-32x4d",
                   "se-resnext101-32x4d": "se-resnext101-32x4d"}
RECIPES = sorted(p for folder in MODEL_OF_FOLDER for p in (REPO / folder / "training").rglob("*.sh"))
HELPER = REPO / "scripts" / "recipe_args.sh"
EFFICIENTNET = REPO / "efficientnet"
EFFICIENTNET_TRAINING = sorted((EFFICIENTNET / "training").rglob("*.sh"))
EFFICIENTNET_INFERENCE = sorted((EFFICIENTNET / "inference").rglob("*.sh"))
EFFICIENTNET_QUANTIZATION = sorted((EFFICIENTNET / "quantization").rglob("*.sh"))
EFFICIENTNETS = ("efficientnet-b0", "efficientnet-b4", "efficientnet-widese-b0", "efficientnet-widese-b4")
PRINT_ARGS = '#!/bin/sh\nprintf "%s\\0" "$0" "$@"\n'  # NUL-separated, so arguments with spaces survive


def _expected_recipe_names() -> set[str]:
    """The reference's recipes, plus DGX H100 ones; DGX-2V only where configs.yml has presets for it."""
    config = yaml.safe_load((REPO / "configs.yml").read_text())
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
            assert precision in config["models"][model][platform]
            names.add(f"{folders[model]}/training/{precision}/{platform}_{model}_{precision}_{epochs}.sh")
    return names


def test_recipe_files_are_the_reference_ones_plus_h100():
    assert {str(p.relative_to(REPO)) for p in RECIPES} == _expected_recipe_names()
    assert len(RECIPES) == 12 + 8 + 8 + 3 * 6
    assert all(os.access(p, os.X_OK) for p in RECIPES)


def test_dgx2v_recipes_exist_only_where_there_are_presets():
    config = launch.load_config(REPO / "configs.yml")
    for folder, model in MODEL_OF_FOLDER.items():
        has_preset = "DGX2V" in config["models"][model]
        has_recipe = any((REPO / folder / "training").rglob("DGX2V_*.sh"))
        assert has_preset == has_recipe, model


def _efficientnet_names() -> set[str]:
    """The reference's efficientnet/ scripts (no epoch count in the names: all train 400), plus DGX H100's."""
    names = {f"training/{precision}/DGX1V-16G_{model}_{precision}.sh" for precision in ("AMP", "FP32")
             for model in ("efficientnet-b0", "efficientnet-widese-b0")}
    names |= {f"training/{precision}/{platform}_{model}_{precision}.sh" for model in EFFICIENTNETS
              for platform, precision in (("DGXA100", "AMP"), ("DGXA100", "TF32"), ("DGXH100", "AMP"),
                                          ("DGXH100", "BF16"), ("DGXH100", "TF32"))}
    names |= {f"inference/{precision}/DGXA100_{model}_{precision}.sh" for model in EFFICIENTNETS
              for precision in ("AMP", "TF32", "FP32")}
    return names | {f"quantization/DGX1V-32G_efficientnet-quant-{size}_FP32.sh" for size in ("b0", "b4")}


def test_efficientnet_scripts_are_the_reference_ones_plus_h100():
    scripts = [*EFFICIENTNET_TRAINING, *EFFICIENTNET_INFERENCE, *EFFICIENTNET_QUANTIZATION]
    assert {str(p.relative_to(EFFICIENTNET)) for p in scripts} == _efficientnet_names()
    assert len(scripts) == 4 + 20 + 12 + 2 and all(os.access(p, os.X_OK) for p in scripts)


@pytest.mark.parametrize("script", [*RECIPES, *EFFICIENTNET_TRAINING, *EFFICIENTNET_INFERENCE,
                                    *EFFICIENTNET_QUANTIZATION, HELPER], ids=lambda p: p.name)
def test_recipe_syntax(script):
    result = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr


# ------------------------------------------------------------------------------------------------
# Running them with a stand-in interpreter
# ------------------------------------------------------------------------------------------------
def _stand_in(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(PRINT_ARGS)
    path.chmod(0o755)
    return path


def _run(recipe: Path, cwd: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(recipe), *args], capture_output=True, cwd=cwd, timeout=30,
                          env=env if env is not None else os.environ)


def _argv(recipe: Path, tmp_path: Path, *args: str) -> list[str]:
    """The interpreter and arguments the recipe starts, run with PYTHON pointing at a stand-in."""
    env = {**os.environ, "PYTHON": str(_stand_in(tmp_path / "bin" / "print_args"))}
    result = _run(recipe, tmp_path, *args, env=env)
    assert result.returncode == 0, result.stderr.decode()
    return result.stdout.decode().split("\0")[:-1]


def _main_args(launch_argv: list[str]) -> argparse.Namespace:
    """The main.py arguments a launch.py command line stands for (the preset as written)."""
    opts, rest = launch.build_parser().parse_known_args(launch_argv)
    preset = launch.resolve(opts.model, opts.precision, opts.mode, opts.platform, opts.cfg_file)
    return parse_args(rest, defaults=preset)


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.name)
def test_recipe_resolves_to_a_valid_run(recipe, tmp_path):
    argv = _argv(recipe, tmp_path, "my_ws", "/data/imagenet")
    assert argv[1:7] == [str(REPO / "multiproc.py"), "--nproc_per_node", "8", "--log_dir", "my_ws",
                         str(REPO / "launch.py")]
    platform, model, precision, epochs = recipe.stem.split("_")
    assert model == MODEL_OF_FOLDER[recipe.parents[2].name] and precision == recipe.parent.name
    args = _main_args(argv[7:])
    preset = launch.resolve(model, precision, "convergence", platform, REPO / "configs.yml")
    assert args.arch == model and args.batch_size == preset["batch_size"]
    assert args.optimizer_batch_size == preset["optimizer_batch_size"] and args.lr == preset["lr"]
    assert (args.data, args.workspace, args.raport_file) == ("/data/imagenet", "my_ws", "raport.json")
    assert args.save_checkpoints and not args.evaluate and args.label_smoothing == 0.1
    assert (args.epochs, args.mixup) == ((90, 0.0) if epochs == "90E" else (250, 0.2))
    assert args.amp == (precision in ("AMP", "BF16"))
    assert args.amp_dtype == {"BF16": "bfloat16"}.get(precision)  # AMP: --amp's own, fp16 on the GPUs they run on
    assert args.tf32 == (precision != "FP32")


@pytest.mark.parametrize("recipe", [*RECIPES, *EFFICIENTNET_TRAINING], ids=lambda p: p.name)
def test_extra_flags_pass_through_last_and_win(recipe, tmp_path):
    argv = _argv(recipe, tmp_path, "ws", "/data", "-b", "64", "--epochs", "2", "--lr", "0.1 ")
    assert argv[-6:] == ["-b", "64", "--epochs", "2", "--lr", "0.1 "]  # unchanged, quoting included
    args = _main_args(argv[7:])
    assert (args.batch_size, args.epochs, args.lr, args.data) == (64, 2, 0.1, "/data")


def test_recipe_defaults_are_the_references(tmp_path):
    recipe = REPO / "resnet50v1.5/training/AMP/DGX1V_resnet50_AMP_250E.sh"
    argv = _argv(recipe, tmp_path)
    args = _main_args(argv[7:])
    assert (args.workspace, args.data) == ("./", "/imagenet") and argv[5] == "./"


def test_a_flag_in_place_of_a_folder_is_one_error_line(tmp_path):
    recipe = REPO / "resnet50v1.5/training/AMP/DGXA100_resnet50_AMP_90E.sh"
    env = {**os.environ, "PYTHON": str(_stand_in(tmp_path / "print_args"))}
    for args in (["-b", "64"], ["ws", "-b", "64"]):
        result = _run(recipe, tmp_path, *args, env=env)
        assert result.stdout == b"", result.stderr.decode()
        err = one_error_line(Result(result.args, result.returncode, "", result.stderr.decode()))
        assert "WORKSPACE and DATA_DIR" in err


def test_a_recipe_on_a_missing_dataset_is_one_line_and_writes_nothing(tmp_path):
    """Refused before multiproc.py starts its 8 processes: no GPU_k.log files, no workspace folder."""
    recipe = REPO / "resnet50v1.5/training/AMP/DGXA100_resnet50_AMP_90E.sh"
    result = subprocess.run(["bash", str(recipe), "rn50", str(tmp_path / "imagenet")], cwd=tmp_path,
                            capture_output=True, text=True, timeout=patient(120),
                            env={**os.environ, "PYTHON": sys.executable})
    assert one_error_line(result) == f"error: dataset directory {tmp_path / 'imagenet'} does not exist"
    assert list(tmp_path.iterdir()) == []


@pytest.fixture
def recipe_copy(tmp_path) -> Path:
    """A repository of one recipe and its helper, to try interpreters without touching the real one."""
    repo = tmp_path / "repo"
    recipe = repo / "resnet50v1.5/training/AMP/DGXA100_resnet50_AMP_90E.sh"
    recipe.parent.mkdir(parents=True)
    shutil.copy(REPO / recipe.relative_to(repo), recipe)
    (repo / "scripts").mkdir()
    shutil.copy(HELPER, repo / "scripts" / HELPER.name)
    return recipe


def _interpreter_run(recipe: Path, cwd: Path, **env: str) -> str:
    """The interpreter the recipe starts, with PYTHON unset unless given, and the stand-ins' bin on PATH."""
    environ = {k: v for k, v in os.environ.items() if k != "PYTHON"}
    environ["PATH"] = f"{cwd / 'bin'}:{environ['PATH']}"
    result = _run(recipe, cwd, "ws", "/data", env={**environ, **env})
    assert result.returncode == 0, result.stderr.decode()
    return result.stdout.decode().split("\0")[0]


def test_python_defaults_to_the_repositorys_venv(recipe_copy, tmp_path):
    repo = recipe_copy.parents[3]
    _stand_in(tmp_path / "bin" / "python3")
    assert _interpreter_run(recipe_copy, tmp_path) == str(tmp_path / "bin" / "python3")  # no .venv yet
    venv_python = _stand_in(repo / ".venv" / "bin" / "python")
    assert _interpreter_run(recipe_copy, tmp_path) == str(venv_python)
    chosen = _stand_in(tmp_path / "elsewhere" / "python")
    assert _interpreter_run(recipe_copy, tmp_path, PYTHON=str(chosen)) == str(chosen)  # PYTHON still wins


# ------------------------------------------------------------------------------------------------
# efficientnet/: training, the inference sweeps, the quantization-aware training command lines
# ------------------------------------------------------------------------------------------------
def _invocations(recipe: Path, tmp_path: Path, *args: str) -> list[list[str]]:
    """Each command the script starts, in order (the stand-in prints its own path first each time)."""
    argv = _argv(recipe, tmp_path, *args)
    starts = [index for index, token in enumerate(argv) if token == argv[0]]
    return [argv[start:end] for start, end in zip(starts, [*starts[1:], len(argv)])]


@pytest.mark.parametrize("recipe", EFFICIENTNET_TRAINING, ids=lambda p: p.name)
def test_efficientnet_recipe_resolves_to_the_references_run(recipe, tmp_path, capsys):
    argv = _argv(recipe, tmp_path, "my_ws", "/data/imagenet")
    assert argv[1:7] == [str(REPO / "multiproc.py"), "--nproc_per_node", "8", "--log_dir", "my_ws",
                         str(REPO / "launch.py")]
    platform, model, precision = recipe.stem.split("_")
    assert model in EFFICIENTNETS and precision == recipe.parent.name
    args = _main_args(argv[7:])
    preset = launch.resolve(model, precision, "convergence", platform, REPO / "configs.yml")
    assert (args.arch, args.batch_size, args.optimizer_batch_size) == (model, preset["batch_size"], 4096)
    assert (args.optimizer, args.lr, args.epochs, args.augmentation) == \
        ("rmsprop", 0.08 if model.endswith("b0") else 0.16, 400, "autoaugment")
    assert (args.data, args.workspace, args.raport_file) == ("/data/imagenet", "my_ws", "raport.json")
    assert args.save_checkpoints and not args.evaluate
    assert args.amp == (precision in ("AMP", "BF16")) and args.tf32 == (precision != "FP32")
    assert launch.main([*argv[7:], "--dry-run"]) == 0  # the command as launch.py resolves it
    assert f"# {model} {precision} convergence {platform} from " in capsys.readouterr().out


@pytest.mark.parametrize("script", EFFICIENTNET_INFERENCE, ids=lambda p: p.name)
def test_efficientnet_inference_script_benchmarks_each_batch_as_the_references(script, tmp_path):
    """The reference's sweep: batch 1 to 256 (to 128 in FP32), a raport per batch, benchmark_inference."""
    platform, model, precision = script.stem.split("_")
    runs = _invocations(script, tmp_path, "ws", "/data")
    expected = [1, 2, 4, 8, 16, 32, 64, 128] + ([] if precision == "FP32" else [256])
    assert len(runs) == len(expected)
    for batch, run in zip(expected, runs):
        assert run[1:7] == [str(REPO / "multiproc.py"), "--nproc_per_node", "8", "--log_dir", "ws",
                            str(REPO / "launch.py")]
        opts, _ = launch.build_parser().parse_known_args(run[7:])
        assert (opts.model, opts.precision, opts.mode, opts.platform) == \
            (model, precision, "benchmark_inference", platform)
        args = _main_args(run[7:])
        assert (args.arch, args.batch_size, args.raport_file, args.data) == \
            (model, batch, f"raport_{batch}.json", "/data")
        assert args.evaluate and not args.save_checkpoints and args.epochs == 1


# The reference's efficientnet/quantization/*.sh, flag for flag, after `multiproc.py --nproc_per_node 8`
REFERENCE_QAT = {
    "b0": ["--arch", "efficientnet-quant-b0", "--epochs", "10", "-j5", "-p", "500", "--data-backend",
           "pytorch", "--optimizer", "sgd", "-b", "128", "--lr", "0.0125", "--momentum", "0.89",
           "--weight-decay", "4.50e-05", "--lr-schedule", "cosine"],
    "b4": ["--arch", "efficientnet-quant-b4", "--epochs", "2", "-j5", "-p", "500", "--data-backend",
           "pytorch", "--optimizer", "rmsprop", "-b", "32", "--lr", "4.09e-06", "--momentum", "0.9",
           "--weight-decay", "9.714e-04", "--lr-schedule", "linear", "--rmsprop-alpha", "0.853",
           "--rmsprop-eps", "0.00422"],
}


@pytest.mark.parametrize("script", EFFICIENTNET_QUANTIZATION, ids=lambda p: p.name)
def test_quantization_scripts_call_quant_main_py_as_the_references(script, tmp_path):
    """Their command line, which quant_main.py's parser reads as a quantization-aware training of the plain
    architecture (the training itself: tests/test_qat.py)."""
    from image_classification.arguments import parse_args
    from image_classification.commands import QUANT_DEFAULTS

    size = script.stem.split("_")[1].removeprefix("efficientnet-quant-")
    argv = _argv(script, tmp_path, "b0.pth")
    assert argv[1:] == [str(REPO / "multiproc.py"), "--nproc_per_node", "8", str(REPO / "quant_main.py"),
                        "/imagenet", *REFERENCE_QAT[size], "--pretrained-from-file", "b0.pth"]
    args = parse_args(argv[5:], QUANT_DEFAULTS, prog="quant_main.py")
    assert (args.arch, args.quantize_aware, args.pretrained_weights) == (f"efficientnet-{size}", True, "b0.pth")
    env = {**os.environ, "PYTHON": str(_stand_in(tmp_path / "bin" / "print_args"))}
    result = _run(script, tmp_path, env=env)
    assert result.returncode != 0 and result.stdout == b"" and b"usage:" in result.stderr  # no weights given

