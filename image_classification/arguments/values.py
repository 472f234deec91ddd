"""What the argument groups share: a flag declared as a field of its group's dataclass (:func:`flag`,
:func:`add_group`, :func:`from_args`), argparse types, the bounds every flag is held to, and a value shown in a
message."""

from __future__ import annotations

import argparse
import dataclasses
import math
import reprlib
from typing import Any, Iterable, TypeVar

Config = TypeVar("Config")


def flag(*names: str, default: Any = None, **options: Any) -> Any:
    """A field of a group's dataclass that is a command-line flag: its names (``"--batch-size", "-b"``; a positional
    has its field's name), its default, and argparse's other options (type, choices, help, ...; ``choices`` and
    ``help`` may be functions, asked when a parser is built).  A field declared
    without it is one the run resolves (the learning rate a rule scales, the preprocessing a checkpoint records)."""
    if default is None and options.get("action") in ("store_true", "store_false"):  # a switch is off or on
        default = options["action"] == "store_false"
    return dataclasses.field(default=default, metadata={"flags": names, "options": options})


def add_group(parser: argparse.ArgumentParser, title: str | None, config: type) -> None:
    """Every flag of ``config`` (:func:`flag`), in field order, as an argument of the group ``title`` of ``parser``
    (None: of the parser itself); each sets the attribute of its field's name."""
    group = parser.add_argument_group(title) if title else parser
    for item in dataclasses.fields(config):
        if "flags" not in item.metadata:
            continue
        names, options = item.metadata["flags"], dict(item.metadata["options"])
        for key in ("choices", "help"):  # given as a function: what it says when the parser is built (the arch table)
            if callable(options.get(key)):
                options[key] = options[key]()
        if names[0].startswith("-"):
            options.setdefault("dest", item.name)
        group.add_argument(*names, default=item.default, **options)


def from_args(config: type[Config], args: argparse.Namespace, **resolved: Any) -> Config:
    """``config``'s dataclass built from the parsed (and checked) ``args``, its flags' values as parsed (a list of
    values as a tuple: the configuration is frozen), the fields in ``resolved`` as given there instead."""
    values = {item.name: getattr(args, item.name) for item in dataclasses.fields(config) if "flags" in item.metadata}
    values = {name: tuple(value) if isinstance(value, list) else value for name, value in values.items()}
    return config(**{**values, **resolved})

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
