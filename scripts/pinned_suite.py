"""Run the test suite on other torch and torchvision versions than requirements.txt pins.

    python3.12 scripts/pinned_suite.py --torch 2.11.0 --torchvision 0.26.0 -- -q -n 2
    python3 scripts/pinned_suite.py --oldest -- -q tests/test_training.py

Builds a virtual environment per set of pins (or reuses it when its requirements are unchanged) under
``.venv-pins/``, with the Python that runs this script, from requirements-dev.txt (requirements.txt
included) with the torch and torchvision pins replaced and DALI left out unless ``--dali``, then runs
pytest in it with the arguments after ``--``.  ``--oldest`` takes the floor that pyproject.toml declares
(``torch>=2.3``: torch 2.3), so ``make test-oldest`` tests exactly what the package promises.

Standard library only: it runs before the environment it builds exists.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))
from container_requirements import DALI, requirement_name  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
PINS_DIR = REPO / ".venv-pins"
# torch before 2.4 was built against numpy 1: under numpy 2 it cannot exchange arrays ("Numpy is not
# available"), so those pins get the last numpy 1, which every other pin in requirements.txt accepts
NUMPY_1_BEFORE_TORCH = (2, 4)
NUMPY_1 = "numpy==1.26.4"
# requirements-dev.txt pins the setuptools that builds the package (tests/test_packaging.py), but a torch may
# cap it (torch 2.11: setuptools<82): other pins get pyproject.toml's own build requirement instead, and pip
# picks a setuptools that both accept
SETUPTOOLS = "setuptools"
VERSION = re.compile(r"\d+(\.\d+)*([a-z]+\d*)?(\+[a-z0-9]+)?")  # 2.11.0, 2.6.0rc1, 2.3.0+cu121


def release(version: str) -> tuple[int, ...]:
    """The leading numbers of a version (``2.11.0+cu130``: (2, 11, 0))."""
    return tuple(int(part) for part in re.findall(r"\d+", version.split("+")[0])[:3])


def declared_floor(pyproject: Path = REPO / "pyproject.toml") -> dict[str, str]:
    """The lowest torch and torchvision versions that pyproject.toml accepts (``torch>=2.3``: "2.3")."""
    floor = {}
    for dependency in tomllib.loads(pyproject.read_text())["project"]["dependencies"]:
        found = re.fullmatch(r"(torch|torchvision)\s*>=\s*([\w.]+)", dependency.strip())
        if found:
            floor[found.group(1)] = found.group(2)
    if set(floor) != {"torch", "torchvision"}:
        raise ValueError(f"{pyproject} declares no 'torch>=X' and 'torchvision>=Y' dependencies")
    return floor


def build_requirement(name: str, pyproject: Path = REPO / "pyproject.toml") -> str:
    """pyproject.toml's ``[build-system] requires`` entry for ``name`` (``setuptools>=70.1``)."""
    for requirement in tomllib.loads(pyproject.read_text())["build-system"]["requires"]:
        if requirement_name(requirement) == name:
            return requirement.strip()
    raise ValueError(f"{pyproject} does not require {name} to build")


def pinned_requirements(lines: Sequence[str], torch: str, torchvision: str, dali: bool) -> list[str]:
    """``lines`` (requirement files' lines, ``-r`` includes left out) as pip should install them: torch and
    torchvision at the versions given, DALI dropped unless ``dali``, numpy 1 under a torch before 2.4,
    setuptools as the build needs it rather than pinned."""
    replaced = {"torch": f"torch=={torch}", "torchvision": f"torchvision=={torchvision}",
                SETUPTOOLS: build_requirement(SETUPTOOLS)}
    if release(torch) < NUMPY_1_BEFORE_TORCH:
        replaced["numpy"] = NUMPY_1
    pinned = []
    for line in lines:
        requirement = line.split("#", 1)[0].strip()
        if not requirement or requirement.startswith("-r"):
            continue
        name = requirement_name(requirement)
        if name.startswith(DALI) and not dali:
            continue
        pinned.append(replaced.pop(name, requirement))
    return pinned + list(replaced.values())


