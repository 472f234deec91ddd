"""How every script ends: a user's mistake is one line on stderr and exit code 2, never a traceback."""

from __future__ import annotations

import sys
from typing import Callable

from .errors import UserError


def run(entry: Callable[..., int | None], *args, **kwargs) -> int:
    """Call ``entry`` and turn a :class:`UserError` into ``error: ...`` on stderr and exit code 2."""
    try:
        code = entry(*args, **kwargs)
    except UserError as error:
        print(f"error: {error}", file=sys.stderr, flush=True)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr, flush=True)
        return 130
    return 0 if code is None else int(code)
