"""The entry points of the repository's scripts and of the installed package's console commands
(``[project.scripts]`` in pyproject.toml): ``ic-train`` = main.py, ``ic-launch`` = launch.py,
``ic-quant-train`` = quant_main.py, ``ic-classify`` = classify.py, ``ic-multiproc`` = multiproc.py,
``ic-checkpoint2model`` = checkpoint2model.py, ``ic-model2onnx`` = model2onnx.py, ``ic-pack`` = ``python -m
image_classification.data.pack``.

Each parses its command line before it imports the module that does the work: the parsers import no
torch, so ``-h`` and a mistyped flag answer at once instead of after seconds of imports, and
``ic-launch --list`` does not wait for the training code.  Each runs under :func:`cli.run`: a user's
mistake is one line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import importlib
from typing import Callable

from .arguments import parse_args
from .arguments.tools import (check_classify_paths, checkpoint2model_parser, classify_parser, model2onnx_parser,
                              pack_parser)
from .system.cli import run
from .system.signals import catch_early


def _parse_then_run(parse: Callable[[], argparse.Namespace], module: str, function: str) -> int:
    """``module.function(parse())``, the module imported only once the arguments are parsed; the exit code."""
    def job() -> int | None:
        args = parse()
        return getattr(importlib.import_module(f"{__package__}.{module}"), function)(args)

    return run(job)


def train(prog: str = "ic-train", defaults: dict | None = None) -> int:
    """main.py: train, evaluate or benchmark (``prog``: the name in usage lines and messages; ``defaults``: values
    under the typed flags, quant_main.py's); what it refuses without torch (the dataset, the workspace) it refuses
    before it imports the training code."""
    catch_early()  # as main.py: a SIGTERM during the imports stops the run cleanly (exit 75)

    def job() -> int | None:
        args = parse_args(prog=prog, defaults=defaults)
        from .train.startup import launched, preflight  # deferred: numpy and PIL (the dataset check), past -h

        classes = None if launched() else preflight(args)  # a launched process checks once its rank is known
        from .training import train as run_training  # deferred: torch

        return run_training(args, classes=classes)

    return run(job)


# quant_main.py's values under the typed flags: the reference's default, efficientnet-quant-b0
QUANT_DEFAULTS = {"quantize_aware": True, "arch": "efficientnet-b0"}


def quant_train(prog: str = "ic-quant-train") -> int:
    """quant_main.py: main.py with quantization-aware training (``--quantize-aware`` set; by default
    ``--arch efficientnet-b0``, the reference's ``efficientnet-quant-b0``)."""
    return train(prog=prog, defaults=QUANT_DEFAULTS)


def launch(prog: str = "ic-launch") -> int:
    """launch.py: a preset of configs.yml; installed, the commands it prints name ``ic-train``."""
    catch_early()
    from .launch import main  # deferred: PyYAML and the presets, which only this command reads

    return run(main, prog=prog)


def classify() -> int:
    """classify.py: classify images with a trained model; an ``--image`` or ``--labels`` path that names nothing
    readable is refused before torch is imported."""
    def parse() -> argparse.Namespace:
        args = classify_parser().parse_args()
        check_classify_paths(args)
        return args

    return _parse_then_run(parse, "deploy.inference", "classify")


def multiproc() -> int:
    """multiproc.py: one training process per GPU."""
    from .multiproc import main  # deferred: the launcher's own imports (logging...), for this command alone

    return run(main)


def checkpoint2model() -> int:
    """checkpoint2model.py: the weights of a training checkpoint as a plain state dict."""
    return _parse_then_run(lambda: checkpoint2model_parser().parse_args(), "deploy.export", "checkpoint2model")


def model2onnx() -> int:
    """model2onnx.py: export a model to ONNX, checked against PyTorch."""
    return _parse_then_run(lambda: model2onnx_parser().parse_args(), "deploy.export", "model2onnx")


def pack() -> int:
    """``python -m image_classification.data.pack``: an ImageFolder packed into WebDataset shards."""
    return _parse_then_run(lambda: pack_parser(prog="ic-pack").parse_args(), "data.pack", "pack_command")
