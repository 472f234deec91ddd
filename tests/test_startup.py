"""The checks before a run writes anything: what cannot work is said before what the workspace holds, and an
evaluation writes where the run it evaluates wrote."""

from __future__ import annotations

import argparse

import pytest

from helpers import refused
from image_classification.arguments import build_parser
from image_classification.cli import run
from image_classification.startup import DEFAULT_WORKSPACE, workspace_folder
from image_classification.training import main


@pytest.mark.parametrize("flags, error", [
    (["--data-backend", "dali-gpu"], "--data-backend dali-gpu needs a CUDA GPU"),
    (["--data-backend", "dali-cpu", "--augmentation", "augmix"], "--augmentation augmix is not supported with DALI"),
    (["--data-backend", "pytorch", "MISSING"], "does not exist"),
    (["--data-backend", "pytorch"], None),  # nothing else in the way: the workspace's run is what is said
])
def test_what_cannot_work_is_said_before_the_run_the_workspace_holds(flags, error, image_folder, tmp_path, capsys):
    """A workspace whose raport holds an earlier run's records is refused too, but only once nothing else
    stands in the way: its message must not hide the one the user meets next."""
    (tmp_path / "experiment_raport.json").write_text('DLLL {"step": "PARAMETER", "data": {}}\n')
    data = str(tmp_path / "missing") if "MISSING" in flags else str(image_folder)
    argv = ["-a", "resnet18", "--device", "cpu", "--epochs", "1", "--workspace", str(tmp_path),
            *(flag for flag in flags if flag != "MISSING"), data]
    line = refused(run(main, argv), capsys)
    assert (error or "already holds another run's records") in line, line


def test_an_evaluation_of_a_checkpoint_writes_into_that_run_s_workspace():
    parse = build_parser().parse_args
    assert build_parser().get_default("workspace") == DEFAULT_WORKSPACE
    assert workspace_folder(parse(["--evaluate", "--resume", "runs/a/model_best.pth.tar", "d"])) == "runs/a"
    assert workspace_folder(parse(["--evaluate", "--resume", "model_best.pth.tar", "d"])) == DEFAULT_WORKSPACE
    for argv in (["--evaluate", "--resume", "runs/a/c.pth.tar", "--workspace", "ws", "d"],  # given: kept
                 ["--evaluate", "--resume", "auto", "--workspace", "ws", "d"],
                 ["--resume", "runs/a/c.pth.tar", "--workspace", "ws", "d"]):  # training goes where it is told
        assert workspace_folder(parse(argv)) == "ws"
    assert workspace_folder(argparse.Namespace(evaluate=False, resume="runs/a/c.pth.tar",
                                               workspace=DEFAULT_WORKSPACE)) == DEFAULT_WORKSPACE


def test_an_evaluation_beside_a_checkpoint_in_a_read_only_folder_says_where_the_raport_goes(read_only_folder, capsys,
                                                                                            tiny_arch, image_folder):
    """The user passed no --workspace: the refusal names the checkpoint's folder as the raport's place, and
    --workspace as the way to move it, not a flag the user never typed as the culprit."""
    import shutil

    folder, seal = read_only_folder
    trained = folder.parent / "trained"
    common = ["-a", tiny_arch, "--data-backend", "pytorch", "-j", "0", "--image-size", "32", "-b", "4", "--prof", "1"]
    assert run(main, [*common, "--epochs", "1", "--workspace", str(trained), str(image_folder)]) == 0
    shutil.copy(trained / "checkpoint.pth.tar", folder / "checkpoint.pth.tar")
    seal()
    capsys.readouterr()
    line = refused(run(main, [*common, "--evaluate", "--resume", str(folder / "checkpoint.pth.tar"),
                              str(image_folder)]), capsys)
    assert line.startswith(f"error: {folder} (the folder of --resume {folder / 'checkpoint.pth.tar'}, where an "
                           "evaluation writes its raport unless --workspace says where) cannot be written"), line
    assert run(main, [*common, "--evaluate", "--resume", str(folder / "checkpoint.pth.tar"), "--workspace",
                      str(folder.parent / "eval"), str(image_folder)]) == 0
