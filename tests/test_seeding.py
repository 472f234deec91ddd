"""One seed-mixing function: the streams of checkpoints written before it are unchanged."""

from __future__ import annotations

import pytest

from helpers import refused
from image_classification.data.common import ShardSampler, sample_seed
from image_classification.seeding import mix_seed
from image_classification.system.cli import run
from image_classification.training import main


@pytest.mark.parametrize("seed", [0, 1, 5, 12345, 2**31 - 1])
def test_every_stream_keeps_the_seeds_of_earlier_versions(seed):
    """The formulas each stream used before mix_seed, written out: resumed checkpoints draw the same."""
    for epoch in (0, 1, 7, 89):
        for position in (0, 3, 1000):
            assert sample_seed(seed, epoch, position) == \
                (seed * 1_000_003 + epoch * 7_919 + position * 104_729) % (2**63 - 1)
        rank, iterations = 3, 12_345
        assert mix_seed(seed + rank, epoch, iterations) == (seed + rank + 1_000_003 * epoch + 7_919 * iterations)
        assert mix_seed(epoch, seed) == seed * 1_000_003 + epoch  # the sampler's shuffle


def test_the_sampler_shuffles_as_it_did():
    import torch

    sampler = ShardSampler(50, rank=0, world_size=1, shuffle=True, seed=7)
    sampler.set_epoch(3)
    expected = torch.randperm(50, generator=torch.Generator().manual_seed(7 * 1_000_003 + 3)).tolist()
    assert [index for index, _ in sampler] == expected


def test_mix_seed_takes_at_most_three_terms_and_stays_in_range():
    assert 0 <= mix_seed(2**62, 2**62, 2**62, 2**62) < 2**63 - 1
    with pytest.raises(ValueError):
        mix_seed(0, 1, 2, 3, 4)


@pytest.mark.parametrize("seed", ["-1", str(2**63)])
def test_a_seed_a_checkpoint_could_not_record_is_refused(seed, tmp_path, capsys):
    argv = ["--data-backend", "synthetic", "--device", "cpu", "--seed", seed, "--workspace", str(tmp_path)]
    assert "--seed must be 0 to 2**63 - 1" in refused(run(main, argv), capsys)
