"""scripts/readme_figures.py: every figure block of the README has the run that regenerates it."""

from helpers import REPO, load_script

figures = load_script("readme_figures")

DEMO_OUTPUT = """\
=> python main.py --data-backend pytorch ...
DLL 2026-11-22T23:23:18.438596 - Epoch: 5 train.loss : 0.64 val.top1 : 99.44 %
DLL 2026-11-22T23:23:18.438596 - Summary: train.loss : 0.64281 train.total_ips : 482.29 images/s train.lr : 0 val.top1 : 99.44 % val.top5 : 100.00 % val.loss : 0.6
val top1: 99.44% (best 99.44%)
checkpoint: workspace/digits/checkpoint.pth.tar
raport: workspace/digits/experiment_raport.json
Experiment ended
"""


def test_every_marked_block_has_a_generator_and_back():
    assert figures.check((REPO / "README.md").read_text()) == []
    assert figures.main(["--check"]) == 0


def test_check_names_what_is_missing():
    problems = figures.check("see `<!-- figures:NAME -->` below\n<!-- figures:nope -->\nold\n")
    assert not any("NAME" in problem for problem in problems)  # a marker quoted inside a line is text
    assert "README block 'nope' has no generator" in problems
    assert "README block 'nope' is not closed" in problems
    assert any("generator 'demo' has no block" in problem for problem in problems)


def test_demo_block_keeps_the_summary_fields_and_the_result_lines():
    block = figures.demo_block(DEMO_OUTPUT, 26.4, "Some CPU (2 cores)")
    assert "Summary: train.loss : 0.64281 ... train.total_ips : 482.29 images/s ... val.top1 : 99.44 % ... " \
           "val.top5 : 100.00 % ..." in block
    assert "val.loss" not in block and "Epoch: 5" not in block and "=> python" not in block
    assert "val top1: 99.44% (best 99.44%)\ncheckpoint:" in block and "Experiment ended\n```" in block
    assert "Measured on Some CPU (2 cores): `make demo` took 26 s" in block and "99.44% val top1." in block


def test_replace_block_changes_only_the_block():
    text = "before\n<!-- figures:demo -->\nold\n<!-- /figures:demo -->\nafter\n"
    assert figures.replace_block(text, "demo", "new\n") == \
        "before\n<!-- figures:demo -->\nnew\n<!-- /figures:demo -->\nafter\n"
