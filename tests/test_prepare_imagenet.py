"""scripts/prepare_imagenet.py on a tiny fake ILSVRC2012 archive set: layout, labels, resume, final check."""

from __future__ import annotations

import io
import shutil
import tarfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from helpers import load_script
from image_classification.system.cli import run

savemat = pytest.importorskip("scipy.io").savemat  # every test writes the devkit's meta.mat with it

WNIDS = ["n01440764", "n01443537", "n01484850"]  # ILSVRC2012_IDs 1, 2, 3
TRAIN_PER_CLASS = 4
VAL_IDS = [2, 1, 3, 3, 1, 2, 2]  # the ground truth: the ID of ILSVRC2012_val_0000000{1..7}.JPEG
EXPECT = ["--expect-classes", "3", "--expect-train-images", str(3 * TRAIN_PER_CLASS),
          "--expect-val-images", str(len(VAL_IDS))]


@pytest.fixture(scope="module")
def prepare():
    return load_script("prepare_imagenet")


def _jpeg(seed: int) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 255, size=(6, 8, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="JPEG")
    return buffer.getvalue()


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def _tar_bytes(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, data in files.items():
            _add(tar, name, data)
    return buffer.getvalue()


def make_archives(root: Path, train_wnids: list[str] = WNIDS, devkit_wnids: list[str] = WNIDS,
                  images: dict[str, bytes] | None = None) -> tuple[dict[str, Path], dict[str, bytes]]:
    """The three archives, laid out as the official ones, and the files they give: {path in OUT: bytes}.

    ``devkit_wnids`` are the classes that meta.mat names; ``images`` replaces the first class's images.
    """
    root.mkdir(parents=True, exist_ok=True)
    expected: dict[str, bytes] = {}
    classes = {}
    for c, wnid in enumerate(train_wnids):
        pictures = {f"{wnid}_{i}.JPEG": _jpeg(100 * c + i) for i in range(TRAIN_PER_CLASS)}
        classes[f"{wnid}.tar"] = _tar_bytes(images if images is not None and c == 0 else pictures)
        expected.update({f"train/{wnid}/{name}": data for name, data in pictures.items()})
    archives = {"train": root / "ILSVRC2012_img_train.tar", "val": root / "ILSVRC2012_img_val.tar",
                "devkit": root / "ILSVRC2012_devkit_t12.tar.gz"}
    archives["train"].write_bytes(_tar_bytes(classes))

    val = {f"ILSVRC2012_val_{i + 1:08d}.JPEG": _jpeg(1000 + i) for i in range(len(VAL_IDS))}
    archives["val"].write_bytes(_tar_bytes(dict(reversed(val.items()))))  # order in the tar must not matter
    for (name, data), ilsvrc_id in zip(val.items(), VAL_IDS):
        expected[f"val/{WNIDS[ilsvrc_id - 1]}/{name}"] = data

    # meta.mat as the devkit has it: leaf synsets 1..N, then higher synsets (num_children > 0)
    synsets = np.array([(i + 1, wnid, f"class {i}", 0) for i, wnid in enumerate(devkit_wnids)] +
                       [(1001, "n00001740", "entity", 3)],
                       dtype=[("ILSVRC2012_ID", "O"), ("WNID", "O"), ("words", "O"), ("num_children", "O")])
    meta = io.BytesIO()
    savemat(meta, {"synsets": synsets})
    truth = "".join(f"{i}\n" for i in VAL_IDS).encode()
    with tarfile.open(archives["devkit"], "w:gz") as devkit:
        _add(devkit, "ILSVRC2012_devkit_t12/data/meta.mat", meta.getvalue())
        _add(devkit, "ILSVRC2012_devkit_t12/data/ILSVRC2012_validation_ground_truth.txt", truth)
        _add(devkit, "ILSVRC2012_devkit_t12/readme.txt", b"fake devkit\n")
    return archives, expected


def _argv(archives: dict[str, Path], out: Path, *extra: str) -> list[str]:
    return ["--train-tar", str(archives["train"]), "--val-tar", str(archives["val"]),
            "--devkit", str(archives["devkit"]), *extra, str(out)]


def _messages(err: str) -> list[str]:
    """stderr without the progress bars."""
    return [line for line in err.splitlines() if line.startswith(("error:", "incomplete:"))]


def _tree(out: Path) -> dict[str, bytes]:
    """Every file under train/ and val/, as {relative path: bytes}."""
    return {str(p.relative_to(out)): p.read_bytes()
            for split in ("train", "val") if (out / split).is_dir()
            for p in (out / split).rglob("*") if p.is_file()}


def test_builds_the_layout_from_the_archives(prepare, tmp_path, capsys):
    archives, expected = make_archives(tmp_path / "archives")
    out = tmp_path / "imagenet"
    assert run(prepare.main, _argv(archives, out, *EXPECT)) == 0
    assert _tree(out) == expected  # every image, in its class, byte for byte
    assert sorted(p.name for p in out.iterdir()) == ["train", "val"]  # no staging left behind
    captured = capsys.readouterr()
    assert "train: 3 classes, 12 images" in captured.out and "val: 3 classes, 7 images" in captured.out
    assert f"{out} is complete" in captured.out and "incomplete" not in captured.err

    assert run(prepare.main, _argv(archives, out, *EXPECT)) == 0  # a rerun finds everything done
    assert _tree(out) == expected


class Interrupt:
    """Stands in for shutil: the n-th copy writes half its file, then the run is interrupted (Ctrl-C)."""

    def __init__(self, at_copy: int):
        self.at_copy, self.copies = at_copy, 0

    def copyfileobj(self, source, target, length=0):
        self.copies += 1
        if self.copies == self.at_copy:
            target.write(source.read(100))
            raise KeyboardInterrupt
        shutil.copyfileobj(source, target, length)

    def __getattr__(self, name):
        return getattr(shutil, name)


def test_an_interrupted_run_leaves_only_whole_files_and_a_rerun_finishes(prepare, tmp_path, monkeypatch,
                                                                          capsys):
    archives, expected = make_archives(tmp_path / "archives")
    out = tmp_path / "imagenet"

    # 1. stopped in the middle of the second class (its 2nd image): only the first class is in train/
    monkeypatch.setattr(prepare, "shutil", Interrupt(at_copy=TRAIN_PER_CLASS + 2))
    assert run(prepare.main, _argv(archives, out, *EXPECT)) == 130
    assert _tree(out) == {k: v for k, v in expected.items() if k.startswith(f"train/{WNIDS[0]}/")}
    assert len(list((out / ".partial" / "train" / WNIDS[1]).iterdir())) == 1  # the finished image waits there

    # 2. the rerun finishes the second class without redoing its first image, then stops in val
    monkeypatch.setattr(prepare, "shutil", interrupt := Interrupt(at_copy=TRAIN_PER_CLASS * 2 - 1 + 3))
    assert run(prepare.main, _argv(archives, out, *EXPECT)) == 130
    tree = _tree(out)
    assert {k for k in tree if k.startswith("train/")} == {k for k in expected if k.startswith("train/")}
    assert len([k for k in tree if k.startswith("val/")]) == 2
    assert all(expected[k] == data for k, data in tree.items())  # nothing half written
    assert interrupt.copies == TRAIN_PER_CLASS * 2 - 1 + 3

    # 3. and the last run completes it
    monkeypatch.undo()
    capsys.readouterr()
    assert run(prepare.main, _argv(archives, out, *EXPECT)) == 0
    assert _tree(out) == expected and not (out / ".partial").exists()
    assert _messages(capsys.readouterr().err) == []


def test_the_check_reports_what_is_missing(prepare, tmp_path, capsys):
    archives, expected = make_archives(tmp_path / "archives", train_wnids=WNIDS[:2])  # a class short
    out = tmp_path / "imagenet"
    assert run(prepare.main, _argv(archives, out, *EXPECT)) == 1
    assert _messages(capsys.readouterr().err) == [
        "incomplete: train: 2 classes instead of 3", "incomplete: train: 8 images instead of 12",
        f"incomplete: train: no folder for {WNIDS[2]}"]  # val is complete

    assert run(prepare.main, _argv(archives, out)) == 1  # the full ImageNet counts, by default
    err = "\n".join(_messages(capsys.readouterr().err))
    assert "train: 2 classes instead of 1,000" in err and "val: 7 images instead of 50,000" in err


@pytest.mark.parametrize("mistake,words", [
    ("swapped", "should hold one <wnid>.tar per class"),
    ("no devkit", "no such archive"),
    ("not a devkit", "has no data/meta.mat"),
    ("truncated", "damaged or truncated"),
])
def test_wrong_archives_are_one_error_line(prepare, tmp_path, capsys, mistake, words):
    archives, _ = make_archives(tmp_path / "archives")
    if mistake == "swapped":
        archives["train"], archives["val"] = archives["val"], archives["train"]
    elif mistake == "no devkit":
        archives["devkit"] = tmp_path / "nowhere.tar.gz"
    elif mistake == "not a devkit":
        archives["devkit"] = archives["val"]
    else:
        data = archives["val"].read_bytes()
        archives["val"].write_bytes(data[:len(data) // 2])
    assert run(prepare.main, _argv(archives, tmp_path / "out", *EXPECT)) == 2
    err = capsys.readouterr().err
    assert _messages(err) == [err.strip().splitlines()[-1]] and words in _messages(err)[0], err
    assert _messages(err)[0].startswith("error: ")


def _refused_before_writing(prepare, archives: dict[str, Path], tmp_path: Path, capsys, words: str) -> None:
    """One error line saying ``words``; nothing written, in OUT (a few levels down) or anywhere else."""
    assert run(prepare.main, _argv(archives, tmp_path / "a" / "b" / "imagenet", *EXPECT)) == 2
    err = capsys.readouterr().err
    assert _messages(err) == [err.strip().splitlines()[-1]] and words in _messages(err)[0], err
    assert len(_messages(err)[0]) < 400
    assert [p.name for p in tmp_path.iterdir()] == ["archives"]


@pytest.mark.parametrize("wnid,words", [
    ("../../../../x", "is not a plain file or folder name"), ("n01/../../x", "not a plain"),
    ("ABSOLUTE", "not a plain"), ("..", "not a plain"), ("n01\nx", "not a plain"),
    ("n" * 400, "is 400 bytes long, more than the file system takes"),
])
def test_a_devkit_wnid_that_is_not_a_plain_name_is_refused_before_anything_is_written(
        prepare, tmp_path, capsys, wnid, words):
    wnid = str(tmp_path / "x") if wnid == "ABSOLUTE" else wnid
    archives, _ = make_archives(tmp_path / "archives", devkit_wnids=[WNIDS[0], wnid, WNIDS[2]])
    _refused_before_writing(prepare, archives, tmp_path, capsys, words)


@pytest.mark.parametrize("wnid,words", [("..", "not a plain"), ("n" * 400, "400 bytes long")])
def test_a_train_class_that_is_not_a_plain_name_is_refused_before_anything_is_written(
        prepare, tmp_path, capsys, wnid, words):
    archives, _ = make_archives(tmp_path / "archives", train_wnids=[*WNIDS, wnid])
    _refused_before_writing(prepare, archives, tmp_path, capsys, words)


@pytest.mark.parametrize("image,words", [("sub/..", "not a plain"), ("i" * 400 + ".JPEG", "405 bytes long")])
def test_an_image_name_that_is_not_plain_is_one_error_line(prepare, tmp_path, capsys, image, words):
    archives, _ = make_archives(tmp_path / "archives", images={image: _jpeg(0)})
    out = tmp_path / "imagenet"
    assert run(prepare.main, _argv(archives, out, *EXPECT)) == 2
    err = capsys.readouterr().err
    assert _messages(err) == [err.strip().splitlines()[-1]] and words in _messages(err)[0], err
    assert f"({WNIDS[0]}.tar)" in _messages(err)[0] and len(_messages(err)[0]) < 400
    assert sorted(p.name for p in tmp_path.iterdir()) == ["archives", "imagenet"]
    assert not [p for p in out.rglob("*") if p.is_file()]
