"""Every flag of the reference README's ``main.py -h`` parses with the same meaning."""

import json
import re
import subprocess
import sys
import textwrap

import pytest

from helpers import REPO, patient, refused
from image_classification.arguments import (REFERENCE_DEFAULTS, build_parser, linear_scaled_lr, model_options, parse_args,
                                            raport_file)
from image_classification.errors import UserError

SEED_FLAGS = [
    "--data-backend", "pytorch", "--arch", "resnext101-32x4d", "--model-config", "fanin", "--num-classes", "10",
    "-j", "3", "--epochs", "5", "--run-epochs", "2", "-b", "16", "--optimizer-batch-size", "64", "--lr", "0.2",
    "--lr-schedule", "cosine", "--warmup", "1", "--label-smoothing", "0.1", "--mixup", "0.2", "--momentum", "0.875",
    "--weight-decay", "3e-5", "--bn-weight-decay", "--nesterov", "--print-freq", "5", "--resume", "c.pth.tar",
    "--static-loss-scale", "128", "--dynamic-loss-scale", "--prof", "7", "--amp", "--seed", "3",
    "--gather-checkpoints", "--raport-file", "r.json", "--training-only", "--no-checkpoints",
    "--checkpoint-filename", "c.pth.tar", "--workspace", "ws", "--memory-format", "nhwc", "/data",
]


def test_every_seed_flag_parses():
    args = parse_args(SEED_FLAGS)
    assert (args.data_backend, args.arch, args.model_config, args.num_classes) == ("pytorch", "resnext101-32x4d",
                                                                                   "fanin", 10)
    assert (args.workers, args.epochs, args.run_epochs, args.batch_size, args.optimizer_batch_size) == (3, 5, 2, 16, 64)
    assert (args.lr, args.lr_schedule, args.warmup, args.label_smoothing, args.mixup) == (0.2, "cosine", 1, 0.1, 0.2)
    assert (args.momentum, args.weight_decay, args.bn_weight_decay, args.nesterov) == (0.875, 3e-5, True, True)
    assert (args.print_freq, args.resume, args.static_loss_scale, args.dynamic_loss_scale) == (5, "c.pth.tar", 128, True)
    assert (args.prof, args.amp, args.seed, args.gather_checkpoints) == (7, True, 3, -1)
    assert (args.raport_file, args.training_only, args.save_checkpoints) == ("r.json", True, False)
    assert (args.checkpoint_filename, args.workspace, args.memory_format, args.data) == ("c.pth.tar", "ws", "nhwc",
                                                                                         "/data")


def test_later_reference_flags_and_both_spellings():
    args = parse_args([
        "--image-size", "160", "--interpolation", "bicubic", "--prefetch", "4", "--end-lr", "1e-5",
        "--optimizer", "rmsprop", "--rmsprop-alpha", "0.8", "--rmsprop-eps", "0.01", "--use-ema", "0.999",
        "--augmentation", "autoaugment", "--topk", "3", "--early-stopping-patience", "4", "--jit", "script",
        "--gpu-affinity", "socket_unique_contiguous", "--num_classes", "7", "--pretrained-from-file", "w.pth",
        "--gather-checkpoints", "3", "--data-backend", "syntetic", "--crop-scale", "0.3", "0.9", "--hflip", "0",
        "--device", "cpu", "--no-tf32", "--conv_init", "fan_in", "--last_bn_0_init",
    ])
    assert args.data_backend == "synthetic" and args.data is None
    assert (args.num_classes, args.pretrained_weights, args.gather_checkpoints) == (7, "w.pth", 3)
    assert args.crop_scale == [0.3, 0.9] and args.hflip == 0 and args.tf32 is False and args.last_bn_0_init is True


