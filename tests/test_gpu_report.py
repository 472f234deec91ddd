"""scripts/gpu_report.py: the plan of steps and its estimates, the runner that survives failing, hanging,
stopped and over-budget steps, pytest's outcomes from a real xdist run, the GPU tests' modules on a machine
without the optional packages, the three files it writes, the report's tables, and (slow) the whole
``--smoke`` run on the CPU."""

from __future__ import annotations

import ast
import functools
import importlib
import importlib.util
import json
import math
import os
import subprocess
import sys
import tarfile
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from helpers import REPO, launch_on, load_script, patient, run_script

report = load_script("gpu_report")
# plan() reads every test module to find the GPU tests' (seconds, many times over here); they stay as they are
# while the suite runs
report.gpu_test_modules = functools.cache(report.gpu_test_modules)

MODELS = ("resnet50", "resnext101-32x4d", "se-resnext101-32x4d")


def fake_step(name: str, code: str, output: Path | None = None, limit_s: float = 30, section: str = "train",
              **fields) -> object:
    """A step running ``python -c code`` in the repository."""
    return report.Step(section, name, ("-c", code), limit_s, output, **fields)


def run_fake(steps, tmp_path, budget_s: float = 60):
    written = []
    result = report.run_report(steps, tmp_path, {"device": "cpu"}, budget_s,
                               write=lambda r: written.append(json.loads(json.dumps(r))), say=lambda line: None)
    return result, written


# ------------------------------------------------------------------------------------------------
# The plan
# ------------------------------------------------------------------------------------------------
def test_the_first_call_runs_the_tests_amp_inference_and_decoding_and_the_second_the_rest(tmp_path):
    """What is worth most first: the decoder's probe (seconds), the GPU tests, the AMP figures (resnet50's in NCHW
    too), inference, GPU decoding; ``--sections train`` (TF32, bf16, the plain loop, compile) is the second call."""
    steps = report.plan(report.FULL, "cuda", tmp_path)
    assert [step.name for step in steps] == [
        "decoder probe", "pytest -m gpu", *(f"{arch} AMP launch.py" for arch in MODELS), "resnet50 AMP launch.py NCHW",
        "resnet50 inference", "JPEG set", "loader pytorch-gpu beside pytorch", "resnet50 AMP launch.py JPEG",
        "resnet50 AMP launch.py synthetic"]
    second = report.plan(report.FULL, "cuda", tmp_path, ["train"])
    assert [step.name for step in second] == [
        *(f"{arch} TF32 launch.py" for arch in MODELS), "resnet50 BF16 launch.py", *(f"{arch} AMP" for arch in MODELS),
        "resnet50 AMP compile"]
    assert [s.name for s in report.plan(report.FULL, "cuda", tmp_path, report.SECTIONS)] == \
        [s.name for s in steps + second]
    assert not any(step.skipped for step in steps + second)
    launch = steps[2]
    assert report.command(launch) == ("python3 launch.py --model resnet50 --precision AMP --mode "
                                      f"benchmark_training_short --platform DGXH100 --workspace "
                                      f"{tmp_path}/launch/resnet50_AMP --raport-file raport.json")
    assert launch.output == tmp_path / "launch" / "resnet50_AMP" / "raport.json" and launch.kind == "launch"
    nchw = steps[5]
    assert nchw.argv == (*launch.argv[:launch.argv.index("--workspace")], "--workspace",
                         str(tmp_path / "launch" / "resnet50_AMP_NCHW"), "--raport-file", "raport.json",
                         "--memory-format", "nchw")  # the same command, the other layout
    assert nchw.memory_format == "nchw" and not launch.memory_format
    assert second[0].argv[second[0].argv.index("--prof") + 1] == "40"  # TF32 and bf16 come after the headline
    amp = second[4]
    assert report.command(amp).startswith("python3 benchmarks/train_throughput.py -a resnet50 --image-size 224 "
                                          "-b 256 --largest-batch")
    assert ("--amp", "--amp-dtype", "float16") == amp.argv[amp.argv.index("--amp"):amp.argv.index("--amp") + 3]
    assert amp.output == tmp_path / "train" / "resnet50_AMP.json" and str(amp.output) in amp.argv
    sweep = steps[6].argv
    assert sweep[sweep.index("--batch-sizes") + 1:sweep.index("--paths")] == \
        ("1", "2", "4", "8", "16", "32", "64", "128", "256")
    tests = steps[1]
    assert tests.argv[:4] == ("-m", "pytest", "-m", "gpu") and "--continue-on-collection-errors" in tests.argv
    assert tests.argv[tests.argv.index("-n") + 1] == "6" and tests.argv[tests.argv.index("-p", 6) + 1] == "outcomes"
    assert dict(tests.env)[report.OUTCOMES_ENV] == str(tests.output) and tests.output.suffix == ".jsonl"
    probe = steps[0]
    assert probe.argv == (report.PROBE_SCRIPT, "--device", "cuda", "-o", str(probe.output)) and probe.echo


def test_the_decode_section_trains_the_same_command_on_its_jpegs_and_on_synthetic_data(tmp_path):
    probe, data, loader, jpeg, synthetic = report.plan(report.FULL, "cuda", tmp_path, ["decode"])
    assert probe.name == report.PROBE_STEP and probe.kind == "probe"
    jpegs = str(tmp_path / report.DATA_FOLDER / "jpegs")
    assert data.argv[0] == report.JPEG_SET_SCRIPT and data.argv[-1] == jpegs
    assert data.argv[data.argv.index("--images") + 1] == str(60 * 256)  # every iteration of --prof 60 at 256
    assert data.argv[data.argv.index("--classes") + 1] == "1000"  # the synthetic data's: the same model
    assert loader.argv[:5] == (report.LOADER_SCRIPT, "--data-backend", "pytorch-gpu", "--beside", "pytorch")
    # what needs pytorch-gpu's device decoder waits for the probe; the synthetic run needs neither
    assert loader.argv[-1] == jpegs and loader.needs == jpeg.needs == ("decoder probe", "JPEG set")
    assert synthetic.needs == ()
    assert jpeg.argv[-3:] == ("--data-backend", "pytorch-gpu", jpegs)
    assert jpeg.argv[:-3] == tuple(a.replace("synthetic", "JPEG") for a in synthetic.argv)  # nothing else differs
    assert (jpeg.data, synthetic.data) == ("JPEG", "synthetic") and not jpeg.note
    # main.py refuses pytorch-gpu off CUDA: the smoke run trains with the pytorch backend, and says so
    cpu = {step.name: step for step in report.plan(report.SMOKE, "cpu", tmp_path, ["decode"])}
    assert cpu["resnet50 AMP launch.py JPEG"].argv[-2] == "pytorch"
    assert "the pytorch backend stands in" in cpu["resnet50 AMP launch.py JPEG"].note
    assert "CPU twin" in cpu["loader pytorch-gpu beside pytorch"].note
    assert cpu["resnet50 AMP launch.py JPEG"].needs == ("JPEG set",)  # the pytorch backend needs no device decoder


