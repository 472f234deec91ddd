"""A line of progress every minute or so, where no progress bar is drawn (output to a log file, a job's
output): how far a pass is and about how long it has left, whatever ``--print-freq`` says.

A training epoch of a few slow iterations prints its first ``--print-freq`` window only at its end; on a
terminal a bar shows the way, elsewhere these lines do.  They read no device value (the loop synchronises
once per print window, never more), only the count of iterations done and the wall clock.
"""

from __future__ import annotations

import sys
import time
from typing import Callable

HEARTBEAT_SECONDS = 60.0  # the longest a long pass stays silent


def format_duration(seconds: float) -> str:
    """``42s``, ``3m 05s``, ``2h 07m``: to the second below an hour, to the minute above."""
    seconds = max(0, int(round(seconds)))
    if seconds < 60:
        return f"{seconds}s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m {seconds:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes:02d}m"


class _NoProgress:
    def update(self, n: int = 1) -> None:
        pass

    def close(self) -> None:
        pass


class Heartbeat(_NoProgress):
    """Counts a pass's steps as a progress bar does (``update``, ``close``) and says, at most once every
    ``every`` seconds (default :data:`HEARTBEAT_SECONDS`), ``<description>: <done>/<total> <unit>, <elapsed> so far, about <left> left``.

    ``done``: where the pass starts (a resumed epoch); the rate, and so the time left, counts only the steps
    taken here."""

    def __init__(self, total: int, description: str, log: Callable[[str], None], *, done: int = 0,
                 unit: str = "iterations", every: float | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.total, self.description, self.log, self.unit = total, description, log, unit
        self.every, self.clock = HEARTBEAT_SECONDS if every is None else every, clock
        self.done = self._first = done
        self._started = self._said = clock()

    def update(self, n: int = 1) -> None:
        self.done += n
        now = self.clock()
        if now - self._said < self.every or self.done >= self.total:  # the pass's end says the rest
            return
        self._said = now
        elapsed = now - self._started
        rate = (self.done - self._first) / elapsed if elapsed > 0 else 0.0
        left = f", about {format_duration((self.total - self.done) / rate)} left" if rate > 0 else ""
        self.log(f"{self.description}: {self.done}/{self.total} {self.unit}, {format_duration(elapsed)} so far"
                 f"{left}")


def pass_length(loader, prof: int) -> int:
    """The batches a pass over ``loader`` takes: all of them, or ``--prof``'s cap."""
    return len(loader) if prof <= 0 else min(prof, len(loader))


def progress_bar(total: int, description: str, enabled: bool, log=None, done: int = 0):
    """A progress bar of a pass (``enabled``: on a terminal), else, given ``log``, a line every minute or so
    (:class:`~image_classification.train.progress.Heartbeat`); ``done``: the batches a resumed pass starts after."""
    if total <= 0 or not (enabled or log is not None):
        return _NoProgress()
    if not enabled:
        return Heartbeat(total, description, log, done=done)
    from tqdm import tqdm

    return tqdm(total=total, initial=done, desc=description, leave=False, dynamic_ncols=True, file=sys.stdout)


