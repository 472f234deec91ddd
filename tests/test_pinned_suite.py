"""scripts/pinned_suite.py (`make test-pins`, `make test-oldest`): which requirements each set of pins
installs, and when an environment is reused.  Nothing is installed here."""

from __future__ import annotations

import subprocess
import tomllib

import pytest

from helpers import REPO, load_script


@pytest.fixture(scope="module")
def pinned_suite():
    return load_script("pinned_suite")


def _requirement_lines() -> list[str]:
    return [line for name in ("requirements.txt", "requirements-dev.txt")
            for line in (REPO / name).read_text().splitlines()]


def _pins(requirements) -> dict[str, str]:
    """{name: version} of ``name==version`` lines."""
    return dict(line.split("==", 1) for line in requirements if "==" in line)


PINNED = _pins(line for line in (line.split("#")[0].strip() for line in _requirement_lines())
               if line and not line.startswith("-r"))
DALI = {name: version for name, version in PINNED.items() if name.startswith("nvidia-dali")}


def test_the_oldest_pins_are_the_floor_pyproject_declares(pinned_suite):
    dependencies = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    floor = pinned_suite.declared_floor()
    assert f"torch>={floor['torch']}" in dependencies
    assert f"torchvision>={floor['torchvision']}" in dependencies


def test_an_old_torch_gets_numpy_1_no_dali_and_every_other_pin(pinned_suite):
    requirements = pinned_suite.pinned_requirements(_requirement_lines(), "2.3", "0.18", dali=False)
    pins = _pins(requirements)
    assert (pins["torch"], pins["torchvision"], pins["numpy"]) == ("2.3", "0.18", "1.26.4")
    assert not any(name.startswith("nvidia-dali") for name in pins)
    assert len(requirements) == len(pins) + 1  # each package once: setuptools as the build requires it
    assert "setuptools>=70.1" in requirements
    rest = set(PINNED) - {"torch", "torchvision", "numpy", "setuptools", *DALI}
    assert {name: pins[name] for name in rest} == {name: PINNED[name] for name in rest}  # test tools included
    assert "pytest-xdist" in rest


def test_a_newer_torch_keeps_numpy_2_and_dali_when_asked(pinned_suite):
    pins = _pins(pinned_suite.pinned_requirements(_requirement_lines(), "2.11.0", "0.26.0", dali=True))
    assert (pins["torch"], pins["torchvision"]) == ("2.11.0", "0.26.0")
    assert pins["numpy"] == PINNED["numpy"] and DALI and {name: pins[name] for name in DALI} == DALI


def test_setuptools_is_left_to_what_the_build_and_the_torch_pin_accept(pinned_suite):
    """torch 2.11 requires setuptools<82, below requirements-dev.txt's pin: the pins take pyproject.toml's build
    requirement instead, which pip resolves with the torch pin."""
    build = tomllib.loads((REPO / "pyproject.toml").read_text())["build-system"]["requires"]
    requirements = pinned_suite.pinned_requirements(_requirement_lines(), "2.11.0", "0.26.0", dali=False)
    setuptools = [line for line in requirements if line.startswith("setuptools")]
    assert setuptools == [r for r in build if r.startswith("setuptools")] and "==" not in setuptools[0]


def test_an_environment_is_reused_only_for_the_same_requirements(pinned_suite, tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(subprocess, "run", lambda argv, **kwargs: calls.append(argv))
    venv = tmp_path / "torch-2.3-tv-0.18-py3.11"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").touch()
    pinned_suite.build_environment(venv, ["torch==2.3", "torchvision==0.18"])
    assert calls[-1][-1] == str(venv / "requirements-pinned.txt") and len(calls) == 1
    pinned_suite.build_environment(venv, ["torch==2.3", "torchvision==0.18"])
    assert len(calls) == 1  # reused
    pinned_suite.build_environment(venv, ["torch==2.3", "torchvision==0.18", "numpy==1.26.4"])
    assert len(calls) == 2 and (venv / "requirements-pinned.txt").read_text().endswith("numpy==1.26.4\n")


def test_a_failed_install_is_not_taken_for_a_finished_one(pinned_suite, tmp_path, monkeypatch):
    venv = tmp_path / "env"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").touch()
    monkeypatch.setattr(subprocess, "run", lambda argv, **kwargs: None)
    pinned_suite.build_environment(venv, ["torch==2.3"])

    def pip_fails(argv, **kwargs):
        raise subprocess.CalledProcessError(1, argv)

    monkeypatch.setattr(subprocess, "run", pip_fails)
    with pytest.raises(subprocess.CalledProcessError):
        pinned_suite.build_environment(venv, ["torch==2.4"])
    with pytest.raises(subprocess.CalledProcessError):  # tried again, not reused
        pinned_suite.build_environment(venv, ["torch==2.3"])


@pytest.mark.parametrize("argv", [[], ["--torch", "2.11.0"], ["--torchvision", "0.26.0"],
                                  ["--oldest", "--torch", "2.4.1"], ["--torch", "", "--torchvision", ""],
                                  ["--torch", "../../2.11.0", "--torchvision", "0.26.0"],
                                  ["--torch", "2.11.0", "--torchvision", "0.26.0; rm -rf ~"]])
def test_pins_that_are_not_a_pair_are_refused_in_one_line(pinned_suite, argv, capsys):
    with pytest.raises(SystemExit) as exit_:
        pinned_suite.main(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.startswith("error: ") and err.count("\n") == 1
