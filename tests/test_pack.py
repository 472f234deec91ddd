"""Packed sets: ``data.pack`` writes an ImageFolder into WebDataset shards that other readers (the webdataset
library, DALI's ``fn.readers.webdataset``) read whole, and every backend trains on them bitwise as on the
folder; damaged, swapped or hostile files are refused in one line; an interrupted pack finishes on a re-run."""

from __future__ import annotations

import contextlib
import glob
import io
import json
import os
import re
import signal
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from helpers import REPO, Forked, one_error_line, refused, run_script, write_image_folder
from image_classification.data.layout import check_dataset, list_samples, open_split
from image_classification.data.pack import PackLock
from image_classification.data.packed import MANIFEST, TABLE, PackedSplit
from image_classification.system.runtime import Runtime
from test_data_files import write_black_png

SIZE = 32


def pack(source: Path, destination: Path, *extra, capsys=None):
    """``python -m image_classification.data.pack SOURCE DESTINATION --shard-size 64KB``, in this process."""
    return run_script(["-m", "image_classification.data.pack", source, destination, "--shard-size", "64KB", *extra],
                      capsys, cwd=REPO)


def files_of(root: Path) -> dict[str, bytes]:
    return {str(path.relative_to(root)): path.read_bytes() for path in sorted(root.rglob("*")) if path.is_file()}


@pytest.fixture(scope="module")
def packed(image_folder, tmp_path_factory) -> Path:
    """The session's colour dataset, packed into 64KB shards (train/: 2 shards of uneven counts)."""
    destination = tmp_path_factory.mktemp("packed") / "colours"
    result = pack(image_folder, destination)
    assert result.returncode == 0, result.stderr
    return destination


def manifest_of(root: Path, split: str = "train") -> dict:
    return json.loads((root / split / MANIFEST).read_text())


def cpu_runtime(rank: int = 0, world_size: int = 1) -> Runtime:
    return Runtime(torch.device("cpu"), None, torch.contiguous_format, rank=rank, local_rank=rank,
                   world_size=world_size)


# -- the shards, as other readers see them ---------------------------------------------------------------
def test_the_shards_hold_every_image_byte_for_byte_and_webdataset_reads_them_all(image_folder, packed):
    wds = pytest.importorskip("webdataset")
    classes = check_dataset(str(image_folder), None, want_train=True, want_val=True)
    for split in ("train", "val"):
        sources = list_samples(image_folder / split, classes)
        shards = sorted(glob.glob(str(packed / split / "*.tar")))
        seen = [(sample["__key__"], sample["jpg"], int(sample["cls"])) for sample in
                wds.WebDataset(shards, shardshuffle=False)]
        assert len(seen) == len(sources) == manifest_of(packed, split)["samples"]
        for index, (key, data, label) in enumerate(seen):
            assert key == f"{index:09d}"
            assert data == Path(sources[index][0]).read_bytes() and label == sources[index][1]
    assert len(manifest_of(packed)["shards"]) == 2  # 64KB shards: the split's samples are cut unevenly


def test_dali_s_webdataset_reader_reads_every_sample_with_our_indices(image_folder, packed):
    pytest.importorskip("nvidia.dali")
    from nvidia.dali import fn, pipeline_def

    shards = sorted(glob.glob(str(packed / "train" / "*.tar")))
    sources = list_samples(image_folder / "train", check_dataset(str(image_folder), None, want_train=True,
                                                                  want_val=False))

    @pipeline_def(batch_size=1, num_threads=1, device_id=None)
    def pipeline():
        images, labels = fn.readers.webdataset(paths=shards, index_paths=[shard[:-4] + ".idx" for shard in shards],
                                               ext=["jpg", "cls"], name="shards")
        return images, labels

    built = pipeline()
    built.build()
    assert built.epoch_size("shards") == len(sources)
    for path, label in sources:
        image, cls = built.run()
        assert image.at(0).tobytes() == Path(path).read_bytes() and int(cls.at(0).tobytes()) == label
    try:  # the index is the one DALI's own wds2idx writes
        from wds2idx import IndexCreator
    except ImportError:
        return
    for shard in shards:
        with IndexCreator(shard, shard + ".check", verbose=False) as creator:
            creator.create_index()
        assert Path(shard + ".check").read_text() == Path(shard[:-4] + ".idx").read_text()
        os.unlink(shard + ".check")


def test_packing_twice_gives_byte_identical_files(image_folder, packed, tmp_path):
    assert pack(image_folder, tmp_path / "again").returncode == 0
    assert files_of(tmp_path / "again") == files_of(packed)


