"""Checkpoint files: sealed with a content hash, a damaged copy refused everywhere, foreign files still load."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
import torch

from helpers import REPO, one_error_line, run_script, tiny_registered
from image_classification.errors import StorageError, UserError
from image_classification.models import build_model, load_weights
from image_classification.records import checkpoint as ckpt
from image_classification.records.checkpoint import load_checkpoint_file
from image_classification.records.integrity import content_digest, verify
from image_classification.system.cli import run


def _checkpoint_payload() -> dict:
    torch.manual_seed(0)
    model = build_model("resnet18", num_classes=3)
    return {"epoch": 1, "batch": 0, "arch": "resnet18", "num_classes": 3, "best_prec1": 50.0,
            "model_options": {"model_config": "classic"}, "state_dict": model.state_dict(),
            "preprocessing": {"image_size": 32, "interpolation": "bilinear"}, "rng": [{"python": (3, (1, 2), None)}]}


def flip(path: Path, offset: int, length: int = 4096) -> None:
    """Invert ``length`` bytes of ``path`` from ``offset``: what a bad sector or a broken copy does."""
    data = bytearray(path.read_bytes())
    for index in range(offset, min(offset + length, len(data))):
        data[index] ^= 0xFF
    path.write_bytes(bytes(data))


def test_digest_covers_values_structure_and_dtypes():
    base = {"a": torch.arange(4, dtype=torch.float32), "b": [1, "x", None, 2.5]}
    digest = content_digest(base)
    assert content_digest({"a": torch.arange(4, dtype=torch.float32), "b": [1, "x", None, 2.5]}) == digest
    changed = [
        {"a": torch.tensor([0.0, 1.0, 2.0, 3.5]), "b": [1, "x", None, 2.5]},
        {"a": torch.arange(4, dtype=torch.float64), "b": [1, "x", None, 2.5]},
        {"a": torch.arange(4, dtype=torch.float32).view(2, 2), "b": [1, "x", None, 2.5]},
        {"a": torch.arange(4, dtype=torch.float32), "b": [1, "y", None, 2.5]},
        {"b": [1, "x", None, 2.5], "a": torch.arange(4, dtype=torch.float32)},
    ]
    assert all(content_digest(other) != digest for other in changed)


def test_saved_checkpoint_verifies_and_loads(tmp_path):
    path = tmp_path / "c.pth.tar"
    ckpt.save_checkpoint(_checkpoint_payload(), path)
    state = ckpt.load_checkpoint(path)
    assert verify(state) is True and state["format"] == ckpt.FORMAT
    model = build_model("resnet18", num_classes=3)
    load_weights(model, state)


@pytest.mark.parametrize("where", [0.3, 0.5, 0.7, 0.9])
def test_a_damaged_checkpoint_is_refused(tmp_path, where):
    path = tmp_path / "c.pth.tar"
    ckpt.save_checkpoint(_checkpoint_payload(), path)
    flip(path, int(path.stat().st_size * where))
    with pytest.raises(UserError, match="damaged|could not be read"):
        load_checkpoint_file(path)


def test_files_without_a_hash_still_load(tmp_path):
    """NGC and torchvision files carry no hash: they load as before, layer names and all."""
    plain = tmp_path / "torchvision_style.pth"
    torch.save(build_model("resnet18").state_dict(), plain)
    assert verify(load_checkpoint_file(plain)) is None
    load_weights(build_model("resnet18"), plain)


def test_weights_file_records_its_description_and_plain_pytorch_still_loads_it(tmp_path):
    model = build_model("resnet18", num_classes=3)
    path = tmp_path / "w.pth"
    ckpt.save_weights(model.state_dict(), {"arch": "resnet18", "num_classes": 3,
                                           "preprocessing": {"image_size": 32}}, path)
    loaded = torch.load(path, weights_only=True)
    assert verify(loaded) is True
    fresh = build_model("resnet18", num_classes=3)
    fresh.load_state_dict(loaded)  # what a user of plain PyTorch does with the file
    loaded["fc.bias"] += 1  # changed after it was written
    assert verify(loaded) is False


class FullDisk:
    """A file that takes ``room`` bytes, then fails each write as a full disk does (ENOSPC)."""

    def __init__(self, handle, room: int):
        self.handle, self.room = handle, room

    def write(self, data) -> int:
        if self.handle.tell() + len(data) > self.room:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return self.handle.write(data)

    def __getattr__(self, name):
        return getattr(self.handle, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.handle.close()


@pytest.mark.parametrize("room", [10, 5000], ids=["at-the-start", "mid-save"])
def test_a_full_disk_inside_torch_save_is_a_storage_error(tmp_path, monkeypatch, room):
    """Mid-save, torch's zip writer turns the ENOSPC into "RuntimeError: [enforce fail at
    inline_container.cc] unexpected pos": still exit 4, the previous file intact, no temporary left."""
    path = tmp_path / "c.pth.tar"
    ckpt.save_checkpoint(_checkpoint_payload(), path)
    before = path.read_bytes()
    fdopen = os.fdopen
    monkeypatch.setattr(ckpt.os, "fdopen", lambda fd, mode: FullDisk(fdopen(fd, mode), room))
    with pytest.raises(StorageError, match="could not write .*c.pth.tar: No space left on device") as error:
        ckpt.save_checkpoint(_checkpoint_payload(), path)
    monkeypatch.undo()
    assert error.value.exit_code == 4 and "\n" not in str(error.value)
    assert path.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == ["c.pth.tar"]


