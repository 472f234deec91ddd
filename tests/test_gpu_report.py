"""scripts/gpu_report.py: the plan of steps, the runner that survives failing, hanging and stopped steps,
the report's tables, and (slow) the whole ``--smoke`` run on the CPU."""

from __future__ import annotations

import importlib
import json
import os
import sys
from pathlib import Path

import pytest
import torch

from helpers import load_script

report = load_script("gpu_report")


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
def test_the_plan_runs_the_amp_figures_first_then_the_tests_the_sweep_the_other_precisions_and_compile(tmp_path):
    steps = report.plan(report.FULL, "cuda", tmp_path)
    models = ("resnet50", "resnext101-32x4d", "se-resnext101-32x4d")
    assert [step.name for step in steps] == [
        *(f"{arch} AMP launch.py" for arch in models), *(f"{arch} AMP" for arch in models), "pytest -m gpu",
        "resnet50 inference", *(f"{arch} TF32 launch.py" for arch in models),
        "resnet50 BF16 launch.py", "resnet50 AMP compile"]
    assert not any(step.skipped for step in steps)
    launch = steps[0]
    assert report.command(launch) == ("python launch.py --model resnet50 --precision AMP --mode "
                                      f"benchmark_training_short --platform DGXH100 --workspace "
                                      f"{tmp_path}/launch/resnet50_AMP --raport-file raport.json")
    assert launch.output == tmp_path / "launch" / "resnet50_AMP" / "raport.json" and launch.kind == "launch"
    assert steps[9].argv[steps[9].argv.index("--prof") + 1] == "40"  # TF32 and bf16 come after the headline
    amp = steps[3]
    assert report.command(amp).startswith("python benchmarks/train_throughput.py -a resnet50 --image-size 224 "
                                          "-b 256 --largest-batch")
    assert ("--amp", "--amp-dtype", "float16") == amp.argv[amp.argv.index("--amp"):amp.argv.index("--amp") + 3]
    assert amp.output == tmp_path / "train" / "resnet50_AMP.json" and str(amp.output) in amp.argv
    assert [step.name for step in steps if "compile" in step.argv] == ["resnet50 AMP compile"]
    sweep = steps[7].argv
    assert sweep[sweep.index("--batch-sizes") + 1:sweep.index("--paths")] == \
        ("1", "2", "4", "8", "16", "32", "64", "128", "256")
    tests = steps[6].argv
    assert tests[:4] == ("-m", "pytest", "-m", "gpu") and "--continue-on-collection-errors" in tests
    assert tests[tests.index("-n") + 1] == "6" and ("COLUMNS", "400") in steps[6].env  # skip reasons in full


def test_the_budget_is_eight_minutes_and_every_h100_step_has_an_estimate_within_its_limit(tmp_path):
    """The budget leaves 20 s of 8 minutes for starting and writing; each step's limit is within it, and
    each step's estimated time within its limit."""
    assert report.FULL.budget_s + 20 <= 8 * 60
    assert all(limit <= report.FULL.budget_s for limit in report.FULL.limits.values())
    steps = report.plan(report.FULL, "cuda", tmp_path)
    expected = dict(report.FULL.estimates)
    assert sorted(expected) == sorted(step.name for step in steps)
    assert all(0 < expected[step.name] < step.limit_s for step in steps)


def test_the_forecast_names_the_steps_the_budget_is_expected_to_leave_out(tmp_path):
    steps = report.plan(report.FULL, "cuda", tmp_path)
    total, cut = report.forecast(report.FULL, steps, report.FULL.budget_s)
    assert total == sum(seconds for _, seconds in report.FULL.estimates)
    assert cut == [step.name for step in steps[10:]]  # what users quote least: the last TF32 figure on
    assert report.forecast(report.FULL, steps, total) == (total, [])
    # a step the device cannot run takes no time; a scale without estimates forecasts nothing
    skipped = [report.Step("train", "resnet50 AMP launch.py", (), 90, skipped="no CUDA"), *steps[1:]]
    assert report.forecast(report.FULL, skipped, 1e9)[0] == total - 25
    assert report.forecast(report.SMOKE, report.plan(report.SMOKE, "cpu", tmp_path), 1) == (0, [])