def test_a_packed_set_counts_what_data_check_counts_on_its_folder(tmp_path, capsys):
    """Links (a loop, a dangling one), unreadable files and the pixel-count rule: the same counts, the same
    images named, on the folder and on its packed copy; training skips the same ones."""
    source = write_image_folder(tmp_path / "src", num_classes=2, train_per_class=5, val_per_class=2)
    train = source / "train"
    (train / "class_00" / "empty.jpg").write_bytes(b"")
    (train / "class_00" / "corrupt.jpg").write_bytes(b"\xff\xd8\xff not a jpeg")
    write_black_png(train / "class_01" / "huge.png", 10000, 10000)
    os.symlink("..", train / "class_01" / "loop")
    os.symlink("nowhere.jpg", train / "class_01" / "dangling.jpg")
    assert pack(source, tmp_path / "dst", capsys=capsys).returncode == 0
    reports = [run_script(["-m", "image_classification.data.check", root, "-j", "1"], capsys, cwd=REPO)
               for root in (source, tmp_path / "dst")]
    for report in reports:
        assert report.returncode == 1
        assert "train/: 2 classes, 14 images" in report.stdout
        assert "train/ unreadable images: 4" in report.stdout
        assert "train/ entries left out (links not followed, files that are not regular): 1" in report.stdout
        for name in ("empty.jpg", "corrupt.jpg", "huge.png", "dangling.jpg", "ImageTooLarge"):
            assert name in report.stdout
    from image_classification.data.common import ShardSampler
    from image_classification.data.folder import ImageFiles

    skipped = []
    for root in (source, tmp_path / "dst"):
        split = open_split(root, "train", ["class_00", "class_01"])
        dataset = ImageFiles(split, lambda image: image, tensors=True)
        sampler = ShardSampler(len(split), 0, 1, shuffle=False, seed=0)
        skipped.append([split.name(index).split(" in ")[0].split("/")[-1] for index, _ in sampler
                        if dataset[(index, 0)][0] is None])
    assert skipped[0] == skipped[1] and len(skipped[0]) == 4
    try:
        import nvidia.dali  # noqa: F401  (what follows compares DALI's reading of both)
    except ImportError:
        return
    from image_classification.arguments import parse_args
    from image_classification.data.dali import dali_loaders
    from image_classification.arguments.data import data_config

    seen = []
    for root in (source, tmp_path / "dst"):
        args = parse_args([str(root), "--data-backend", "dali-cpu", "-b", "2", "-j", "1"])
        train, _ = dali_loaders(data_config(args, SIZE), cpu_runtime(), ["class_00", "class_01"], want_train=True,
                                want_val=False)
        train.set_epoch(0)
        seen.append((sum(len(labels) for _, labels in train), train.skipped))
    assert seen[0] == seen[1] and seen[0][1] == 4, seen


@pytest.mark.parametrize("backend", ["pytorch", "pytorch-gpu", "dali-cpu"])
def test_validation_and_data_check_skip_the_elongated_images_of_packed_val_as_on_the_folder(tmp_path, backend,
                                                                                             capsys):
    """Validation resizes an image whole to its short side: a 65,361 x 1 strip, within the size rule, would make
    89.5 million pixels at 32 px crops (37 px short side).  Read from the shards, validation names and leaves
    out the same strips as from the folder, and data.check names them for the resize it is told."""
    if backend == "dali-cpu":
        pytest.importorskip("nvidia.dali")
    from image_classification.data import get_loaders
    from image_classification.data.common import DataConfig
    from test_data_files import KEPT_STRIP, STRIPS

    source = write_image_folder(tmp_path / "src", num_classes=2, train_per_class=2, val_per_class=2)
    for name, (width, height) in (*STRIPS.items(), KEPT_STRIP):
        write_black_png(source / "val" / "class_00" / name, width, height)
    assert pack(source, tmp_path / "dst", capsys=capsys).returncode == 0
    words = "(ImageTooLarge: more than 89,478,485 pixels once resized to a {} px short side (a "

    def named(text: str, short_side: int) -> list[str]:
        return sorted(name for line in text.splitlines() if words.format(short_side) in line
                      for name in (*STRIPS, KEPT_STRIP[0]) if name in line)

    passes = []
    for root in (source, tmp_path / "dst"):
        config = DataConfig(data=str(root), data_backend=backend, image_size=SIZE, batch_size=3, workers=0)
        _, val = get_loaders(config, cpu_runtime(), want_train=False, want_val=True)
        capsys.readouterr()
        val.set_epoch(0)
        seen = sum(len(targets) for _, targets in val)
        passes.append((seen, val.skipped, named(capsys.readouterr().err, 37)))
    assert passes[0] == passes[1] == (4 + 1, 2, sorted(STRIPS)), passes
    for flags, short_side, flagged in (((), 256, sorted([*STRIPS, KEPT_STRIP[0]])),
                                       (("--val-resize-size", "37"), 37, sorted(STRIPS))):
        for root in (source, tmp_path / "dst"):
            report = run_script(["-m", "image_classification.data.check", root, "-j", "1", *flags], capsys,
                                cwd=REPO)
            assert report.returncode == 1 and "train/ unreadable images" not in report.stdout, report.stdout
            assert f"val/ unreadable images: {len(flagged)}" in report.stdout
            assert named(report.stdout, short_side) == flagged, report.stdout


