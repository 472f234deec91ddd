"""What the tests share: the repository's path, a free port, images on the fly, the one-error-line check,
and running a script of ours in the test's own process.

Most tests run the scripts in-process (:func:`run_script`): starting a Python that imports torch costs
seconds on a small machine, and the scripts are thin (``sys.exit(run(main))``).  A fresh process is kept
where the process is the point: SIGKILL, signals, a lock held by another process, multiproc.py/torchrun,
an installed package, and one README command as a user types it.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import os
import runpy
import signal
import socket
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import numpy as np
from PIL import Image

REPO = Path(__file__).resolve().parents[1]


def tiny_arch_row() -> tuple:
    """The ``tiny`` architecture, an ``ARCHS`` row of image_classification.models.resnet: one BasicBlock per
    stage, 16-32 channels (imported late: collecting the tests needs no torch)."""
    from image_classification.models.resnet import BasicBlock

    return (BasicBlock, (1, 1, 1, 1), (16, 16, 32, 32), 1, 1, False)


@contextlib.contextmanager
def tiny_registered():
    """``-a tiny`` accepted while the block runs (for fixtures broader than a test; tests use the
    ``tiny_arch`` fixture), removed after."""
    from image_classification.models.resnet import ARCHS

    previous = ARCHS.get("tiny")
    ARCHS["tiny"] = tiny_arch_row()
    try:
        yield "tiny"
    finally:
        if previous is None:
            ARCHS.pop("tiny", None)
        else:
            ARCHS["tiny"] = previous


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def multiproc_cmd(nproc: int, *script_and_args, log_dir: Path | None = None) -> list[str]:
    """``python multiproc.py`` starting ``nproc`` ranks of a script on a free port (logs in ``log_dir``)."""
    cmd = [sys.executable, str(REPO / "multiproc.py"), "--nproc_per_node", str(nproc),
           "--master_port", str(free_port())]
    if log_dir is not None:
        cmd += ["--log_dir", str(log_dir)]
    return cmd + [str(arg) for arg in script_and_args]


def load_script(name: str) -> ModuleType:
    """Import ``scripts/<name>.py`` (not a package) as the module ``name``."""
    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def write_image_folder(
    root: Path, num_classes: int = 3, train_per_class: int = 8, val_per_class: int = 4,
    size: tuple[int, int] = (48, 40), seed: int = 0,
) -> Path:
    """Write a JPEG ImageFolder (train/ and val/) whose classes differ by colour, so a model can learn them."""
    rng = np.random.default_rng(seed)
    colours = [(200, 40, 40), (40, 200, 40), (40, 40, 200), (200, 200, 40), (40, 200, 200), (200, 40, 200)]
    for split, count in (("train", train_per_class), ("val", val_per_class)):
        for label in range(num_classes):
            folder = root / split / f"class_{label:02d}"
            folder.mkdir(parents=True, exist_ok=True)
            base = np.array(colours[label % len(colours)], dtype=np.float32)
            for index in range(count):
                noise = rng.normal(0, 25, size=(size[1], size[0], 3))
                pixels = np.clip(base + noise, 0, 255).astype(np.uint8)
                Image.fromarray(pixels).save(folder / f"img_{index:03d}.jpg", quality=90)
    return root


@dataclass
class Result:
    """What a run left: its exit code and output (a ``subprocess.CompletedProcess`` has the same fields)."""

    args: list[str]
    returncode: int
    stdout: str
    stderr: str


def explain(result) -> str:
    """A run's exit code and the ends of its output, for an assertion message."""
    return (f"exit {result.returncode}: {' '.join(map(str, result.args))}\n"
            f"--- stdout\n{result.stdout[-3000:]}\n--- stderr\n{result.stderr[-3000:]}")


def one_error_line(result, code: int = 2) -> str:
    """The one line a refused run printed on stderr, asserting there is exactly one (``error: ...``, no
    traceback) and the exit code ``code``.  ``result``: a :class:`Result` or ``CompletedProcess``."""
    err = result.stderr
    assert result.returncode == code, explain(result)
    assert err.startswith("error: ") and err.count("\n") == 1 and err.endswith("\n"), explain(result)
    assert "Traceback" not in err, explain(result)
    return err.rstrip("\n")


