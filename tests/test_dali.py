"""The DALI backends on the CPU: batches like the pytorch backend's, exact sharding, per-epoch shuffles,
crops that depend on the seed, epoch and position alone (exact resumes)."""

from __future__ import annotations

import importlib
import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from helpers import train_until_crash
from image_classification.arguments import parse_args
from image_classification.data.common import MEAN_255, STD_255
from image_classification.data.folder import folder_loaders
from image_classification.data.layout import check_dataset
from image_classification.errors import UserError
from image_classification.system.runtime import Runtime
from image_classification.arguments.data import data_config

SIZE = 32


@pytest.fixture
def dali():
    return pytest.importorskip("nvidia.dali")


def make_args(root: Path, *extra: str, backend: str = "dali-cpu", batch_size: int = 4):
    return parse_args([str(root), "--data-backend", backend, "-b", str(batch_size), "-j", "1", "--seed", "3", *extra])


def cpu_runtime(memory_format=torch.contiguous_format, rank: int = 0, world_size: int = 1) -> Runtime:
    return Runtime(torch.device("cpu"), None, memory_format, rank=rank, local_rank=rank, world_size=world_size)


def loaders(args, runtime: Runtime, *, want_train: bool = True, want_val: bool = True):
    from image_classification.data.dali import dali_loaders

    classes = check_dataset(args.data, args.num_classes, want_train=want_train, want_val=want_val)
    return dali_loaders(data_config(args, SIZE), runtime, classes, want_train=want_train, want_val=want_val)


def epoch(loader, number: int, **kwargs) -> list[tuple[torch.Tensor, torch.Tensor]]:
    loader.set_epoch(number, **kwargs)
    return list(loader)


# Flat colours survive any crop, flip and resize, so each image can be told apart after augmentation.
def _colour(index: int) -> tuple[int, int, int]:
    return 20 + 6 * index, 120, 230 - 6 * index


@pytest.fixture(scope="module")
def flat_folder(tmp_path_factory) -> Path:
    """3 classes, 7 train and 5 val images each (odd totals), every image a distinct flat colour."""
    root = tmp_path_factory.mktemp("flat")
    index = 0
    for split, count in (("train", 7), ("val", 5)):
        for label in range(3):
            folder = root / split / f"c{label}"
            folder.mkdir(parents=True)
            for item in range(count):
                Image.new("RGB", (40, 36), _colour(index)).save(folder / f"{item}.jpg", quality=95)
                index += 1
    return root


def identify(images: torch.Tensor) -> list[int]:
    """The index of the flat colour each normalised image shows."""
    mean = torch.tensor(MEAN_255).view(1, 3, 1, 1)
    std = torch.tensor(STD_255).view(1, 3, 1, 1)
    red = (images * std + mean)[:, 0].mean(dim=(1, 2))
    return [round((value - 20) / 6) for value in red.tolist()]


def seen(batches) -> list[int]:
    return [ident for images, _ in batches for ident in identify(images)]


# -- errors a user can cause ---------------------------------------------------------------------------
def test_missing_dali_is_a_user_error_and_the_module_still_imports(image_folder, monkeypatch):
    monkeypatch.setitem(sys.modules, "nvidia.dali", None)
    monkeypatch.delitem(sys.modules, "image_classification.data.dali", raising=False)
    module = importlib.import_module("image_classification.data.dali")
    args = make_args(image_folder)
    with pytest.raises(UserError, match="pip install nvidia-dali.*--data-backend pytorch"):
        module.dali_loaders(data_config(args, SIZE), cpu_runtime(), ["a"], want_train=True, want_val=True)


def test_dali_gpu_without_a_gpu_points_to_dali_cpu(image_folder):
    from image_classification.data.dali import dali_loaders

    args = make_args(image_folder, backend="dali-gpu")
    with pytest.raises(UserError, match="dali-cpu"):
        dali_loaders(data_config(args, SIZE), cpu_runtime(), ["a"], want_train=True, want_val=True)


def test_augmix_is_refused_naming_the_backend_that_has_it(image_folder):
    from image_classification.data.dali import dali_loaders

    args = make_args(image_folder, "--augmentation", "augmix")
    with pytest.raises(UserError, match="augmix is not supported with DALI.*--data-backend pytorch"):
        dali_loaders(data_config(args, SIZE), cpu_runtime(), ["a"], want_train=True, want_val=False)


