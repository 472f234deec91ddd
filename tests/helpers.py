"""What the tests share: the repository's path, a free port, images on the fly, the one-error-line check,
and running a script of ours in the test's own process.

Most tests run the scripts in-process (:func:`run_script`): starting a Python that imports torch costs
seconds on a small machine, and the scripts are thin (``sys.exit(run(main))``).  A fresh process is kept
where the process is the point: SIGKILL, signals, a lock held by another process, multiproc.py/torchrun,
an installed package, and one documented command as a user types it.
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
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from PIL import Image

REPO = Path(__file__).resolve().parents[1]


def tiny_arch_row() -> tuple:
    """The ``tiny`` architecture, an ``ARCHS`` row of image_classification.models.archs: one basic block per
    stage, 16-32 channels."""
    return ("basic", (1, 1, 1, 1), (16, 16, 32, 32), 1, 1, False)


def tiny_bottleneck_row() -> tuple:
    """A bottleneck row like ResNet-50's (1x1, 3x3, 1x1 convs and downsample convs), one block per stage,
    16-32 output channels: the models that ``--memory-format auto`` trains channels-last on the CPU."""
    return ("bottleneck", (1, 1, 1, 1), (8, 8, 16, 16), 2, 1, False)


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


def hub_load(entry: str, **kwargs):
    """``torch.hub.load`` of this repository's ``entry`` (hubconf.py), from the working tree."""
    import torch

    return torch.hub.load(str(REPO), entry, source="local", **kwargs)


def published_on_ngc(monkeypatch, hub_dir: Path, weights: dict) -> list[str]:
    """Downloads into the torch.hub cache under ``hub_dir`` write ``weights`` instead of reaching the network;
    the list returned gathers the URLs asked for."""
    import torch

    downloads: list[str] = []

    def fake_download(url, dst, *args, **kwargs):
        downloads.append(url)
        torch.save(weights, dst)

    monkeypatch.setattr(torch.hub, "get_dir", lambda: str(hub_dir))
    monkeypatch.setattr(torch.hub, "download_url_to_file", fake_download)
    return downloads


def torch_export_writes_onnx() -> bool:
    """Whether ONNX goes through torch.export's exporter here (torch 2.6 and later, onnxscript installed); on the
    oldest torch the package supports, the TorchScript-based exporter writes every file."""
    from image_classification.deploy.torch_export import OPSET, torch_export_unavailable

    return torch_export_unavailable(OPSET) is None


def aoti_available() -> bool:
    """Whether this torch compiles and runs AOTInductor packages (2.6 and later) and a C++ compiler is there;
    told without importing Inductor, which takes seconds."""
    import shutil

    import torch

    version = tuple(int(part) for part in torch.__version__.split("+")[0].split(".")[:2])
    compilers = (os.environ.get("CXX"), "c++", "g++", "clang++")
    return version >= (2, 6) and any(name and shutil.which(name) for name in compilers)


_EXPORTS: dict[str, tuple[bytes, str]] = {}  # reuse_exports' files: what the real exporter wrote, by its input


def reuse_exports(monkeypatch) -> None:
    """The ONNX cache's and model2onnx.py's exporter, run for real once per input and then copied: a model of the same class and
    tensors, example shape, batch and opset gets the bytes (and the exporter's name) the first export wrote.
    For the tests of what the cache does with an export (prove it, refuse it, write it again), whose exports of
    the same tiny models would otherwise take most of their time; where a test replaces torch.export's or the
    TorchScript exporter's entry (to make one fail), the export runs for real."""
    import hashlib

    from image_classification.deploy import export, onnx_runtime, torch_export

    real = torch_export.export_onnx

    def export_onnx(model, example, path, *, dynamic_batch, opset=torch_export.OPSET, log=None):
        digest = hashlib.sha256(f"{type(model).__qualname__}|{tuple(example.shape)}|{dynamic_batch}|{opset}|"
                                f"{id(torch_export._export_through_torch_export)}|"
                                f"{id(torch_export._export_through_torchscript)}".encode())
        for name, tensor in model.state_dict().items():
            digest.update(name.encode() + tensor.detach().cpu().contiguous().numpy().tobytes())
        key = digest.hexdigest()
        if key not in _EXPORTS:
            written_by = real(model, example, path, dynamic_batch=dynamic_batch, opset=opset, log=log)
            _EXPORTS[key] = (Path(path).read_bytes(), written_by)
            return written_by
        content, written_by = _EXPORTS[key]
        Path(path).write_bytes(content)
        return written_by

    monkeypatch.setattr(onnx_runtime, "export_onnx", export_onnx)
    monkeypatch.setattr(export, "export_onnx", export_onnx)