def refused(returned: int, capsys, code: int = 2) -> str:
    """:func:`one_error_line` of an entry point called here: ``returned`` is what ``cli.run(...)`` returned,
    the output is read from pytest's ``capsys``."""
    out, err = capsys.readouterr()
    return one_error_line(Result([], returned, out, err), code)


def exit_code(error: SystemExit) -> int:
    """The status a process ending with ``error`` would have (``sys.exit`` semantics)."""
    code = error.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


_STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGUSR1", "SIGINT")
                      if hasattr(signal, name))


@contextlib.contextmanager
def process_state(cwd: Path | None = None, argv: list[str] | None = None, env: dict[str, str] | None = None,
                  threads: int | None = None):
    """Run a script's body here as if in its own process, and put back what it may change: the working
    folder, ``sys.argv``, ``sys.path``, the environment, torch's thread count (``threads``: the count to
    run with, as OMP_NUM_THREADS gives a process), the stop-signal handlers."""
    import torch

    saved_cwd, saved_argv, saved_env, saved_path = os.getcwd(), sys.argv[:], dict(os.environ), sys.path[:]
    saved_threads = torch.get_num_threads()
    handlers = {sig: signal.getsignal(sig) for sig in _STOP_SIGNALS}
    try:
        if cwd is not None:
            os.chdir(cwd)
        if argv is not None:
            sys.argv = list(argv)
        if env:
            os.environ.update(env)
        if threads is not None:
            torch.set_num_threads(threads)
        yield
    finally:
        os.chdir(saved_cwd)
        sys.argv = saved_argv
        sys.path[:] = saved_path
        os.environ.clear()
        os.environ.update(saved_env)
        torch.set_num_threads(saved_threads)
        for sig, handler in handlers.items():
            signal.signal(sig, handler)


def run_script(argv: list, capsys=None, cwd: Path | None = None, env: dict[str, str] | None = None,
               threads: int | None = None) -> Result:
    """Run ``[python] SCRIPT.py ARGS`` or ``[python] -m MODULE ARGS`` in this process, as ``python`` would
    (the file or module executed as ``__main__``, its folder or the working folder first on ``sys.path``),
    and return its exit code and what it printed.

    ``capsys``: pytest's fixture, which then captures the output (what was printed before the call is left
    out); without it (in a fixture broader than a test) the output is captured here.  Warnings are
    filtered as a fresh interpreter filters them and end the result's stderr, where a process would have
    printed them.
    """
    argv = [str(token) for token in argv]
    if argv[0] in ("python", sys.executable):
        argv = argv[1:]
    module = argv[1] if argv[0] == "-m" else None
    script_argv = [module, *argv[2:]] if module else argv
    if capsys is not None:
        capsys.readouterr()
    out, err = io.StringIO(), io.StringIO()
    capture = contextlib.nullcontext() if capsys is not None else _redirected(out, err)
    with capture, warnings.catch_warnings(record=True) as caught:
        warnings.resetwarnings()  # python's own defaults, not pytest's
        for category in (DeprecationWarning, PendingDeprecationWarning, ImportWarning, ResourceWarning):
            warnings.simplefilter("ignore", category)
        warnings.filterwarnings("default", category=DeprecationWarning, module="__main__")
        # runpy re-executes a module that is imported already, as `python -m` does: that is the point
        warnings.filterwarnings("ignore", message=".*found in sys.modules", category=RuntimeWarning)
        try:
            with process_state(cwd, script_argv, env, threads):
                if module:
                    sys.path.insert(0, os.getcwd())
                    runpy.run_module(module, run_name="__main__", alter_sys=True)
                else:
                    sys.path.insert(0, str(Path(argv[0]).resolve().parent))
                    runpy.run_path(argv[0], run_name="__main__")
            code = 0
        except SystemExit as error:
            code = exit_code(error)
    if capsys is not None:
        printed, complained = capsys.readouterr()
    else:
        printed, complained = out.getvalue(), err.getvalue()
    complained += "".join(warnings.formatwarning(w.message, w.category, w.filename, w.lineno, w.line)
                          for w in caught)
    return Result(argv, code, printed, complained)


@contextlib.contextmanager
def _redirected(out: io.StringIO, err: io.StringIO):
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        yield