def test_defaults_match_the_reference_but_for_the_learning_rate_the_last_batchnorm_and_the_layout():
    args = parse_args(["/data"])
    assert (args.workers, args.epochs, args.batch_size, args.lr_schedule, args.warmup) == (5, 90, 256, "step", 0)
    # a plain run scales its rate to the batch (0.1 at the reference's -b 256) and starts each residual block as the
    # identity; launch.py's presets start from the reference's values instead
    assert args.lr is None and model_options(args) == {"last_bn_0_init": True}
    assert REFERENCE_DEFAULTS == {"lr": 0.1, "last_bn_0_init": False, "memory_format": "nchw"}
    assert linear_scaled_lr(256) == 0.1 and linear_scaled_lr(32) == 0.0125
    assert (args.momentum, args.weight_decay, args.print_freq) == (0.9, 1e-4, 10)
    # the reference's 1 was where its always-dynamic scaler started; ours starts at 65536 unless told
    assert args.static_loss_scale is None and not args.dynamic_loss_scale
    assert (raport_file(args), args.checkpoint_filename, args.workspace) == ("experiment_raport.json",
                                                                            "checkpoint.pth.tar", "./")
    # channels-last on the CPU for the models that train faster in it, decided when the device is known
    assert (args.memory_format, args.arch, build_parser().get_default("model_config")) == ("auto", "resnet50", None)
    assert args.gather_checkpoints == 0 and args.save_checkpoints is True
    # resolved when the run starts: top-5 (or the class count), the checkpoint's or the dataset's classes, 1000
    assert (args.topk, args.num_classes, args.image_size, args.interpolation) == (None, None, None, None)


def test_prefix_abbreviations_used_by_the_reference_scripts_work_and_are_said(capsys):
    """The reference's recipes type ``--mom`` (argparse's prefixes), so a unique prefix still works; it is said
    on stderr, never taken silently (``--epoch 3`` runs as ``--epochs 3``).  A whole flag, and ``--checkpoint``
    (an alias of its own), say nothing; a prefix of two flags is refused naming both."""
    args = parse_args(["--mom", "0.875", "--checkpoint", "x.pth.tar", "--epoch=3", "/data"])
    assert args.momentum == 0.875 and args.checkpoint_filename == "x.pth.tar" and args.epochs == 3
    assert capsys.readouterr().err.splitlines() == [
        "note: --mom is read as --momentum, the one flag it begins",
        "note: --epoch is read as --epochs, the one flag it begins"]
    parse_args(["--momentum", "0.875", "/data"])
    assert capsys.readouterr().err == ""
    with pytest.raises(UserError, match="ambiguous option: --e could match --epochs, --early-stopping-patience, "
                       "--end-lr, --evaluate"):
        parse_args(["--e", "3", "/data"])


@pytest.mark.parametrize("argv", [
    ["--arch", "resnet99", "/d"], ["--lr-schedule", "poly", "/d"], ["-b", "0", "/d"], ["--epochs", "0", "/d"],
    ["--memory-format", "nwhc", "/d"], ["--data-backend", "tfrecord", "/d"], [], ["--hflip", "2", "/d"],
    ["--crop-scale", "0.9", "0.1", "/d"], ["--evaluate", "--training-only", "/d"],
])
def test_bad_flags_are_user_errors(argv):
    with pytest.raises(UserError):
        parse_args(argv)


def test_unknown_preset_key_is_named():
    with pytest.raises(UserError, match="learning_rat"):
        parse_args(["/d"], defaults={"learning_rat": 1})


def test_help_lists_every_architecture():
    text = build_parser().format_help()
    for arch in ("resnet18", "resnext101-32x8d-basic", "se-resnext101-32x4d", "efficientnet-b0",
                 "efficientnet-widese-b7"):
        assert arch in text


@pytest.mark.parametrize("argv, options", [
    (["--arch", "efficientnet-b0"], {}),  # a plain run's zeroed last BatchNorm is the ResNets' alone
    (["--arch", "efficientnet-b4", "--last_bn_0_init", "false"], {"last_bn_0_init": False}),  # asks nothing
    (["--arch", "efficientnet-b4", "--dropout", "0.5", "--survival_prob", "0.9", "--bn_momentum", "0.1",
      "--bn_epsilon", "1e-5", "--conv_init", "fan_out"],
     {"dropout": 0.5, "survival_prob": 0.9, "bn_momentum": 0.1, "bn_epsilon": 1e-5, "conv_init": "fan_out"}),
    (["--arch", "resnet50"], {"last_bn_0_init": True}),
    (["--arch", "resnet50", "-c", "fanin", "--last_bn_0_init", "false"],
     {"model_config": "fanin", "last_bn_0_init": False}),
])
def test_the_model_flags_given_reach_the_model_and_a_plain_run_defaults_per_family(argv, options):
    assert model_options(parse_args([*argv, "/d"])) == options