def score_validations(monkeypatch, *top1: float) -> None:
    """Each validation of the training loop reports the next of ``top1`` as its score (its other figures
    stay real): the way to make an epoch the best, or not, at will.  Monkeypatched until the test ends,
    or the ``monkeypatch`` context (a ``pytest.MonkeyPatch``) closes."""
    from image_classification.train import loop

    scores, real_validate = iter(top1), loop.Loop.validate

    def scored(self, *args, **kwargs):
        result = real_validate(self, *args, **kwargs)
        result.top1 = next(scores)
        return result

    monkeypatch.setattr(loop.Loop, "validate", scored)


def count_step_syncs(monkeypatch) -> list[int]:
    """Patch ``Engine.train_step`` so that each step appends to the list returned how many host synchronisations
    CUDA's sync debug mode warned of inside it (the print windows' reads are outside the steps)."""
    from image_classification.train import engine

    original, syncs = engine.Engine.train_step, []

    def counted_step(self, *args, **kwargs):
        import torch

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                return original(self, *args, **kwargs)
            finally:
                torch.cuda.set_sync_debug_mode("default")
                syncs.append(sum("synchroniz" in str(warning.message) for warning in caught))

    monkeypatch.setattr(engine.Engine, "train_step", counted_step)
    return syncs


class FakeCuda:
    """torch.cuda's streams and current device as the loaders use them, for the CPU twins of CUDA paths: every
    stream made (its device, in ``streams``) and every ``torch.cuda.set_device`` (the device, by the calling
    thread, in ``devices``) are recorded; stream contexts, waits and ``record_stream`` do nothing."""

    def __init__(self, monkeypatch):
        import threading

        import torch

        self.streams: list = []
        self.devices: dict[str, list] = {}
        streams, devices = self.streams, self.devices

        class Stream:
            def __init__(self, device=None, *args, **kwargs):
                streams.append(device)

            def record_event(self):
                return None

            def wait_stream(self, other) -> None:
                pass

            def wait_event(self, event) -> None:
                pass

        def set_device(device) -> None:
            devices.setdefault(threading.current_thread(), []).append(torch.device(device))

        monkeypatch.setattr(torch.cuda, "Stream", Stream)
        monkeypatch.setattr(torch.cuda, "stream", lambda stream: contextlib.nullcontext())
        monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: Stream.__new__(Stream))
        monkeypatch.setattr(torch.cuda, "set_device", set_device)
        monkeypatch.setattr(torch.Tensor, "record_stream", lambda self, stream: None)


def patient(seconds: float) -> float:
    """How long a wait that is there to catch a hang may last here and now: ``seconds`` on an idle machine,
    times the load per core above one (on a machine shared with other work everything runs that much slower:
    a fixed limit failed runs that were merely slow)."""
    try:
        load = os.getloadavg()[0] / (os.cpu_count() or 1)
    except OSError:  # no load average on this system
        load = 1.0
    return seconds * max(1.0, load)


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