def test_on_the_cpu_fp16_runs_for_resnet18_and_bf16_compiles(tmp_path):
    steps = {step.name: step for step in report.plan(report.SMOKE, "cpu", tmp_path, ["train"])}
    assert len(steps) == 11
    assert [name for name, step in steps.items() if step.skipped] == ["resnext101-32x4d AMP", "se-resnext101-32x4d AMP"]
    assert [name for name, step in steps.items() if "compile" in step.argv] == ["resnet18 BF16 compile"]
    assert all(step.env == (("OMP_NUM_THREADS", "1"),) for step in steps.values())
    assert all(step.argv[step.argv.index("--device") + 1] == "cpu" for step in steps.values() if step.kind != "launch")
    launched = [step for step in steps.values() if step.kind == "launch"]
    assert len(launched) == 7 and all(step.argv[step.argv.index("--platform") + 1] == "CPU" for step in launched)
    assert not any("compile" in step.argv for step in report.plan(report.SMOKE, "cpu", tmp_path, compiler=False))


def test_every_planned_benchmark_command_parses_with_its_script(tmp_path, capsys):
    """The flags the report passes exist, with values the scripts accept."""
    sys.path.insert(0, str(report.REPO))
    for scale in (report.FULL, report.SMOKE):
        for step in report.plan(scale, "cuda", tmp_path):
            if step.section == "tests":
                continue
            if step.kind == "launch":  # launch.py resolves its preset and main.py's flags, as the run will
                from image_classification import launch

                dry = launch.main([*step.argv[1:], "--dry-run"], cuda_available=True)
                assert dry == 0
                continue
            script = importlib.import_module("benchmarks." + Path(step.argv[0]).stem)
            args = script.build_parser().parse_args(list(step.argv[1:]))
            assert args.output == str(step.output) and args.device == "cuda"