def test_each_call_fits_its_budget_by_the_estimates_and_every_estimate_its_step_s_limit(tmp_path):
    """Both calls' steps add up, by the estimates, to at most 520 s: the default budget, so that the first call
    and the machine's start (1-2 minutes) fit the 10 minutes a command may run; nothing is expected to be left
    out; each estimate is within its step's limit, and the smoke run estimates every step it runs."""
    assert report.FULL.budget_s == 520
    for sections in (report.DEFAULT_SECTIONS, ["train"]):
        steps = report.plan(report.FULL, "cuda", tmp_path, sections)
        total, cut = report.forecast(steps, report.FULL.budget_s)
        assert total <= 520 and cut == [] and total == sum(step.estimate_s for step in steps)
        assert all(0 < step.estimate_s < step.limit_s <= report.FULL.budget_s for step in steps)
    every = report.plan(report.FULL, "cuda", tmp_path, report.SECTIONS)
    assert sorted(report.H100_ESTIMATES) == sorted(step.name for step in every)  # no estimate left over
    smoke = report.plan(report.SMOKE, "cpu", tmp_path, report.SECTIONS)
    assert all(step.estimate_s > 0 for step in smoke if not step.skipped)
    for sections in (report.DEFAULT_SECTIONS, ["train"]):  # the smoke run of each call fits its budget too
        assert report.forecast(report.plan(report.SMOKE, "cpu", tmp_path, sections), report.SMOKE.budget_s)[1] == []


def test_the_forecast_names_the_steps_the_budget_would_leave_out(tmp_path):
    steps = report.plan(report.FULL, "cuda", tmp_path, report.SECTIONS)
    total, cut = report.forecast(steps, report.FULL.budget_s)
    assert cut and total <= report.FULL.budget_s
    assert cut == [step.name for step in steps if step.name in cut]  # from the end, in the order they come
    assert steps[0].name not in cut
    everything = sum(step.estimate_s for step in steps)
    assert report.forecast(steps, everything) == (everything, [])
    # a step the device cannot run takes no time
    skipped = [replace(steps[0], skipped="no CUDA"), *steps[1:]]
    assert report.forecast(skipped, 1e9)[0] == everything - steps[0].estimate_s


def test_on_the_cpu_fp16_runs_for_resnet18_and_bf16_compiles(tmp_path):
    steps = {step.name: step for step in report.plan(report.SMOKE, "cpu", tmp_path, ["train"])}
    assert len(steps) == 8
    assert [name for name, step in steps.items() if step.skipped] == ["resnext101-32x4d AMP",
                                                                      "se-resnext101-32x4d AMP"]
    assert [name for name, step in steps.items() if "compile" in step.argv] == ["resnet18 BF16 compile"]
    every = report.plan(report.SMOKE, "cpu", tmp_path, report.SECTIONS)
    assert all(step.env[0] == ("OMP_NUM_THREADS", "1") for step in every)
    assert all(step.argv[step.argv.index("--device") + 1] == "cpu" for step in every if "--device" in step.argv)
    launched = [step for step in every if step.kind == "launch"]
    assert len(launched) == 10 and all(step.argv[step.argv.index("--platform") + 1] == "CPU" for step in launched)
    assert not any("compile" in step.argv for step in report.plan(report.SMOKE, "cpu", tmp_path, report.SECTIONS,
                                                                  compiler=False))


def test_every_planned_command_parses_with_its_script(tmp_path, capsys):
    """The flags the report passes exist, with values the scripts accept."""
    sys.path.insert(0, str(report.REPO))
    for scale in (report.FULL, report.SMOKE):
        for step in report.plan(scale, "cuda", tmp_path, report.SECTIONS):
            if step.kind == "tests":
                continue
            if step.kind == "launch":  # launch.py resolves its preset and main.py's flags, as the run will
                from image_classification import launch

                assert launch_on([*step.argv[1:], "--dry-run"], True) == 0
                continue
            script = (load_script(Path(step.argv[0]).stem) if step.argv[0].startswith("scripts/") else
                      importlib.import_module(step.argv[0][:-3].replace("/", ".")))
            args = script.build_parser().parse_args(list(step.argv[1:]))
            if step.kind in ("throughput", "compile", "infer"):
                assert args.output == str(step.output) and args.device == "cuda"
    assert (REPO / report.LOADER_SCRIPT).is_file() and (REPO / report.JPEG_SET_SCRIPT).is_file()


# ------------------------------------------------------------------------------------------------
# The GPU tests' modules
# ------------------------------------------------------------------------------------------------
def test_the_tests_step_collects_only_the_modules_that_hold_a_gpu_test(tmp_path):
    modules = report.gpu_test_modules()
    assert {"tests/test_gpu.py", "tests/test_device_decode.py", "tests/test_optim.py"} <= set(modules)
    assert "tests/test_prepare_imagenet.py" not in modules and "tests/test_gpu_report.py" not in modules
    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "test_marked.py").write_text("import pytest\n\n\n@pytest.mark.gpu\ndef test_a():\n    pass\n")
    (tests / "test_module_mark.py").write_text("import pytest\n\npytestmark = [pytest.mark.gpu]\n")
    (tests / "test_says_so.py").write_text('"""Not one of pytest.mark.gpu\'s."""\n\n\ndef test_b():\n    pass\n')
    assert report.gpu_test_modules(tests) == ["tests/test_marked.py", "tests/test_module_mark.py"]
    step = report.tests_step(report.FULL, tmp_path, ["tests/test_marked.py"])
    assert step.argv[-1] == "tests/test_marked.py" and not step.skipped
    assert report.tests_step(report.FULL, tmp_path, []).skipped == "no test module holds a test marked gpu"