def load_script(name: str, folder: str = "scripts") -> ModuleType:
    """Import ``<folder>/<name>.py`` as the module ``name`` (scripts/ is not a package)."""
    spec = importlib.util.spec_from_file_location(name, REPO / folder / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def libjpeg_decode(raw: bytes, mode: str = "UNCHANGED"):
    """libjpeg's own decode of a JPEG's bytes, reading its markers as libjpeg reads them (torchvision's decoder:
    Pillow reads them in Python first), to a CHW uint8 tensor; torchvision's deprecation of its decoders, not
    the subject here, left out."""
    import torch
    from torchvision.io import ImageReadMode, decode_jpeg

    from image_classification.data.decoders import TORCHVISION_DEPRECATION

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", TORCHVISION_DEPRECATION, DeprecationWarning)
        return decode_jpeg(torch.frombuffer(bytearray(raw), dtype=torch.uint8), mode=ImageReadMode[mode])


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


def randomised(model, seed: int):
    """``model`` in eval mode, every parameter and BN statistic given values that differ from a fresh model's (so
    that weights loaded into the wrong place, or not at all, show)."""
    import torch  # deferred: torch, for the tests that build models

    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, tensor in model.state_dict().items():
            if tensor.is_floating_point():
                noise = torch.rand(tensor.shape, generator=generator)
                tensor.copy_(noise + 0.5 if "running_var" in name else (noise - 0.5) * 0.2)
    return model.eval()


def write_colour_checkpoint(image_folder: Path, path: Path, size: int = 32) -> Path:
    """A resnet18 trained for a few SGD steps on :func:`write_image_folder`'s colours (train/, ``size`` px),
    saved at ``path`` as a training checkpoint that records no class names; every training image right."""
    import torch  # deferred: torch, for the tests that train

    from image_classification.deploy.inference import image_transform
    from image_classification.models import build_model

    torch.manual_seed(0)
    transform = image_transform(size)
    classes = sorted(folder.name for folder in (image_folder / "train").iterdir())
    images, targets = [], []
    for label, name in enumerate(classes):
        for image in sorted((image_folder / "train" / name).iterdir()):
            images.append(transform(Image.open(image).convert("RGB")))
            targets.append(label)
    images, targets = torch.stack(images), torch.tensor(targets)
    model = build_model("resnet18", num_classes=len(classes))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    model.train()
    for _ in range(6):  # the colours are learnt in a few steps
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(images), targets).backward()
        optimizer.step()
    with torch.no_grad():  # BN statistics of the final weights, over the whole training set
        for module in model.modules():
            if isinstance(module, torch.nn.BatchNorm2d):
                module.reset_running_stats()
                module.momentum = None
        model(images)
    model.eval()
    with torch.no_grad():
        assert (model(images).argmax(1) == targets).all()
    torch.save({"epoch": 1, "arch": "resnet18", "best_prec1": 100.0, "state_dict": model.state_dict(),
                "model_options": {"num_classes": len(classes), "model_config": "classic"}}, path)
    return path



class Crash(Exception):
    """A run that dies without saving (as a SIGKILL would leave it)."""


def train_until_crash(argv: list[str], step: int) -> None:
    """``training.main(argv)`` in this process, dying without saving at its ``step``-th training step
    (counting from 1), as a SIGKILL would leave it: the checkpoints written before are all it leaves."""
    from unittest import mock

    from image_classification.train import engine as engine_module
    from image_classification.training import main

    original, calls = engine_module.Engine.train_step, [0]

    def crashing(self, *args, **kwargs):
        calls[0] += 1
        if calls[0] == step:
            raise Crash()
        return original(self, *args, **kwargs)

    with mock.patch.object(engine_module.Engine, "train_step", crashing):
        try:
            main(argv)
        except Crash:
            return
    raise AssertionError(f"the run ended before its training step {step}")

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


@contextlib.contextmanager
def sigterm_noted():
    """A SIGTERM sent to this process that nothing else catches is noted in the list yielded instead of
    ending the tests (a test of a script's own handler fails, not the test session, where it has none)."""
    unhandled: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: unhandled.append(signum))
    try:
        yield unhandled
    finally:
        signal.signal(signal.SIGTERM, previous)


def sigterm_during_the_export(monkeypatch) -> None:
    """``export_onnx`` (model2onnx.py's and the ONNX cache's) writes part of its file, then gets a SIGTERM while
    it traces the model, by torch.export or TorchScript (sent by this process to itself: signal handlers run in
    the main thread, so the test runs here)."""
    import torch

    from image_classification.deploy import export, onnx_runtime, torch_export

    exporter = torch_export.export_onnx  # the real one, whatever a test put in the modules' place

    def stop_while_traced(*_) -> None:  # returns None: a forward pre-hook's value would replace the input
        exporting = getattr(torch.compiler, "is_exporting", lambda: False)
        if torch.jit.is_tracing() or exporting():
            os.kill(os.getpid(), signal.SIGTERM)

    def export_onnx(model, example, path, **kwargs):
        Path(path).write_bytes(b"partial")
        hook = model.register_forward_pre_hook(stop_while_traced)
        try:
            return exporter(model, example, path, **kwargs)
        finally:
            hook.remove()

    monkeypatch.setattr(export, "export_onnx", export_onnx)
    monkeypatch.setattr(onnx_runtime, "export_onnx", export_onnx)


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
        _fresh_warning_filters()
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