# ------------------------------------------------------------------------------------------------
# The runner
# ------------------------------------------------------------------------------------------------
def test_a_failing_a_hanging_and_a_garbled_step_are_recorded_and_the_report_goes_on(tmp_path, monkeypatch):
    monkeypatch.setattr(report, "MIN_STEP_S", 0.5)
    good, garbled, stale = tmp_path / "good.json", tmp_path / "garbled.json", tmp_path / "stale.json"
    pid_file = tmp_path / "pids"
    hang = ("import os, subprocess, sys, time; child = subprocess.Popen(['sleep', '60']); "
            f"open({str(pid_file)!r}, 'w').write(f'{{os.getpid()}} {{child.pid}}'); time.sleep(60)")
    steps = [
        fake_step("fails", "import sys; print('working'); sys.exit('error: --arch nope is unknown')"),
        fake_step("hangs", hang, limit_s=3),
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
    assert "working" in Path(records["fails"]["log"]).read_text()
    assert records["hangs"]["error"].startswith("stopped after 3 s")
    assert "could not be read" in records["garbled"]["error"]
    assert records["skipped"]["error"] == "fp16 autocast needs CUDA" and "log" not in records["skipped"]
    assert records["good"]["result"] == {"figure": 1}
    assert "not written by this step" in records["stale"]["error"] and "result" not in records["stale"]
    # the hanging step and what it started are gone
    for pid in map(int, pid_file.read_text().split()):
        assert not Path(f"/proc/{pid}").exists() or Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    # written after every step, each time with the steps so far, and once more at the end
    assert [len(snapshot["steps"]) for snapshot in written] == [1, 2, 3, 4, 5, 6, 6]


def test_steps_beyond_the_budget_are_recorded_as_not_run(tmp_path):
    steps = [fake_step("slow", "import time; time.sleep(1.5)", limit_s=30), fake_step("next", "pass")]
    result, _ = run_fake(steps, tmp_path, budget_s=report.MIN_STEP_S + 1)
    assert result["steps"][0]["status"] == "ok"  # it ran; then too little of the budget was left
    assert result["steps"][1]["status"] == "not run" and "of the budget were left" in result["steps"][1]["error"]


def test_a_sigterm_ends_the_step_under_way_and_records_the_rest(tmp_path):
    steps = [fake_step("stops", "import os, signal, time; os.kill(os.getppid(), signal.SIGTERM); time.sleep(30)"),
             fake_step("after", "pass")]
    result, written = run_fake(steps, tmp_path)
    assert [step["status"] for step in result["steps"]] == ["not run", "not run"]
    assert all("stopped by signal 15" in step["error"] for step in result["steps"])
    assert written[-1] == result


def test_pytest_outcomes_are_read_from_its_verbose_output():
    output = """\
tests/test_gpu.py::test_a[precision0-nchw] SKIPPED (needs CUDA)          [  5%]
tests/test_gpu.py::test_b PASSED                                         [ 10%]
tests/test_optim.py::test_c FAILED                                       [ 15%]
tests/test_gpu.py::test_d
"""
    parsed = report.parse_tests(output)
    assert parsed["counts"] == {"skipped": 1, "passed": 1, "failed": 1}
    assert parsed["tests"][0] == {"test": "tests/test_gpu.py::test_a[precision0-nchw]", "outcome": "skipped",
                                  "reason": "needs CUDA"}


# ------------------------------------------------------------------------------------------------
# The report
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


def launch_result(total: float, wall: float, batch: int) -> dict:
    return {"total_ips": total, "wall_ips": wall, "batch_size": batch, "warmup": 20, "iterations": 100,
            "amp_dtype": None, "loss": 6.9}


def fake_report() -> dict:
    def step(section, name, status="ok", result=None, error=None, arch="", precision="", kind=""):
        return {"section": section, "name": name, "arch": arch, "precision": precision, "kind": kind,
                "status": status, "command": f"python {name}.py", "seconds": 12.0, "error": error,
                **({"result": result} if result else {})}

    point = {"images_per_s": 3000.0, "p50_ms": 10.0, "p90_ms": 11.0, "p99_ms": 12.5, "speedup": 1.5}
    infer = {"config": {"arch": "resnet50", "image_size": 224, "batch_sizes": [1, 256]},
             "environment": {"device": "cuda"},
             "paths": {"torchvision": {"1": point, "256": point}, "fp16": {"1": point, "256": point},
                       "bf16": {"skipped": "this GPU computes no bf16"}}}
    tests = {"counts": {"passed": 2, "skipped": 1},
             "tests": [{"test": "tests/test_gpu.py::test_a", "outcome": "passed"},
                       {"test": "tests/test_gpu.py::test_b", "outcome": "passed"},
                       {"test": "tests/test_gpu.py::test_c", "outcome": "skipped", "reason": "no DALI"}]}
    return {"smoke": False, "device": "cuda", "command": "python scripts/gpu_report.py --out r", "started": "now",
            "seconds": 500.0, "budget_s": 540.0, "machine": {"description": "1x NVIDIA H100 80GB HBM3 (...)"},
            "steps": [
                step("train", "rn50-amp-launch", result=launch_result(4812.4, 3100.0, 256), arch="resnet50",
                     precision="AMP", kind="launch"),
                step("train", "rnx-amp-launch", "not run", error="3 s of the budget were left",
                     arch="resnext101-32x4d", precision="AMP", kind="launch"),
                step("train", "rn50-amp", result=train_result(2500.0, 256), arch="resnet50", precision="AMP",
                     kind="throughput"),
                step("train", "rnx-amp", result=train_result(400.0, 128, too_large=[256]), arch="resnext101-32x4d",
                     precision="AMP", kind="throughput"),
                step("tests", "pytest -m gpu", result=tests),
                step("infer", "infer", result=infer, arch="resnet50"),
                step("train", "rn50-tf32-launch", result=launch_result(1925.0, 1500.0, 256), arch="resnet50",
                     precision="TF32", kind="launch"),
                step("train", "rn50-bf16-launch", "failed", error="exit code 1: CUDA error | bad", arch="resnet50",
                     precision="BF16", kind="launch"),
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
    assert rnx == "| resnext101-32x4d | 1 | - | not run: 3 s of the budget were left | - | - | - |"
    detail = next(line for line in lines if line.startswith("| resnet50 | AMP (fp16) | 256 |"))
    assert detail == "| resnet50 | AMP (fp16) | 256 | 2,000 | 2,500 (1.25x) | 3,000 (1.50x) | 61 |"
    assert "| resnext101-32x4d | AMP (fp16) | 128 | 320 | 400 (1.25x) | - | - |" in lines
    for name in ("rn50-amp-launch", "rnx-amp-launch", "rn50-amp", "rnx-amp", "rn50-tf32-launch", "rn50-bf16-launch",
                 "rn50-amp-compile", "infer"):
        assert f"`python {name}.py`" in text  # the command behind every row
    assert text.index("## Training throughput") < text.index("## GPU tests") < text.index("## Inference")
    assert "| Batch | Throughput img/s | Latency p50 | Latency p90 | Latency p99 | vs torchvision |" in text
    assert "#### resnet50, AMP (fp16 autocast), channels-last" in text and "| 256 | 3,000 | 10.00 ms | 11.00 ms | " \
        "12.50 ms | 1.50x |" in text
    assert "skipped: this GPU computes no bf16" in text
    assert "Outcomes: 2 passed, 1 skipped." in text and "* skipped (1): no DALI" in text
    assert "| train | rnx-amp-launch | not run | 12 | 3 s of the budget were left |" in text
    assert " s budget." in text  # a report with no forecast says nothing of one
    assert " s budget (the first H100 report's times foretold 570 s)." in report.markdown({**fake_report(),
                                                                                            "expected_s": 570.0})


def test_a_launch_step_s_figures_are_its_raport_s_summary_and_one_without_any_fails(tmp_path):
    """The raport of launch.py's benchmark gives the headline (warm-up left out) and the wall-clock figure; a
    run whose every iteration was warm-up has no figure, and the step says so instead of reporting a number."""
    from image_classification.training import main

    common = ["--data-backend", "synthetic", "-a", "resnet18", "--image-size", "32", "-b", "2", "--epochs", "1",
              "--training-only", "--no-checkpoints", "-p", "1", "--benchmark-warmup", "2"]
    assert main(common + ["--prof", "4", "--workspace", str(tmp_path / "ok")]) == 0
    figures = report.launch_figures(tmp_path / "ok" / "experiment_raport.json")
    assert figures["batch_size"] == 2 and figures["warmup"] == 2 and figures["iterations"] == 4
    assert figures["total_ips"] > 0 and figures["wall_ips"] > 0
    assert main(common + ["--prof", "2", "--workspace", str(tmp_path / "short")]) == 0
    with pytest.raises(ValueError, match="no iteration after the warm-up"):
        report.launch_figures(tmp_path / "short" / "experiment_raport.json")


def test_an_out_folder_that_holds_a_report_is_refused(tmp_path, capsys):
    from image_classification.cli import run

    (tmp_path / "report.json").write_text("{}")
    assert run(report.main, ["--out", str(tmp_path)]) == 2
    assert "already holds a report" in capsys.readouterr().err
    assert (tmp_path / "report.json").read_text() == "{}"


def test_without_cuda_only_the_smoke_run_is_offered(tmp_path, capsys, monkeypatch):
    from image_classification.cli import run

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert run(report.main, ["--out", str(tmp_path / "report")]) == 2
    assert "none is available here; --smoke runs the same steps" in capsys.readouterr().err
    assert not (tmp_path / "report").exists()


def test_write_report_replaces_both_files_whole(tmp_path):
    fake = fake_report()
    report.write_report(fake, tmp_path)
    assert json.loads((tmp_path / "report.json").read_text()) == fake
    assert (tmp_path / "report.md").read_text() == report.markdown(fake)
    assert sorted(os.listdir(tmp_path)) == ["report.json", "report.md"]  # no temporary file left


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU machine the report runs its GPU tests")
def test_smoke_runs_every_step_on_the_cpu(tmp_path):
    out = tmp_path / "report"
    code = report.main(["--out", str(out), "--smoke", "--budget", "1800"])  # a loaded machine is no failure
    result = json.loads((out / "report.json").read_text())
    statuses = {step["name"]: step["status"] for step in result["steps"]}
    assert code == 0, statuses
    assert result["device"] == "cpu" and result["machine"]["cpu_instruction_sets"] is not None
    tests = next(step for step in result["steps"] if step["section"] == "tests")
    assert tests["status"] == "ok" and tests["result"]["counts"].keys() == {"skipped"}
    assert {test["reason"] for test in tests["result"]["tests"]} >= {"needs CUDA"}
    assert [name for name, status in statuses.items() if status == "skipped"] == [
        f"{arch} AMP" for arch in report.SMOKE.archs[1:]]
    if not result["compile_missing"]:
        compiled = next(step for step in result["steps"] if step["name"] == "resnet18 BF16 compile")["result"]
        assert list(compiled["paths"]) == ["compile"]
    text = (out / "report.md").read_text()
    assert "| Arch | GPUs | Throughput FP32 |" in text and "#### resnet18, bf16 autocast, channels-last" in text
    assert all(step["result"]["total_ips"] > 0 for step in result["steps"] if step["kind"] == "launch")