def test_odd_names_are_kept_for_messages_and_never_reach_the_tar(tmp_path):
    source = write_image_folder(tmp_path / "src", num_classes=2, train_per_class=2, val_per_class=1)
    odd = ["new\nline.jpg", os.fsdecode(b"caf\xe9 .jpg"), "-rf ..jpg"]
    for number, name in enumerate(odd):
        Image.new("RGB", (20, 10), (number, 0, 0)).save(source / "train" / "class_01" / name, "JPEG")
    assert pack(source, tmp_path / "dst").returncode == 0
    classes = check_dataset(str(tmp_path / "dst"), None, want_train=True, want_val=True)
    split = open_split(tmp_path / "dst", "train", classes)
    folder = list_samples(source / "train", classes)
    assert [split.names(index) for index in range(len(split))] == \
        [os.path.relpath(path, source / "train") for path, _ in folder]
    assert all(split.read(index) == Path(path).read_bytes() for index, (path, _) in enumerate(folder))
    members = [line.split()[3] for shard in (tmp_path / "dst" / "train").glob("*.idx")
               for line in shard.read_text().splitlines()[1:]]
    assert members and all(member.split(".")[0].isdigit() for member in members)


# -- training reads the shards as it reads the folder ----------------------------------------------------
def run_args(arch: str, backend: str, workspace: Path, data: Path, *extra: str) -> list[str]:
    return ["-a", arch, "--num-classes", "3", "--device", "cpu", "--data-backend", backend, "-j", "0" if backend ==
            "pytorch" else "1", "--image-size", str(SIZE), "-b", "4", "--lr", "0.05", "--seed", "3", "--epochs", "2",
            "-p", "100", "--workspace", str(workspace), *extra, str(data)]


def _val_records(workspace: Path) -> list[dict]:
    from image_classification.records.raport import read_raport

    return [{key: value for key, value in record["data"].items() if key in ("val.loss", "val.top1", "val.top5")}
            for record in read_raport(workspace / "experiment_raport.json")
            if record.get("type") == "LOG" and "val.loss" in record.get("data", {})]


@pytest.mark.parametrize("backend", ["pytorch", "dali-cpu"])
def test_the_same_command_on_the_shards_trains_bitwise_the_weights_of_the_folder(image_folder, packed, tmp_path,
                                                                                 tiny_arch, backend):
    if backend != "pytorch":
        pytest.importorskip("nvidia.dali")
    from image_classification.training import main

    for name, data in (("folder", image_folder), ("shards", packed)):
        assert main(run_args(tiny_arch, backend, tmp_path / name, data)) == 0
    weights = [torch.load(tmp_path / name / "checkpoint.pth.tar", weights_only=True)["state_dict"]
               for name in ("folder", "shards")]
    assert [name for name in weights[0] if not torch.equal(weights[0][name], weights[1][name])] == []
    assert _val_records(tmp_path / "folder") == _val_records(tmp_path / "shards") != []
    evaluated = [run_script([REPO / "main.py", *run_args(tiny_arch, backend, tmp_path / f"eval-{name}", data,
                                                         "--evaluate", "--resume",
                                                         str(tmp_path / "folder" / "checkpoint.pth.tar"))])
                 for name, data in (("folder", image_folder), ("shards", packed))]
    assert all(result.returncode == 0 for result in evaluated), evaluated[0].stderr + evaluated[1].stderr
    top1 = [[line for line in result.stdout.splitlines() if line.startswith("val top1")] for result in evaluated]
    assert top1[0] == top1[1] != []


@pytest.mark.parametrize("world", [pytest.param(1, marks=pytest.mark.slow), 2, pytest.param(3, marks=pytest.mark.slow)])
def test_every_rank_reads_from_the_shards_what_it_reads_from_the_folder(image_folder, packed, world):
    """Any number of processes (a resume on another count included) deals the samples of the folder's
    numbering, so each rank's batches are the folder's, bit for bit, and every rank has as many batches
    though the shards hold uneven counts."""
    from image_classification.data.common import DataConfig
    from image_classification.data.folder import folder_loaders

    classes = check_dataset(str(image_folder), None, want_train=True, want_val=True)
    lengths = set()
    for rank in range(world):
        batches = []
        for root in (image_folder, packed):
            config = DataConfig(data=str(root), data_backend="pytorch", image_size=SIZE, batch_size=2, seed=5,
                                workers=2)  # worker processes, as many as the 2 cores the suite plans for
            train, val = folder_loaders(config, cpu_runtime(rank, world), classes, want_train=True, want_val=True)
            train.set_epoch(3, start_batch=1)
            batches.append((list(train), list(val), len(train)))
        (train_a, val_a, length), (train_b, val_b, _) = batches
        assert len(train_a) == len(train_b) == length - 1
        for (images_a, labels_a), (images_b, labels_b) in zip(train_a + val_a, train_b + val_b):
            assert torch.equal(images_a, images_b) and torch.equal(labels_a, labels_b)
        lengths.add(length)
    assert len(lengths) == 1


