"""SIGTERM and SIGUSR1 (what SLURM sends at a time limit or before a preemption), and a training run's first
SIGINT (Ctrl-C): remembered, never fatal.

Standard library only, so that the entry scripts can catch them before torch is imported: a signal during
the imports, the dataset scan or the checkpoint load then stops the run cleanly (exit 75) before its first
step, instead of killing it with no word.  Once the loop runs, it saves where it is and stops.  A second
Ctrl-C is the way out of a stop that takes too long (a validation pass ends before the stop is acted on):
it raises KeyboardInterrupt at once, and the run ends with exit code 130 and no new checkpoint, but for a
file being written when it comes: :func:`image_classification.records.checkpoint.write_atomic` holds the
signals meanwhile and hands them to these handlers once the file is in place (raised inside torch.save's
zip writer, the interrupt could abort the process).

Work with nothing worth saving (an ONNX export) stops at once instead, inside :func:`stop_raises`: the
signal raises :class:`Stopped`, whose ``finally`` blocks remove the partial file on the way out, and
:func:`image_classification.system.cli.run` ends the script with its one line and exit 75.
"""

from __future__ import annotations

import contextlib
import signal
import sys
from typing import Iterator

from ..errors import EXIT_PREEMPTED

STOP_SIGNALS = ("SIGTERM", "SIGUSR1")
RUN_STOP_SIGNALS = STOP_SIGNALS + ("SIGINT",)  # what stops a training run with a checkpoint (exit 75)

_received: list[str] = []  # the signals caught since the handlers went in (a list: no `global`)
_previous: dict[int, object] = {}  # the handlers ours replaced, restored when the run ends


def _handle(signum, frame) -> None:
    name = signal.Signals(signum).name
    if name == "SIGINT" and name in _received:
        print("Received SIGINT again: stopping at once, without saving", file=sys.stderr, flush=True)
        raise KeyboardInterrupt
    _received.append(name)
    if name == "SIGINT":
        print("Received SIGINT: stopping at the next step, with a checkpoint of it (Ctrl-C again stops at once, "
              "without one)", file=sys.stderr, flush=True)
    else:
        print(f"Received {name}", file=sys.stderr, flush=True)


def catch_early() -> None:
    """Install the handlers now (an entry script's first line); :class:`StopSignal` keeps what they caught."""
    for name in RUN_STOP_SIGNALS:
        number = getattr(signal, name, None)
        if number is None or number in _previous:
            continue
        try:
            _previous[number] = signal.signal(number, _handle)
        except ValueError:  # not the main thread: leave the signals alone
            return


class StopSignal:
    """A run's stop signals: ``received`` names the first one, caught since the handlers were installed."""

    def __enter__(self) -> "StopSignal":
        catch_early()
        return self

    @property
    def received(self) -> str | None:
        return _received[0] if _received else None

    def __exit__(self, *exc) -> None:
        for number, previous in _previous.items():
            signal.signal(number, previous)
        _previous.clear()
        _received.clear()


def ignore_in_worker() -> None:
    """For a loader's worker process: the stop signals are the main process's to act on.

    SLURM signals the whole process group, and so does a terminal's Ctrl-C; a worker killed by it would end
    the run with a DataLoader traceback instead of the main process's checkpoint and exit 75.
    """
    for name in RUN_STOP_SIGNALS:
        number = getattr(signal, name, None)
        if number is not None:
            signal.signal(number, signal.SIG_IGN)


class Stopped(BaseException):
    """A stop signal received inside :func:`stop_raises`; its text is the line the script ends with.

    A BaseException, as KeyboardInterrupt is: code that catches Exception (the ONNX exporter's) lets it by.
    """


@contextlib.contextmanager
def stop_raises(doing: str, outcome: str) -> Iterator[None]:
    """Within the block, SIGTERM and SIGUSR1 raise :class:`Stopped` ("Stopped by SIGTERM while ``doing``;
    ``outcome`` (exit code 75)"); a second signal while that unwinds is ignored, so that the clean-up runs.
    Outside the main thread, where handlers cannot be set, the signals keep their handlers."""
    raised: list[str] = []

    def handle(signum, frame) -> None:
        if raised:
            return
        raised.append(signal.Signals(signum).name)
        raise Stopped(f"Stopped by {raised[0]} while {doing}; {outcome} (exit code {EXIT_PREEMPTED})")

    previous = {}
    try:
        for name in STOP_SIGNALS:
            number = getattr(signal, name, None)
            if number is not None:
                previous[number] = signal.signal(number, handle)
    except ValueError:  # not the main thread
        pass
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
