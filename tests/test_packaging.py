"""pyproject.toml: `pip install .` into a fresh venv gives the package, its presets and the ic-* commands.

Nothing is downloaded: the build runs without isolation on this environment's setuptools, the install
skips dependencies, and the commands find torch and friends through PYTHONPATH.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tomllib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from helpers import REPO, free_port, one_error_line, patient

PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
COMMANDS = {"ic-train", "ic-quant-train", "ic-launch", "ic-classify", "ic-multiproc", "ic-checkpoint2model",
            "ic-model2onnx", "ic-pack"}
# a build writes these into the tree it builds, so the test builds a copy
BUILD_LEFTOVERS = ("build", "*.egg-info")


def _name(requirement: str) -> str:
    """The canonical distribution name of a requirement line (PEP 503)."""
    return re.sub(r"[-_.]+", "-", re.match(r"[A-Za-z0-9_.-]+", requirement).group()).lower()


def test_dependencies_are_the_runtime_requirements():
    lines = [line.split("#")[0].strip() for line in (REPO / "requirements.txt").read_text().splitlines()]
    pinned = {_name(line) for line in lines if line}
    project = PYPROJECT["project"]
    own = _name(project["name"])
    declared = {_name(r) for r in project["dependencies"]}
    declared |= {_name(r) for extra in project["optional-dependencies"].values() for r in extra} - {own}
    assert declared == pinned


def test_the_test_tools_pin_a_setuptools_that_builds_the_package():
    """The build below runs on this environment's setuptools: torch 2.3 brings none, and Python 3.11's venv
    holds 65.5, which cannot build a wheel without the `wheel` package."""
    lines = [line.split("#")[0].strip() for line in (REPO / "requirements-dev.txt").read_text().splitlines()]
    pins = {_name(name): version for name, version in (line.split("==") for line in lines if "==" in line)}
    (floor,) = [r.split(">=")[1] for r in PYPROJECT["build-system"]["requires"] if _name(r) == "setuptools"]
    assert [int(part) for part in pins["setuptools"].split(".")] >= [int(part) for part in floor.split(".")]


def test_console_commands():
    scripts = PYPROJECT["project"]["scripts"]
    assert set(scripts) == COMMANDS
    assert all(target.startswith("image_classification.commands:") for target in scripts.values())


def _copy_of_the_repository(destination: Path) -> Path:
    """The repository's files at ``destination``, without its environments, outputs and build leftovers."""
    anywhere = shutil.ignore_patterns(".git", "__pycache__", ".pytest_cache", *BUILD_LEFTOVERS)

    def ignore(folder: str, names: list[str]) -> set[str]:
        # at the root only: image_classification/data is a subpackage
        at_root = {".venv", ".venv-pins", "workspace", "data"} if Path(folder) == REPO else set()
        return anywhere(folder, names) | (at_root & set(names))

    shutil.copytree(REPO, destination, symlinks=True, ignore=ignore)
    return destination


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A fresh venv with the package installed from a copy of the repository, the copy then deleted."""
    root = tmp_path_factory.mktemp("packaging")
    source = _copy_of_the_repository(root / "source")
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=patient(120))
    # pip and setuptools come from this environment, so the venv needs neither nor a download
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--no-deps", "--no-build-isolation",
           "--no-index", "--disable-pip-version-check", "-q"]
    result = subprocess.run([*pip, str(source)], capture_output=True, text=True, timeout=patient(300),
                            env=_env())
    assert result.returncode == 0, result.stderr[-3000:]
    shutil.rmtree(source)  # the installed package must stand on its own
    return venv


def _env() -> dict[str, str]:
    """PYTHONPATH on this environment's site-packages (torch...), which hold no image_classification."""
    return {**os.environ, "PYTHONPATH": sysconfig.get_paths()["purelib"]}


def _run(venv: Path, command: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(venv / "bin" / command), *args], capture_output=True, text=True,
                          timeout=patient(300), cwd=cwd, env=_env())