def test_shards_are_opened_once_per_run_not_per_image(packed):
    """The folder opens a file per image and epoch; the shards are opened when the split is, and read
    with os.pread after."""
    from image_classification.data.common import DataConfig
    from image_classification.data.folder import folder_loaders

    opened: list[str] = []
    recording = [True]

    def hook(event, args):
        if recording[0] and event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
            opened.append(os.fsdecode(args[0]))

    import sys

    sys.addaudithook(hook)
    try:
        classes = check_dataset(str(packed), None, want_train=True, want_val=False)
        # read in this process (-j 0), where the audit hook sees every open of the epochs too
        config = DataConfig(data=str(packed), data_backend="pytorch", image_size=SIZE, batch_size=4, workers=0)
        train, _ = folder_loaders(config, cpu_runtime(), classes, want_train=True, want_val=False)
        at_start = [path for path in opened if path.endswith(".tar")]
        for epoch in range(2):
            train.set_epoch(epoch)
            assert sum(len(labels) for _, labels in train) == 24
    finally:
        recording[0] = False
    assert sorted(at_start) == sorted(str(packed / "train" / shard["file"]) for shard in manifest_of(packed)["shards"])
    assert [path for path in opened if path.endswith(".tar")] == at_start  # none during the epochs


def test_a_split_sent_to_a_spawned_worker_reopens_the_shards_it_checked(packed, tmp_path):
    """Pickled (a loader worker started by spawn or forkserver), a split holds no descriptors; it opens the
    shards again where it is read, and refuses a shard replaced since the run checked it."""
    import pickle
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(packed, copy)
    classes = check_dataset(str(copy), None, want_train=True, want_val=False)
    split = open_split(copy, "train", classes)
    sent = pickle.loads(pickle.dumps(split))
    assert [sent.read(index) for index in range(len(sent))] == [split.read(index) for index in range(len(split))]
    replaced = copy / "train" / "shard-000001.tar"
    data = replaced.read_bytes()
    replaced.unlink()
    replaced.write_bytes(data)  # the same bytes in another file
    from image_classification.errors import UserError

    with pytest.raises(UserError, match="shard-000001.tar was replaced since the run started"):
        pickle.loads(pickle.dumps(split)).read(0)


def test_dali_reads_the_shards_off_the_training_thread(packed, monkeypatch):
    pytest.importorskip("nvidia.dali")
    from image_classification.arguments import parse_args
    from image_classification.data.dali import dali_loaders
    from image_classification.arguments.data import data_config

    readers: list[str] = []
    read = PackedSplit.read

    def recorded(self, index):
        readers.append(threading.current_thread().name)
        return read(self, index)

    monkeypatch.setattr(PackedSplit, "read", recorded)
    args = parse_args([str(packed), "--data-backend", "dali-cpu", "-b", "4", "-j", "2", "--seed", "3"])
    classes = check_dataset(str(packed), None, want_train=True, want_val=True)
    train, val = dali_loaders(data_config(args, SIZE), cpu_runtime(), classes, want_train=True, want_val=True)
    train.set_epoch(0)
    assert sum(len(labels) for _, labels in train) == 24 and sum(len(labels) for _, labels in val) == 12
    assert len(readers) == 36 and threading.main_thread().name not in readers


def test_the_sampler_s_arrays_are_its_iteration():
    from image_classification.data.common import ShardSampler

    for repeats, world, rank in ((1, 1, 0), (1, 3, 2), (3, 2, 1)):
        sampler = ShardSampler(301, rank, world, shuffle=True, seed=2**62 + 5, repeats=repeats)
        sampler.set_epoch(7, start=4)
        indices, seeds = sampler.pass_order()
        assert list(zip(indices.tolist(), seeds.tolist())) == list(sampler)


def test_the_sample_table_costs_twelve_bytes_a_sample(tmp_path):
    """Numpy arrays, not Python objects: a million samples open in about 12 MB (14 M would take 168 MB)."""
    import tracemalloc

    from benchmarks.startup import write_synthetic_split

    count = 1_000_000
    classes = write_synthetic_split(tmp_path / "train", count, shards=4)
    from image_classification.data.packed import open_packed_split

    tracemalloc.start()
    try:
        opened = open_packed_split(tmp_path / "train", classes)
        held = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert len(opened) == count and opened.label(count - 1) == (count - 1) % 1000
    assert held < 13 * count, held


# -- hostile and damaged sets ------------------------------------------------------------------------------
def _swap_table(split: Path) -> None:
    table = np.load(split / TABLE)
    table["label"] = table["label"][::-1]
    np.save(split / TABLE, table)


def _edit_manifest(change):
    def edit(split: Path) -> None:
        manifest = json.loads((split / MANIFEST).read_text())
        change(manifest)
        (split / MANIFEST).write_text(json.dumps(manifest))
    return edit


def _link_shard(split: Path) -> None:
    shard = split / "shard-000001.tar"
    os.replace(shard, split.parent / "elsewhere.tar")
    os.symlink(split.parent / "elsewhere.tar", shard)


def _truncate_shard(split: Path) -> None:
    shard = split / "shard-000001.tar"
    shard.write_bytes(shard.read_bytes()[:-10240])


