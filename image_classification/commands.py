"""The console commands of the installed package (``[project.scripts]`` in pyproject.toml).

Each is the entry point of one of the repository's scripts, wrapped in :func:`cli.run` as those scripts
are: ``ic-train`` = main.py, ``ic-launch`` = launch.py, ``ic-classify`` = classify.py, ``ic-multiproc`` =
multiproc.py, ``ic-checkpoint2model`` = checkpoint2model.py, ``ic-model2onnx`` = model2onnx.py.  Modules
are imported when the command runs, so ``ic-launch --list`` does not wait for the training code.
"""

from __future__ import annotations

import importlib
from typing import Callable

from .cli import run
from .signals import catch_early


def _command(module: str, function: str = "main", *, saves_on_signal: bool = False) -> Callable[[], int]:
    def command() -> int:
        if saves_on_signal:  # as main.py and launch.py: a SIGTERM during the imports stops cleanly
            catch_early()
        return run(getattr(importlib.import_module(f"{__package__}.{module}"), function))

    command.__doc__ = f"{module}.{function}, as a console command: its exit code"
    return command


train = _command("training", saves_on_signal=True)
launch = _command("launch", saves_on_signal=True)
classify = _command("inference")
multiproc = _command("multiproc")
checkpoint2model = _command("export", "checkpoint2model_main")
model2onnx = _command("export", "model2onnx_main")
