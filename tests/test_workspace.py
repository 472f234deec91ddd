"""The workspace: names checked before anything is written."""

from __future__ import annotations

import os

import pytest
import torch

from image_classification import checkpoint as ckpt
from image_classification.errors import UserError
from image_classification.workspace import LOCK_NAME, Workspace

CHECKPOINT, RAPORT = "checkpoint.pth.tar", "experiment_raport.json"


def refused(workspace: Workspace, saving: bool = True) -> str:
    """The one line that ``prepare`` refuses ``workspace`` with, after checking it wrote nothing."""
    with pytest.raises(UserError) as error:
        workspace.prepare(saving)
    assert error.value.exit_code == 2 and "\n" not in str(error.value)
    assert not workspace.path.exists()
    return str(error.value)


# -- names ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("raport,what", [
    ("model_best.pth.tar", "the best model"),
    ("sub/../checkpoint.pth.tar", "--checkpoint-filename"),
    ("./checkpoint.pth.tar", "--checkpoint-filename"),
    ("checkpoint_0000.pth.tar", "a per-epoch checkpoint"),
    (LOCK_NAME, "the workspace's lock"),
])
@pytest.mark.parametrize("saving", [True, False], ids=["training", "evaluating"])
def test_a_raport_that_is_a_checkpoint_or_the_lock_is_refused(tmp_path, raport, what, saving):
    line = refused(Workspace(tmp_path / "ws", CHECKPOINT, raport), saving)
    assert line.startswith(f"--raport-file {raport} is the same file as {what}"), line


def test_a_raport_linked_to_the_checkpoint_is_refused(tmp_path):
    (tmp_path / "ws").mkdir()
    (tmp_path / "ws" / "raport.json").symlink_to(CHECKPOINT)
    with pytest.raises(UserError, match="--raport-file raport.json is the same file as --checkpoint-filename"):
        Workspace(tmp_path / "ws", CHECKPOINT, "raport.json").prepare(True)


@pytest.mark.parametrize("flag,name", [
    ("--checkpoint-filename", "../x"), ("--raport-file", "../../x"), ("--raport-file", "sub/../../x"),
])
def test_a_name_that_leads_out_of_the_workspace_is_refused(tmp_path, flag, name):
    names = {"--checkpoint-filename": CHECKPOINT, "--raport-file": RAPORT, flag: name}
    line = refused(Workspace(tmp_path / "a" / "ws", names["--checkpoint-filename"], names["--raport-file"]))
    assert line == f"{flag} {name} leads out of --workspace; give a name inside it"
    assert list(tmp_path.iterdir()) == []


def test_a_long_legal_name_is_accepted_and_its_checkpoint_saved(tmp_path):
    """250 characters fit the file system; the temporary beside the checkpoint is cut to fit too."""
    name = "c" * 242 + ".pth.tar"
    workspace = Workspace(tmp_path / "ws", name, "r" * 245 + ".json")
    workspace.prepare(True)
    ckpt.save_checkpoint({"epoch": 1, "state_dict": {"w": torch.ones(2)}}, workspace.latest)
    assert ckpt.load_checkpoint(workspace.latest)["epoch"] == 1
    left = workspace.path / (ckpt.temporary_name(workspace.latest) + "k2x9_abc.tmp")  # a killed save's
    left.write_bytes(b"partial")
    assert workspace.remove_stale_temporaries() == [left] and not left.exists()


@pytest.mark.parametrize("flag", ["--checkpoint-filename", "--raport-file"])
def test_a_name_too_long_for_the_file_system_is_named_as_such(tmp_path, flag):
    names = {"--checkpoint-filename": CHECKPOINT, "--raport-file": RAPORT, flag: "n" * 300}
    line = refused(Workspace(tmp_path / "ws", names["--checkpoint-filename"], names["--raport-file"]))
    assert line.startswith(f"{flag} is too long for the file system: nnnn") and "300 bytes" in line, line