TINY_MODULE = '''
import pytest

pytestmark = pytest.mark.gpu


def test_passes():
    assert True


def test_skips():
    pytest.skip("needs the moon")


def test_fails():
    value = 1
    assert value == 2, "one is not two"


@pytest.mark.xfail(reason="a known bug")
def test_xfails():
    assert False


@pytest.fixture
def broken():
    raise RuntimeError("the fixture broke")


def test_errors(broken):
    pass


class TestGroup:
    @pytest.mark.parametrize("value", [1, "a|b"])
    def test_param(self, value):
        pass
'''


def write_suite(tmp_path: Path, *modules: tuple[str, str]) -> list[str]:
    """A folder of test modules (name, text) with its own pytest.ini; their paths."""
    folder = tmp_path / "suite"
    folder.mkdir()
    (folder / "pytest.ini").write_text("[pytest]\nmarkers =\n    gpu: needs a CUDA device\n")
    for name, text in modules:
        (folder / name).write_text(text)
    return [str(folder / name) for name, _ in modules]


def test_pytest_outcomes_are_read_from_the_lines_a_real_xdist_run_writes_as_each_test_ends(tmp_path):
    """The report's own tests step, on two workers, over a module with a test of every outcome and a module
    that cannot be imported: each test's outcome, a skip's reason, a failure's message and the end of its
    traceback, the collection error named by its module."""
    modules = write_suite(tmp_path, ("test_tiny.py", TINY_MODULE), ("test_needs.py", NEEDS_MODULE),
                          ("test_broken.py", "import pytest\n\npytestmark = pytest.mark.gpu\nimport not_a_module_xyz\n"))
    step = report.tests_step(replace(report.SMOKE, test_workers=2), tmp_path / "work", modules)
    assert "-n" in step.argv and step.argv[step.argv.index("-n") + 1] == "2"
    record = report.run_step(step, tmp_path / "work", 120)
    assert record["status"] == "failed", record
    assert record["error"] == ("1 failed and 2 errors: test_tiny.py::test_fails, test_broken.py, "
                               "test_tiny.py::test_errors")  # named from the suite's root folder, as pytest names them
    tests = {test["test"]: test for test in record["result"]["tests"]}
    assert record["result"]["counts"] == {"passed": 3, "skipped": 2, "failed": 1, "xfailed": 1, "error": 2}
    assert tests["test_tiny.py::test_passes"] == {"test": "test_tiny.py::test_passes", "outcome": "passed"}
    assert tests["test_tiny.py::test_skips"]["reason"] == "needs the moon"
    assert tests["test_tiny.py::test_xfails"] == {"test": "test_tiny.py::test_xfails", "outcome": "xfailed",
                                                  "reason": "a known bug"}
    failed = tests["test_tiny.py::test_fails"]
    assert failed["outcome"] == "failed" and failed["message"].startswith("AssertionError: one is not two")
    assert "assert value == 2" in failed["traceback"] and failed["traceback"].endswith("AssertionError")
    assert tests["test_tiny.py::test_errors"]["outcome"] == "error"
    assert "RuntimeError: the fixture broke" in tests["test_tiny.py::test_errors"]["traceback"]
    assert {"test_tiny.py::TestGroup::test_param[1]", "test_tiny.py::TestGroup::test_param[a|b]"} <= set(tests)
    broken = tests["test_broken.py"]
    assert broken["outcome"] == "error" and "No module named 'not_a_module_xyz'" in broken["traceback"]
    assert tests["test_needs.py"] == {  # a module skipped whole
        "test": "test_needs.py", "outcome": "skipped",
        "reason": "could not import 'not_a_module_xyz': No module named 'not_a_module_xyz'"}


NEEDS_MODULE = "import pytest\n\npytest.importorskip('not_a_module_xyz')\n"
SLOW_MODULE = """
import time

import pytest

pytestmark = pytest.mark.gpu


def test_quick():
    pass


def test_hangs():
    time.sleep(600)
"""


@pytest.mark.slow
def test_a_tests_step_that_is_stopped_keeps_every_outcome_it_reached(tmp_path, monkeypatch):
    """A hang that the step's time limit ends: the outcomes written before it are the report's (JUnit XML, written
    at the end only, would have held none)."""
    monkeypatch.setattr(report, "timeout_flags", lambda scale: ())  # the step's limit ends it, not pytest-timeout
    modules = write_suite(tmp_path, ("test_slow.py", SLOW_MODULE))
    step = replace(report.tests_step(report.SMOKE, tmp_path / "work", modules), limit_s=20)
    record = report.run_step(step, tmp_path / "work", 120)
    assert record["status"] == "timed out" and record["error"].endswith("; 1 tests had ended"), record
    assert record["result"]["tests"] == [{"test": "test_slow.py::test_quick", "outcome": "passed"}]


@pytest.mark.skipif(importlib.util.find_spec("pytest_timeout") is None, reason="needs pytest-timeout")
def test_each_test_has_a_time_limit_where_pytest_timeout_is_installed(tmp_path):
    """A hanging test fails alone, within its limit, and the others' outcomes stand."""
    modules = write_suite(tmp_path, ("test_slow.py", SLOW_MODULE))
    step = report.tests_step(replace(report.SMOKE, test_timeout_s=3), tmp_path / "work", modules)
    assert step.argv[step.argv.index("--timeout") + 1] == "3"
    record = report.run_step(step, tmp_path / "work", 120)
    assert record["status"] == "failed" and record["error"] == "1 failed and 0 errors: test_slow.py::test_hangs"
    hung = next(test for test in record["result"]["tests"] if test["outcome"] == "failed")
    assert "Timeout" in hung["message"] and record["seconds"] < 60
    assert report.timeout_flags(replace(report.SMOKE, test_timeout_s=0)) == ()


@pytest.mark.slow
def test_the_gpu_tests_skip_without_cuda_before_a_module_s_fixture_trains(tmp_path):
    """On a machine where a GPU test cannot run it is skipped before any fixture shared by a module or the
    session is set up (test_quantization's ``trained`` trains a model for a minute): a skip inside the test
    would come after pytest had set those up."""
    if torch.cuda.is_available():
        pytest.skip("on a GPU machine the GPU tests run")
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "gpu",
                             "--setup-show", *report.gpu_test_modules()], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-2000:]
    shared = [line.split()[2] for line in result.stdout.splitlines() if line.split()[:2] in (["SETUP", "M"],
                                                                                           ["SETUP", "S"])]
    cheap = {"one_torch_thread", "tmp_path_factory"}  # the suite's thread setting, and pytest's own factory
    assert [name for name in shared if name not in cheap] == [], shared


