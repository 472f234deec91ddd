"""Fixtures of the fault tests, and the one-line count of what they did, printed at the end of the session."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers import write_image_folder

from .harness import RUN, TALLY, explain, train_here


@pytest.fixture(scope="session")
def data(tmp_path_factory) -> Path:
    """3 colour classes, 8 training images each (6 iterations of -b 4 per epoch), 32x32 pixels."""
    return write_image_folder(tmp_path_factory.mktemp("faults_data"), size=(32, 32), seed=5)


@pytest.fixture(scope="session")
def straight(data, tmp_path_factory) -> Path:
    """The workspace of the uninterrupted run (``harness.RUN``, -j 0) that interrupted runs must equal.

    Read-only for the tests: copy what you change.  Run in this process (no fault to inject).
    """
    workspace = tmp_path_factory.mktemp("straight")
    result = train_here(data, workspace, *RUN, "-j", "0")
    assert result.returncode == 0, explain(result)
    return workspace


def summary_line() -> str:
    t = TALLY
    return (f"faults: {t['kills']} SIGKILLs survived ({t['save_kills']} in the middle of a save), "
            f"{t['stops']} SIGTERM/SIGUSR1 stops saved (exit 75), "
            f"{t['bad_inputs']} bad inputs refused with one line, "
            f"{t['storage_faults']} full disks ended the run with one line and exit 4; lost: "
            f"{t['damaged']} checkpoints, {t['records_lost']} raport records, "
            f"{t['redone']} iterations redone "
            f"(at most one --checkpoint-interval per kill)")


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if sum(TALLY.values()):
        terminalreporter.write_line(summary_line())
