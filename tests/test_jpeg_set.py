"""benchmarks/jpeg_set.py: photograph-sized JPEGs from numpy and Pillow alone, the same on every machine."""

from __future__ import annotations

import json

from PIL import Image

from helpers import REPO, one_error_line, run_script

SCRIPT = REPO / "benchmarks" / "jpeg_set.py"


def write(folder, *flags: str, capsys=None):
    return run_script([SCRIPT, *flags, folder], capsys)


def test_the_set_is_the_same_whatever_the_workers_and_its_summary_says_what_was_written(tmp_path, capsys):
    one, two = tmp_path / "one", tmp_path / "two"
    assert write(one, "--images", "7", "--classes", "3", "-j", "1", capsys=capsys).returncode == 0
    result = write(two, "--images", "7", "--classes", "3", "-j", "2", "-o", str(tmp_path / "set.json"), capsys=capsys)
    assert result.returncode == 0, result.stderr
    files = sorted(path.relative_to(one) for path in one.rglob("*.jpg"))
    assert [str(path) for path in files[:3]] == ["train/class_0/img_000000.jpg", "train/class_0/img_000003.jpg",
                                                 "train/class_0/img_000006.jpg"]
    assert files == sorted(path.relative_to(two) for path in two.rglob("*.jpg")) and len(files) == 7
    assert all((one / path).read_bytes() == (two / path).read_bytes() for path in files)  # image i, seed i
    with Image.open(one / files[0]) as image:
        assert (image.format, image.mode, image.size) == ("JPEG", "RGB", (500, 375))
    summary = json.loads((tmp_path / "set.json").read_text())
    assert json.loads(result.stdout.splitlines()[-1]) == summary
    sizes = [(one / path).stat().st_size for path in files]
    assert summary["images"] == 7 and summary["classes"] == 3 and summary["mean_bytes"] == round(sum(sizes) / 7)
    # a photograph's spectrum, not white noise (which JPEG cannot compress) nor flat colour (all but free):
    # the photo set's 500x375 cuts at quality 90 average 38 KB
    assert 25_000 < summary["mean_bytes"] < 60_000


def test_a_folder_that_is_not_empty_is_refused_and_left_alone(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("mine")
    line = one_error_line(write(tmp_path, "--images", "2", capsys=capsys))
    assert line == f"error: {tmp_path} is not an empty folder: the set is written into a new one"
    assert [path.name for path in tmp_path.iterdir()] == ["notes.txt"]