def _count_past_int64(manifest: dict) -> None:
    """A sample count of 10**30, the first shard's count raised so that the counts still add up."""
    manifest["shards"][0]["samples"] = 10**30 - sum(shard["samples"] for shard in manifest["shards"][1:])
    manifest["samples"] = 10**30


def _swap_shards(split: Path) -> None:
    """Shards of the same size, in each other's place: only their tar headers tell."""
    first, second = (split / f"shard-00000{number}.tar" for number in (0, 1))
    data = second.read_bytes()
    second.write_bytes(first.read_bytes()[:len(data)])


DAMAGES = {
    "another shard's samples": (_swap_shards, "shard-000001.tar does not hold sample "),
    "a shard outside the split": (_edit_manifest(lambda m: m["shards"][0].update(file="../../x/shard-000000.tar")),
                                  "damaged (shard entry 0 is not shard-000000.tar)"),
    "a linked shard": (_link_shard, "shard-000001.tar is a symbolic link"),
    "a truncated shard": (_truncate_shard, "shard-000001.tar is 20,480 bytes, its manifest says 30,720"),
    "a swapped table": (_swap_table, "samples.npy does not match its manifest's SHA-256"),
    "another pack version": (_edit_manifest(lambda m: m.update(version=2)), "is of pack format 2; this version reads "
                                                                            "format 1"),
    "a shard count that does not add up": (_edit_manifest(lambda m: m["shards"][1].update(samples=9)),
                                           "do not add up to its sample count"),
    "a sample count past any integer": (_edit_manifest(_count_past_int64),
                                        "holds the whole number 100000000000000000000000..., beyond what a 64-bit "
                                        "integer holds; pack the dataset again"),  # was an OverflowError
    "a manifest nested 100,000 deep": (lambda split: (split / MANIFEST).write_text("[" * 100_000),
                                       "manifest.json nests its values more than 32 levels deep (line 1); pack the "
                                       "dataset again"),  # was a RecursionError
}


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_a_damaged_or_hostile_set_is_refused_in_one_line_before_training(packed, tmp_path, tiny_arch, damage, capsys):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(packed, copy)
    change, expected = DAMAGES[damage]
    change(copy / "train")
    result = run_script([REPO / "main.py", *run_args(tiny_arch, "pytorch", tmp_path / "ws", copy)], capsys)
    assert expected in one_error_line(result)


def test_a_sample_whose_header_is_not_its_own_is_not_read(packed, tmp_path):
    """Every read takes the sample's tar header with its bytes: a shard changed under a run gives no image
    of another sample under this one's label."""
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(packed, copy)
    classes = check_dataset(str(copy), None, want_train=True, want_val=False)
    split = open_split(copy, "train", classes)
    shard = copy / "train" / "shard-000000.tar"
    data = bytearray(shard.read_bytes())
    header = int(split.blocks[3]) * 512 - 512
    data[header:header + 9] = b"000000004"  # sample 3's header now names sample 4
    shard.write_bytes(bytes(data))
    assert split.read(2) == (packed / "train" / "shard-000000.tar").read_bytes()[
        int(split.blocks[2]) * 512:int(split.blocks[2]) * 512 + int(split.sizes[2])]
    with pytest.raises(OSError, match="does not hold sample 3 where its table places it"):
        split.read(3)


def test_a_sample_whose_header_records_another_size_is_not_read(packed, tmp_path):
    """The header names the right sample but records another size (a shard of a re-pack in which that image
    changed, the next ones kept in place): the read is refused, not cut to the table's size."""
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(packed, copy)
    classes = check_dataset(str(copy), None, want_train=True, want_val=False)
    split = open_split(copy, "train", classes)
    shard = copy / "train" / "shard-000000.tar"
    data = bytearray(shard.read_bytes())
    header = int(split.blocks[3]) * 512 - 512
    data[header + 124:header + 136] = b"%011o\0" % (int(split.sizes[3]) - 1)  # checksum not redone: not read
    shard.write_bytes(bytes(data))
    split.read(2)
    with pytest.raises(OSError, match="does not hold sample 3 where its table places it"):
        split.read(3)


def test_data_check_names_a_damaged_shard_in_one_line(packed, tmp_path, capsys):
    """A shard of the right size with other bytes trains (only sizes are checked at start-up); data.check reads
    every shard whole and names it."""
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(packed, copy)
    shard = copy / "val" / "shard-000000.tar"
    data = bytearray(shard.read_bytes())
    data[2000] ^= 0xFF
    shard.write_bytes(bytes(data))
    result = run_script(["-m", "image_classification.data.check", copy, "-j", "1"], capsys, cwd=REPO)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    lines = [line.strip() for line in result.stdout.splitlines()]
    assert "val/ damaged files: 1" in lines
    assert "shard-000000.tar: its SHA-256 differs from the manifest's (changed or damaged since it was packed)" in lines