def environment_name(torch: str, torchvision: str, dali: bool) -> str:
    """``torch-2.3-tv-0.18-py3.11``, with ``-dali`` when DALI is installed."""
    python = f"py{sys.version_info.major}.{sys.version_info.minor}"
    return f"torch-{torch}-tv-{torchvision}-{python}" + ("-dali" if dali else "")


def build_environment(venv: Path, requirements: list[str]) -> Path:
    """``venv`` holding exactly ``requirements`` (built, or reused when it was built from the same list);
    its Python."""
    python, wanted = venv / "bin" / "python", "\n".join(requirements) + "\n"
    installed = venv / "requirements-installed.txt"
    if installed.is_file() and installed.read_text() == wanted and python.exists():
        print(f"Reusing {venv} ({requirements_summary(requirements)})", flush=True)
        return python
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    installed.unlink(missing_ok=True)  # a failed install leaves no record that passes for a finished one
    listed = venv / "requirements-pinned.txt"
    listed.write_text(wanted)
    print(f"Installing into {venv} ({requirements_summary(requirements)}); a first install downloads "
          "torch and its CUDA libraries, a few GB", flush=True)
    subprocess.run([str(python), "-m", "pip", "install", "--disable-pip-version-check", "--progress-bar",
                    "off", "-q", "-r", str(listed)], check=True)
    installed.write_text(wanted)
    return python


def requirements_summary(requirements: list[str]) -> str:
    """The pins that set an environment apart: torch's, torchvision's, numpy's and DALI's."""
    shown = ("torch", "torchvision", "numpy")
    names = [requirement_name(requirement) for requirement in requirements]
    return ", ".join(r for r, name in zip(requirements, names) if name in shown or name.startswith(DALI))


class _Parser(argparse.ArgumentParser):
    """The toolkit's convention (one ``error:`` line, exit code 2) without importing the toolkit."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"error: {message}\n")


def main(argv: Sequence[str] | None = None) -> int:
    parser = _Parser(prog="pinned_suite.py", description="Run pytest on other torch and torchvision pins.")
    parser.add_argument("--torch", metavar="VERSION", help="the torch version to install, e.g. 2.11.0")
    parser.add_argument("--torchvision", metavar="VERSION", help="the torchvision version that goes with it")
    parser.add_argument("--oldest", action="store_true",
                        help="the oldest torch and torchvision that pyproject.toml accepts")
    parser.add_argument("--dali", action="store_true", help="install DALI too (requirements.txt's pin)")
    parser.add_argument("pytest_args", nargs="*", metavar="PYTEST_ARG", help="passed to pytest (after --)")
    args = parser.parse_args(argv)
    given = [version for version in (args.torch, args.torchvision) if version]
    if (bool(given) if args.oldest else len(given) != 2):
        parser.error("give either --oldest or both --torch and --torchvision (each torch has its own)")
    for version in given:
        if not VERSION.fullmatch(version):
            parser.error(f"{version[:40]!r} is not a version number (such as 2.11.0)")
    try:
        pins = declared_floor() if args.oldest else {"torch": args.torch, "torchvision": args.torchvision}
        lines = [line for name in ("requirements.txt", "requirements-dev.txt")
                 for line in (REPO / name).read_text().splitlines()]
        requirements = pinned_requirements(lines, pins["torch"], pins["torchvision"], args.dali)
    except (OSError, ValueError, tomllib.TOMLDecodeError) as error:
        parser.error(str(error))
    venv = PINS_DIR / environment_name(pins["torch"], pins["torchvision"], args.dali)
    try:
        python = build_environment(venv, requirements)
    except subprocess.CalledProcessError as error:
        print(f"error: installing into {venv} failed (exit code {error.returncode}; pip's output is above)",
              file=sys.stderr)
        return 2
    return subprocess.run([str(python), "-m", "pytest", *args.pytest_args], cwd=REPO).returncode


if __name__ == "__main__":
    sys.exit(main())