def write_one_class(root: Path, images: list[Image.Image], suffix: str = ".jpg") -> Path:
    """The same images under train/only/ and val/only/."""
    for split in ("train", "val"):
        folder = root / split / "only"
        folder.mkdir(parents=True)
        for index, image in enumerate(images):
            image.save(folder / f"{index}{suffix}")
    return root


def test_unreadable_images_are_skipped_with_one_warning(dali, tmp_path, capsys):
    """As the pytorch backend does: a zero-byte and a corrupt JPEG are named once and left out."""
    write_one_class(tmp_path, [Image.new("RGB", (40, 36), _colour(index)) for index in range(7)])
    (tmp_path / "val" / "only" / "1.jpg").write_bytes(b"\xff\xd8\xff not a jpeg")
    (tmp_path / "val" / "only" / "4.jpg").write_bytes(b"")
    _, val = loaders(make_args(tmp_path, batch_size=2), cpu_runtime(), want_train=False)
    seen = sum(len(targets) for _, targets in epoch(val, 0))
    err = capsys.readouterr().err
    assert seen == 5 and val.skipped == 2
    assert err.count("warning: skipped unreadable image") == 2 and "1.jpg" in err and "4.jpg" in err
    assert sum(len(targets) for _, targets in epoch(val, 1)) == 5 and capsys.readouterr().err == ""
    assert val.builds == 2  # once, and again after the failure (both files in its read-ahead); not per pass


def test_a_dangling_link_is_skipped_with_one_warning(dali, tmp_path, capsys):
    """DALI's file reader fails on it: named once and left out, the pass going on without it."""
    write_one_class(tmp_path, [Image.new("RGB", (40, 36), _colour(index)) for index in range(5)])
    link = tmp_path / "val" / "only" / "2.jpg"
    link.unlink()
    link.symlink_to(tmp_path / "gone.jpg")
    _, val = loaders(make_args(tmp_path, batch_size=2), cpu_runtime(), want_train=False)
    assert sum(len(targets) for _, targets in epoch(val, 0)) == 4 and val.skipped == 1
    assert capsys.readouterr().err.count("warning: skipped unreadable image") == 1
    assert sum(len(targets) for _, targets in epoch(val, 1)) == 4 and val.builds == 2


# -- batches -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("memory_format", [torch.contiguous_format, torch.channels_last], ids=["nchw", "nhwc"])
def test_batches_match_the_pytorch_backend(dali, image_folder, memory_format):
    args = make_args(image_folder)
    runtime = cpu_runtime(memory_format)
    classes = check_dataset(args.data, args.num_classes, want_train=True, want_val=True)
    train, val = loaders(args, runtime)
    ref_train, ref_val = folder_loaders(data_config(args, SIZE), runtime, classes, want_train=True,
                                        want_val=True)
    assert (len(train), len(val), val.num_samples) == (len(ref_train), len(ref_val), ref_val.num_samples) == (6, 3, 12)

    for split, ours, theirs in (("train", train, ref_train), ("val", val, ref_val)):
        batches, ref_batches = epoch(ours, 0), epoch(theirs, 0)
        assert len(batches) == len(ours)
        for (images, targets), (ref_images, ref_targets) in zip(batches, ref_batches, strict=True):
            assert images.shape == ref_images.shape == (4, 3, SIZE, SIZE)
            assert images.dtype == torch.float32 and targets.dtype == torch.int64
            assert images.is_contiguous(memory_format=memory_format)
            assert images.stride() == ref_images.stride()
            assert -2.2 <= images.min() and images.max() <= 2.7
            # Both backends walk the same sampler, so the labels agree batch by batch.
            assert torch.equal(targets, ref_targets)
            if split == "val":  # the same resize sizes, antialiasing and centre crop as torchvision's
                assert ((images - ref_images).abs() * torch.tensor(STD_255).view(1, 3, 1, 1)).mean() < 0.3  # levels


@pytest.fixture(scope="module")
def photographs(tmp_path_factory) -> Path:
    """scikit-image's photographs as val JPEGs (quality 90, a class each): 1024x768 and 768x1024 with a camera's
    grain (which the pytorch backend decodes at a reduced scale), 500x375, and 40x30 (which the resize enlarges)."""
    samples = pytest.importorskip("skimage.data")
    root = tmp_path_factory.mktemp("photographs")
    rng = np.random.default_rng(0)
    for name in ("astronaut", "coffee", "chelsea", "rocket"):
        folder = root / "val" / name
        folder.mkdir(parents=True)
        photo = Image.fromarray(getattr(samples, name)()).convert("RGB")
        for index, size in enumerate(((1024, 768), (768, 1024), (500, 375), (40, 30))):
            pixels = np.asarray(photo.resize(size, Image.BICUBIC), dtype=np.float32)
            pixels = pixels + rng.normal(0, 6, size=pixels.shape[:2] + (1,))
            Image.fromarray(np.clip(np.rint(pixels), 0, 255).astype(np.uint8)).save(folder / f"{index}.jpg", quality=90)
    return root


