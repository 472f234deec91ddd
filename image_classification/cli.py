"""How every script ends: a user's mistake is one line on stderr and exit code 2, never a traceback."""

from __future__ import annotations

import os
import sys
from typing import Callable

from .errors import UserError


def run(entry: Callable[..., int | None], *args, **kwargs) -> int:
    """Call ``entry`` and turn a :class:`UserError` into ``error: ...`` on stderr and its exit code (2 for
    bad input; see :mod:`image_classification.errors` for the others)."""
    try:
        code = entry(*args, **kwargs)
    except UserError as error:
        return report(error)
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
