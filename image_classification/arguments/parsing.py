"""The parser built from the groups, the checks run after parsing, and presets written as the flags they set."""

from __future__ import annotations

import argparse
import functools
import sys
from typing import Sequence

from ..errors import UserError
from ..models import list_models
from ..system.cli import UserErrorParser
from .data import add_data_arguments, check_data_combinations, check_data_values
from .deployed import add_deployed_arguments, check_deployed_combinations
from .model import add_model_arguments, check_compile_supported, check_model_combinations, settle_quant_spelling
from .optimisation import add_optimisation_arguments, check_optimisation_combinations, check_optimisation_values
from .precision import add_precision_arguments, check_precision_values
from .run import add_run_arguments, bare_gather_flag, check_run_combinations, check_run_values
from .values import shown, str2bool


# Where a plain main.py run's defaults differ from the reference's main.py: the reference's values.  launch.py's
# presets (the reference's recipes) start from these, so that every preset resolves as it did in the reference.
REFERENCE_DEFAULTS = {"lr": 0.1, "last_bn_0_init": False, "memory_format": "nchw"}


def build_parser(prog: str = "main.py") -> argparse.ArgumentParser:
    """Return the parser for training, evaluation and benchmarking runs; the groups in the order of ``-h``."""
    parser = UserErrorParser(prog=prog, description="PyTorch ImageNet Training")
    add_data_arguments(parser)
    add_model_arguments(parser)
    add_optimisation_arguments(parser)
    add_precision_arguments(parser)
    add_deployed_arguments(parser)
    add_run_arguments(parser)
    return parser


def parse_args(argv: Sequence[str] | None = None, defaults: dict | None = None, *,
               require_data: bool = True, prog: str = "main.py") -> argparse.Namespace:
    """Parse ``argv`` (``sys.argv[1:]`` when None), with ``defaults`` (a preset) applied under explicit flags.

    A preset's values go through exactly the checks a typed flag does: each is written as the flag it
    stands for and parsed, so ``batch_size: 0`` fails like ``-b 0`` does, naming the key.
    ``require_data=False`` accepts a missing DIR (``launch.py --dry-run`` prints a command without one).
    ``prog``: the command's name in usage and errors (``ic-train`` when installed).
    """
    archs = tuple(list_models())
    parser = _shared_parser(prog, archs)
    argv = list(sys.argv[1:] if argv is None else argv)
    preset_argv: list[str] = []
    for key, value in (defaults or {}).items():
        tokens = preset_tokens(parser, key, value)
        try:
            _check_alone(prog, archs, tuple(tokens))
        except UserError as error:
            reason = str(error).split(": ", 1)[-1] if str(error).startswith(parser.prog) else str(error)
            raise UserError(f"preset value {key}: {shown(value)} is not valid: {reason[:200]}") from None
        preset_argv += tokens
    args = parser.parse_args(bare_gather_flag(preset_argv + argv))
    settle_quant_spelling(args)
    validate_args(args, require_data=require_data)
    return args


@functools.lru_cache(maxsize=4)
def _shared_parser(prog: str, archs: tuple[str, ...]) -> argparse.ArgumentParser:
    """:func:`build_parser`'s parser for :func:`parse_args`, which only reads it (parsing changes no parser; a
    caller that changes one builds its own), built once per ``prog`` and model table (``archs``: ``--arch``'s
    choices and help are the table's when the parser is built)."""
    return build_parser(prog)


@functools.lru_cache(maxsize=2048)
def _check_alone(prog: str, archs: tuple[str, ...], tokens: tuple[str, ...]) -> None:
    """Parse ``tokens`` (one preset value's flag) on their own and check the value (:func:`check_values`), once
    per value: both are pure functions of the tokens, and a dry run or a test resolves the same presets many
    times (errors are raised each time, never cached)."""
    check_values(_shared_parser(prog, archs).parse_args(bare_gather_flag(list(tokens))))


def check_values(args: argparse.Namespace) -> None:
    """Check each value on its own: ranges argparse's types do not cover. Raises :class:`UserError`."""
    check_data_values(args)
    check_optimisation_values(args)
    check_precision_values(args)
    check_run_values(args)


def validate_args(args: argparse.Namespace, *, require_data: bool = True) -> None:
    """Check values and their combinations. Raises :class:`UserError`."""
    check_values(args)
    check_data_combinations(args, require_data=require_data)
    check_optimisation_combinations(args)
    check_run_combinations(args)
    check_deployed_combinations(args)
    check_model_combinations(args)
    check_compile_supported(args)  # last: it imports torch


def _action_for(parser: argparse.ArgumentParser, dest: str) -> argparse.Action | None:
    return next((a for a in parser._actions if a.dest == dest and a.option_strings), None)


def flag_tokens(action: argparse.Action, value) -> list[str]:
    """The command-line tokens that set ``action``'s dest to ``value`` (none for a switch left off)."""
    flag = next((s for s in action.option_strings if s.startswith("--")), action.option_strings[0])
    if isinstance(action, argparse.BooleanOptionalAction):
        return [flag if value else "--no-" + flag[2:]]
    if action.nargs == 0:  # store_true / store_false
        return [flag] if value == action.const else []
    if isinstance(value, (list, tuple)):
        return [flag, *map(str, value)]
    if isinstance(value, bool):
        return [f"{flag}={str(value).lower()}"]
    return [f"{flag}={value}"]


def preset_tokens(parser: argparse.ArgumentParser, key: str, value) -> list[str]:
    """The tokens that set ``key`` (an argparse dest) to a preset's ``value``, its type checked; [] for None."""
    action = _action_for(parser, key)
    if action is None or key == "help":
        raise UserError(f"unknown configuration key: {shown(key)}")
    if value is None:
        return []
    if isinstance(value, str) and "\0" in value:  # it would reach the file system as a path, which refuses it
        raise UserError(f"preset value {key}: {shown(value)} is not valid: it holds a NUL byte, which no flag value "
                        "or file name can hold")
    if isinstance(action, argparse.BooleanOptionalAction) or action.nargs == 0:
        _require(key, value, bool)
    elif isinstance(action.nargs, int) and action.nargs > 1:
        if not isinstance(value, (list, tuple)) or len(value) != action.nargs:
            count = {2: "two", 4: "four"}.get(action.nargs, str(action.nargs))
            raise UserError(f"preset value {key}: {shown(value)} is not valid: expected a list of {count} numbers")
        for item in value:
            _require(key, item, (int, float), scalar=True)
    elif not (isinstance(value, bool) and action.type is str2bool):
        _require(key, value, (str, int, float), scalar=True)
    return flag_tokens(action, value)


def _require(key: str, value, kinds, scalar: bool = False) -> None:
    wrong = not isinstance(value, kinds) or (scalar and isinstance(value, bool))
    if wrong:
        expected = "true or false" if kinds is bool else "a single value"
        raise UserError(f"preset value {key}: {shown(value)} is not valid: expected {expected}")