@pytest.mark.parametrize("argv, words", [
    (["--arch", "efficientnet-b0", "--last_bn_0_init"], "last_bn_0_init does not apply to efficientnet-b0"),
    (["--arch", "efficientnet-b0", "-c", "classic"], "model_config does not apply to efficientnet-b0"),
    (["--arch", "resnet50", "--dropout", "0.2"], "dropout does not apply to resnet50 (a ResNet)"),
    (["--arch", "efficientnet-b0", "--dropout", "1"], "dropout must be from 0 up to (not including) 1"),
    (["--arch", "efficientnet-b0", "--survival_prob", "0"], "survival_prob must be above 0"),
])
def test_a_model_flag_that_does_not_fit_the_architecture_is_one_line(argv, words, capsys):
    from image_classification.system.cli import run
    from image_classification.training import main

    assert words in refused(run(main, argv + ["--data-backend", "synthetic", "--device", "cpu"]), capsys)
    with pytest.raises(UserError, match=words.split(" (")[0]):  # refused at parsing, before any set-up
        parse_args(["/d", *argv])


# -- one validation path for flags and preset values ----------------------------------------------------
BAD_FLAGS = {
    "negative lr": ["--lr", "-0.1"],
    "nan lr": ["--lr", "nan"],
    "negative momentum": ["--momentum", "-0.5"],
    "momentum of one": ["--momentum", "1"],
    "negative rmsprop eps": ["--optimizer", "rmsprop", "--rmsprop-eps", "-1e-3"],
    "negative weight decay": ["--weight-decay", "-1"],
    "tiny image": ["--image-size", "1"],
    "zero topk": ["--topk", "0"],
    "bad interval": ["--checkpoint-interval", "ten"],
    "dist timeout past a year": ["--dist-timeout", "1e39"],  # timedelta: OverflowError in a distributed run
    "dist timeout under a second": ["--dist-timeout", "1e-9"],  # every process would time out at its start
    "interval past a year": ["--checkpoint-interval", "525601m"],
    "interval past float": ["--checkpoint-interval", "9" * 400 + "m"],
    "interval of iterations past float": ["--checkpoint-interval", "9" * 400 + ".5"],  # was an OverflowError
    "nesterov without momentum": ["--nesterov", "--momentum", "0"],
    "zero optimizer batch": ["--optimizer-batch-size", "0"],
}
BAD_PRESETS = {
    "zero batch": {"batch_size": 0},
    "fractional epochs": {"epochs": 1.5},
    "list for a number": {"lr": [0.1, 0.2]},
    "zero topk": {"topk": 0},
    "zero image size": {"image_size": 0},
    "bool for a number": {"epochs": True},
    "string for a switch": {"amp": "yes"},
    "unknown choice": {"lr_schedule": "poly"},
    "crop scale of one number": {"crop_scale": 0.5},
    "negative lr": {"lr": -1.0},
}


def test_waits_of_up_to_a_year_are_taken_as_typed():
    from image_classification.arguments import CheckpointInterval

    args = parse_args(["--dist-timeout", "31536000", "--checkpoint-interval", "8760h", "DIR"])
    assert (args.dist_timeout, CheckpointInterval.parse(args.checkpoint_interval).seconds) == (31536000, 31536000)
    # a count of iterations is read as an integer: through a float, this one became 100000000000000000000
    assert CheckpointInterval.parse("99999999999999999999").iterations == 99999999999999999999
    assert CheckpointInterval.parse("12.0").iterations == 12


@pytest.mark.parametrize("name", BAD_FLAGS)
def test_bad_values_are_one_line_and_exit_2(name, capsys):
    from image_classification.system.cli import run
    from image_classification.training import main

    refused(run(main, BAD_FLAGS[name] + ["--data-backend", "synthetic", "--device", "cpu"]), capsys)


HUGE = "100000000000000000000"  # 10^20: an OverflowError or an allocator's traceback, once