HIDDEN = ("scipy", "skimage", "onnx", "webdataset", "tritonclient", "nvidia.dali")
HIDE = '''
"""Packages absent, as on a machine without them: every finder is asked for them in vain."""
import sys

HIDDEN = {hidden!r}


def hidden(name):
    return any(name == top or name.startswith(top + ".") for top in HIDDEN)


class Hide:
    def __init__(self, finder):
        self.finder = finder

    def find_spec(self, name, path=None, target=None):
        return None if hidden(name) else self.finder.find_spec(name, path, target)

    def __getattr__(self, attribute):
        return getattr(self.finder, attribute)


sys.meta_path[:] = [Hide(finder) if hasattr(finder, "find_spec") else finder for finder in sys.meta_path]
'''


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU machine the GPU tests would run, not only collect")
def test_the_tests_step_collects_without_scipy_skimage_onnx_webdataset_tritonclient_or_dali(tmp_path, monkeypatch):
    """The GPU machine lacks some optional packages: the report's tests step, run where they cannot be imported
    (a sitecustomize on PYTHONPATH hides them from every finder), collects every module without an error and
    names the package a test skips for."""
    shim = tmp_path / "hide"
    shim.mkdir()
    (shim / "sitecustomize.py").write_text(HIDE.format(hidden=HIDDEN))
    monkeypatch.setenv("PYTHONPATH", str(shim))
    probe = subprocess.run([sys.executable, "-c", "import skimage"], capture_output=True, text=True)
    assert "No module named 'skimage'" in probe.stderr  # hidden from the steps' processes
    (step,) = report.plan(report.SMOKE, "cpu", tmp_path / "work", ["tests"])
    record = report.run_step(step, tmp_path / "work", 600)
    assert record["status"] == "ok", record.get("error")
    outcomes = {test["test"]: test for test in record["result"]["tests"]}
    assert not [name for name, test in outcomes.items() if test["outcome"] in ("error", "failed")]
    assert {name.split("::")[0] for name in outcomes} == set(report.gpu_test_modules())
    assert outcomes["tests/test_quantization.py"] == {  # every test of it needs onnx: skipped whole
        "test": "tests/test_quantization.py", "outcome": "skipped",
        "reason": "could not import 'onnx': No module named 'onnx'"}


# Import names of what pyproject.toml's dependencies install, and what the tests themselves need
REQUIRED = {"torch", "torchvision", "numpy", "PIL", "yaml", "tqdm", "pynvml", "pytest"}


def _importorskipped(body: list[ast.stmt]) -> set[str]:
    """The packages ``pytest.importorskip`` is called for in ``body``'s statements, not in functions they define."""
    names, nodes = set(), list(body)
    while nodes:
        node = nodes.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "importorskip"
                and node.args and isinstance(node.args[0], ast.Constant)):
            names.add(node.args[0].value)
        nodes.extend(ast.iter_child_nodes(node))
    return names


