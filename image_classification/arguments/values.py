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
# there, in some optimizers as a crash, in others as weights that go non-finite, so it is a flag error.
FLOAT32_MAX = 3.4028234663852886e38  # torch.finfo(torch.float32).max, written out: the parser imports no torch


def str2bool(value: str) -> bool:
    lowered = value.lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {value!r}")


def probability(value: str) -> float:
    number = float(value)
    if not 0.0 <= number <= 1.0:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1, got {number}")
    return number


def check_float32(args: argparse.Namespace, names: tuple[str, ...]) -> None:
    """Each float flag of ``names`` (dests) that is given must be finite and fit float32. Raises :class:`UserError`."""
    for name in names:
        value = getattr(args, name)
        if value is not None and not (math.isfinite(value) and abs(value) <= FLOAT32_MAX):
            raise UserError(f"--{name.replace('_', '-')} must be a finite number that float32 can hold (at most "
                            f"{FLOAT32_MAX:.4g} in size), got {value}")


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
