"""``data.check`` fails wherever training would, holds a packed set's sample table against its shards' own
labels, and prints every name on any stdout."""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from helpers import REPO, one_error_line, run_script, write_image_folder
from image_classification.data.check import check
from image_classification.data.packed import MANIFEST, TABLE
from test_pack import DAMAGES, pack


def data_check(capsys, *argv):
    """``python -m image_classification.data.check ARGV``, in this process."""
    return run_script(["-m", "image_classification.data.check", *argv, "-j", "1"], capsys, cwd=REPO)


@pytest.fixture(scope="module")
def packed(image_folder, tmp_path_factory) -> Path:
    destination = tmp_path_factory.mktemp("packed") / "colours"
    assert pack(image_folder, destination).returncode == 0
    return destination


def test_a_folder_whose_splits_hold_no_class_folders_fails_as_training_does(tmp_path, capsys):
    """main.py refuses it (exit 2); data.check said "ok: nothing to fix"."""
    for split in ("train", "val"):
        (tmp_path / "data" / split).mkdir(parents=True)
    (tmp_path / "data" / "train" / "notes.txt").write_text("not a class folder")
    assert f"{tmp_path / 'data'} has no class folders in train/ nor val/" in one_error_line(
        data_check(capsys, tmp_path / "data"))

    folder = write_image_folder(tmp_path / "half", num_classes=2, train_per_class=2, val_per_class=1)
    shutil.rmtree(folder / "val")
    (folder / "val").mkdir()
    half = data_check(capsys, folder)
    assert half.returncode == 1 and "  val/ has no class folders; expected val/<class>/<image> files" in half.stdout


def test_labels_swapped_in_the_sample_table_differ_from_the_shards_own(packed, tmp_path, capsys):
    """The table's hash updated in the manifest: only the shards' ``.cls`` members, which the webdataset and DALI
    readers take the labels from, tell."""
    copy = tmp_path / "copy"
    shutil.copytree(packed, copy)
    table = np.load(copy / "train" / TABLE)
    assert table["label"][0] == 0 and table["label"][8] == 1
    table["label"][[0, 8]] = table["label"][[8, 0]]
    np.save(copy / "train" / TABLE, table)
    manifest = json.loads((copy / "train" / MANIFEST).read_text())
    manifest["table"]["sha256"] = hashlib.sha256((copy / "train" / TABLE).read_bytes()).hexdigest()
    (copy / "train" / MANIFEST).write_text(json.dumps(manifest))
    result = data_check(capsys, copy)
    assert result.returncode == 1, result.stdout
    assert "  train/ damaged files: 1" in result.stdout
    assert "shard-000000.tar: its .cls members give 2 sample(s) another label than the sample table does (sample " \
           "0: '0' in the shard, 1 in the table)" in result.stdout


@pytest.mark.parametrize("damage", ["a sample count past any integer", "a manifest nested 100,000 deep"])
def test_a_manifest_that_lies_in_shape_is_one_line(packed, tmp_path, capsys, damage):
    """An OverflowError and a RecursionError before."""
    copy = tmp_path / "copy"
    shutil.copytree(packed, copy)
    change, expected = DAMAGES[damage]
    change(copy / "train")
    assert expected in one_error_line(data_check(capsys, copy))


def test_every_name_reaches_a_strict_utf8_stdout(tmp_path):
    """An unreadable image named in Latin-1 (not UTF-8) and one whose name holds a line break: each is listed on
    one line, its odd bytes written as ``\\xNN``, where the report died of a UnicodeEncodeError."""
    folder = write_image_folder(tmp_path / "data", num_classes=2, train_per_class=2, val_per_class=1)
    class_dir = os.fsencode(folder / "train" / "class_00")
    for name in (b"caf\xe9.jpg", b"two\nlines.jpg"):
        with open(class_dir + b"/" + name, "wb") as handle:
            handle.write(b"not an image")
    strict = io.TextIOWrapper(io.BytesIO(), encoding="utf-8")  # as PYTHONIOENCODING=utf-8 makes stdout
    assert check(folder, workers=1, out=strict) == 2
    strict.flush()
    lines = strict.buffer.getvalue().decode("utf-8").splitlines()
    assert "  train/ unreadable images: 2" in lines
    listed = [line for line in lines if "UnidentifiedImageError" in line]
    assert [line.split(" (")[0] for line in listed] == [f"    {folder}/train/class_00/caf\\xe9.jpg",
                                                        f"    {folder}/train/class_00/two\\x0alines.jpg"]
