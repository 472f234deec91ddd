"""Fixtures of the fault tests (the count of what they did is in ``tally.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers import write_image_folder

from .harness import RUN, explain, train_here


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
