"""scripts/readme_figures.py: every figure block of the docs has the run that regenerates it, in whichever
page holds it."""

from pathlib import Path

from helpers import load_script

figures = load_script("readme_figures")

DEMO_OUTPUT = """\
=> python main.py --data-backend pytorch ...
Epoch 5/6: train loss 0.6512, 480.1 img/s, lr 0.003; val loss 0.6101, top1 99.44%, top5 100.00%
SAVING workspace/digits/checkpoint.pth.tar (end of epoch 5)
Epoch 6/6 [1/23] loss 0.6423, 490.2 img/s, lr 0
Epoch 6/6: train loss 0.6428, 482.3 img/s, lr 0; val loss 0.6111, top1 99.17%, top5 100.00%
SAVING workspace/digits/checkpoint.pth.tar (end of epoch 6)
Summary (each figure's best epoch; throughput over the run): train loss 0.6428, 482.29 img/s; val loss 0.6101, \
top1 99.44%, top5 100.00%
val top1: last 99.17% (epoch 6), best 99.44% (epoch 5, model_best.pth.tar)
checkpoint: workspace/digits/checkpoint.pth.tar
raport: workspace/digits/experiment_raport.json
Experiment ended
"""


def test_every_marked_block_has_a_generator_and_back():
    assert figures.check(figures.pages()) == []
    assert figures.main(["--check"]) == 0


def test_check_names_what_is_missing():
    problems = figures.check({Path("README.md"): "see `<!-- figures:NAME -->`\n<!-- figures:nope -->\nold\n",
                              Path("docs/a.md"): "<!-- figures:loader -->\n<!-- /figures:loader -->\n",
                              Path("docs/b.md"): "<!-- figures:loader -->\n<!-- /figures:loader -->\n"})
    assert not any("NAME" in problem for problem in problems)  # a marker quoted inside a line is text
    assert "figure block 'nope' has no generator" in problems
    assert "figure block 'nope' is not closed in README.md" in problems
    assert "figure block 'loader' is marked 2 times" in problems
    assert any("generator 'demo' has no block" in problem for problem in problems)


def test_a_block_is_found_and_rewritten_in_the_docs_page_that_holds_it(tmp_path, monkeypatch):
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text("# Title\n")
    page = tmp_path / "docs" / "performance.md"
    page.write_text("before\n<!-- figures:loader -->\nold\n<!-- /figures:loader -->\nafter\n")
    texts = figures.pages(tmp_path)
    assert list(texts) == [tmp_path / "README.md", page] and figures.page_holding("loader", texts) == page
    monkeypatch.setattr(figures, "pages", lambda: texts)
    monkeypatch.setattr(figures, "check", lambda texts: [])  # the other generators have no block here
    monkeypatch.setattr(figures, "check_repeated", lambda texts, values: [])  # nor the repeated figures
    monkeypatch.setitem(figures.GENERATORS, "loader", lambda: "new\n")
    assert figures.main(["loader"]) == 0
    assert page.read_text() == "before\n<!-- figures:loader -->\nnew\n<!-- /figures:loader -->\nafter\n"
    assert (tmp_path / "README.md").read_text() == "# Title\n"


def test_demo_block_shows_the_run_s_last_epoch_its_summary_and_the_result_lines_as_printed():
    block = figures.demo_block(DEMO_OUTPUT, 26.4, "Some CPU (2 cores)", 41.2)
    assert block.startswith("```\nEpoch 6/6: train loss 0.6428, 482.3 img/s, lr 0; val loss 0.6111, top1 99.17%, ")
    assert "\nSummary (each figure's best epoch; throughput over the run): train loss 0.6428, 482.29 img/s; " in block
    assert "Epoch 5/6" not in block and "Epoch 6/6 [" not in block and "=> python" not in block
    assert "val top1: last 99.17% (epoch 6), best 99.44% (epoch 5, model_best.pth.tar)\ncheckpoint:" in block
    assert "Experiment ended\n```" in block
    assert "Measured on Some CPU (2 cores): `make demo` took 26 s (41 s of CPU time)" in block
    assert "99.44% val top1 (model_best.pth.tar)." in " ".join(block.split())


def test_replace_block_changes_only_the_block():
    text = "before\n<!-- figures:demo -->\nold\n<!-- /figures:demo -->\nafter\n"
    assert figures.replace_block(text, "demo", "new\n") == \
        "before\n<!-- figures:demo -->\nnew\n<!-- /figures:demo -->\nafter\n"


