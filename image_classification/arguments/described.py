"""A parsed main.py command line described: the main.py arguments that reproduce it, and where each of its values
comes from (typed, a preset's layer, or main.py's default), as ``launch.py --dry-run`` prints them."""

from __future__ import annotations

import argparse
from typing import Sequence

from .parsing import build_parser, flag_tokens


def main_py_argv(args: argparse.Namespace, always: Sequence[str] = ()) -> list[str]:
    """main.py arguments that reproduce ``args``: every value that differs from main.py's default, and the dests in
    ``always`` (a preset's keys) even where they equal it."""
    argv, positional = [], []
    for action in build_parser()._actions:
        value = getattr(args, action.dest, None)
        if action.dest == "help" or value is None:  # None is only ever a default, and no flag spells it
            continue
        default = action.default
        same = value == default or (isinstance(value, (list, tuple)) and default is not None
                                    and list(value) == list(default))
        if same and action.dest not in always:
            continue
        if action.option_strings:
            argv += flag_tokens(action, value)
        else:
            positional.append(str(value))
    return argv + positional


VALUES_HEADER = "# every value of the run as written, and where it comes from (a later preset wins, a typed flag most):"


def typed_dests(argv: Sequence[str]) -> set[str]:
    """The main.py destinations that the command line ``argv`` gives a value (a parse with no defaults)."""
    parser = build_parser()
    for action in parser._actions:
        action.default = argparse.SUPPRESS  # an action without a value typed sets nothing
    return set(vars(parser.parse_known_args(list(argv))[0]))


def source_of(key: str, layers: Sequence[tuple[str, dict]]) -> str | None:
    """The name of the last of ``layers`` (name, values) that sets ``key``."""
    return next((name for name, preset in reversed(layers) if key in preset), None)


def value_sources(args: argparse.Namespace, typed: set[str], layers: Sequence[tuple[str, dict]]) -> list[str]:
    """A line per main.py option that the command line or a preset sets (its value, then where it is set), and
    the options left at main.py's defaults, with theirs, in a few lines."""
    lines, defaults = [VALUES_HEADER], []
    for action in build_parser()._actions:
        if action.dest == "help":
            continue
        value = getattr(args, action.dest)
        name = next((flag for flag in action.option_strings if flag.startswith("--")),
                    action.option_strings[-1] if action.option_strings else action.metavar or action.dest)
        source = "typed" if action.dest in typed else source_of(action.dest, layers)
        if action.dest == "num_classes" and source != "typed" and value is None:
            source = None  # the presets' ImageNet count is left out: the classes line above says which
        if source is None:
            defaults.append(f"{name} {_value_text(action, value)}")
        else:
            lines.append(f"#   {name} {_value_text(action, value)}: {source}")
    lines.append("# main.py's defaults for the rest:")
    row = "#  "
    for item in defaults:
        if len(row) + len(item) + 2 > 110:
            lines.append(row.rstrip(","))
            row = "#  "
        row += f" {item},"
    return lines + [row.rstrip(",")]


def _value_text(action: argparse.Action, value) -> str:
    if value is None:
        return "none"
    if isinstance(action, argparse.BooleanOptionalAction) or action.nargs == 0:
        on = value if isinstance(action, argparse.BooleanOptionalAction) else value == action.const
        return "on" if on else "off"
    return " ".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)