def _fresh_warning_filters() -> None:
    """The warning filters of a fresh interpreter (python's defaults, not pytest's)."""
    warnings.resetwarnings()
    for category in (DeprecationWarning, PendingDeprecationWarning, ImportWarning, ResourceWarning):
        warnings.simplefilter("ignore", category)
    warnings.filterwarnings("default", category=DeprecationWarning, module="__main__")
    # runpy re-executes a module that is imported already, as `python -m` does: that is the point
    warnings.filterwarnings("ignore", message=".*found in sys.modules", category=RuntimeWarning)


def _fresh_interpreter_output() -> None:
    """In a forked child: warnings and log records go to stderr as in a fresh interpreter, not to the
    test's capture (pytest records warnings and holds handlers on the root logger)."""
    import logging

    _fresh_warning_filters()

    def show(message, category, filename, lineno, file=None, line=None):
        sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))

    warnings.showwarning = show
    root = logging.getLogger()
    for handler in root.handlers[:]:
        root.removeHandler(handler)
    root.setLevel(logging.WARNING)


@contextlib.contextmanager
def _redirected(out: io.StringIO, err: io.StringIO):
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        yield


# ---------------------------------------------------------------------------------------------------------
# Processes of their own, forked from the test's: real processes (a SIGKILL kills them, signals reach them,
# their locks are theirs, the workers they start are fresh interpreters) that skip a fresh interpreter's
# seconds of importing torch.
# ---------------------------------------------------------------------------------------------------------
def forkable() -> bool:
    """This process may fork a run: POSIX, and no CUDA started here (a forked child could not use it)."""
    if not hasattr(os, "fork"):
        return False
    torch = sys.modules.get("torch")
    return torch is None or not torch.cuda.is_initialized()


class Forked:
    """``target()`` in a child process forked from this one, set up as a fresh ``python -u`` would be: its
    own environment, working folder and default stop-signal handlers, stdout and stderr written to files,
    exit status from ``SystemExit``.  ``pid``, ``poll``, ``wait``, ``kill`` and ``send_signal`` as a
    ``subprocess.Popen`` has them; ``args`` is the command line it stands for."""

    def __init__(self, target, args: list, stdout: Path, stderr: Path | None = None,
                 env: dict[str, str] | None = None, cwd: Path | None = None):
        self.args = [str(arg) for arg in args]
        self.returncode: int | None = None
        stdout.touch()
        if stderr is not None:
            stderr.touch()
        sys.stdout.flush()
        sys.stderr.flush()
        self.pid = os.fork()
        if self.pid == 0:
            _forked_child(target, stdout, stderr, env, cwd)  # never returns

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = 600) -> int:
        import subprocess

        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(self.args, timeout)
            time.sleep(0.02)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def _forked_child(target, stdout: Path, stderr: Path | None, env: dict | None, cwd: Path | None) -> None:
    code = 1
    try:
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND
        os.dup2(os.open(stdout, flags), 1)
        os.dup2(os.open(stderr, flags) if stderr is not None else 1, 2)
        sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115 (-u: line by line)
        sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
        if env is not None:
            os.environ.clear()
            os.environ.update(env)
        if cwd is not None:
            os.chdir(cwd)
        for sig in _STOP_SIGNALS:
            signal.signal(sig, signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL)
        _fresh_interpreter_output()
        if "torch" in sys.modules and os.environ.get("OMP_NUM_THREADS", "").isdigit():
            sys.modules["torch"].set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
        target()
        code = 0
    except SystemExit as error:
        code = exit_code(error)
    except BaseException:  # noqa: BLE001 (as the interpreter does: a traceback and exit 1)
        import traceback

        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _script_target(argv: list[str]):
    """What ``python ARGV`` runs (a script or ``-m MODULE``), for a forked child."""
    def target() -> None:
        if argv[0] == "-m":
            sys.argv = [argv[1], *argv[2:]]
            sys.path.insert(0, os.getcwd())
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = list(argv)
            sys.path.insert(0, str(Path(argv[0]).resolve().parent))
            runpy.run_path(argv[0], run_name="__main__")
    return target


