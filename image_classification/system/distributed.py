"""When another process of a distributed run is gone: tell it apart from a bug, and say so in one line.

Two ways a peer's end reaches a survivor, and how each becomes one line and exit 5 (:class:`PeerLost`):

* the backend notices (gloo: the connection to a killed process resets at once): the collective raises,
  and :func:`lost_peer_reason` recognises the error;
* nobody notices (a process hung, or NCCL, whose kernels wait on the GPU for data that never comes and
  whose watchdog would abort the process with a C++ trace after its own timeout): every host-side wait
  for the other processes runs under a :class:`PeerWatchdog` guard, which ends the process after
  ``--dist-timeout`` seconds.  The backend's timeout is set a minute later, so this line comes first.
"""

from __future__ import annotations

import os
import re
import sys
import threading
import time
from contextlib import contextmanager
from datetime import timedelta
from typing import Callable, Iterator

import torch.distributed as dist

from ..errors import PeerLost


def attempt_store(timeout: timedelta) -> dist.Store | None:
    """The store for the process group of this attempt of a torchrun run; None outside torchrun (env://).

    torchrun's agent serves one store for the whole run and keeps it across ``--max-restarts`` restarts
    (static and c10d rendezvous alike), and torch >= 2.5 no longer keeps the attempts apart in it: the
    restarted ranks would read the addresses their killed predecessors published (gloo: "connectFullMesh
    ... Connection refused") or the previous attempt's barrier counts.  Each attempt gets its own keys, as
    torch 2.4 did (``/worker/attempt_N``).
    """
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    agent_store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                                timeout=timeout)
    return dist.PrefixStore(f"/worker/attempt_{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}", agent_store)


class PeerWatchdog:
    """A daemon thread that ends this process when a guarded wait lasts longer than ``timeout_s``.

    Arming and disarming cost a lock and a notify: nothing touches the device.  The thread runs only
    while a guard is open.
    """

    def __init__(self, rank: int, timeout_s: float, *, exit_process: Callable[[int], None] = os._exit):
        self.rank, self.timeout_s, self._exit = rank, timeout_s, exit_process
        self._condition = threading.Condition()
        self._waiting: tuple[str, float] | None = None  # (what, since)
        self._thread: threading.Thread | None = None

    @contextmanager
    def guard(self, what: str) -> Iterator[None]:
        with self._condition:
            self._waiting = (what, time.monotonic())
            if self._thread is None:
                self._thread = threading.Thread(target=self._watch, name="peer-watchdog", daemon=True)
                self._thread.start()
            self._condition.notify()
        try:
            yield
        finally:
            with self._condition:
                self._waiting = None
                self._condition.notify()

    def _watch(self) -> None:
        with self._condition:
            while True:
                if self._waiting is None:
                    self._condition.wait()
                    continue
                what, since = self._waiting
                left = since + self.timeout_s - time.monotonic()
                if left > 0:
                    self._condition.wait(left)
                    continue
                print(f"error: rank {self.rank} stops: no answer from the other processes for "
                      f"{self.timeout_s:g} s while {what}; one of them is gone or hung (--dist-timeout)",
                      file=sys.stderr, flush=True)
                sys.stdout.flush()
                self._exit(PeerLost.exit_code)
                self._waiting = None  # only reached when exit_process returns (tests)


# what gloo and NCCL say when the process at the other end of a collective is gone
_BROKEN_CONNECTION = re.compile(r"Connection (reset|closed|refused)[^.\n]*|Broken pipe")
_BACKEND_FAILURE = re.compile(r"(gloo|NCCL)\S*\s*(.*(Timed out|timed out|error|abort).*)")


def lost_peer_reason(error: RuntimeError) -> str | None:
    """What broke, when ``error`` is a collective call failing because a peer process is gone; else None."""
    text = str(error)
    found = _BROKEN_CONNECTION.search(text)
    if found is not None:
        return found.group(0)
    found = _BACKEND_FAILURE.search(text)
    if found is not None:
        return found.group(2).strip()[:200]
    if isinstance(error, getattr(dist, "DistNetworkError", ())):
        return text.splitlines()[0][:200] if text else type(error).__name__
    return None
