"""Print the lines of a requirements file whose package this Python environment does not have.

    python scripts/container_requirements.py requirements.txt > requirements-missing.txt

The Dockerfile installs only those.  An NGC PyTorch image ships its own builds of torch, torchvision,
DALI, numpy, Pillow and more, built against its CUDA and pinned by its pip constraints file
(``/etc/pip/constraint.txt``, in ``PIP_CONSTRAINT``): installing our pins over them would replace those
builds or fail against the pins.  DALI is one package per CUDA major (``nvidia-dali-cuda120``,
``nvidia-dali-cuda130``), so any installed flavour counts as DALI.

Standard library only: it runs in the image before anything of ours is installed.
"""

from __future__ import annotations

import argparse
import re
import sys
from importlib import metadata
from pathlib import Path
from typing import Iterable, Sequence

DALI = "nvidia-dali-cuda"


def canonical(name: str) -> str:
    """PEP 503's normalised distribution name."""
    return re.sub(r"[-_.]+", "-", name).lower()


def installed_distributions() -> set[str]:
    return {canonical(dist.metadata["Name"]) for dist in metadata.distributions() if dist.metadata["Name"]}


def _provided(name: str, installed: set[str]) -> bool:
    return name in installed or (name.startswith(DALI) and any(i.startswith(DALI) for i in installed))


def requirement_name(requirement: str) -> str:
    """The canonical distribution name of a requirement line without its comment (``torch==2.14.1``)."""
    match = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement)
    if match is None:
        raise ValueError(f"not a requirement: {requirement}")
    return canonical(match.group())


def missing_requirements(lines: Iterable[str], installed: set[str]) -> list[str]:
    """The requirement lines, as written, whose distribution is not in ``installed`` (canonical names)."""
    missing = []
    for line in lines:
        requirement = line.split("#", 1)[0].strip()
        if requirement and not _provided(requirement_name(requirement), installed):
            missing.append(requirement)
    return missing


class _Parser(argparse.ArgumentParser):
    """The toolkit's convention (one ``error:`` line, exit code 2) without importing the toolkit."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"error: {message}\n")


def main(argv: Sequence[str] | None = None) -> int:
    parser = _Parser(prog="container_requirements.py",
                     description="Print the requirement lines whose package is not installed here.")
    parser.add_argument("requirements", type=Path, metavar="FILE", help="a pip requirements file")
    args = parser.parse_args(argv)
    try:
        lines = args.requirements.read_text().splitlines()
        missing = missing_requirements(lines, installed_distributions())
    except OSError as error:
        parser.error(f"cannot read {args.requirements}: {error.strerror}")
    except ValueError as error:
        parser.error(f"{args.requirements}: {error}")
    print("\n".join(missing))
    return 0


if __name__ == "__main__":
    sys.exit(main())
