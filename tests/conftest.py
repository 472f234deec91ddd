"""Shared fixtures: tiny real-image datasets built on the fly (nothing is downloaded), and the ``tiny``
architecture for runs whose model is not the subject.  The helpers themselves are in ``helpers.py``."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest

# REPO, load_script and write_image_folder are imported from here by some test modules too
from helpers import REPO, load_script, tiny_arch_row, write_image_folder  # noqa: F401

if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

# One intra-op thread in the processes the tests start too (fresh interpreters, multiproc.py's workers,
# forks): on a small machine shared with other work, two OpenMP threads wait for each other's core at every
# operator.  A value set before the suite starts stays.
os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(scope="session", autouse=True)
def one_torch_thread():
    """One intra-op thread for what runs in the test process: on a small machine shared with other
    processes, two OpenMP threads run the tests' small convolutions several times slower than one."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def torchvision_deprecation_left_out_once_its_decoder_loaded():
    """pytest puts its warning filters back before each test: where torchvision's decoder was loaded, the filter
    our code sets once per process (data/decoders.py: torchvision's deprecation of it, by its message alone) is
    put back with them, as a run keeps it."""
    decoders = sys.modules.get("image_classification.data.decoders")
    if decoders is not None and decoders._torchvision.cache_info().currsize:
        decoders.quiet_torchvision_deprecation()


_TORCHLIB = "torch.onnx._internal.exporter._registration"


@pytest.fixture(autouse=True)
def one_torchlib_registry_per_opset():
    """torch.onnx's torch.export-based exporter builds its table of ATen-to-ONNX translations from onnxscript's
    torchlib anew for every export (about a second of CPU on 2 cores, a fifth of a small model's export).  The
    table depends on the opset and on the operators torch has registered when it is built (an entry whose operator
    is not there is left out: the quantized_decomposed ones until torch.ao's quantization loads them), and
    nothing of ours adds to it (no custom_translation_table); so once an export has imported the exporter, the
    later exports of the test process share one table per opset and set of operators."""
    registration = sys.modules.get(_TORCHLIB)
    registry = getattr(registration, "ONNXRegistry", None)
    build = getattr(registry, "from_torchlib", None)
    if build is None or hasattr(build, "shared"):
        return
    import functools

    import torch

    @functools.lru_cache(maxsize=8)
    def built(operators: int, *args, **kwargs):
        return build(*args, **kwargs)  # build is bound to the class already

    def shared(*args, **kwargs):
        return built(len(torch._C._dispatch_get_all_op_names()), *args, **kwargs)

    shared.shared = True
    registry.from_torchlib = staticmethod(shared)


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


@pytest.fixture
def read_only_folder(tmp_path, monkeypatch):
    """A folder, and a function that makes it read-only: a tmpfs remounted read-only where the tests may
    mount (root writes into a 0555 folder), else creating folders and creating, replacing and removing
    files in it fail with EROFS as they would there, and ``os.access`` says it cannot be written."""
    folder = tmp_path / "read-only"
    folder.mkdir()
    mounted = succeeds("mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(folder))

    def seal() -> None:
        if mounted and succeeds("mount", "-o", "remount,ro", str(folder)):
            return

        def refuse(real, writes=lambda *args: True):
            def call(path, *args, **kwargs):
                if Path(path).absolute().is_relative_to(folder) and writes(*args):
                    raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
                return real(path, *args, **kwargs)
            return call

        real_access = os.access

        def access(path, mode, *args, **kwargs):
            if mode & os.W_OK and Path(path).absolute().is_relative_to(folder):
                return False
            return real_access(path, mode, *args, **kwargs)

        monkeypatch.setattr(os, "access", access)
        monkeypatch.setattr(os, "open", refuse(os.open, lambda flags, *_: flags & (os.O_CREAT | os.O_WRONLY)))
        monkeypatch.setattr(os, "mkdir", refuse(os.mkdir))
        monkeypatch.setattr(os, "replace", refuse(os.replace))
        monkeypatch.setattr(os, "unlink", refuse(os.unlink))

    yield folder, seal
    if mounted:
        succeeds("umount", "-l", str(folder))


def succeeds(*command: str) -> bool:
    try:
        return subprocess.run(command, capture_output=True).returncode == 0
    except OSError:  # no such program
        return False


# Modules that take longest, run first: pytest-xdist (`make test`, --dist loadscope) hands whole modules to
# its workers in collection order, so a long module collected last would leave one worker running it alone.
LONGEST_FIRST = ("test_readme_commands.py", "test_training.py", "faults/test_distributed.py",
                 "test_inference.py", "test_models.py", "test_distributed.py", "test_dali.py")


def pytest_collection_modifyitems(config, items):
    def rank(item) -> int:
        path = item.path.as_posix()
        ranks = (i for i, name in enumerate(LONGEST_FIRST) if path.endswith("/tests/" + name))
        return next(ranks, len(LONGEST_FIRST))

    items.sort(key=rank)  # stable: each module keeps its own order


# The fault tests' one-line count at the end of the session.  Under pytest-xdist (``make test``: a worker per
# core) each worker counts its own share and hands it to the controller, which adds them up and prints.


def pytest_sessionfinish(session):
    handed_back = getattr(session.config, "workeroutput", None)  # set on an xdist worker only
    if handed_back is not None:
        from faults.tally import TALLY

        handed_back["fault_tally"] = dict(TALLY)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    from faults.tally import TALLY

    TALLY.update(getattr(node, "workeroutput", {}).get("fault_tally", {}))


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    from faults.tally import TALLY, summary_line

    if sum(TALLY.values()):
        terminalreporter.write_line(summary_line())