# -- packing: refusals, interruptions, re-runs -------------------------------------------------------------
def test_what_a_pack_refuses(image_folder, packed, tmp_path, capsys):
    being_written = tmp_path / "busy" / "train" / ".shard-000000.tar.tmp"
    being_written.parent.mkdir(parents=True)
    with PackLock(tmp_path / "busy"):
        being_written.write_bytes(b"the other pack's")
        assert "another pack is writing" in one_error_line(pack(image_folder, tmp_path / "busy", capsys=capsys))
        assert being_written.read_bytes() == b"the other pack's"
    assert "is SRC or inside it" in one_error_line(pack(image_folder, image_folder / "val" / "x", capsys=capsys))
    (tmp_path / "foreign" / "train").mkdir(parents=True)
    (tmp_path / "foreign" / "train" / "notes.txt").write_text("mine")
    assert "holds 'notes.txt', which a pack does not write" in one_error_line(pack(image_folder, tmp_path / "foreign",
                                                                                   capsys=capsys))
    assert "is a packed set already" in one_error_line(pack(packed, tmp_path / "twice", capsys=capsys))
    assert "--shard-size '1XB'" in one_error_line(pack(image_folder, tmp_path / "x", "--shard-size", "1XB",
                                                       capsys=capsys))
    assert (tmp_path / "foreign" / "train" / "notes.txt").read_text() == "mine"


def test_a_read_only_dst_is_one_line(image_folder, read_only_folder, capsys):
    folder, seal = read_only_folder
    seal()
    line = one_error_line(pack(image_folder, folder / "packed", capsys=capsys))
    assert line.startswith(f"error: DST {folder / 'packed'} cannot be written") and "read-only" in line.lower(), line
    assert not (folder / "packed").exists()


def test_a_dst_whose_disk_fills_is_one_line_and_a_re_run_finishes_it(image_folder, tmp_path, capsys, monkeypatch):
    """The second shard is written where every write fails as on a full disk (/dev/full): exit 4, the first
    shard kept, the half-written one removed; the same command then finishes the pack."""
    from image_classification.data import pack_destination

    real = pack_destination.open_own

    def filling(path, flags):
        if path.name.startswith(".shard-000001"):
            real(path, flags)  # made as usual, written to a full disk
            return os.open("/dev/full", os.O_WRONLY)
        return real(path, flags)

    monkeypatch.setattr(pack_destination, "open_own", filling)
    destination = tmp_path / "dst"
    line = one_error_line(pack(image_folder, destination, capsys=capsys), code=4)
    assert line.startswith(f"error: DST {destination} could not be written (No space left on device)"), line
    assert "the shards finished are kept" in line
    assert sorted(os.listdir(destination / "train")) == [".pack-progress.jsonl", "shard-000000.idx",
                                                         "shard-000000.tar"]
    monkeypatch.setattr(pack_destination, "open_own", real)
    again = pack(image_folder, destination, capsys=capsys)
    assert again.returncode == 0 and "2 shard(s), 0.1 MB (1 written, 1 kept)" in again.stdout, again.stdout


def test_a_dst_inside_src_or_beside_other_files_is_refused(image_folder, tmp_path, capsys):
    """As the docs say: a DST inside SRC (not only inside its splits), or whose top folder holds other files."""
    import shutil

    source = Path(shutil.copytree(image_folder, tmp_path / "src"))
    before = files_of(source)
    assert f"DST {source / 'packed'} is SRC or inside it" in one_error_line(pack(source, source / "packed",
                                                                                 capsys=capsys))
    assert files_of(source) == before and not (source / "packed").exists()
    (tmp_path / "dst").mkdir()
    (tmp_path / "dst" / "notes.txt").write_text("mine")
    assert f"{tmp_path / 'dst'} holds 'notes.txt', which a pack does not write" in one_error_line(
        pack(source, tmp_path / "dst", capsys=capsys))
    assert os.listdir(tmp_path / "dst") == ["notes.txt"]


@pytest.mark.parametrize("planted", [".pack.lock", "train/.pack-progress.jsonl"])
def test_a_pack_never_writes_through_a_link_planted_in_dst(image_folder, tmp_path, planted, capsys, monkeypatch):
    """A link at a file a pack writes is refused before anything is written; one planted after DST was checked
    is not followed when the file is opened.  The file it points to is left as it was."""
    from image_classification.data import pack as pack_module
    from image_classification.system.cli import run

    outside = tmp_path / "outside.txt"
    outside.write_text("mine\n")
    destination = tmp_path / "dst"
    (destination / "train").mkdir(parents=True)
    (destination / planted).symlink_to(outside)
    assert f"{destination / planted} is a symbolic link, which a pack never writes" in one_error_line(
        pack(image_folder, destination, capsys=capsys))
    (destination / planted).unlink()
    checked = pack_module.prepare_destination

    def planted_after_the_check(source, target, splits):
        checked(source, target, splits)
        (target / planted).symlink_to(outside)

    monkeypatch.setattr(pack_module, "prepare_destination", planted_after_the_check)
    code = run(pack_module.main, [str(image_folder), str(destination), "--shard-size", "64KB"])
    assert f"{destination / planted} is a symbolic link, which a pack never writes through" in refused(code, capsys)
    assert outside.read_text() == "mine\n"


