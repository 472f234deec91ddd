"""What the fault tests did and what was lost, counted over the session and printed as one line at its end
(by ``tests/conftest.py``, which also adds up the counts of pytest-xdist's workers).  No torch here: the
controller of a parallel run imports this module only to print the line."""

from __future__ import annotations

from collections import Counter

# kills: SIGKILLs the training survived (resumed and finished); save_kills: of them, kills in the middle of a
# save; stops: SIGTERM / SIGUSR1 / SIGINT stops; interrupts: double Ctrl-Cs (exit 130); bad_inputs: refused inputs
# (one line, exit 2); storage_faults: failed saves (exit 4); redone: iterations trained again after kills; damaged:
# checkpoints that did not load after a fault; records_lost: raport records missing or repeated after a resume.  The
# last two must stay 0.
TALLY: Counter = Counter()


def summary_line() -> str:
    t = TALLY
    return (f"faults: {t['kills']} SIGKILLs survived ({t['save_kills']} in the middle of a save), "
            f"{t['stops']} SIGTERM/SIGUSR1/SIGINT stops saved (exit 75), "
            f"{t['interrupts']} double Ctrl-Cs stopped the run (exit 130), "
            f"{t['bad_inputs']} bad inputs refused with one line, "
            f"{t['storage_faults']} full disks ended the run with one line and exit 4; lost: "
            f"{t['damaged']} checkpoints, {t['records_lost']} raport records, "
            f"{t['redone']} iterations redone "
            f"(at most one --checkpoint-interval per kill)")