@pytest.mark.parametrize("argv, said", [
    (["--workers=--"], "argument -j/--workers: expected a value, got '--'"),  # argparse made it []: a TypeError
    (["--lr=--"], "argument --lr/--learning-rate: expected a value, got '--'"),
    (["--seed=--"], "argument --seed: expected a value, got '--'"),
    (["-j--"], "argument -j/--workers: expected a value, got '--'"),
    (["--prof", HUGE], f"argument --prof: must be at most 2,147,483,647 in size, got {HUGE}"),
    (["-b", HUGE], f"argument -b/--batch-size: must be at least 1 and at most 2,147,483,647, got {HUGE}"),
    (["--num-classes", HUGE], f"argument --num-classes/--num_classes: must be at least 1 and at most 2,147,483,647, "
                              f"got {HUGE}"),
    (["-j", "x"], "argument -j/--workers: expected a whole number, got 'x'"),
    # positive as a Python float, 0 or a subnormal in float32: 1/scale was infinite, a NaN step, exit 3
    (["--static-loss-scale", "1e-40"], "argument --static-loss-scale: must be 0 or from 1.175e-38 to 3.403e+38 in "
                                       "size (what float32 holds), got 1e-40"),
    (["--rmsprop-eps", "1e-50"], "argument --rmsprop-eps: must be 0 or from 1.175e-38"),
    (["--lr", "1e39"], "argument --lr/--learning-rate: must be 0 or from 1.175e-38 to 3.403e+38 in size"),
    (["--hflip", "1e-45"], "argument --hflip: must be 0 or from 1.175e-38"),
    (["--crop-scale", "1e-40", "1"], "argument --crop-scale: must be 0 or from 1.175e-38"),
])
def test_a_value_no_flag_can_hold_is_one_line_with_the_bounds(argv, said, capsys, tmp_path):
    from image_classification.system.cli import run
    from image_classification.training import main

    workspace = tmp_path / "ws"
    line = refused(run(main, argv + ["--data-backend", "synthetic", "--device", "cpu", "--workspace", str(workspace)]),
                   capsys)
    assert line.startswith(f"error: main.py: {said}"), line
    assert not workspace.exists()


def test_a_size_that_no_memory_holds_is_one_line(capsys, tmp_path, monkeypatch):
    """--num-classes 2147483647 parses, and its head needs 4 TB: the allocator's failure is one line naming the
    flags that size what is allocated, not a traceback."""
    from image_classification.system.cli import run
    from image_classification.train import plan
    from image_classification.training import main

    def no_memory(*args, **kwargs):
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: "
                           "you tried to allocate 4398046509056 bytes. Error code 12 (Cannot allocate memory)")

    monkeypatch.setattr(plan, "build_model", no_memory)
    line = refused(run(main, ["--data-backend", "synthetic", "--device", "cpu", "-b", "4", "--num-classes",
                              str(2**31 - 1), "--workspace", str(tmp_path / "ws")]), capsys)
    assert line == ("error: out of memory on cpu (DefaultCPUAllocator: can't allocate memory: you tried to allocate "
                    "4398046509056 bytes. Error code 12 (Cannot allocate memory)); lower -b/--batch-size (now 4), the "
                    "image size or --num-classes")
    assert not (tmp_path / "ws").exists()


@pytest.mark.parametrize("name", BAD_PRESETS)
def test_bad_preset_values_fail_like_the_flags_and_name_the_key(name, capsys):
    from image_classification.system.cli import run
    from image_classification.training import main

    preset = BAD_PRESETS[name]
    assert next(iter(preset)) in refused(run(main, ["--data-backend", "synthetic", "--device", "cpu"], preset),
                                         capsys)


def test_preset_values_reach_the_run_and_flags_still_win():
    args = parse_args(["-b", "64", "/d"], defaults={"batch_size": 128, "amp": True, "crop_scale": [0.2, 1.0],
                                                    "save_checkpoints": False, "tf32": False, "lr": 2.048})
    assert (args.batch_size, args.amp, args.crop_scale, args.save_checkpoints, args.tf32, args.lr) == (
        64, True, [0.2, 1.0], False, False, 2.048)


def test_topk_above_the_class_count_is_refused_and_the_default_fits(tmp_path, capsys, tiny_arch):
    from image_classification.system.cli import run
    from image_classification.training import main

    tiny = ["-a", tiny_arch, "--image-size", "32", "-b", "8", "--device", "cpu", "--data-backend", "synthetic",
            "--prof", "1", "--epochs", "1", "--num-classes", "3", "--seed", "1", "--lr", "0.01",
            "--workspace", str(tmp_path)]
    assert "--topk 5 exceeds the number of classes, 3" in refused(run(main, tiny + ["--topk", "5"]), capsys)
    assert run(main, tiny) == 0
    assert re.search(r"^Epoch 1/1: .*; val loss [\d.]+, top1 [\d.]+%, top3 [\d.]+%$", capsys.readouterr().out, re.M)