def val_pixels(root: Path, backend: str, size: int, interpolation: str, decode_scale: str = "auto") -> torch.Tensor:
    """A validation pass of ``backend`` on ``root`` at ``size`` px, in grey levels (0-255), NCHW."""
    args = parse_args([str(root), "--data-backend", backend, "-b", "4", "-j", "1", "--interpolation", interpolation,
                       "--decode-scale", decode_scale])
    runtime = cpu_runtime()
    classes = check_dataset(args.data, args.num_classes, want_train=False, want_val=True)
    if backend == "pytorch":
        _, val = folder_loaders(data_config(args, size), runtime, classes, want_train=False, want_val=True)
    else:
        from image_classification.data.dali import dali_loaders

        _, val = dali_loaders(data_config(args, size), runtime, classes, want_train=False, want_val=True)
    std, mean = torch.tensor(STD_255).view(1, 3, 1, 1), torch.tensor(MEAN_255).view(1, 3, 1, 1)
    return torch.cat([(images * std + mean).round() for images, _ in epoch(val, 0)])


@pytest.mark.parametrize("size, interpolation", [(32, "bilinear"), (32, "bicubic"), (32, "triangular"),
                                                 (224, "bilinear")])
def test_validation_decodes_only_the_window_its_centre_crop_keeps_and_gives_the_whole_image_s_pixels(
        dali, photographs, size, interpolation, monkeypatch):
    """The decoder is asked for a window (ROI decoding), whose resize reaches the pixels that the whole image's
    resize and centre crop would give: within a grey level of the same pipeline with the window widened to the
    whole image."""
    fn = pytest.importorskip("nvidia.dali.fn")

    from image_classification.data import dali_pipeline

    decoders = []
    for name in ("image", "image_crop", "image_slice", "image_random_crop"):
        monkeypatch.setattr(fn.decoders, name, lambda *args, _name=name, _decode=getattr(fn.decoders, name), **kwargs:
                            decoders.append(_name) or _decode(*args, **kwargs))
    windowed = val_pixels(photographs, "dali-cpu", size, interpolation)
    assert decoders == ["image_slice"]
    monkeypatch.setattr(dali_pipeline, "_WINDOW_MARGIN", 10**6)  # the window: the whole image
    whole = val_pixels(photographs, "dali-cpu", size, interpolation)
    assert windowed.shape == whole.shape == (16, 3, size, size)
    difference = (windowed - whole).abs()
    assert difference.mean() < 0.01 and difference.max() <= 1, (float(difference.mean()), float(difference.max()))


@pytest.mark.parametrize("size, interpolation", [(32, "bilinear"), (64, "bicubic"), (224, "bilinear")])
def test_validation_stays_within_the_bounds_of_the_pytorch_backend_s(dali, photographs, size, interpolation):
    """Against the whole image's PIL resize (``--decode-scale full``) the resampling arithmetic alone, 0.3 grey
    levels on average; against the reduced decode (``auto``, which these sizes use on the large photographs) the
    reduced decode's bound; MAX_BOUND at any pixel."""
    from image_classification.data import reduced

    ours = val_pixels(photographs, "dali-cpu", size, interpolation)
    for decode_scale, mean_bound in (("full", 0.3), ("auto", reduced.MEAN_BOUND)):
        difference = (ours - val_pixels(photographs, "pytorch", size, interpolation, decode_scale)).abs()
        print(f"{size} px {interpolation}, against {decode_scale}: mean {difference.mean():.3f}, "
              f"max {difference.max():.0f}")
        assert difference.mean() <= mean_bound and difference.max() <= reduced.MAX_BOUND, decode_scale


