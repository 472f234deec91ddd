"""``--progressive-resize MIN MAX START END``: the training crop of each epoch is a pure function of the epoch
(FFCV's ramp, in steps of 32 px), every data backend serves it, the raport and the log say it, a checkpoint
records the schedule and a resume follows it; refusals are one line."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch

from helpers import refused
from image_classification.data import get_loaders
from image_classification.data.layout import check_dataset
from image_classification.models.preprocessing import Preprocessing, ResizeSchedule, choose_preprocessing
from image_classification.records.raport import read_raport
from image_classification.system.cli import run as cli_run
from image_classification.system.runtime import Runtime
from image_classification.arguments.data import data_config
from image_classification.training import main

# FFCV's published ResNet-50 ramps (libffcv/ffcv-imagenet, rn50_configs/rn50_{E}_epochs.yaml): E: (start_ramp,
# end_ramp), from 160 to 192 px
FFCV_RAMPS = {16: (11, 13), 24: (17, 20), 32: (23, 27), 40: (29, 34), 56: (41, 48), 88: (65, 76)}


def ffcv_resolution(epoch: int, min_res: int, max_res: int, start_ramp: int, end_ramp: int) -> int:
    """FFCV's train_imagenet.py get_resolution, as its text reads (numpy's interp and round)."""
    if epoch <= start_ramp:
        return min_res
    if epoch >= end_ramp:
        return max_res
    interp = np.interp([epoch], [start_ramp, end_ramp], [min_res, max_res])
    return int(np.round(interp[0] / 32)) * 32


@pytest.mark.parametrize("epochs", sorted(FFCV_RAMPS))
def test_the_sizes_are_ffcv_s_for_each_published_ramp(epochs):
    start, end = FFCV_RAMPS[epochs]
    schedule = ResizeSchedule(160, 192, start, end)
    assert [schedule.size_at(e) for e in range(epochs)] == \
        [ffcv_resolution(e, 160, 192, start, end) for e in range(epochs)]
    assert schedule.size_at(0) == 160 and schedule.size_at(epochs - 1) == 192


def test_between_the_ends_the_sizes_are_multiples_of_32_kept_within_min_and_max():
    schedule = ResizeSchedule(100, 300, 0, 10)
    sizes = [schedule.size_at(e) for e in range(12)]
    assert sizes == [100, 128, 128, 160, 192, 192, 224, 256, 256, 288, 300, 300]  # 100 + 20e, to the nearest 32
    assert sorted(sizes) == sizes
    assert [schedule.size_at(e) for e in (-1, 0, 10, 99)] == [100, 100, 300, 300]
    assert ResizeSchedule(96, 112, 0, 2).size_at(1) == 96  # 104 is 3.25 x 32: the multiple 96 is within [96, 112]
    assert ResizeSchedule(100, 120, 0, 2).size_at(1) == 100  # 110: 96, below MIN: MIN
    assert ResizeSchedule(64, 128, 0, 2).size_at(1) == 96
    assert ResizeSchedule(64, 128, 2, 2).sizes(4) == [(0, 64), (2, 128)]  # a step at END
    assert ResizeSchedule(32, 64, 1, 2).size_at(1) == 32 and ResizeSchedule(32, 64, 0, 1).size_at(1) == 64


def test_a_half_step_rounds_up_where_ffcv_rounds_to_even():
    # 32 + 64 * 1/4 = 48 = 1.5 x 32: FFCV's numpy rounds it to 2 x 32 (even), as does a half up
    assert ResizeSchedule(32, 96, 0, 4).size_at(1) == 64 == ffcv_resolution(1, 32, 96, 0, 4)
    # 32 + 128 * 2/4 = 96... and 32 + 128 * 3/8 = 80 = 2.5 x 32: FFCV takes 64 (2, even), we take 96
    assert ResizeSchedule(32, 160, 0, 8).size_at(3) == 96
    assert ffcv_resolution(3, 32, 160, 0, 8) == 64


@pytest.mark.parametrize("values,message", [
    (["224", "160", "0", "3"], "MIN 224 is larger than MAX 160"),
    (["16", "64", "0", "3"], "MIN and MAX must be at least 32 px"),
    (["32", "20", "0", "3"], "MIN and MAX must be at least 32 px"),
    (["32", "64", "3", "1"], "needs 0 <= START <= END"),
    (["32", "64", "-1", "1"], "needs 0 <= START <= END"),
    (["32", "64", "1", "5"], "END 5 is not before --epochs 4"),
    (["32", "64", "1", "4"], "END 4 is not before --epochs 4: epoch END is the first at MAX 64 px"),  # never at MAX
])
def test_a_schedule_that_cannot_be_is_refused_in_one_line(values, message, capsys):
    argv = ["--data-backend", "synthetic", "--device", "cpu", "--epochs", "4", "--progressive-resize", *values]
    error = refused(cli_run(main, argv), capsys)
    assert error.startswith(f"error: --progressive-resize {' '.join(values)}: {message}"), error
    assert "\n" not in error


def test_a_fixed_training_crop_and_a_schedule_exclude_each_other(capsys):
    argv = ["--data-backend", "synthetic", "--epochs", "4", "--progressive-resize", "32", "64", "0", "2",
            "--train-crop-size", "48"]
    assert "leave out --train-crop-size" in refused(cli_run(main, argv), capsys)


# -- every backend serves each epoch its size --------------------------------------------------------------
SCHEDULE = ResizeSchedule(32, 64, 0, 2)  # epochs 0, 1, 2: 32, 64 (48 rounds up), 64
EXPECTED = [32, 64, 64]


def _config(root: Path | None, backend: str, workers: int = 0):
    from image_classification.arguments import parse_args

    args = parse_args([*([str(root)] if root else []), "--data-backend", backend, "-b", "4", "-j", str(workers),
                       "--seed", "3", "--num-classes", "3"])
    return data_config(args, preprocessing=Preprocessing(48, train_schedule=SCHEDULE))


def _sides(root, backend: str, memory_format=torch.contiguous_format, workers: int = 0) -> list[set[int]]:
    runtime = Runtime(torch.device("cpu"), None, memory_format)
    config = _config(root, backend, workers)
    classes = check_dataset(root, 3, want_train=True, want_val=True) if root else None
    if backend == "pytorch-gpu":  # main.py refuses it off CUDA; its loaders run as they are on the CPU's decoder
        from image_classification.data.device_decode import device_decode_loaders

        train, val = device_decode_loaders(config, runtime, classes, want_train=True, want_val=True)
    else:
        train, val = get_loaders(config, runtime, classes, want_train=True, want_val=True)
    seen = []
    for epoch in range(3):
        train.set_epoch(epoch)
        batches = list(train)
        assert batches
        assert all(images.is_contiguous(memory_format=memory_format) for images, _ in batches)
        seen.append({tuple(images.shape[-2:]) for images, _ in batches})
        val.set_epoch(epoch)
        assert {tuple(images.shape[-2:]) for images, _ in val} == {(48, 48)}  # validation keeps its own size
    return seen, train


@pytest.mark.parametrize("backend,workers", [("pytorch", 0), ("pytorch", 2), ("pytorch-gpu", 1), ("synthetic", 0)])
def test_every_backend_trains_each_epoch_at_its_size_and_validates_at_its_own(backend, workers, image_folder):
    seen, _ = _sides(None if backend == "synthetic" else image_folder, backend, torch.channels_last, workers)
    assert seen == [{(size, size)} for size in EXPECTED]


def test_dali_builds_its_training_pipeline_once_per_size(image_folder):
    pytest.importorskip("nvidia.dali")
    seen, train = _sides(image_folder, "dali-cpu", torch.channels_last)
    assert seen == [{(size, size)} for size in EXPECTED]
    assert train.builds == 2  # 32 px, then 64 px for epochs 1 and 2


@pytest.mark.parametrize("backend", ["pytorch", "dali-cpu"])
def test_packed_shards_follow_the_schedule_too(backend, image_folder, tmp_path):
    if backend.startswith("dali"):
        pytest.importorskip("nvidia.dali")
    from test_pack import pack

    assert pack(image_folder, tmp_path / "packed").returncode == 0
    seen, _ = _sides(tmp_path / "packed", backend)
    assert seen == [{(size, size)} for size in EXPECTED]


def test_a_resumed_epoch_starts_part_way_at_its_own_size(image_folder):
    """A mid-epoch resume builds its loaders afresh and starts epoch 1 at batch 2: the crops are the
    uninterrupted run's, at epoch 1's size."""
    runtime = Runtime(torch.device("cpu"), None, torch.contiguous_format)
    classes = check_dataset(image_folder, 3, want_train=True, want_val=False)
    config = _config(image_folder, "pytorch", 1)
    straight, _ = get_loaders(config, runtime, classes, want_train=True, want_val=False)
    for epoch in range(2):
        straight.set_epoch(epoch)
        whole = list(straight)
    resumed, _ = get_loaders(config, runtime, classes, want_train=True, want_val=False)
    resumed.set_epoch(1, 2)
    part = list(resumed)
    assert len(part) == len(whole) - 2
    for (a, a_targets), (b, b_targets) in zip(whole[2:], part):
        assert a.shape[-1] == 64 and torch.equal(a, b) and torch.equal(a_targets, b_targets)


# -- the run: its log, raport and checkpoint -----------------------------------------------------------------
def _run(tmp_path: Path, arch: str, *extra: str) -> list[str]:
    return ["-a", arch, "--num-classes", "3", "--device", "cpu", "--data-backend", "synthetic", "--prof", "2",
            "-b", "4", "--val-crop-size", "48", "--epochs", "4", "-p", "1", "--seed", "1", "--lr", "0.01",
            "--workspace", str(tmp_path), *extra]


def _epoch_sizes(raport: Path) -> list[int]:
    return [record["data"]["train.image_size"] for record in read_raport(raport)
            if record.get("type") == "LOG" and isinstance(record.get("step"), list) and len(record["step"]) == 1
            and "train.image_size" in record["data"]]


def test_the_raport_and_the_log_say_each_epoch_s_size(tmp_path, tiny_arch, capsys):
    assert main(_run(tmp_path, tiny_arch, "--progressive-resize", "32", "96", "1", "3", "--amp",
                     "--memory-format", "nhwc")) == 0
    out = capsys.readouterr().out
    assert _epoch_sizes(tmp_path / "experiment_raport.json") == [32, 32, 64, 96]
    assert "=> epoch 1: training crops of 32 px, --progressive-resize 32 96 1 3" in out
    assert "=> epoch 3: training crops of 64 px (from 32 px)" in out
    assert "=> epoch 4: training crops of 96 px (from 64 px)" in out
    assert "=> epoch 2:" not in out  # said when it changes, not every epoch
    assert re.findall(r"^Epoch \d/4: train .*, crops (\d+) px; val ", out, re.M) == ["32", "32", "64", "96"]
    parameters = next(r["data"] for r in read_raport(tmp_path / "experiment_raport.json") if r["step"] == "PARAMETER")
    assert parameters["progressive_resize"] == [32, 96, 1, 3]


def test_a_fixed_size_run_records_its_size_in_every_epoch_and_prints_no_crop_size(tmp_path, tiny_arch, capsys):
    assert main(_run(tmp_path, tiny_arch, "--epochs", "2", "--train-crop-size", "40")) == 0
    assert _epoch_sizes(tmp_path / "experiment_raport.json") == [40, 40]
    out = capsys.readouterr().out
    assert "training crops of" not in out and " px" not in out and "Epoch 2/2: train loss " in out


def test_the_checkpoint_records_the_schedule_and_a_resume_without_the_flag_follows_it(tmp_path, tiny_arch,
                                                                                      capsys):
    first = _run(tmp_path, tiny_arch, "--progressive-resize", "32", "64", "1", "2")
    assert main(first + ["--run-epochs", "2"]) == 0
    state = torch.load(tmp_path / "checkpoint.pth.tar", weights_only=True)
    assert state["preprocessing"]["train_schedule"] == {"min_size": 32, "max_size": 64, "start": 1, "end": 2}
    assert state["preprocessing"]["train_crop_size"] == 64
    assert Preprocessing.from_dict(state["preprocessing"]).train_schedule == ResizeSchedule(32, 64, 1, 2)
    capsys.readouterr()
    assert main(_run(tmp_path, tiny_arch, "--resume", "auto")) == 0
    assert _epoch_sizes(tmp_path / "experiment_raport.json") == [32, 32, 64, 64]
    assert "=> epoch 3: training crops of 64 px, --progressive-resize 32 64 1 2" in capsys.readouterr().out


def test_a_fixed_size_given_on_resume_replaces_the_recorded_schedule_and_says_so():
    recorded = Preprocessing(48, train_schedule=ResizeSchedule(32, 64, 1, 2))
    said = []
    chosen = choose_preprocessing(recorded, 224, "the checkpoint", said.append, train_crop_size=48, training=True)
    assert chosen.train_schedule is None and chosen.train_size_at(0) == 48
    assert said == ["--train-crop-size 48 replaces the progressive resize recorded in the checkpoint (32 px up to "
                    "epoch 1, 64 px from epoch 2 on, multiples of 32 px in between): every epoch trains on 48 px "
                    "crops"]
    said.clear()
    other = choose_preprocessing(recorded, 224, "the checkpoint", said.append, progressive_resize=[32, 96, 0, 3])
    assert other.train_schedule == ResizeSchedule(32, 96, 0, 3) and other.train_size == 96
    assert said == ["--progressive-resize 32 96 0 3 overrides the 32 64 1 2 recorded in the checkpoint"]
    said.clear()
    assert choose_preprocessing(recorded, 224, "the weights", said.append, image_size=64).train_schedule is None
    # inference says nothing of the schedule it never follows
    assert said == ["--image-size 64 overrides the 48 recorded in the weights (and its 64 px training crops)"]


@pytest.mark.parametrize("schedule", [{"min_size": 64, "max_size": 32, "start": 0, "end": 1},
                                      {"min_size": 32, "max_size": 64, "start": 2, "end": 1},
                                      {"min_size": 32, "max_size": 64, "start": 0},
                                      {"min_size": 32, "max_size": 96, "start": 0, "end": 1},  # train_crop_size 64
                                      {"min_size": 32.0, "max_size": 64, "start": 0, "end": 1}])
def test_a_damaged_recorded_schedule_is_refused_in_one_line(schedule):
    from image_classification.errors import UserError

    record = {**Preprocessing(48, train_schedule=ResizeSchedule(32, 64, 0, 1)).to_dict(), "train_schedule": schedule}
    with pytest.raises(UserError, match="the checkpoint records"):
        Preprocessing.from_dict(record)


def test_an_old_record_without_a_schedule_reads_as_one_size():
    record = Preprocessing(48, train_crop_size=40).to_dict()
    assert "train_schedule" not in record
    assert Preprocessing.from_dict(record).train_size_at(7) == 40


def test_one_image_a_batch_is_refused_where_the_ramp_starts_at_32_px(capsys):
    """At 32 px a ResNet's last map is one pixel, which BatchNorm cannot normalise over a batch of one: the
    smallest training crop counts, not the validation crop."""
    argv = ["--data-backend", "synthetic", "--device", "cpu", "-b", "1", "--epochs", "2", "--val-crop-size", "64",
            "--progressive-resize", "32", "64", "0", "1"]
    assert "-b 1 cannot train at 32 px" in refused(cli_run(main, argv), capsys)
