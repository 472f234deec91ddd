"""Shared fixtures: tiny real-image datasets built on the fly (nothing is downloaded), and the ``tiny``
architecture for runs whose model is not the subject.  The helpers themselves are in ``helpers.py``."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

# REPO, load_script and write_image_folder are imported from here by some test modules too
from helpers import REPO, load_script, tiny_arch_row, write_image_folder  # noqa: F401

if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


@pytest.fixture(scope="session", autouse=True)
def one_torch_thread():
    """One intra-op thread for what runs in the test process: on a small machine shared with other
    processes, two OpenMP threads run the tests' small convolutions several times slower than one.
    (Processes the tests start keep their own defaults.)"""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def image_folder(tmp_path_factory) -> Path:
    """A 3-class colour dataset: 8 train and 4 val JPEGs per class, 48x40 pixels."""
    return write_image_folder(tmp_path_factory.mktemp("colours"))


@pytest.fixture
def tiny_arch(monkeypatch) -> str:
    """``-a tiny`` for runs in this process: one BasicBlock per stage, 16-32 channels (a few hundred
    kilobytes a checkpoint, a fraction of ResNet-18's time at 32 px).  Removed again after the test."""
    from image_classification.models.resnet import ARCHS

    monkeypatch.setitem(ARCHS, "tiny", tiny_arch_row())
    return "tiny"