def start_process(argv: list, stdout: Path, stderr: Path | None = None, cwd: Path | None = None,
                  env: dict[str, str] | None = None):
    """Start ``python SCRIPT ARGS`` (or ``python -m MODULE ARGS``) as a process of its own, forked from this
    one when it can be (else a fresh interpreter); stdout in ``stdout``, stderr in ``stderr`` or with it."""
    import subprocess

    argv = [str(token) for token in argv]
    if argv[0] not in ("python", sys.executable):
        raise ValueError(f"not a Python command line: {argv}")
    if forkable():
        return Forked(_script_target(argv[1:]), argv, stdout, stderr, env=dict(env or os.environ), cwd=cwd)
    with stdout.open("w") as out, (stderr or stdout).open("a") as err:
        return subprocess.Popen([sys.executable, "-u", *argv[1:]], stdout=out,
                                stderr=subprocess.STDOUT if stderr is None else err, text=True, cwd=cwd,
                                env=env)


def wait_or_kill(process, timeout: float = 600) -> int:
    """Wait for a :class:`Forked` or ``subprocess.Popen`` process; one still running when the wait ends
    (a timeout, an interrupted test) is killed and reaped, never left behind."""
    try:
        return process.wait(timeout=timeout)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def run_process(argv: list, cwd: Path | None = None, env: dict[str, str] | None = None,
                timeout: float = 600) -> Result:
    """:func:`start_process` and wait for it: its exit code and output, as ``subprocess.run`` gives them."""
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        out, err = Path(folder, "stdout"), Path(folder, "stderr")
        process = start_process(argv, out, err, cwd=cwd, env=env)
        wait_or_kill(process, timeout)
        return Result([str(token) for token in argv], process.returncode, out.read_text(), err.read_text())


def launch_on(argv: list[str], cuda_available: bool, **kwargs) -> int:
    """``launch.py argv`` in this process, on a machine with CUDA or without (as ``machine.cuda_available``, the
    one place that asks, answers; with CUDA, its GPU decodes JPEGs, as torchvision's decoder does on one, which a
    run without DALI and without --data-backend asks before it takes pytorch-gpu); its exit code."""
    from image_classification import launch
    from image_classification.data import device_decode
    from image_classification.system import machine
    from image_classification.system.cli import run

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(machine, "cuda_available", lambda: cuda_available)
        if cuda_available:
            patch.setattr(device_decode, "gpu_decoding_problem", lambda device=None: None)
        return run(launch.main, argv, **kwargs)


def run_config(**values):
    """A run's frozen configuration (``train.plan.RunConfig``) from the flat names of the values a test sets, each
    put into its group (``lr`` into the optimisation's, ``batch_size`` into the data's, ``preprocessing`` too); the
    EMA as ``ema_decay``/``ema_style``/``ema_steps``, the loss scale as ``loss_scale``/``dynamic_loss_scale``."""
    import dataclasses

    from image_classification.arguments.data import DataConfig
    from image_classification.arguments.deployed import DeployConfig
    from image_classification.arguments.model import ModelConfig
    from image_classification.arguments.optimisation import OptimConfig
    from image_classification.arguments.precision import PrecisionConfig
    from image_classification.arguments.run import RunSettings
    from image_classification.models.preprocessing import Preprocessing
    from image_classification.train.plan import RunConfig

    values = dict(values)
    values.pop("model_options", None)
    decay, style, steps = values.pop("ema_decay", None), values.pop("ema_style", "reference"), values.pop("ema_steps", None)
    if decay is not None:
        values.update({"model_ema": True, "model_ema_decay": decay, "model_ema_steps": steps} if style == "torchvision"
                      else {"use_ema": decay})
    if "loss_scale" in values or "dynamic_loss_scale" in values:
        values["loss_scale_adapts"] = values.pop("dynamic_loss_scale", True)
    values.setdefault("preprocessing", Preprocessing(32))
    values.setdefault("lr", 0.1)  # a rate as resolve_lr settles it (the flag has none)
    groups, held = {}, set()
    for group in (ModelConfig, OptimConfig, DataConfig, PrecisionConfig, RunSettings, DeployConfig):
        names = {item.name for item in dataclasses.fields(group)}  # a settled value (seed, classes) in each group
        groups[group] = group(**{name: value for name, value in values.items() if name in names})
        held |= names
    assert held >= set(values), f"no group holds {sorted(set(values) - held)}"
    return RunConfig(groups[ModelConfig], groups[OptimConfig], groups[DataConfig], groups[PrecisionConfig],
                     groups[RunSettings], groups[DeployConfig])
