"""How every script starts and ends: a user's mistake is one line on stderr and exit code 2, never a
traceback.

Standard library only (as :mod:`image_classification.errors`, which holds the exit codes), so that
``multiproc.py`` and ``--help`` never wait for torch.
"""

from __future__ import annotations

import argparse
import difflib
import math
import os
import re
import sys
from typing import Callable, Sequence

from ..errors import EXIT_PREEMPTED, UserError
from .signals import Stopped


_NEGATIVE_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$")  # a value, not a flag (as argparse reads it)


class UserErrorParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors become :class:`UserError` (one line, exit code 2).

    A flag it does not know is named alone, with the closest one it does ("did you mean
    --label-smoothing?"), before anything else is said: argparse itself would take the typo's value for a
    positional argument (the dataset) and complain about what follows, or that a required flag is missing.
    """

    def error(self, message: str):  # type: ignore[override]
        raise UserError(f"{self.prog}: {message}")

    def parse_args(self, args: Sequence[str] | None = None, namespace=None):  # type: ignore[override]
        argv = list(sys.argv[1:] if args is None else args)
        if not any(action.nargs == argparse.REMAINDER for action in self._actions):
            self.refuse_unknown_flags(argv)  # a parser that passes the rest on (multiproc.py) cannot tell
            argv = self.expand_prefixes(argv)
        namespace, extras = self.parse_known_args(argv, namespace)
        self.refuse_unknown_flags(extras)
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return namespace

    def refuse_unknown_flags(self, argv: Sequence[str], *others: "UserErrorParser") -> None:
        """Raise :class:`UserError` for the first token of ``argv`` (up to ``--``) that is a flag unknown here
        and to ``others`` (the parsers that share a command line with this one: launch.py's and main.py's)."""
        parsers = (self, *others)
        for token in argv:
            if token == "--":
                return
            if len(token) < 2 or not token.startswith("-") or _NEGATIVE_NUMBER.match(token):
                continue
            if not any(parser._knows(token) for parser in parsers):
                flag = token.split("=", 1)[0]
                flags = [known for parser in parsers for known in parser._option_string_actions]
                close = difflib.get_close_matches(flag, flags, n=1, cutoff=0.6)
                hint = f"did you mean {close[0]}?" if close else f"{self.prog} -h lists the flags"
                raise UserError(f"{self.prog}: unknown flag {flag}; {hint}")

    def _get_values(self, action: argparse.Action, arg_strings: list[str]):
        """A flag's value is never ``--``: argparse drops it from ``--workers=--`` (or ``-j--``) and sets the flag
        to an empty list, on which the checks after parsing failed with a TypeError."""
        if action.option_strings and action.nargs not in (argparse.PARSER, argparse.REMAINDER) \
                and "--" in arg_strings:
            self.error(f"argument {'/'.join(action.option_strings)}: expected a value, got '--'")
        return super()._get_values(action, arg_strings)

    def expand_prefixes(self, argv: Sequence[str]) -> list[str]:
        """``argv`` with each unique prefix of a long flag (up to ``--``) written out, as argparse would read it
        (``--epoch 3`` is ``--epochs 3``; the reference's recipes type ``--mom``), each said on stderr, so
        that a prefix is never taken silently.  A prefix of several flags is left for argparse to refuse."""
        expanded, flags = [], [flag for flag in self._option_string_actions if flag.startswith("--")]
        for index, token in enumerate(argv):
            if token == "--":
                return expanded + list(argv[index:])
            name, equals, value = token.partition("=")
            matches = [flag for flag in flags if flag.startswith(name)] if self.allow_abbrev else []
            if name.startswith("--") and name not in self._option_string_actions and len(matches) == 1:
                print(f"note: {name} is read as {matches[0]}, the one flag it begins", file=sys.stderr, flush=True)
                token = matches[0] + equals + value
            expanded.append(token)
        return expanded

    def _knows(self, token: str) -> bool:
        """Whether argparse takes ``token`` for one of this parser's flags: the flag, ``--flag=value``, a
        prefix of one long flag (or of several: argparse names them), or a short flag with its value (``-b8``)."""
        known = self._option_string_actions
        if token.startswith("--"):
            name = token.split("=", 1)[0]
            return name in known or (self.allow_abbrev and any(flag.startswith(name) for flag in known))
        return token in known or token[:2] in known


MAX_COUNT = 2**31 - 1  # the largest whole number a flag takes: beyond any run, within what torch's kernels index


def whole(value: str) -> int:
    """``value`` as an integer; argparse's one-line error where it is none."""
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {value!r}") from None


def whole_number(value: str) -> int:
    """A whole-number flag's value, at most :data:`MAX_COUNT` in size (10^20 was an OverflowError or an allocator's
    traceback further on); the flag's own range is checked after parsing."""
    number = whole(value)
    if abs(number) > MAX_COUNT:
        raise argparse.ArgumentTypeError(f"must be at most {MAX_COUNT:,} in size, got {number}")
    return number


def positive_int(value: str) -> int:
    number = whole(value)
    if not 1 <= number <= MAX_COUNT:
        raise argparse.ArgumentTypeError(f"must be at least 1 and at most {MAX_COUNT:,}, got {number}")
    return number


def positive_float(value: str) -> float:
    number = float(value)
    if not (math.isfinite(number) and number > 0):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {value}")
    return number


def run(entry: Callable[..., int | None], *args, **kwargs) -> int:
    """Call ``entry`` and turn a :class:`UserError` into ``error: ...`` on stderr and its exit code (2 for
    bad input; see :mod:`image_classification.errors` for the others), and a stop signal that interrupted
    its work (:class:`image_classification.system.signals.Stopped`) into that line and exit 75."""
    try:
        code = entry(*args, **kwargs)
    except UserError as error:
        return report(error)
    except Stopped as stop:  # SIGTERM / SIGUSR1 inside signals.stop_raises: its partial files are gone
        print(stop, file=sys.stderr, flush=True)
        return EXIT_PREEMPTED
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr, flush=True)
        return 130
    except BrokenPipeError:  # the reader went away (`... | head`): stop quietly, as a shell tool does
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    return 0 if code is None else int(code)


def report(error: UserError) -> int:
    """Say ``error: ...`` on stderr, in one line; returns the exit code it calls for."""
    print(f"error: {error}", file=sys.stderr, flush=True)
    return error.exit_code
