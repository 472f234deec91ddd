"""Scratch folders of exports: an export killed outright leaves its files beside its output, never in $TMPDIR,
and the next export there removes them, keeping those of live writers and other machines."""

from __future__ import annotations

import os
import signal
import tempfile
from pathlib import Path

import pytest
import torch

from helpers import Forked, forkable, wait_or_kill
from image_classification.deploy import onnx_runtime
from image_classification.deploy.export import model2onnx_main
from image_classification.deploy.inference import main as classify_main
from image_classification.models import build_model
from image_classification.records.scratch import SCRATCH, remove_dead_writers
from image_classification.records.workspace import writer_stamp

pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")


def dead_stamp() -> str:
    """The stamp of a writer that died: this pid, reused by a process that started later."""
    pid, start, machine = writer_stamp().split("-")
    return f"{pid}-{int(start) + 1}-{machine}"


def test_the_scratch_of_dead_writers_is_removed_and_that_of_live_writers_and_other_machines_kept(tmp_path):
    pid, start, _ = dead_stamp().split("-")
    kept = [f".m.onnx.{writer_stamp()}.0000beef.tmp", f".m.onnx.{pid}-{start}-{'0' * 12}.0000beef.tmp",
            "notes.txt", f".m.onnx.{dead_stamp()}.0000beef.onnx"]
    dead = [f".m.onnx.{dead_stamp()}.0000beef.tmp", f".resnet18.{dead_stamp()}.00c0ffee.tmp"]
    for name in kept + dead:
        (tmp_path / name).mkdir()
    (tmp_path / dead[0] / "pre.quant.x").mkdir()
    (tmp_path / dead[0] / "pre.quant.x" / "model.onnx").write_bytes(b"partial")
    assert sorted(remove_dead_writers(tmp_path, SCRATCH)) == sorted(tmp_path / name for name in dead)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(kept)


def killed_at_the_first_temporary_folder(job, tmp_path: Path) -> Path:
    """Run ``job`` in a process of its own, SIGKILLed as it makes its first temporary folder through
    :mod:`tempfile` (ONNX Runtime's quantizer makes one for each step); the folder it took for $TMPDIR."""
    temporary = tmp_path / "TMPDIR"
    temporary.mkdir()

    def target() -> None:
        tempfile.tempdir = str(temporary)  # what $TMPDIR gives a fresh process
        made = tempfile.mkdtemp

        def mkdtemp(*args, **kwargs):
            path = made(*args, **kwargs)
            os.kill(os.getpid(), signal.SIGKILL)
            return path

        tempfile.mkdtemp = mkdtemp
        job()

    process = Forked(target, ["int8 export"], tmp_path / "killed.out")
    assert wait_or_kill(process, 300) == -signal.SIGKILL, (tmp_path / "killed.out").read_text()
    return temporary


@pytest.mark.skipif(not forkable(), reason="needs fork")
@pytest.mark.parametrize("tool", [pytest.param("model2onnx --output", marks=pytest.mark.slow),
                                  pytest.param("model2onnx --triton-repository", marks=pytest.mark.slow), "classify"])
def test_an_int8_export_killed_outright_leaves_its_files_beside_the_output_and_the_next_run_removes_them(
        tool, tiny_arch, image_folder, tmp_path, monkeypatch, capsys):
    torch.manual_seed(0)
    weights = tmp_path / "tiny.pth"
    torch.save(build_model(tiny_arch, num_classes=3).state_dict(), weights)
    int8 = ["--quantize", "int8", "--calibration-data", str(image_folder / "train"), "--calibration-images", "4"]
    common = ["-a", tiny_arch, "--weights", str(weights), "--image-size", "32"]
    if tool == "classify":
        monkeypatch.setenv(onnx_runtime.CACHE_ENV, str(tmp_path / "cache"))
        folder, own = tmp_path / "cache" / "onnx", "0" * 32  # the cache names its files by a 32-digit key
        common += ["--image", str(next(image_folder.glob("val/*/*.jpg"))), "--cpu", "--runtime", "onnxruntime"]
        entry, written = classify_main, None
    else:
        folder, own = tmp_path / "out", "m.onnx"
        place = ["--triton-repository", str(folder)] if "triton" in tool else ["--output", str(folder / "m.onnx")]
        common += [*place, "-b", "1"]
        entry, written = model2onnx_main, "tiny" if "triton" in tool else "m.onnx"

    temporary = killed_at_the_first_temporary_folder(lambda: entry(common + int8), tmp_path)
    assert list(temporary.iterdir()) == []  # nothing in $TMPDIR, which nothing would clear
    left = [path for path in folder.iterdir() if SCRATCH.match(path.name)]
    inside = [path for path in left[0].iterdir() if path.is_dir()] if len(left) == 1 else []
    assert len(inside) == 1, sorted(folder.rglob("*"))  # ONNX Runtime's first temporary folder, in the scratch

    live = folder / f".{own}.{writer_stamp()}.0000beef.tmp"  # this process's: a live writer's
    live.mkdir()
    assert entry(common) == 0  # the next export (FP32) into the same folder
    capsys.readouterr()
    assert not left[0].exists() and live.is_dir()
    live.rmdir()
    remaining = sorted(path.name for path in folder.iterdir())
    if written is None:
        assert len(remaining) == 2 and all(not name.startswith(".") for name in remaining), remaining
    else:
        assert remaining == [written]