def _without_waiting(*attempts) -> list[str]:
    """What each of ``attempts`` (functions) raised as a UserError, or printed: called in a thread, so that one
    waiting on a FIFO for good fails the test instead of hanging it."""
    import contextlib
    import io

    from image_classification.errors import UserError

    outcome = []

    def attempt_all():
        for attempt in attempts:
            with contextlib.redirect_stdout(io.StringIO()) as out:
                try:
                    attempt()
                except UserError as error:
                    print(error)
            outcome.append(out.getvalue())

    thread = threading.Thread(target=attempt_all, daemon=True)
    thread.start()
    thread.join(timeout=60)
    return outcome


@pytest.mark.parametrize("fifo", [MANIFEST, "shard-000001.tar"])
def test_a_fifo_in_place_of_a_manifest_or_a_shard_is_refused_without_waiting(packed, tmp_path, fifo):
    """``open`` of a FIFO waits for a writer: start-up and data.check waited for good (and main.py ignored
    SIGTERM meanwhile)."""
    import shutil

    from image_classification.data.check import check

    copy = tmp_path / "copy"
    shutil.copytree(packed, copy)
    (copy / "train" / fifo).unlink()
    os.mkfifo(copy / "train" / fifo)
    try:
        outcome = _without_waiting(
            lambda: open_split(copy, "train", check_dataset(str(copy), None, want_train=True, want_val=True)),
            lambda: check(copy, workers=1))
    finally:  # a reader still waiting: a writer lets it go
        with contextlib.suppress(OSError):
            os.close(os.open(copy / "train" / fifo, os.O_WRONLY | os.O_NONBLOCK))
    assert len(outcome) == 2, "waited on the FIFO"
    for said in outcome:
        assert f"{copy / 'train' / fifo} is not a regular file (a folder, a device or a pipe); pack the dataset " \
               "again" in said


def test_a_fifo_named_like_an_image_is_left_out_and_never_waited_on(image_folder, tmp_path):
    """A FIFO in a class folder, named like an image: training's listing, data.check and the pack left it out
    with a warning, where each waited on it for good (the pack ignoring SIGTERM meanwhile); a file swapped for
    a FIFO after it was listed is refused by the reader without waiting."""
    import shutil

    from image_classification.data import DataConfig, get_loaders
    from image_classification.data.check import check
    from image_classification.data.files import NotARegularFile, read_bytes
    from image_classification.data.pack import pack

    copy = tmp_path / "copy"
    shutil.copytree(image_folder, copy)
    fifos = [copy / "train" / "class_00" / "zz_fifo.jpg", copy / "val" / "class_01" / "zz_fifo.png"]
    for fifo in fifos:
        os.mkfifo(fifo)
    said = "not a regular file (a pipe, a socket or a device)"

    def train_and_validate():
        config = DataConfig(str(copy), "pytorch", image_size=32, batch_size=4, workers=0)
        train, val = get_loaders(config, Runtime(torch.device("cpu"), None, torch.contiguous_format),
                                 want_train=True, want_val=True)
        for loader in (train, val):
            loader.set_epoch(0)
            print(sum(len(targets) for _, targets in loader))

    def swapped():  # listed as a regular file, a FIFO by the time it is read
        with pytest.raises(NotARegularFile, match=re.escape(said)):
            read_bytes(str(fifos[0]))
        print("refused")

    try:
        with contextlib.redirect_stderr(io.StringIO()) as err:
            outcome = _without_waiting(train_and_validate, lambda: check(copy, workers=1),
                                       lambda: pack(copy, tmp_path / "packed", workers=1), swapped)
    finally:  # a reader still waiting: a writer lets it go
        for fifo in fifos:
            with contextlib.suppress(OSError):
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    assert len(outcome) == 4, "waited on a FIFO"
    assert outcome[0].split() == ["24", "12"]  # every image but the FIFOs
    assert f"{fifos[0]}: {said}" in outcome[1] and f"{fifos[1]}: {said}" in outcome[1]
    assert "train: 3 classes, 24 images" in outcome[2] and "val: 3 classes, 12 images" in outcome[2]
    assert outcome[3] == "refused\n"
    assert f"warning: leaving out {fifos[0]}: {said}" in err.getvalue()


def _dies_at(monkeypatch, sample: int, how) -> None:
    """The pack's reader of source files calls ``how()`` when it reaches sample ``sample`` of a split."""
    from image_classification.data import pack as pack_module

    read = pack_module._read_source

    def reading(plan, index):
        if index == sample and plan.source_dir.name == "train":
            how()
        return read(plan, index)

    monkeypatch.setattr(pack_module, "_read_source", reading)