def inference_record(native: bool) -> dict:
    point = {"images_per_s": 20.0, "p50_ms": 50.0, "p90_ms": 51.0, "p99_ms": 52.0, "speedup": 1.25}
    paths = {name: {"dtype": "float32", "1": point, "max_abs_diff": 5e-5, "top1_agreement": 1.0}
             for name in ("torchvision", "eager", "channels_last", "bf16")}
    paths["compile"] = {"dtype": "float32", "skipped": "torch.compile on cpu needs a C++ compiler; none found"}
    return {"config": {"batch_sizes": [1], "image_size": 224, "arch": "resnet50"}, "paths": paths,
            "classify_default": "bf16" if native else "channels_last",
            "environment": {"device": "cpu", "cpu_model": "AMD EPYC", "cpu_cores": 2, "python": "3.11.7",
                            "torch": "2.14.1", "torchvision": "0.29.1", "cpu_capability": "AVX2",
                            "cpu_instruction_sets": ["AVX2"], "gpu": None,
                            "cpu_bf16_native": native, "load_average": [1.04, 0.5, 0.25]}}


def test_inference_block_names_the_cpu_capability_and_classifys_default_row():
    block = figures.inference_block(inference_record(native=False), "python benchmarks/infer_throughput.py")
    assert "Measured on AMD EPYC (2 cores; AVX2; torch's CPU kernels AVX2), no GPU used; Python 3.11.7, " \
        "torch 2.14.1, torchvision 0.29.1; the CPU has no native bf16: it emulates bf16" in block
    assert "load average at the end of the run 1.0 / 0.5 / 0.2 (1 / 5 / 15 min)" in block
    rows = [line for line in block.splitlines() if line.startswith("| ") and "path" not in line]
    assert [row.split(" | ")[0] for row in rows] == [
        "| torchvision eager FP32 (baseline)", "| eager FP32",
        "| channels-last FP32 (**`classify.py`'s default here**)", "| bf16 autocast, channels-last",
        "| `torch.compile`"]  # fp16 and ONNX Runtime were not measured: no rows
    assert rows[0].endswith("| - | - |") and rows[1].endswith("| 5.0e-05 | 100% |")
    assert rows[-1] == "| `torch.compile` | skipped: torch.compile on cpu needs a C++ compiler; none found | | | | |"  # 5 cells
    native = figures.inference_block(inference_record(native=True), "python benchmarks/infer_throughput.py")
    assert "computes bf16 natively" in native and "| bf16 autocast, channels-last (**`classify.py`" in native


def test_a_gpu_figure_names_the_gpu_and_its_driver():
    record = inference_record(native=True)
    record["environment"].update(device="cuda", load_average=None, gpu={
        "name": "NVIDIA H100 80GB HBM3", "memory_gib": 79.1, "capability": "9.0", "count": 1,
        "driver": "580.159.04", "cuda": "13.0"})
    block = figures.inference_block(record, "python benchmarks/infer_throughput.py")
    assert "Measured on 1x NVIDIA H100 80GB HBM3 (79.1 GiB, compute capability 9.0, driver 580.159.04, CUDA " \
        "13.0), host AMD EPYC (2 cores; AVX2; torch's CPU kernels AVX2); Python 3.11.7, torch 2.14.1, " \
        "torchvision 0.29.1; 224 px" in block


def test_inference_block_states_the_fp32_ceiling_and_how_near_the_fastest_fp32_row_comes():
    record = inference_record(native=False)
    assert "ceiling" not in figures.inference_block(record, "python benchmarks/infer_throughput.py")  # CUDA
    record["paths"]["channels_last"]["1"] = {**record["paths"]["channels_last"]["1"], "images_per_s": 30.0}
    record["paths"]["bf16"]["dtype"] = "bfloat16"  # faster rows in fewer bits do not count
    record["paths"]["bf16"]["1"] = {**record["paths"]["bf16"]["1"], "images_per_s": 90.0}
    record["fp32_ceiling"] = {"gflop_per_image": 8.18, "gemm_gflops": 327.2, "images_per_s": 40.0}
    block = " ".join(figures.inference_block(record, "python benchmarks/infer_throughput.py").split())
    assert "resnet50 needs 8.18 GFLOP per image" in block and "runs at 327 GFLOP/s" in block
    assert "no FP32 path can much exceed 40.0 images/s; at batch 1 the fastest FP32 row (channels-last FP32) " \
           "reaches 75% of it." in block