def test_one_image_batches_that_batchnorm_cannot_train_are_refused(tmp_path, capsys, tiny_arch):
    from image_classification.system.cli import run
    from image_classification.training import main

    code = run(main, ["-a", tiny_arch, "--image-size", "32", "-b", "1", "--device", "cpu", "--data-backend",
                      "synthetic", "--prof", "1", "--epochs", "1", "--workspace", str(tmp_path)])
    assert "-b 1 cannot train at 32 px" in refused(code, capsys)


# Every entry script with -h, and with a mistake in its flags, run one after another in one fresh interpreter;
# a dotted name is a module run with python -m; another name without .py is an installed console command
# (ic-NAME: image_classification.commands.NAME).
ANSWERS_WITHOUT_TORCH = textwrap.dedent("""
    import contextlib, importlib, io, json, runpy, sys
    answers = []
    for argv in json.loads(sys.argv[1]):
        sys.argv = argv
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                if argv[0].endswith(".py"):
                    runpy.run_path(argv[0], run_name="__main__")
                    code = 0
                elif argv[0].startswith("image_classification."):  # python -m NAME
                    runpy.run_module(argv[0], run_name="__main__", alter_sys=True)
                    code = 0
                else:
                    commands = importlib.import_module("image_classification.commands")
                    code = getattr(commands, argv[0].removeprefix("ic-"))()
            except SystemExit as end:
                code = end.code
        answers.append([argv, code, out.getvalue(), err.getvalue()])
    print(json.dumps({"answers": answers, "torch": sorted(m for m in sys.modules if m.split(".")[0] == "torch")}))
""")
PRESET = ["--model", "resnet50", "--precision", "AMP", "--mode", "convergence", "--platform", "DGXA100"]
SCRIPTS = {"main.py": ["/data"], "launch.py": [*PRESET, "/data"], "classify.py": ["--image", "x.jpg"],
           "multiproc.py": ["main.py"], "checkpoint2model.py": ["--checkpoint-path", "c", "--weight-path", "w"],
           "model2onnx.py": ["--output", "m.onnx"], "ic-pack": ["src", "dst"],
           "image_classification.data.pack": ["src", "dst"], "image_classification.data.check": ["/data"]}


def test_help_and_a_mistyped_flag_answer_before_torch_is_imported():
    """Importing torch takes seconds: every script parses its flags first, so that -h, --list and a typo
    answer at once (and the help texts that depend on the machine are computed without it)."""
    cases = [[script, "-h"] for script in SCRIPTS] + [[script, "--no-such-flag", *rest]
                                                      for script, rest in SCRIPTS.items()]
    cases.append(["launch.py", "--list"])
    result = subprocess.run([sys.executable, "-c", ANSWERS_WITHOUT_TORCH, json.dumps(cases)], cwd=REPO,
                            capture_output=True, text=True, timeout=patient(120))
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    for argv, code, out, err in report["answers"]:
        if "--no-such-flag" in argv:
            assert code == 2 and err.startswith("error: ") and "--no-such-flag" in err and err.count("\n") == 1, argv
        else:
            assert code == 0 and out and err == "", argv
            assert "--list" in argv or out.startswith("usage: "), argv
    assert report["torch"] == []


def test_compile_on_a_python_that_this_torch_cannot_compile_for_is_refused(tmp_path, capsys, monkeypatch,
                                                                            tiny_arch):
    """torch 2.3's torch.compile refuses Python 3.12: one line before the run, not a traceback at the first
    step."""
    import torch._dynamo

    from image_classification.system.cli import run
    from image_classification.training import main

    def compile_as_torch_2_3_on_python_3_12(*args, **kwargs):
        raise RuntimeError("Python 3.12+ not yet supported for torch.compile")

    monkeypatch.setattr(torch._dynamo, "is_dynamo_supported", lambda: False)
    monkeypatch.setattr(torch, "compile", compile_as_torch_2_3_on_python_3_12)
    code = run(main, ["--compile", "-a", tiny_arch, "--image-size", "32", "-b", "8", "--prof", "1", "--epochs", "1",
                      "--data-backend", "synthetic", "--device", "cpu", "--workspace", str(tmp_path)])
    assert "--compile: torch " in refused(code, capsys) and not any(tmp_path.iterdir())
