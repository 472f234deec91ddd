"""How every script starts and ends: a user's mistake is one line on stderr and exit code 2, never a
traceback.

Standard library only (as :mod:`image_classification.errors`, which holds the exit codes), so that
``multiproc.py`` and ``--help`` never wait for torch.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from typing import Callable

from .errors import EXIT_PREEMPTED, UserError
from .signals import Stopped


class UserErrorParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors become :class:`UserError` (one line, exit code 2)."""

    def error(self, message: str):  # type: ignore[override]
        raise UserError(f"{self.prog}: {message}")


def positive_int(value: str) -> int:
    number = int(value)
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {number}")
    return number


def positive_float(value: str) -> float:
    number = float(value)
    if not (math.isfinite(number) and number > 0):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {value}")
    return number


def run(entry: Callable[..., int | None], *args, **kwargs) -> int:
    """Call ``entry`` and turn a :class:`UserError` into ``error: ...`` on stderr and its exit code (2 for
    bad input; see :mod:`image_classification.errors` for the others), and a stop signal that interrupted
    its work (:class:`image_classification.signals.Stopped`) into that line and exit 75."""
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
