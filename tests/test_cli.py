"""How every command of the toolkit answers a mistake in its command line: one line, exit code 2."""

from __future__ import annotations

import pytest

from helpers import refused
from image_classification import launch, multiproc
from image_classification.arguments import build_parser, parse_args
from image_classification.arguments import tools as tool_arguments
from image_classification.system.cli import run


def parse(parser):
    """``parser.parse_args`` as a command's entry point (its errors one line, exit 2, through ``cli.run``)."""
    return lambda argv: parser.parse_args(argv)


@pytest.mark.parametrize("entry, argv, flag, meant", [
    # the typo's value must not become the dataset, and the unknown flag is named alone
    (parse_args, ["--lable-smoothing", "0.1", "data/digits"], "--lable-smoothing", "--label-smoothing"),
    (parse_args, ["--epochs", "2", "--lable-smoothing=0.1", "data/digits"], "--lable-smoothing", "--label-smoothing"),
    # named before argparse's own complaint that the flag it stands for is missing
    (parse(tool_arguments.classify_parser()), ["--imgae", "X"], "--imgae", "--image"),
    (parse(tool_arguments.model2onnx_parser()), ["--ouptut", "m.onnx"], "--ouptut", "--output"),
    (parse(tool_arguments.checkpoint2model_parser()), ["--checkpoint-path", "c", "--weights-path", "w"],
     "--weights-path", "--weight-path"),
    (parse(tool_arguments.pack_parser(prog="ic-pack")), ["--shard-sise", "1GB", "src", "dst"], "--shard-sise",
     "--shard-size"),
    (launch.main, ["--model", "resnet50", "--precision", "AMP", "--mode", "convergence", "--platform", "DGXA100",
                   "--warmpu", "2", "/data", "--dry-run"], "--warmpu", "--warmup"),
    # launch.py's own flags too, before it says that --model is missing
    (launch.main, ["--modl", "resnet50", "--precision", "AMP", "--mode", "convergence", "--platform", "DGXA100",
                   "/data"], "--modl", "--model"),
    # a launcher's own flags; what follows the training script is that script's to judge
    (multiproc.main, ["--nproc-per-nodes", "2", "main.py", "--lr", "0.1"], "--nproc-per-nodes", "--nproc-per-node"),
])
def test_an_unknown_flag_is_named_alone_with_the_closest_one(entry, argv, flag, meant, capsys):
    line = refused(run(entry, argv), capsys)
    assert line.endswith(f": unknown flag {flag}; did you mean {meant}?"), line


def test_every_script_and_benchmark_answers_a_typo_as_the_commands_do(capsys):
    """The helper scripts too: one line naming the unknown flag and the closest, exit 2 (no plain argparse)."""
    from helpers import REPO, load_script

    plain = [path.relative_to(REPO).as_posix() for folder in ("scripts", "benchmarks")
             for path in sorted((REPO / folder).glob("*.py")) if "argparse.ArgumentParser(" in path.read_text()]
    assert plain == []
    import benchmarks.startup

    for entry, argv, meant in ((load_script("augment_draws").command, ["--bacth", "8"], "--batch"),
                               (benchmarks.startup.main, ["--rouns", "1", "DIR"], "--rounds"),
                               (load_script("readme_options").main, ["--chek"], "--check")):
        line = refused(run(entry, argv), capsys)
        assert line.endswith(f"unknown flag {argv[0]}; did you mean {meant}?"), line


def test_a_flag_nothing_resembles_points_to_the_help(capsys):
    assert refused(run(parse_args, ["-x", "/data"]), capsys) == "error: main.py: unknown flag -x; main.py -h lists the flags"


def test_values_and_short_flags_with_their_values_are_not_taken_for_unknown_flags():
    args = build_parser().parse_args(["-b8", "-j0", "--lr", "-1", "--epoch", "3", "--crop-scale", "0.5", "1", "/data"])
    assert (args.batch_size, args.workers, args.lr, args.epochs, args.data) == (8, 0, -1, 3, "/data")
    assert multiproc.build_parser().parse_args(["main.py", "--no-such-flag"]).training_script_args == ["--no-such-flag"]