@pytest.mark.parametrize("interpolation", ["bilinear", "bicubic", "triangular"])
def test_every_interpolation_and_no_flip_build(dali, image_folder, interpolation):
    args = parse_args([str(image_folder), "--data-backend", "dali-cpu", "-b", "4", "-j", "0", "--seed", "3",
                       "--interpolation", interpolation, "--hflip", "0", "--crop-scale", "0.5", "0.9"])
    train, val = loaders(args, cpu_runtime())
    for loader in (train, val):
        images, targets = next(iter(loader))
        assert images.shape == (4, 3, SIZE, SIZE) and targets.shape == (4,)


@pytest.mark.parametrize("augmentation", ["autoaugment", *(pytest.param(name, marks=pytest.mark.slow)
                                                         for name in ("randaugment", "trivialaugment"))])
def test_auto_augmentations_run_on_dali(dali, flat_folder, augmentation, recwarn):
    """DALI's auto_aug policies change the training crops (flat colours: only colour operations can show),
    and the same seed repeats them, from any batch on: a pipeline that starts part-way (a resume) draws
    what one that made the first batches does.  No operator DALI deprecates is called, auto_aug's own calls
    included (DALI shows its deprecation warnings whatever the filters say: ``recwarn`` sees them)."""
    extra = ["--randaugment-magnitude", "30", "--randaugment-num-ops", "3"] if augmentation == "randaugment" else []
    plain = torch.cat([images for images, _ in epoch(loaders(make_args(flat_folder), cpu_runtime(),
                                                              want_val=False)[0], 0)])
    runs = []
    for start_batch in (0, 2):
        train, _ = loaders(make_args(flat_folder, "--augmentation", augmentation, *extra), cpu_runtime(),
                           want_val=False)
        runs.append(torch.cat([images for images, _ in epoch(train, 0, start_batch=start_batch)]))
    assert runs[0].shape == plain.shape == (20, 3, SIZE, SIZE)
    assert torch.equal(runs[0][8:], runs[1])
    assert not torch.equal(runs[0], plain)
    assert [str(w.message).splitlines()[0] for w in recwarn if issubclass(w.category, DeprecationWarning)] == []


def test_repeated_augmentation_shows_each_image_in_several_crops(dali, flat_folder):
    """--ra-reps 3 on one process: the 21 images fill one epoch of 21 (five batches of 4 kept), each image
    in three consecutive positions."""
    train, _ = loaders(make_args(flat_folder, "--ra-reps", "3"), cpu_runtime(), want_val=False)
    idents = seen(epoch(train, 0))
    assert len(train) == 5 and len(idents) == 20
    assert all(idents[i] == idents[i + 1] == idents[i + 2] for i in range(0, 18, 3))


