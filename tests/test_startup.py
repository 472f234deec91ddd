"""The checks before a run writes anything: what cannot work is said before what the workspace holds, and an
evaluation writes where the run it evaluates wrote."""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys

import pytest

from helpers import REPO, refused
from image_classification.arguments import build_parser
from image_classification.system.cli import run
from image_classification.train.startup import DEFAULT_WORKSPACE, workspace_folder
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


def test_the_first_line_of_a_run_names_its_workspace_and_the_flag_that_moves_it(tmp_path, monkeypatch, capsys):
    """A run without --workspace writes into the current folder: its first line says so, as an absolute path,
    and names --workspace; a given one, and the folder of an evaluated checkpoint, are named the same way."""
    monkeypatch.chdir(tmp_path)
    run = ["--data-backend", "synthetic", "-a", "resnet18", "--image-size", "32", "-b", "2", "--num-classes", "2",
           "--prof", "1", "--epochs", "1", "--device", "cpu", "--lr", "0.001", "--seed", "1"]
    here = f"=> workspace: {tmp_path} (the current folder: --workspace DIR writes the run elsewhere)"
    for flags, line in [((), here), (("--workspace", "ws"), f"=> workspace: {tmp_path / 'ws'} (--workspace)"),
                        (("--evaluate", "--resume", "checkpoint.pth.tar", "--raport-file", "eval.json"), here)]:
        assert main([*run, *flags]) == 0
        assert capsys.readouterr().out.splitlines()[0] == line, flags
    (tmp_path / "runs").mkdir()
    (tmp_path / "checkpoint.pth.tar").rename(tmp_path / "runs" / "checkpoint.pth.tar")
    assert main([*run, "--evaluate", "--resume", "runs/checkpoint.pth.tar"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == \
        f"=> workspace: {tmp_path / 'runs'} (the folder of --resume's checkpoint: --workspace DIR writes the run elsewhere)"


# main.py's entry point in a fresh interpreter: its exit code, then whether torch had been imported
TRAIN_AND_TELL = ("import sys; from image_classification import commands; code = commands.train(); "
                  "print('torch imported:', 'torch' in sys.modules); sys.exit(code)")


def test_what_needs_no_torch_is_refused_before_torch_is_imported(image_folder, tmp_path):
    """A dataset without val/ (the line names --training-only) and a workspace another run holds are refused
    before main.py imports torch (seconds), as a typo is; a run that gets past them imports it."""
    from image_classification.records.workspace import Workspace

    no_val = tmp_path / "no-val"
    shutil.copytree(image_folder / "train", no_val / "train")
    held = Workspace(tmp_path / "held", "checkpoint.pth.tar", "experiment_raport.json")
    held.prepare(True)
    held.lock()
    env = {name: value for name, value in os.environ.items() if name not in ("RANK", "WORLD_SIZE", "SLURM_PROCID")}
    env["PYTHONPATH"] = str(REPO)

    def train(*argv: str) -> subprocess.CompletedProcess:
        command = [sys.executable, "-c", TRAIN_AND_TELL, "-a", "resnet18", "--device", "cpu", "--epochs", "1",
                   "--data-backend", "pytorch", *argv]
        return subprocess.run(command, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)

    try:
        missing = train("--workspace", str(tmp_path / "ws"), str(no_val))
        in_use = train("--workspace", str(held.path), str(image_folder))
    finally:
        held.unlock()
    for result in (missing, in_use):
        assert result.returncode == 2 and result.stdout.endswith("torch imported: False\n"), result
    assert missing.stderr == f"error: {no_val} has no val/ folder; expected val/<class>/<image> files (--training-only " \
                             "trains without one)\n"
    assert in_use.stderr.startswith(f"error: --workspace {held.path} is in use by another run (")
    assert not (tmp_path / "ws").exists()
    started = train("--workspace", str(tmp_path / "ws"), "--prof", "1", "-b", "2", "--image-size", "32",
                    "--training-only", "--no-checkpoints", str(no_val))
    assert started.returncode == 0 and started.stdout.endswith("torch imported: True\n"), started