def test_pip_install_gives_the_package_and_its_commands(installed, tmp_path):
    assert {path.name for path in (installed / "bin").iterdir()} >= COMMANDS
    probe = ("import importlib.metadata as m, json, image_classification as p; "
             "eps = [e for e in m.entry_points(group='console_scripts') "
             "if e.dist.name == 'image-classification']; "
             "print(json.dumps([p.__file__, sorted(e.name for e in eps if callable(e.load()))]))")
    runs = {
        "probe": lambda: subprocess.run([str(installed / "bin" / "python"), "-c", probe], capture_output=True,
                                        text=True, cwd=tmp_path, env=_env(), timeout=patient(120)),
        "train": lambda: _run(installed, "ic-train", "-h", cwd=tmp_path),
        "presets": lambda: _run(installed, "ic-launch", "--list", cwd=tmp_path),
        # an installed command as the training script, found beside the venv's Python (PATH lacks it)
        "multiproc": lambda: _run(installed, "ic-multiproc", "--master_port", str(free_port()), "ic-train", "-h",
                                  cwd=tmp_path),
        "mistake": lambda: _run(installed, "ic-launch", "--model", "resnet51", "--precision", "AMP", "--mode",
                                "evaluate", "--platform", "CPU", "--dry-run", cwd=tmp_path),
        "pack": lambda: _run(installed, "ic-pack", "src", "dst", cwd=tmp_path),
    }
    with ThreadPoolExecutor(len(runs)) as pool:  # each is mostly a Python importing torch: side by side
        futures = {name: pool.submit(start) for name, start in runs.items()}
    result, train, presets, multiproc, mistake, pack = (futures[name].result() for name in runs)
    assert result.returncode == 0, result.stderr
    package_file, commands = json.loads(result.stdout)
    assert package_file.startswith(str(installed)) and set(commands) == COMMANDS

    assert train.returncode == 0, train.stderr
    assert "--arch" in train.stdout and "--raport-file" in train.stdout

    assert presets.returncode == 0, presets.stderr
    cfg_file = re.match(r"presets in (.+):", presets.stdout).group(1)
    assert Path(cfg_file).is_relative_to(installed) and "DGXH100: AMP, BF16, TF32" in presets.stdout
    assert Path(cfg_file).read_text() == (REPO / "configs.yml").read_text()  # the file, not a link

    assert multiproc.returncode == 0, multiproc.stderr
    assert f"{installed / 'bin' / 'ic-train'} -h" in multiproc.stdout and "--raport-file" in multiproc.stdout

    one_error_line(mistake)
    assert one_error_line(pack) == "error: SRC src does not exist"


def test_the_presets_are_package_data_with_one_source():
    link = REPO / "image_classification" / "configs.yml"
    assert link.is_symlink() and link.resolve() == (REPO / "configs.yml").resolve()
    assert not (REPO / "configs.yml").is_symlink()
    assert PYPROJECT["tool"]["setuptools"]["package-data"]["image_classification"] == ["configs.yml"]


def test_the_source_tree_holds_no_build_leftovers():
    assert not [p for pattern in BUILD_LEFTOVERS for p in REPO.glob(pattern)]


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_the_make_set_up_installs_the_commands_into_its_environment(tmp_path):
    """`make demo` and `make test` install the package, editable, into .venv beside the requirements: the
    ic-* commands that the docs offer are there, run the source tree, and leave no build files in it."""
    repo = _copy_of_the_repository(tmp_path / "repo")
    # Under another distribution name: this environment's own editable install (make test's) has a finder module
    # named after the distribution on PYTHONPATH, which would shadow the copy's and import this tree instead.
    pyproject = repo / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace('name = "image-classification"', 'name = "ic-copy"', 1))
    venv = repo / ".venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=patient(120))
    (venv / ".installed").touch()  # requirements.txt installed (they are this environment's, on PYTHONPATH)

    def make(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["make", "--no-print-directory", *args], cwd=repo, capture_output=True, text=True,
                              timeout=patient(300), env=_env())

    for target in ("demo", "test"):
        assert "--editable ." in make("-n", target).stdout, target
    # what `make demo` runs first, offline: pip and setuptools come from this environment
    result = make(".venv/.installed-package", "PIP_FLAGS=--no-index --no-build-isolation")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "--editable ." not in make("-n", "demo").stdout  # done once
    assert {path.name for path in (venv / "bin").iterdir()} >= COMMANDS
    where = subprocess.run([str(venv / "bin" / "python"), "-c", "import image_classification as p; print(p.__file__)"],
                           capture_output=True, text=True, cwd=tmp_path, env=_env(), timeout=patient(120))
    assert Path(where.stdout.strip()).is_relative_to(repo / "image_classification"), where.stderr
    assert one_error_line(_run(venv, "ic-pack", "src", "dst", cwd=tmp_path)) == "error: SRC src does not exist"
    assert not [p for pattern in BUILD_LEFTOVERS for p in repo.glob(pattern)]