@pytest.mark.parametrize("hflip", [0.0, 1.0])
def test_hflip_is_the_flip_probability(dali, tmp_path, hflip):
    ramp = np.tile(np.linspace(0, 255, 48, dtype=np.uint8)[None, :, None], (40, 1, 3))  # dark left, bright right
    write_one_class(tmp_path, [Image.fromarray(ramp)] * 4, suffix=".png")
    args = parse_args([str(tmp_path), "--data-backend", "dali-cpu", "-b", "4", "-j", "1", "--seed", "3",
                       "--hflip", str(hflip)])
    images, _ = next(iter(loaders(args, cpu_runtime(), want_val=False)[0]))
    left, right = images[..., : SIZE // 2].mean(dim=(1, 2, 3)), images[..., SIZE // 2 :].mean(dim=(1, 2, 3))
    assert bool((left > right).all()) == (hflip == 1.0) and bool((left < right).all()) == (hflip == 0.0)


def test_trains_and_validates_end_to_end(dali, image_folder, tmp_path):
    from image_classification.training import main

    argv = ["--data-backend", "dali-cpu", "-a", "resnet18", "--epochs", "1", "-b", "4", "-j", "1",
            "--image-size", str(SIZE), "--workspace", str(tmp_path), "--device", "cpu", str(image_folder)]
    assert main(argv) == 0
    records = [json.loads(line.removeprefix("DLLL "))
               for line in (tmp_path / "experiment_raport.json").read_text().splitlines()]
    assert any("val.top1" in record.get("data", {}) for record in records)


# -- sharding and shuffling ----------------------------------------------------------------------------
def test_validation_shards_cover_every_image_once(dali, flat_folder):
    args = make_args(flat_folder)
    per_rank = []
    for rank in range(2):
        _, val = loaders(args, cpu_runtime(rank=rank, world_size=2), want_train=False)
        batches = epoch(val, 0)
        assert [len(t) for _, t in batches] == ([4, 4] if rank == 0 else [4, 3])  # 15 images: 8 + 7
        assert len(batches) == len(val) and sum(len(t) for _, t in batches) == val.num_samples
        labels = [label for _, targets in batches for label in targets.tolist()]
        idents = seen(batches)
        assert labels == [(ident - 21) // 5 for ident in idents]  # val images 21..35, 5 per class
        per_rank.append(idents)
    assert sorted(per_rank[0] + per_rank[1]) == list(range(21, 36))


def test_train_shards_are_disjoint_and_reshuffled(dali, flat_folder):
    args = make_args(flat_folder)
    trains = [loaders(args, cpu_runtime(rank=r, world_size=2), want_val=False)[0] for r in range(2)]
    assert [len(t) for t in trains] == [2, 2]  # 21 images: 10 per rank, 2 whole batches of 4
    orders = {}
    for number in (0, 1):
        shards = [seen(epoch(train, number)) for train in trains]
        assert all(len(shard) == 8 == len(set(shard)) for shard in shards)
        assert not set(shards[0]) & set(shards[1])
        assert all(0 <= ident < 21 for shard in shards for ident in shard)
        orders[number] = shards
    assert orders[0] != orders[1]


def test_an_epoch_is_reproducible_and_can_start_part_way(dali, flat_folder):
    args = make_args(flat_folder)
    first = loaders(args, cpu_runtime(), want_val=False)[0]
    again = loaders(args, cpu_runtime(), want_val=False)[0]
    batches, repeat = epoch(first, 2), epoch(again, 2)
    assert all(torch.equal(a, b) and torch.equal(s, t) for (a, s), (b, t) in zip(batches, repeat, strict=True))
    resumed = epoch(again, 2, start_batch=3)
    assert seen(resumed) == seen(batches[3:])
    assert len(again) == len(batches) == 5


def test_crops_depend_on_the_epoch_and_position_alone(dali, image_folder):
    """A pipeline that has made a whole epoch, and one built to start an epoch part-way (a resume), give
    bitwise the same batches: the crops and flips do not follow the pipeline's history (auto_aug's draws:
    test_auto_augmentations_run_on_dali)."""
    args = make_args(image_folder)
    straight = loaders(args, cpu_runtime(), want_val=False)[0]
    epoch(straight, 0)
    expected = epoch(straight, 1)
    resumed = loaders(args, cpu_runtime(), want_val=False)[0]
    batches = epoch(resumed, 1, start_batch=2)
    assert len(expected) == 6 and len(batches) == 4
    for (images, targets), (ref_images, ref_targets) in zip(batches, expected[2:], strict=True):
        assert torch.equal(targets, ref_targets) and torch.equal(images, ref_images)


# -- reading the files ---------------------------------------------------------------------------------
class ImageOpens:
    """An audit hook: the .jpg files Python code in this process opens (np.fromfile, open, PIL) while
    ``recording``.  DALI's C++ threads open files without passing through it."""

    def __init__(self) -> None:
        self.recording, self.paths = False, []

    def __call__(self, event: str, args: tuple) -> None:
        if self.recording and event == "open" and isinstance(args[0], (str, bytes)):
            if os.fsdecode(args[0]).endswith(".jpg"):
                self.paths.append(os.fsdecode(args[0]))


@pytest.fixture(scope="session")
def image_opens() -> ImageOpens:
    hook = ImageOpens()
    sys.addaudithook(hook)  # audit hooks cannot be removed: one for the session, idle unless recording
    return hook


def test_the_training_thread_reads_no_image(dali, flat_folder, image_opens):
    """The feed hands DALI paths and its thread pool reads the files: no Python code in this process,
    the training loop's thread included, opens one, yet every image arrives in the sampler's order."""
    from image_classification.data.common import ShardSampler

    train, val = loaders(make_args(flat_folder), cpu_runtime())
    probe = str(flat_folder / "train" / "c0" / "0.jpg")
    image_opens.recording = True
    try:
        np.fromfile(probe, dtype=np.uint8)  # as the feed once read every file: the hook sees it
        batches, val_batches = epoch(train, 1), epoch(val, 1)
    finally:
        image_opens.recording = False
    assert image_opens.paths == [probe]
    sampler = ShardSampler(21, 0, 1, shuffle=True, seed=3)
    sampler.set_epoch(1)
    assert seen(batches) == [index for index, _ in sampler][:20]
    assert sorted(seen(val_batches)) == list(range(21, 36))


# -- one pipeline per split and run --------------------------------------------------------------------
def test_the_pipeline_is_built_once_and_fed_each_epoch_s_order(dali, flat_folder):
    """Building a pipeline allocates its decoders' buffers: once per run, then every pass feeds it."""
    from image_classification.data.common import ShardSampler

    args = make_args(flat_folder)
    train, val = loaders(args, cpu_runtime())
    labels = {ident: ident // 7 for ident in range(21)}  # train images 0..20, 7 per class
    for number in range(3):
        batches = epoch(train, number)
        sampler = ShardSampler(21, 0, 1, shuffle=True, seed=3)
        sampler.set_epoch(number)
        expected = [index for index, _ in sampler][:20]  # whole batches of 4
        assert seen(batches) == expected  # the pytorch backend's order: flat folder index = sample index
        assert [label for _, targets in batches for label in targets.tolist()] == [labels[i] for i in expected]
        assert sorted(seen(epoch(val, number))) == list(range(21, 36))
    assert (train.builds, val.builds) == (1, 1)


def test_a_pass_left_part_way_does_not_leak_into_the_next(dali, flat_folder):
    """--prof and early stops leave a pass unfinished; the next one still starts at its own first image."""
    args = make_args(flat_folder)
    train = loaders(args, cpu_runtime(), want_val=False)[0]
    whole = seen(epoch(train, 1))
    train.set_epoch(0)
    next(iter(train))  # one batch of epoch 0, the pipeline's read-ahead left in its queue
    assert seen(epoch(train, 1)) == whole
    assert seen(epoch(train, 1, start_batch=2)) == whole[8:]
    assert train.builds == 1


# -- resumes -------------------------------------------------------------------------------------------
def _differing(straight: Path, resumed: Path) -> list[str]:
    """The names of the weights that differ between two runs' last checkpoints (both finished: 12 steps)."""
    first, second = (torch.load(run / "checkpoint.pth.tar", weights_only=True) for run in (straight, resumed))
    assert first["iterations"] == second["iterations"] == 12
    weights = second["state_dict"]
    return [name for name, tensor in first["state_dict"].items() if not torch.equal(tensor, weights[name])]


def resume_run(image_folder: Path, arch: str, *extra: str) -> list[str]:
    return ["-a", arch, "--num-classes", "3", "--device", "cpu", "--data-backend", "dali-cpu", "-j", "1",
            "--image-size", str(SIZE), "-b", "4", "--lr", "0.05", "--seed", "3", "--epochs", "2", "-p", "1",
            "--checkpoint-interval", "2", "--progressive-resize", str(SIZE), str(2 * SIZE), "0", "1", "--resume", "auto",
            *extra, str(image_folder)]  # epoch 1, where the resumed runs start, trains at 64 px


@pytest.mark.slow  # five runs; test_crops_depend_on_the_epoch_and_position_alone is the loaders' part
@pytest.mark.filterwarnings("error::DeprecationWarning")  # auto_aug's own calls included
@pytest.mark.parametrize("augmentation", [[], ["--augmentation", "trivialaugment"]], ids=["crop", "auto-aug"])
def test_a_resumed_run_draws_the_crops_of_an_uninterrupted_one(dali, image_folder, tmp_path, tiny_arch,
                                                               augmentation):
    """Stopped at the end of epoch 0 (--run-epochs 1) or killed mid-epoch 1 after an interval checkpoint, a
    resumed dali-cpu run ends with bitwise the weights of an uninterrupted one: every crop, flip and
    augmentation depends on the seed, epoch and position alone, not on the pipeline's history."""
    from image_classification.training import main

    run = resume_run(image_folder, tiny_arch, *augmentation)
    assert main(run + ["--workspace", str(tmp_path / "straight")]) == 0
    assert main(run + ["--workspace", str(tmp_path / "staged"), "--run-epochs", "1"]) == 0
    assert main(run + ["--workspace", str(tmp_path / "staged")]) == 0
    train_until_crash(run + ["--workspace", str(tmp_path / "crashed")], 9)  # a step after the checkpoint at 8
    saved = torch.load(tmp_path / "crashed" / "checkpoint.pth.tar", weights_only=True)
    assert (saved["epoch"], saved["batch"]) == (1, 2)
    assert main(run + ["--workspace", str(tmp_path / "crashed")]) == 0
    assert _differing(tmp_path / "straight", tmp_path / "staged") == []
    assert _differing(tmp_path / "straight", tmp_path / "crashed") == []
