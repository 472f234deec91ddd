"""The console commands of the installed package (``[project.scripts]`` in pyproject.toml).

Each is the entry point of one of the repository's scripts, wrapped in :func:`cli.run` as those scripts
are: ``ic-train`` = main.py, ``ic-launch`` = launch.py, ``ic-classify`` = classify.py, ``ic-multiproc`` =
multiproc.py, ``ic-checkpoint2model`` = checkpoint2model.py, ``ic-model2onnx`` = model2onnx.py, ``ic-pack`` =
``python -m image_classification.data.pack``.  Modules
are imported when the command runs, so ``ic-launch --list`` does not wait for the training code.
"""

from __future__ import annotations

import importlib
from typing import Callable

from .cli import run
from .signals import catch_early


def _command(module: str, function: str = "main", *, saves_on_signal: bool = False,
             prog: str | None = None) -> Callable[[], int]:
    """``prog``: the name the command gives itself in usage lines and the commands it prints."""
    def command() -> int:
        if saves_on_signal:  # as main.py and launch.py: a SIGTERM during the imports stops cleanly
            catch_early()
        entry = getattr(importlib.import_module(f"{__package__}.{module}"), function)
        return run(entry, prog=prog) if prog else run(entry)

    command.__doc__ = f"{module}.{function}, as a console command: its exit code"
    return command


train = _command("training", saves_on_signal=True, prog="ic-train")
launch = _command("launch", saves_on_signal=True, prog="ic-launch")
classify = _command("inference")
multiproc = _command("multiproc")
checkpoint2model = _command("export", "checkpoint2model_main")
model2onnx = _command("export", "model2onnx_main")
pack = _command("data.pack", prog="ic-pack")