def test_another_runtime_error_while_writing_stays_a_bug(tmp_path):
    def broken(handle):
        handle.write(b"part")
        raise RuntimeError("a bug in the code that writes")

    with pytest.raises(RuntimeError, match="a bug in the code"):
        ckpt.write_atomic(tmp_path / "c.pth.tar", broken)
    assert list(tmp_path.iterdir()) == []


def test_a_signal_whose_handler_raises_is_handled_once_the_file_is_in_place(tmp_path):
    """A second Ctrl-C's KeyboardInterrupt raised inside torch.save can abort the process: a signal that comes while
    a file is written reaches its handler once the file is renamed into place, and the handler is restored."""
    import signal
    import threading

    target, seen = tmp_path / "c.pth.tar", []

    def interrupted(signum, frame):
        seen.append(target.is_file())
        raise KeyboardInterrupt

    def write(handle):
        os.kill(os.getpid(), signal.SIGUSR1)
        handle.write(b"complete")

    previous = signal.signal(signal.SIGUSR1, interrupted)
    try:
        with pytest.raises(KeyboardInterrupt):
            ckpt.write_atomic(target, write)
        assert signal.getsignal(signal.SIGUSR1) is interrupted
        worker = threading.Thread(target=ckpt.write_atomic, args=(tmp_path / "d", lambda h: h.write(b"d")))
        worker.start()  # outside the main thread no handler can be set: the write goes on as it is
        worker.join()
    finally:
        signal.signal(signal.SIGUSR1, previous)
    assert seen == [True] and target.read_bytes() == b"complete"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["c.pth.tar", "d"]


def test_non_finite_weights_are_refused(tmp_path):
    state = build_model("resnet18", num_classes=3).state_dict()
    state["layer2.0.conv1.weight"][0, 0, 0, 0] = float("nan")
    with pytest.raises(UserError, match="NaN or infinite values .*layer2.0.conv1.weight"):
        load_weights(build_model("resnet18", num_classes=3), state)


@pytest.fixture(scope="module")
def damaged(tmp_path_factory, image_folder) -> dict[str, Path]:
    """A real training checkpoint (of the tiny architecture, registered for the module's tests) and
    copies of it damaged by a 4 KiB flip inside the weights."""
    from image_classification.deploy.export import checkpoint2model_main
    from image_classification.training import main

    root = tmp_path_factory.mktemp("damaged")
    with tiny_registered():
        assert main(["-a", "tiny", "--image-size", "32", "-b", "8", "--device", "cpu", "--epochs", "1",
                     "--prof", "1", "--data-backend", "pytorch", "-j", "0", "--seed", "1",
                     "--workspace", str(root / "ws"), str(image_folder)]) == 0
        good = root / "ws" / "checkpoint.pth.tar"
        bad = root / "bad.pth.tar"
        bad.write_bytes(good.read_bytes())
        flip(bad, bad.stat().st_size // 2)
        weights = root / "weights.pth"
        assert run(checkpoint2model_main, ["--checkpoint-path", str(good), "--weight-path", str(weights)]) == 0
        bad_weights = root / "bad_weights.pth"
        bad_weights.write_bytes(weights.read_bytes())
        flip(bad_weights, bad_weights.stat().st_size // 2)
        yield {"checkpoint": bad, "weights": bad_weights, "data": image_folder, "root": root}


@pytest.mark.parametrize("entry", ["resume", "pretrained", "classify", "checkpoint2model", "classify-weights"])
def test_every_entry_point_refuses_a_damaged_file(damaged, entry, tmp_path, capsys):
    """Each script run as ``python SCRIPT ...`` would run it (in this process: see helpers.run_script)."""
    data = str(damaged["data"])
    common = ["-a", "tiny", "--image-size", "32", "-b", "8", "--device", "cpu", "--data-backend", "pytorch",
              "-j", "0", "--epochs", "2", "--workspace", str(tmp_path / "ws"), data]
    image = str(next((damaged["data"] / "val" / "class_00").iterdir()))
    commands = {
        "resume": ["main.py", "--resume", str(damaged["checkpoint"]), *common],
        "pretrained": ["main.py", "--pretrained-weights", str(damaged["checkpoint"]), *common],
        "classify": ["classify.py", "--weights", str(damaged["checkpoint"]), "--image", image],
        "classify-weights": ["classify.py", "--weights", str(damaged["weights"]), "--image", image],
        "checkpoint2model": ["checkpoint2model.py", "--checkpoint-path", str(damaged["checkpoint"]),
                             "--weight-path", str(tmp_path / "out.pth")],
    }
    result = run_script(commands[entry], capsys, cwd=REPO)
    assert "damaged" in one_error_line(result) or "could not be read" in result.stderr
    assert not (tmp_path / "out.pth").exists()
