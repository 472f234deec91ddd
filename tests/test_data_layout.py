"""What start-up decides about a dataset before the first step: a class folder whose name cannot be a label is
refused in one line (on the folder and on its packed copy), and a stop signal ends a start-up whose read of the
dataset hangs."""

from __future__ import annotations

import json
import os
import signal
import threading
from pathlib import Path

import pytest

from helpers import REPO, one_error_line, run_script, sigterm_noted, write_image_folder
from image_classification.data.packed import MANIFEST
from test_pack import pack

UNDECODABLE = os.fsdecode(b"cl\xe9")  # "clé" in Latin-1: not UTF-8


def train_argv(arch: str, workspace: Path, data: Path) -> list:
    return [REPO / "main.py", "--data-backend", "pytorch", "-a", arch, "--image-size", "32", "-b", "4", "-j", "0",
            "--epochs", "1", "--device", "cpu", "--workspace", workspace, data]


@pytest.fixture
def latin1_folder(tmp_path) -> Path:
    """Two classes, the second's folder named in Latin-1 in both splits."""
    folder = write_image_folder(tmp_path / "data", num_classes=2, train_per_class=4, val_per_class=2)
    for split in ("train", "val"):
        os.rename(folder / split / "class_01", folder / split / UNDECODABLE)
    return folder


def test_a_class_folder_whose_name_is_not_utf8_is_refused_before_the_first_step(latin1_folder, tmp_path, tiny_arch,
                                                                                  capsys):
    """Its name is a label every checkpoint records: the first save failed with a UnicodeEncodeError after a whole
    epoch, with no checkpoint, every time the run was started again."""
    refused = one_error_line(run_script(train_argv(tiny_arch, tmp_path / "ws", latin1_folder), capsys))
    assert f"class folder {latin1_folder}/train/cl\\xe9 has a name that is not UTF-8 text; rename the class folder " \
           "to UTF-8" in refused
    assert not (tmp_path / "ws").exists()
    assert "has a name that is not UTF-8 text" in one_error_line(pack(latin1_folder, tmp_path / "packed",
                                                                      capsys=capsys))
    checked = run_script(["-m", "image_classification.data.check", latin1_folder, "-j", "1"], capsys, cwd=REPO)
    assert checked.returncode == 1 and "  train/ class folders whose names cannot be labels (not UTF-8 text, or a " \
        "line break or another control character in them): 1\n    cl\\xe9\n" in checked.stdout


def test_a_packed_class_whose_name_is_not_utf8_is_refused_before_the_first_step(image_folder, tmp_path, tiny_arch,
                                                                               capsys):
    """A set packed from such a folder (by a version that took it): its manifests hold the name as an escape."""
    packed = tmp_path / "packed"
    assert pack(image_folder, packed, capsys=capsys).returncode == 0
    for split in ("train", "val"):
        manifest = json.loads((packed / split / MANIFEST).read_text())
        manifest["classes"][1] = UNDECODABLE
        (packed / split / MANIFEST).write_text(json.dumps(manifest))  # "cl\udce9"
    refused = one_error_line(run_script(train_argv(tiny_arch, tmp_path / "ws", packed), capsys))
    assert f"{packed}/train/manifest.json lists the class cl\\xe9, whose name is not UTF-8 text" in refused
    assert not (tmp_path / "ws").exists()
    checked = run_script(["-m", "image_classification.data.check", packed, "-j", "1"], capsys, cwd=REPO)
    assert checked.returncode == 1 and "  val/ class folders whose names cannot be labels (not UTF-8 text, or a line " \
        "break or another control character in them): 1\n    cl\\xe9\n" in checked.stdout


def test_class_folders_whose_names_hold_a_line_break_or_a_control_character_are_refused(tmp_path, tiny_arch,
                                                                                          capsys):
    """Such a name passed data.check and training, then broke classify.py's output (a line break: another line;
    ESC: the terminal's control sequence) and Triton's labels file, refused only after the export.  Refused where
    UTF-8 is checked, in one line naming each escaped."""
    folder = write_image_folder(tmp_path / "data", num_classes=3, train_per_class=4, val_per_class=2)
    for split in ("train", "val"):
        os.rename(folder / split / "class_01", folder / split / "class\n01")
        os.rename(folder / split / "class_02", folder / split / "class\x1b[2J02")
    refused = one_error_line(run_script(train_argv(tiny_arch, tmp_path / "ws", folder), capsys))
    assert f"class folders {folder}/train/class\\x0a01, {folder}/train/class\\x1b[2J02 have names that hold a line " \
           "break or another control character" in refused, refused
    assert not (tmp_path / "ws").exists()
    assert "hold a line break or another control character" in one_error_line(pack(folder, tmp_path / "packed",
                                                                                    capsys=capsys))
    checked = run_script(["-m", "image_classification.data.check", folder, "-j", "1"], capsys, cwd=REPO)
    assert checked.returncode == 1 and ("  train/ class folders whose names cannot be labels (not UTF-8 text, or a "
                                        "line break or another control character in them): 2\n    class\\x0a01\n"
                                        "    class\\x1b[2J02\n") in checked.stdout, checked.stdout


def test_a_stop_signal_ends_a_start_up_whose_read_of_the_dataset_hangs(image_folder, tmp_path, tiny_arch, capsys,
                                                                        monkeypatch):
    """A read that does not return (a hung network file system; a FIFO in place of a manifest did it): SIGTERM
    ends the start-up at once with exit 75, where it was noted and the wait went on."""
    from image_classification.data import layout

    reader, writer = os.pipe()
    scan, signalled, unblocked = layout.walk_split, [], []

    def hung(*args, **kwargs):
        if not signalled:  # the first scan: SIGTERM half a second into it
            signalled.append(threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGTERM)))
            signalled[0].start()
        os.read(reader, 1)  # returns only once the test writes, 20 s on
        unblocked.append(True)
        return scan(*args, **kwargs)

    monkeypatch.setattr(layout, "walk_split", hung)
    late = threading.Timer(20, os.write, (writer, b"x" * 64))  # a byte for each split's scan
    late.start()
    try:
        with sigterm_noted():
            result = run_script(train_argv(tiny_arch, tmp_path / "ws", image_folder), capsys)
        assert unblocked == []  # the run ended while the read still hung: it did not wait for the write
    finally:
        late.cancel()
        os.close(reader)
        os.close(writer)
    assert result.returncode == 75 and result.stderr == (
        "Stopped by SIGTERM while reading the dataset; nothing was trained or written: run the same command again "
        "(exit code 75)\n"), result.stderr
    assert not (tmp_path / "ws").exists()
