"""What the argument groups share: argparse types, the bounds every flag is held to, and a value shown in a
message."""

from __future__ import annotations

import argparse
import math
import reprlib
from typing import Iterable

from ..errors import UserError

# The longest wait a flag may ask for, in seconds: far beyond any run, and far within what Python's clocks,
# threading's waits (TIMEOUT_MAX, about 292 years on Linux) and timedelta (the process group's timeout) hold.
MAX_WAIT_S = 365 * 24 * 3600
# Every float flag ends up in float32 tensors (the optimizers' steps, the loss scale): a larger value overflows
# there, in some optimizers as a crash, in others as weights that go non-finite, and a smaller one than float32's
# smallest normal number is 0 or a subnormal there (a loss scale of 1e-40: 1/scale is infinite, the unscaled
# gradients NaN), so both are flag errors.  Written out: the parser imports no torch.
FLOAT32_MAX = 3.4028234663852886e38  # torch.finfo(torch.float32).max
FLOAT32_TINY = 1.1754943508222875e-38  # torch.finfo(torch.float32).tiny, the smallest normal number


def str2bool(value: str) -> bool:
    lowered = value.lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {value!r}")


def float32(value: str) -> float:
    """A float flag's value, held to the float32 it becomes: 0, or finite and from :data:`FLOAT32_TINY` to
    :data:`FLOAT32_MAX` in size (the flag's own range is checked after parsing)."""
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {value!r}") from None
    if number != 0 and not (math.isfinite(number) and FLOAT32_TINY <= abs(number) <= FLOAT32_MAX):
        raise argparse.ArgumentTypeError(f"must be 0 or from {FLOAT32_TINY:.4g} to {FLOAT32_MAX:.4g} in size (what "
                                         f"float32 holds), got {value}")
    return number


def probability(value: str) -> float:
    number = float32(value)
    if not 0.0 <= number <= 1.0:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1, got {number}")
    return number


def raise_first(checks: Iterable[tuple[bool, str]]) -> None:
    """Raise :class:`UserError` with the message of the first ``(failed, message)`` pair that failed."""
    for failed, message in checks:
        if failed:
            raise UserError(message)


_SHOWN = reprlib.Repr()  # reads only what it shows: a few items, two levels deep
_SHOWN.maxlevel, _SHOWN.maxstring, _SHOWN.maxother = 2, 40, 40
_SHOWN.maxlist = _SHOWN.maxtuple = _SHOWN.maxdict = _SHOWN.maxset = 4


def shown(value, limit: int = 100) -> str:
    """``value`` for a one-line message, cut short: a preset's value may be huge or hold itself (YAML
    aliases), and a full repr of it would take minutes and gigabytes."""
    text = _SHOWN.repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."