def test_a_pack_stopped_by_sigterm_keeps_finished_shards_and_a_rerun_finishes_it(image_folder, packed, tmp_path,
                                                                                 capsys):
    destination = tmp_path / "dst"
    from image_classification.data.pack import main
    from image_classification.system.cli import run

    with pytest.MonkeyPatch.context() as patch:
        _dies_at(patch, 22, lambda: os.kill(os.getpid(), signal.SIGTERM))  # in the second shard
        code = run(main, [str(image_folder), str(destination), "--shard-size", "64KB", "-j", "1"])
    err = capsys.readouterr().err
    assert code == 75 and err.startswith("Stopped by SIGTERM while packing") and err.count("\n") == 1, err
    left = sorted(path.name for path in (destination / "train").iterdir())
    assert left == [".pack-progress.jsonl", "shard-000000.idx", "shard-000000.tar"]  # no partial file, no manifest
    assert (destination / "train" / "shard-000000.tar").read_bytes() == \
        (packed / "train" / "shard-000000.tar").read_bytes()
    finished = pack(image_folder, destination, capsys=capsys)
    assert finished.returncode == 0 and "(1 written, 1 kept)" in finished.stdout
    assert files_of(destination) == files_of(packed)


def test_a_pack_killed_leaves_no_set_a_reader_takes_for_complete(image_folder, packed, tmp_path, tiny_arch, capsys):
    from image_classification.data.pack import main

    destination = tmp_path / "dst"
    with pytest.MonkeyPatch.context() as patch:
        _dies_at(patch, 22, lambda: os.kill(os.getpid(), signal.SIGKILL))
        killed = Forked(lambda: main([str(image_folder), str(destination), "--shard-size", "64KB", "-j", "1"]),
                        ["pack"], tmp_path / "out")
        assert killed.wait() == -signal.SIGKILL
    left = {path.name for path in (destination / "train").iterdir()}
    assert ".shard-000001.tar.tmp" in left and MANIFEST not in left and "shard-000001.tar" not in left
    unfinished = f"{destination / 'train'} holds the shards of a pack that did not finish (no manifest.json); run " \
                 "the same pack command again"
    refusal = run_script([REPO / "main.py", *run_args(tiny_arch, "pytorch", tmp_path / "ws", destination)], capsys)
    assert unfinished in one_error_line(refusal)
    checked = run_script(["-m", "image_classification.data.check", destination, "-j", "1"], capsys, cwd=REPO)
    assert unfinished in one_error_line(checked)  # it said "ok: nothing to fix"
    finished = pack(image_folder, destination, capsys=capsys)
    assert finished.returncode == 0 and "(1 written, 1 kept)" in finished.stdout
    assert files_of(destination) == files_of(packed)


def test_a_rerun_rewrites_only_the_shards_whose_sources_changed(tmp_path, capsys):
    source = write_image_folder(tmp_path / "src", num_classes=3, train_per_class=8, val_per_class=2)
    destination = tmp_path / "dst"
    assert pack(source, destination, capsys=capsys).returncode == 0
    again = pack(source, destination, capsys=capsys)
    assert "(0 written, 2 kept)" in again.stdout
    changed = source / "train" / "class_02" / "img_007.jpg"  # the last sample: the second shard
    Image.new("RGB", (40, 30), (1, 2, 3)).save(changed)
    rerun = pack(source, destination, capsys=capsys)
    assert "(1 written, 1 kept)" in rerun.stdout
    classes = check_dataset(str(destination), None, want_train=True, want_val=True)
    split = open_split(destination, "train", classes)
    assert split.read(len(split) - 1) == changed.read_bytes()
    assert pack(source, tmp_path / "fresh", capsys=capsys).returncode == 0
    assert files_of(destination) == files_of(tmp_path / "fresh")


# -- the benchmarks --------------------------------------------------------------------------------------
def test_the_loader_benchmark_times_a_folder_and_its_packed_copy_and_counts_their_opens(image_folder, packed, capsys):
    from helpers import load_script

    loader = load_script("benchmark_loader", "benchmarks")
    assert loader.main(["--data-backend", "pytorch", "-b", "4", "-j", "0", "--epochs", "2", "--image-size", "32",
                        "--device", "cpu", "--packed", str(packed), str(image_folder)]) == 0
    out = capsys.readouterr().out
    assert "pytorch folder: " in out and "files opened per epoch: 24" in out  # a file per training image
    assert "files opened per epoch: 0" in out.split("pytorch packed: ")[1]
    assert "packed / folder: " in out and "verdict: " in out


def test_the_startup_benchmark_writes_an_imagenet_shaped_folder_and_reads_its_packed_table(tmp_path, capsys):
    from benchmarks.startup import make_folder, time_split_open

    make_folder(tmp_path / "shaped", 3, 5)
    assert sorted(os.listdir(tmp_path / "shaped" / "train" / "n00000002"))[:2] == ["n00000002_0.JPEG",
                                                                                    "n00000002_1.JPEG"]
    assert pack(tmp_path / "shaped", tmp_path / "shaped-packed", capsys=capsys).returncode == 0
    assert time_split_open(tmp_path / "shaped-packed") > 0 and time_split_open(tmp_path / "shaped") > 0