def _unguarded_imports(path: Path, local: set[str]) -> list[str]:
    """``path``'s imports of optional packages that no ``pytest.importorskip`` of the same package before it,
    in its function or at module level, or an ``except ImportError`` around it, turns into a skip."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    module_level = _importorskipped(tree.body)
    found = []

    def visit(node: ast.AST, guarded: set[str], scope: list[ast.stmt]) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                visit(child, set(module_level), child.body)
                continue
            if isinstance(child, ast.Try) and any(
                    isinstance(h.type, ast.Name) and h.type.id in ("ImportError", "ModuleNotFoundError")
                    for h in child.handlers):
                continue
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in child.names] if isinstance(child, ast.Import) else \
                    [child.module] if child.level == 0 and child.module else []
                before = _importorskipped([s for s in scope if s.lineno < child.lineno]) | guarded
                for name in names:
                    top = name.split(".")[0]
                    if top in sys.stdlib_module_names or top in REQUIRED or top in local:
                        continue
                    if not any(name == g or name.startswith(g + ".") or g.startswith(name + ".") or
                               g.split(".")[0] == top for g in before):
                        found.append(f"{path.relative_to(REPO)}:{child.lineno}: {name}")
            visit(child, guarded, scope)

    visit(tree, set(), tree.body)
    return found


def test_every_import_of_an_optional_package_in_the_tests_skips_where_it_is_missing():
    """A test that needs scikit-image, scipy, ONNX, DALI and the like is skipped with the package's name on a
    machine without it (the GPU machine has none of several), never an error: each import of a package that
    pyproject.toml's dependencies do not install follows a ``pytest.importorskip`` of it (at module level
    only where the whole module needs it) or sits in a ``try`` that catches ImportError."""
    local = {path.stem for path in (REPO / "tests").rglob("*.py")} | {"image_classification", "benchmarks", "faults"}
    unguarded = [line for path in sorted((REPO / "tests").rglob("*.py")) for line in _unguarded_imports(path, local)]
    assert unguarded == []


# ------------------------------------------------------------------------------------------------
# The runner
# ------------------------------------------------------------------------------------------------
def test_a_failing_a_hanging_and_a_garbled_step_are_recorded_and_the_report_goes_on(tmp_path, monkeypatch):
    monkeypatch.setattr(report, "MIN_STEP_S", 0.5)
    good, garbled, stale = tmp_path / "good.json", tmp_path / "garbled.json", tmp_path / "stale.json"
    pid_file = tmp_path / "pids"
    limit = float(math.ceil(patient(3)))  # time for a loaded machine to start the hanging step's Python
    hang = ("import os, subprocess, sys, time; child = subprocess.Popen(['sleep', '60']); "
            f"open({str(pid_file)!r}, 'w').write(f'{{os.getpid()}} {{child.pid}}'); time.sleep(60)")
    steps = [
        fake_step("fails", "import sys; print('working'); sys.exit('error: --arch nope is unknown')"),
        fake_step("hangs", hang, limit_s=limit),
        fake_step("garbled", f"open({str(garbled)!r}, 'w').write('{{half')", output=garbled),
        fake_step("skipped", "raise SystemExit(1)", skipped="fp16 autocast needs CUDA"),
        fake_step("good", f"import json; json.dump({{'figure': 1}}, open({str(good)!r}, 'w'))", output=good),
        fake_step("stale", "pass", output=stale),
    ]
    stale.write_text('{"figure": 9}')
    os.utime(stale, (1e9, 1e9))  # left by an earlier run
    result, written = run_fake(steps, tmp_path)
    records = {step["name"]: step for step in result["steps"]}
    assert [step["status"] for step in result["steps"]] == ["failed", "timed out", "failed", "skipped", "ok", "failed"]
    assert records["fails"]["error"] == "exit code 1: error: --arch nope is unknown"
    assert "working" in (tmp_path / records["fails"]["log"]).read_text()
    assert records["hangs"]["error"].startswith(f"stopped after {limit:.0f} s")
    assert "could not be read" in records["garbled"]["error"]
    assert records["skipped"]["error"] == "fp16 autocast needs CUDA" and "log" not in records["skipped"]
    assert records["good"]["result"] == {"figure": 1}
    assert "not written by this step" in records["stale"]["error"] and "result" not in records["stale"]
    # the hanging step and what it started are gone
    for pid in map(int, pid_file.read_text().split()):
        assert not Path(f"/proc/{pid}").exists() or Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    # written at the start with every step pending, after every step with the rest pending, and at the end
    assert [[s["status"] for s in snapshot["steps"]].count("pending") for snapshot in written] == \
        [6, 5, 4, 3, 2, 1, 0, 0]
    assert [snapshot["finished"] for snapshot in written] == [False] * 7 + [True]


def test_a_step_whose_estimate_is_more_than_what_is_left_is_left_out_and_a_smaller_one_still_runs(tmp_path):
    steps = [fake_step("first", "import time; time.sleep(1.5)", estimate_s=1),
             fake_step("large", "pass", estimate_s=report.MIN_STEP_S + 5),
             fake_step("small", "pass", estimate_s=report.MIN_STEP_S - 2)]
    result, _ = run_fake(steps, tmp_path, budget_s=report.MIN_STEP_S + 1)
    first, large, small = result["steps"]
    assert first["status"] == "ok"  # it ran; then less than the large step's estimate was left
    assert large["status"] == "left out" and large["error"].startswith(f"its estimate, {report.MIN_STEP_S + 5} s, is "
                                                                       "more than the ")
    assert "log" not in large  # never started
    assert small["status"] == "left out" and small["error"].endswith("s of the budget were left")  # under MIN_STEP_S


def test_a_step_that_needs_one_that_did_not_succeed_is_skipped_saying_why(tmp_path):
    steps = [fake_step("probe", "pass"), fake_step("JPEG set", "raise SystemExit('no room')"),
             fake_step("loader", "pass", needs=("probe", "JPEG set")), fake_step("elsewhere", "pass", needs=("absent",))]
    result, _ = run_fake(steps, tmp_path)
    assert [step["status"] for step in result["steps"]] == ["ok", "failed", "skipped", "skipped"]
    assert result["steps"][2]["error"] == "it needs the step 'JPEG set', which ended failed: exit code 1: no room"
    assert result["steps"][3]["error"] == "it needs the step 'absent', which is not in this run"


def test_a_refused_device_decoder_costs_only_the_steps_that_need_it(tmp_path, monkeypatch):
    """The probe says why (its figures kept though it exits 1); the loader and the JPEG training are skipped
    saying so; the JPEG set, the synthetic run and every other section still run."""
    monkeypatch.setattr(report, "MIN_STEP_S", 0.5)
    (tmp_path / "decode").mkdir()  # write_json makes it where the probe runs
    stand_ins = {"probe": "import json, sys; json.dump({'taken': None, 'problem': 'torchvision: its pixels differ "
                          "by 9.50 grey levels'}, open(sys.argv[-1], 'w')); print('refused: 9.50'); sys.exit(1)"}
    steps = []
    for step in report.plan(report.FULL, "cuda", tmp_path):
        code = stand_ins.get(step.kind, "pass")
        steps.append(replace(step, argv=("-c", code, *((str(step.output),) if step.kind == "probe" else ())),
                             output=step.output if step.kind == "probe" else None, estimate_s=0,
                             kind="" if step.kind == "tests" else step.kind))  # no outcomes to read
    result, _ = run_fake(steps, tmp_path, budget_s=600)
    statuses = {step["name"]: step["status"] for step in result["steps"]}
    assert statuses.pop("decoder probe") == "failed"
    assert {name for name, status in statuses.items() if status != "ok"} == {
        "loader pytorch-gpu beside pytorch", "resnet50 AMP launch.py JPEG"}
    skipped = next(step for step in result["steps"] if step["name"] == "resnet50 AMP launch.py JPEG")
    assert skipped["error"] == "it needs the step 'decoder probe', which ended failed: exit code 1: refused: 9.50"
    probe = result["steps"][0]
    assert probe["result"]["problem"].startswith("torchvision: its pixels differ")


def test_a_sigterm_ends_the_step_under_way_and_records_the_rest(tmp_path):
    steps = [fake_step("stops", "import os, signal, time; os.kill(os.getppid(), signal.SIGTERM); time.sleep(30)"),
             fake_step("after", "pass")]
    result, written = run_fake(steps, tmp_path)
    assert [step["status"] for step in result["steps"]] == ["not run", "not run"]
    assert all("stopped by signal 15" in step["error"] for step in result["steps"])
    assert written[-1] == result and result["finished"]


# ------------------------------------------------------------------------------------------------
# What the steps' files say
# ------------------------------------------------------------------------------------------------
def test_a_launch_step_s_figures_are_its_raport_s_summary_and_one_without_any_fails(tmp_path):
    """The raport of launch.py's benchmark gives the headline (warm-up left out) and the wall-clock figure; a
    run whose every iteration was warm-up has no figure, and the step says so instead of reporting a number."""
    from image_classification.training import main

    common = ["--data-backend", "synthetic", "-a", "resnet18", "--image-size", "32", "-b", "2", "--epochs", "1",
              "--training-only", "--no-checkpoints", "-p", "1", "--benchmark-warmup", "2"]
    assert main(common + ["--prof", "4", "--workspace", str(tmp_path / "ok")]) == 0
    figures = report.launch_figures(tmp_path / "ok" / "experiment_raport.json")
    assert figures["batch_size"] == 2 and figures["warmup"] == 2 and figures["iterations"] == 4
    assert figures["total_ips"] > 0 and figures["wall_ips"] > 0 and figures["data_backend"] == "synthetic"
    assert main(common + ["--prof", "2", "--workspace", str(tmp_path / "short")]) == 0
    with pytest.raises(ValueError, match="no iteration after the warm-up"):
        report.launch_figures(tmp_path / "short" / "experiment_raport.json")


def test_the_decoder_probe_gives_each_probe_s_grey_levels_and_the_verdict(capsys):
    """benchmarks/decoder_probe.py on the CPU twin: every probe JPEG against the CPU decoder (0 levels: the same
    decoder), and the decoder taken; exit code 1 and why where it is refused."""
    probe = load_script("decoder_probe", "benchmarks")
    result = probe.probe(torch.device("cpu"))
    library = next(iter(result["libraries"]))  # the CPU's own decoder first: the twin decodes as the CPU does
    found = result["libraries"][library]
    assert result["cpu_decoder"].startswith(library) and result["taken"].startswith(library)
    assert result["problem"] is None
    assert [entry["probe"] for entry in found["probes"]] == list(probe.PROBE_NAMES)
    assert all(entry["mean_levels"] == 0 and entry["max_levels"] == 0 for entry in found["probes"])
    text = "\n".join(probe.lines(result))
    assert f"{library} {found['version']} EXIF-tagged: mean 0.000, max 0 grey levels" in text
    assert text.endswith(f"taken: {result['taken']}")
    refused = {**result, "taken": None, "problem": "torchvision: its pixels differ by 9.50 grey levels on average"}
    assert probe.lines(refused)[-1] == f"refused: {refused['problem']}"
    markdown = "\n".join(report.markdown({**fake_report(), "steps": [
        {**fake_report()["steps"][0], "name": "decoder probe", "kind": "probe", "section": "decode",
         "status": "failed", "error": "exit code 1: refused", "result": refused}]}).splitlines())
    assert "## The device's JPEG decoder" in markdown and f"| {library} {found['version']} | colour | 0.000 | 0 |" \
        in markdown and f"**refused: {refused['problem']}**" in markdown


def test_the_loader_step_s_figures_are_read_from_what_the_benchmark_prints(image_folder, capsys):
    """benchmark_loader.py's own output, as the report's loader step runs it (here its CPU twin), with the JPEGs
    pytorch-gpu decoded on the CPU (none: the CPU twin's decoder refuses none)."""
    argv = [report.LOADER_SCRIPT, "--data-backend", "pytorch-gpu", "--beside", "pytorch", "-b", "4", "-j", "0",
            "--epochs", "2", "--image-size", "32", "--device", "cpu", str(image_folder)]
    result = run_script([str(REPO / argv[0]), *argv[1:]], capsys)
    assert result.returncode == 0, result.stderr
    figures = report.loader_figures(result.stdout)
    assert figures["backend"] == "pytorch-gpu" and figures["images_per_s"] > 0 and figures["cpu_ms"] > 0
    (name, base), = figures["beside"].items()
    assert name == "pytorch" and base["images_per_s"] > 0 and base["speedup"] > 0
    assert base["spread"].startswith("spread") and base["verdict"]
    assert figures["cpu_decoded"] == 0 and "decoded on the CPU: 0 JPEGs of 2 epochs" in result.stdout
    with pytest.raises(ValueError, match="does not end in 'images/s: N'"):
        report.loader_figures(result.stdout.rsplit("images/s:", 1)[0])


# ------------------------------------------------------------------------------------------------
# The three files and the report
# ------------------------------------------------------------------------------------------------
def train_result(median: float, batch: int, compiled: float | None = None, too_large=()) -> dict:
    def stats(value):
        return {"median": value, "ratio": value / (median / 1.25), "ratio_spread": 0.01}

    paths = {"channels_last": stats(median)}
    if compiled:
        paths["compile"] = stats(compiled)
    return {"config": {"batch_size": batch, "largest_batch": {"tried_from": 256, "out_of_memory_at": list(too_large)}},
            "plain": {"median": median / 1.25}, "paths": paths,
            "warmup_seconds": {"plain": 1.0, "channels_last": 1.0, **({"compile": 61.4} if compiled else {})}}


def launch_result(total: float, wall: float, batch: int, backend: str = "synthetic", amp_dtype=None) -> dict:
    return {"total_ips": total, "wall_ips": wall, "batch_size": batch, "warmup": 20, "iterations": 100,
            "amp_dtype": amp_dtype, "loss": 6.9, "data_backend": backend}


def fake_report() -> dict:
    def step(section, name, status="ok", result=None, error=None, arch="", precision="", kind="", data="", **more):
        return {"section": section, "name": name, "arch": arch, "precision": precision, "kind": kind, "data": data,
                "status": status, "command": f"python {name}.py", "seconds": 12.0, "estimate_s": 10.0,
                "error": error, **({"result": result} if result else {}), **more}

    point = {"images_per_s": 3000.0, "p50_ms": 10.0, "p90_ms": 11.0, "p99_ms": 12.5, "speedup": 1.5}
    infer = {"config": {"arch": "resnet50", "image_size": 224, "batch_sizes": [1, 256]},
             "environment": {"device": "cuda"},
             "paths": {"torchvision": {"1": point, "256": point}, "fp16": {"1": point, "256": point},
                       "bf16": {"skipped": "this GPU computes no bf16"}}}
    tests = {"counts": {"passed": 1, "skipped": 2, "failed": 1},
             "tests": [{"test": "tests/test_gpu.py::test_a", "outcome": "passed"},
                       {"test": "tests/test_gpu.py::test_b", "outcome": "failed", "message": "AssertionError: 1 | 2",
                        "traceback": "    assert syncs == 0\nE   AssertionError: 1 | 2"},
                       {"test": "tests/test_gpu.py::test_c", "outcome": "skipped", "reason": "no DALI"},
                       {"test": "tests/test_gpu.py::test_d", "outcome": "skipped", "reason": "no DALI"}]}
    loader = {"backend": "pytorch-gpu", "cpu_ms": 0.4, "images_per_s": 5210.0,
              "beside": {"pytorch": {"images_per_s": 2400.0, "cpu_ms": 5.6, "speedup": 2.17,
                                     "spread": "spread 3.0% over 2 epochs", "verdict": "2.17x faster"}}}
    jpeg_set = {"images": 15360, "classes": 1000, "width": 500, "height": 375, "quality": 90, "alpha": 1.6,
                "mean_bytes": 41900, "seconds": 9.5}
    return {"smoke": False, "device": "cuda", "command": "python scripts/gpu_report.py --out r", "started": "now",
            "seconds": 500.0, "budget_s": 540.0, "machine": {"description": "1x NVIDIA H100 80GB HBM3 (...)"},
            "finished": True, "work": "/tmp/gpu_report.x", "steps": [
                step("amp", "rn50-amp-launch", result=launch_result(4812.4, 3100.0, 256), arch="resnet50",
                     precision="AMP", kind="launch"),
                step("amp", "rnx-amp-launch", "left out", error="its estimate, 25 s, is more than the 3 s left",
                     arch="resnext101-32x4d", precision="AMP", kind="launch"),
                step("tests", "pytest -m gpu", "failed", result=tests, error="1 failed: tests/test_gpu.py::test_b"),
                step("infer", "infer", result=infer, arch="resnet50"),
                step("decode", "JPEG set", result=jpeg_set, kind="data"),
                step("decode", "loader", result=loader, kind="loader"),
                step("decode", "rn50-jpeg", result=launch_result(4500.0, 3000.0, 256, "pytorch-gpu", "float16"),
                     arch="resnet50", precision="AMP", kind="launch", data="JPEG"),
                step("decode", "rn50-synthetic", result=launch_result(4800.0, 3100.0, 256, amp_dtype="float16"),
                     arch="resnet50", precision="AMP", kind="launch", data="synthetic"),
                step("train", "rn50-tf32-launch", result=launch_result(1925.0, 1500.0, 256), arch="resnet50",
                     precision="TF32", kind="launch"),
                step("train", "rn50-bf16-launch", "failed", error="exit code 1: CUDA error | bad", arch="resnet50",
                     precision="BF16", kind="launch"),
                step("train", "rn50-amp", result=train_result(2500.0, 256), arch="resnet50", precision="AMP",
                     kind="throughput"),
                step("train", "rnx-amp", result=train_result(400.0, 128, too_large=[256]), arch="resnext101-32x4d",
                     precision="AMP", kind="throughput"),
                step("train", "rn50-amp-compile", result=train_result(2500.0, 256, compiled=3000.0), arch="resnet50",
                     precision="AMP", kind="compile"),
            ]}


def test_the_report_has_nvidia_s_tables_the_machine_and_every_command():
    text = report.markdown(fake_report())
    assert "* Machine: 1x NVIDIA H100 80GB HBM3 (...)" in text
    assert "| Arch | GPUs | Throughput TF32 | Throughput AMP (fp16) | speed-up (TF32 to AMP) | Throughput bf16 | " \
        "speed-up (TF32 to bf16) |" in text
    assert "the first 20 left out" in text
    lines = text.splitlines()
    rn50 = next(line for line in lines if line.startswith("| resnet50 | 1 |"))
    assert rn50 == ("| resnet50 | 1 | 1,925 img/s (batch 256; wall clock 1,500) | 4,812 img/s (batch 256; wall clock "
                    "3,100) | 2.50x | failed: exit code 1: CUDA error \\| bad | - |")
    rnx = next(line for line in lines if line.startswith("| resnext101-32x4d | 1 |"))
    assert rnx == "| resnext101-32x4d | 1 | - | left out: its estimate, 25 s, is more than the 3 s left | - | - | - |"
    detail = next(line for line in lines if line.startswith("| resnet50 | AMP (fp16) | 256 |"))
    assert detail == "| resnet50 | AMP (fp16) | 256 | 2,000 | 2,500 (1.25x) | 3,000 (1.50x) | 61 |"
    assert "| resnext101-32x4d | AMP (fp16) | 128 | 320 | 400 (1.25x) | - | - |" in lines
    for name in ("rn50-amp-launch", "rnx-amp-launch", "rn50-amp", "rnx-amp", "rn50-tf32-launch", "rn50-bf16-launch",
                 "rn50-amp-compile", "infer", "loader", "rn50-jpeg", "rn50-synthetic", "JPEG set"):
        assert f"`python {name}.py`" in text  # the command behind every figure
    assert text.index("## Training throughput") < text.index("## GPU tests") < text.index("## Inference") < \
        text.index("## GPU decoding") < text.index("## Steps")
    assert "| Batch | Throughput img/s | Latency p50 | Latency p90 | Latency p99 | vs torchvision |" in text
    assert "#### resnet50, AMP (fp16 autocast), channels-last" in text and "| 256 | 3,000 | 10.00 ms | 11.00 ms | " \
        "12.50 ms | 1.50x |" in text
    assert "skipped: this GPU computes no bf16" in text
    assert "| amp | rnx-amp-launch | left out | 12 | 10 | its estimate, 25 s, is more than the 3 s left |" in text
    assert " s budget." in text and "**The run had not finished**" not in text


def test_the_report_gives_each_failed_test_s_message_and_traceback_and_groups_the_skips():
    text = report.markdown(fake_report())
    assert "Outcomes: 1 failed, 1 passed, 2 skipped." in text and "* skipped (2): no DALI" in text
    assert "**failed**: `tests/test_gpu.py::test_b`: AssertionError: 1 \\| 2\n\n```\n    assert syncs == 0\n" \
        "E   AssertionError: 1 | 2\n```" in text


def test_the_report_gives_the_loader_s_speed_up_and_jpeg_over_synthetic():
    fake = fake_report()
    text = report.markdown(fake)
    assert "15360 JPEGs of 500x375 at quality 90" in text and "41 KiB on average" in text
    assert "| pytorch-gpu | 5,210 | 0.40 | |" in text
    assert "| pytorch | 2,400 | 5.60 | 2.17x faster |" in text  # the verdict: the speed-up and whether it is one
    assert "resnet50 training at AMP (fp16), the same launch.py command on the JPEGs and on synthetic data" in text
    assert "| JPEG | pytorch-gpu | 4,500 img/s (batch 256; wall clock 3,000) |" in text
    assert "| synthetic | synthetic | 4,800 img/s (batch 256; wall clock 3,100) |" in text
    assert "**JPEG / synthetic: 0.94** (the goal: 0.90 or more)." in text
    # a missing run leaves no ratio, and a note says what stood in for what
    fake["steps"][7] = {**fake["steps"][7], "status": "left out", "error": "its estimate ...", "note": "smoke"}
    del fake["steps"][7]["result"]
    text = report.markdown(fake)
    assert "JPEG / synthetic: not measured" in text and "Note: smoke." in text


def test_a_report_written_before_the_end_says_which_steps_had_not_run():
    fake = fake_report()
    fake["finished"] = False
    fake["steps"][-1] = {**fake["steps"][-1], "status": "pending", "error": None}
    text = report.markdown({**fake, "expected_s": 390.0, "estimated_on": "the first H100 report"})
    assert "**The run had not finished** when this was written: the steps marked pending had not run." in text
    assert "(foretold: 390 s, by the estimates from the first H100 report)." in text
    assert "| train | rn50-amp-compile | pending | 12 | 10 |  |" in text


def test_write_report_replaces_all_three_files_whole_and_archives_the_work_but_the_data(tmp_path, monkeypatch):
    out, work = tmp_path / "out", tmp_path / "work"
    out.mkdir()
    (work / "logs").mkdir(parents=True)
    (work / "logs" / "a.log").write_text("step a\n")
    (work / "launch" / "resnet50_AMP").mkdir(parents=True)
    (work / "launch" / "resnet50_AMP" / "raport.json").write_text("{}\n")
    (work / report.DATA_FOLDER / "jpegs" / "train" / "class_0").mkdir(parents=True)
    (work / report.DATA_FOLDER / "jpegs" / "train" / "class_0" / "img.jpg").write_bytes(b"\xff\xd8")
    monkeypatch.setattr(report, "ARCHIVE_MEMBER_LIMIT", 10)
    (work / "logs" / "long.log").write_text("0123456789" * 3)
    fake = fake_report()
    report.write_report(fake, out, work)
    assert sorted(os.listdir(out)) == sorted(report.REPORT_FILES)  # no temporary file left, nothing else
    assert json.loads((out / "report.json").read_text()) == fake
    assert (out / "report.md").read_text() == report.markdown(fake)
    with tarfile.open(out / "logs.tar.gz") as tar:
        assert sorted(tar.getnames()) == ["gpu_report/launch/resnet50_AMP/raport.json", "gpu_report/logs/a.log",
                                          "gpu_report/logs/long.log"]
        assert tar.extractfile("gpu_report/logs/a.log").read() == b"step a\n"
        assert tar.extractfile("gpu_report/logs/long.log").read() == b"[the first 20 bytes left out]\n0123456789"


def test_an_out_folder_that_holds_a_report_is_refused(tmp_path, capsys):
    from image_classification.system.cli import run

    (tmp_path / "report.json").write_text("{}")
    assert run(report.main, ["--out", str(tmp_path)]) == 2
    assert "already holds a report" in capsys.readouterr().err
    assert (tmp_path / "report.json").read_text() == "{}"


def test_without_cuda_only_the_smoke_run_is_offered(tmp_path, capsys, monkeypatch):
    from image_classification.system.cli import run

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert run(report.main, ["--out", str(tmp_path / "report")]) == 2
    assert "none is available here; --smoke runs the same steps" in capsys.readouterr().err
    assert not (tmp_path / "report").exists()


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU machine the report runs its GPU tests")
def test_smoke_runs_every_step_on_the_cpu_and_leaves_three_files(tmp_path, monkeypatch):
    out, scratch = tmp_path / "report", tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(report.tempfile, "tempdir", str(scratch))
    code = report.main(["--out", str(out), "--smoke", "--sections", *report.SECTIONS,
                        "--budget", "1800"])  # a loaded machine is no failure
    result = json.loads((out / "report.json").read_text())
    statuses = {step["name"]: step["status"] for step in result["steps"]}
    assert code == 0, statuses
    assert sorted(os.listdir(out)) == sorted(report.REPORT_FILES)
    assert not list(scratch.glob("gpu_report.*"))  # the steps' scratch folder is gone
    assert result["device"] == "cpu" and result["machine"]["cpu_instruction_sets"] is not None and result["finished"]
    tests = next(step for step in result["steps"] if step["section"] == "tests")
    assert tests["status"] == "ok" and tests["result"]["counts"].keys() == {"skipped"}
    assert {test["reason"] for test in tests["result"]["tests"]} >= {"needs CUDA"}
    assert [name for name, status in statuses.items() if status == "skipped"] == [
        f"{arch} AMP" for arch in report.SMOKE.archs[1:]]
    if not result["compile_missing"]:
        compiled = next(step for step in result["steps"] if step["name"] == "resnet18 BF16 compile")["result"]
        assert list(compiled["paths"]) == ["compile"]
    decode = {step["name"]: step for step in result["steps"] if step["section"] == "decode"}
    assert decode["JPEG set"]["result"]["images"] == report.SMOKE.jpeg_images
    assert decode["loader pytorch-gpu beside pytorch"]["result"]["backend"] == "pytorch-gpu"
    assert decode["resnet50 AMP launch.py JPEG"]["result"]["data_backend"] == "pytorch"
    text = (out / "report.md").read_text()
    assert "| Arch | GPUs | Throughput FP32 |" in text and "#### resnet18, bf16 autocast, channels-last" in text
    assert "**JPEG / synthetic: " in text and "the pytorch backend stands in" in text
    assert all(step["result"]["total_ips"] > 0 for step in result["steps"] if step["kind"] == "launch")
    with tarfile.open(out / "logs.tar.gz") as tar:
        names = set(tar.getnames())
    assert {"gpu_report/tests/outcomes.jsonl", "gpu_report/decode/jpeg_set.json", "gpu_report/decode/probe.json",
            "gpu_report/launch/resnet50_AMP/raport.json", "gpu_report/infer/resnet18.json"} <= names
    assert {f"gpu_report/{step['log']}" for step in result["steps"] if "log" in step} <= names
    assert not any(name.startswith(f"gpu_report/{report.DATA_FOLDER}/") for name in names)