def test_profile_text_says_what_the_convolutions_leave():
    record = {"config": {"arch": "resnet50", "image_size": 128},
              "plain": {"profile": {"conv_forward": 0.25, "conv_backward": 0.55, "bound": 1.25}}}
    assert figures.profile_text(record) == ("resnet50 at 128 px spends 80% in convolutions (forward 25%, "
                                            "backward 55%), so removing all else would gain at most 1.25x")
    assert figures.profile_text({"config": {}, "plain": {}}) == ""  # on CUDA: no host profile


def test_train_step_row_shows_each_path_and_withholds_a_verdict_inside_the_noise():
    def stats(median, spread, ratio=None, ratio_spread=None):
        return {"median": median, "relative_spread": spread, "ratio": ratio, "ratio_spread": ratio_spread}

    record = {"plain": stats(20.0, 0.05), "paths": {"eager": stats(20.5, 0.04, 1.025, 0.06),
                                                    "compile": stats(30.0, 0.03, 1.5, 0.04)}}
    row = figures.train_step_row(record, "python benchmarks/train_throughput.py -a resnet50")
    assert row.startswith("| `python benchmarks/train_throughput.py -a resnet50` | 20.0 (5%) | 20.5 (4%): 1.02x (spread")
    assert "no verdict" in row.split(" | ")[2] and row.split(" | ")[3] == "-"
    assert row.endswith("| 30.0 (3%): **1.50x** |")


def test_int8_accuracy_block_compares_each_runtime_with_pytorch_fp32():
    rows = [("PyTorch FP32", "", 98.61, 0.12584), ("ONNX Runtime FP32", "--runtime onnxruntime", 98.61, 0.12584),
            ("ONNX Runtime int8, minmax", "--runtime onnxruntime --quantize int8", 98.33, 0.1301)]
    block = figures.int8_accuracy_block(rows, 359, 360, "Some CPU (2 cores)")
    table = [line for line in block.splitlines() if line.startswith("| ") and "FLAGS" not in line]
    assert table == ["| PyTorch FP32 | `(none)` | 98.61% | 0.1258 | - |",
                     "| ONNX Runtime FP32 | `--runtime onnxruntime` | 98.61% | 0.1258 | +0.00 |",
                     "| ONNX Runtime int8, minmax | `--runtime onnxruntime --quantize int8` | 98.33% | 0.1301 | -0.28 |"]
    text = " ".join(block.split())
    assert "Measured on Some CPU (2 cores)." in text
    assert "names the class PyTorch FP32 names for 359 of the 360 val digits (99.7%)" in text


def test_every_figure_the_pages_repeat_has_one_value():
    """The demo's top-1 (README, data.md, inference.md), the suite's count and time (the README's prose and
    table) and the H100 figures (performance.md, training.md) each have one value, docs/figures.json's."""
    assert figures.check_repeated(figures.pages(), figures.load_figures()) == []


def test_a_page_that_repeats_a_figure_with_another_value_is_named(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text("... 99.17% val top1\n(model_best.pth.tar). ...\n")
    (tmp_path / "docs" / "inference.md").write_text("| PyTorch FP32 | `(none)` | 98.61% | 0.1258 | - |\n")
    texts = figures.pages(tmp_path)
    problems = figures.check_repeated(texts, {"demo_top1": {"value": "99.17"}, "stray": {"value": "1"}}, tmp_path)
    assert "demo_top1: docs/inference.md says 98.61; figures.json holds 99.17" in problems
    assert not any("README.md says" in problem for problem in problems)  # its line break is white space
    assert any(problem.startswith("demo_top1: docs/data.md no longer shows it") for problem in problems)
    assert "stray: figures.json holds it, but no page is said to repeat it" in problems
    assert "suite_tests: figures.json holds no value" in problems


def test_a_generator_records_the_figure_it_measured(tmp_path):
    path = tmp_path / "figures.json"
    path.write_text('{"demo_top1": {"value": "99.17", "what": "the demo"}}\n')
    figures.record_figure("demo_top1", "98.89", path)
    assert figures.load_figures(path) == {"demo_top1": {"value": "98.89", "what": "the demo"}}
