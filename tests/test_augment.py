"""The timm/torchvision recipe flags: CutMix, the MixUp/CutMix switch, random erasing, RandAugment,
TrivialAugment, AugMix and repeated augmentation, each held to the library it mirrors, and a resume in the
middle of a run that uses them all."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch
from torchvision import transforms
from torchvision.transforms import v2

from helpers import refused, train_until_crash
from image_classification.arguments import parse_args
from image_classification.data.common import DataConfig, ShardSampler
from image_classification.data.transforms import PolicyDraws, TrainTransform, auto_augmentation
from image_classification.errors import UserError
from image_classification.system.cli import run as cli_run
from image_classification.train.batch_augment import augment_batch, cutmix_box, random_erase
from image_classification.train.losses import classification_loss, cutmix, mixup
from image_classification.training import main


def batch(n: int = 6, height: int = 32, width: int = 40) -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(100)
    return torch.randn(n, 3, height, width), torch.tensor([0, 1, 2, 3, 4, 0, 1, 2][:n])


# -- CutMix and the switch ------------------------------------------------------------------------------
@pytest.mark.parametrize("alpha", [0.2, 1.0, 5.0])
def test_cutmix_cuts_torchvision_s_boxes_and_mixes_its_labels(alpha):
    """Under the same torch seed: the same lambda, box, pasted pixels and area-corrected soft labels as
    torchvision's v2.CutMix, bit for bit."""
    images, labels = batch()
    for seed in range(25):
        torch.manual_seed(seed)
        ours = cutmix(images, labels, 5, cutmix_box(32, 40, alpha))
        torch.manual_seed(seed)
        theirs = v2.CutMix(alpha=alpha, num_classes=5)(images, labels)
        assert torch.equal(ours[0], theirs[0]) and torch.equal(ours[1], theirs[1]), seed


def test_cutmix_lambda_is_the_pasted_area_and_boxes_are_clipped_at_the_edges():
    images, labels = batch(4, 10, 10)
    mixed, soft = cutmix(images, labels, 5, (6, 0, 10, 5))  # a 4 x 5 box clipped at the top right
    assert torch.equal(mixed[1, :, 0:5, 6:10], images[0, :, 0:5, 6:10])
    assert torch.equal(mixed[0, :, 0:5, 6:10], images[3, :, 0:5, 6:10])  # the first takes the last's
    assert torch.equal(mixed[:, :, 5:], images[:, :, 5:]) and torch.equal(mixed[..., :6], images[..., :6])
    torch.testing.assert_close(soft[1], torch.tensor([0.2, 0.8, 0, 0, 0]))  # lambda = 1 - 20/100
    edges = set()
    for seed in range(200):
        torch.manual_seed(seed)
        x1, y1, x2, y2 = cutmix_box(7, 9, 1.0)
        assert 0 <= x1 <= x2 <= 9 and 0 <= y1 <= y2 <= 7
        edges |= {x1 == 0 or y1 == 0 or x2 == 9 or y2 == 7}
    assert edges == {True, False}


@pytest.mark.parametrize("flags", [dict(mixup_alpha=0.4), dict(cutmix_alpha=1.0),
                                   dict(mixup_alpha=0.4, cutmix_alpha=1.0, erase_prob=0.5)])
def test_mixed_soft_labels_sum_to_one(flags):
    images, labels = batch(8)
    np.random.seed(0)
    torch.manual_seed(0)
    for _ in range(20):
        _, soft = augment_batch(images, labels, num_classes=5, **flags)
        assert soft.shape == (8, 5)
        torch.testing.assert_close(soft.sum(dim=1), torch.ones(8))


def _cut(images: torch.Tensor, mixed: torch.Tensor) -> bool:
    """Whether ``mixed`` is a CutMix of ``images`` (every pixel its own or its predecessor's) rather than a
    MixUp blend."""
    return bool(((mixed == images) | (mixed == images.roll(1, 0))).all())


@pytest.mark.parametrize("switch", [0.0, 0.3, 1.0])
def test_the_switch_probability_picks_cutmix_for_that_share_of_batches(switch):
    images, labels = batch(4)
    np.random.seed(1)
    torch.manual_seed(1)
    cuts = sum(_cut(images, augment_batch(images, labels, num_classes=5, mixup_alpha=0.4, cutmix_alpha=1.0,
                                          switch_prob=switch)[0]) for _ in range(300))
    assert cuts == pytest.approx(300 * switch, abs=25)


def test_mixup_alone_draws_as_before_cutmix_existed():
    """A --mixup run keeps its draws (numpy's beta, one permutation): a run resumed across the change
    continues exactly."""
    images, labels = batch(6)
    np.random.seed(5)
    torch.manual_seed(5)
    lam = float(np.random.beta(0.2, 0.2))
    expected = mixup(images, labels, 5, lam, torch.randperm(6))
    np.random.seed(5)
    torch.manual_seed(5)
    got = augment_batch(images, labels, num_classes=5, mixup_alpha=0.2, cutmix_alpha=0.0)
    assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])
    assert augment_batch(images, labels, num_classes=5)[1] is labels  # nothing asked: class ids stay


def test_mixed_labels_with_smoothing_give_timm_s_loss():
    """timm smooths the one-hot targets and then mixes them; our loss smooths the mixed targets: the same
    cross entropy, for MixUp and CutMix weights alike."""
    timm_mixup = pytest.importorskip("timm.data.mixup")
    torch.manual_seed(3)
    logits, labels = torch.randn(6, 5), torch.tensor([0, 1, 2, 3, 4, 0])
    flip = torch.arange(5, -1, -1)  # timm pairs each sample with the batch's mirror image
    for lam, smoothing in ((0.7, 0.1), (0.35, 0.0), (0.9, 0.3)):
        _, soft = mixup(torch.zeros(6, 1, 1, 1), labels, 5, lam, flip)
        theirs = timm_mixup.mixup_target(labels, 5, lam=lam, smoothing=smoothing)
        expected = (-logits.log_softmax(-1) * theirs).sum(-1).mean()
        torch.testing.assert_close(classification_loss(logits, soft, smoothing), expected)


# -- random erasing -------------------------------------------------------------------------------------
@pytest.mark.parametrize("p", [0.5, 1.0])
def test_random_erase_erases_torchvision_s_rectangles(p):
    """Under the same torch seed, each image erased exactly as torchvision's RandomErasing(p) (v1 and v2,
    value 0 after normalisation) erases it; the batch handed in is left as it was."""
    images, _ = batch(8)
    before = images.clone()
    for seed in range(20):
        torch.manual_seed(seed)
        ours = random_erase(images, p)
        for eraser in (transforms.RandomErasing(p), v2.RandomErasing(p)):
            torch.manual_seed(seed)
            assert torch.equal(ours, torch.stack([eraser(image.clone()) for image in images])), seed
    assert torch.equal(images, before)
    torch.manual_seed(0)
    erased = (random_erase(images, 1.0) == 0).all(dim=1).flatten(1).any(dim=1)
    assert bool(erased.all())


# -- RandAugment, TrivialAugment, AugMix on the pytorch backend ---------------------------------------
@pytest.mark.parametrize("augmentation, theirs", [
    ("randaugment", lambda: v2.RandAugment(num_ops=3, magnitude=17)),
    ("trivialaugment", v2.TrivialAugmentWide),
    ("augmix", v2.AugMix),
])
def test_training_transform_applies_torchvision_s_augmentation(augmentation, theirs):
    """After the crop and flip, torchvision's transform with the flags' settings: the same seed gives the
    same pixels; without it the images differ."""
    config = DataConfig(data=None, data_backend="pytorch", image_size=32, batch_size=4, augmentation=augmentation,
                        randaugment_magnitude=17, randaugment_num_ops=3)
    plain = DataConfig(data=None, data_backend="pytorch", image_size=32, batch_size=4)
    image = torch.randint(0, 256, (3, 48, 40), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    expected_steps = [TrainTransform(plain), theirs()]
    changed = 0
    for seed in range(6):
        torch.manual_seed(seed)
        ours = TrainTransform(config)(image)
        torch.manual_seed(seed)
        assert torch.equal(ours, v2.Compose(expected_steps)(image)), seed
        torch.manual_seed(seed)
        changed += not torch.equal(ours, TrainTransform(plain)(image))
    assert changed >= 4


@pytest.mark.parametrize("augmentation", ["autoaugment", "randaugment", "trivialaugment"])
def test_a_policy_drawn_apart_from_its_image_then_applied_is_the_policy_bit_for_bit(augmentation):
    """What pytorch-gpu's workers draw (the operations and magnitudes, from a stand-in of the image's size) and its
    background thread applies (drawing nothing) is torchvision's policy on the image: the same pixels, and the
    generator left where the policy leaves it; every operation of the policy's space comes up."""
    config = DataConfig(data=None, data_backend="pytorch", image_size=32, batch_size=4, augmentation=augmentation,
                        randaugment_magnitude=17, randaugment_num_ops=3)
    policy = auto_augmentation(config)
    halves = PolicyDraws(policy)
    image = torch.randint(0, 256, (3, 32, 32), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    seen = set()
    for seed in range(120):
        torch.manual_seed(seed)
        expected = policy(image)
        after_policy = torch.rand(2)
        torch.manual_seed(seed)
        drawn = halves.draw(32, 32)
        after_draw = torch.rand(2)
        assert torch.equal(halves.apply(image, drawn), expected), (seed, drawn)
        assert torch.equal(after_draw, after_policy)
        seen.update(name for name, _ in drawn)
    space = ({name for rule in policy._policies for name, _, _ in rule} if augmentation == "autoaugment"
             else set(policy._AUGMENTATION_SPACE))
    assert seen == space
    with pytest.raises(TypeError, match="AugMix does not draw apart"):
        PolicyDraws(v2.AugMix())


# -- repeated augmentation ------------------------------------------------------------------------------
def _shares(size: int, world: int, repeats: int, epoch: int = 0, seed: int = 0) -> list[list[int]]:
    shares = []
    for rank in range(world):
        sampler = ShardSampler(size, rank, world, shuffle=True, seed=seed, repeats=repeats)
        sampler.set_epoch(epoch)
        shares.append([index for index, _ in sampler])
    return shares


@pytest.mark.parametrize("size, world, repeats", [(10, 3, 3), (23, 2, 2), (600, 4, 3), (300, 8, 4)])
def test_ra_sampler_deals_as_timm_s_repeat_aug_sampler(size, world, repeats):
    """Seed 0: the same indices, rank by rank and epoch by epoch, as timm's RepeatAugSampler (torchvision's
    RASampler, with timm's whole-dataset epoch for datasets under 256 images)."""
    timm_sampler = pytest.importorskip("timm.data.distributed_sampler")
    for epoch in (0, 1):
        for rank, share in enumerate(_shares(size, world, repeats, epoch)):
            theirs = timm_sampler.RepeatAugSampler(list(range(size)), num_replicas=world, rank=rank,
                                                   num_repeats=repeats)
            theirs.set_epoch(epoch)
            assert share == list(theirs), (epoch, rank)


def test_ra_sampler_shares_are_disjoint_and_show_each_image_n_times():
    """Before each rank keeps its epoch's length, the ranks' positions split the repeated, padded list
    without overlap: every image N times over the ranks, its copies on N different ranks.  After it, the
    epoch is as long as without repeats (torchvision's rounding to 256)."""
    size, world, repeats = 600, 4, 3
    samplers = [ShardSampler(size, rank, world, shuffle=True, seed=7, repeats=repeats) for rank in range(world)]
    full = [sampler._repeated(sampler._permutation()) for sampler in samplers]
    counts = Counter(index for share in full for index in share)
    assert sum(counts.values()) == size * repeats and set(counts.values()) == {repeats}
    ranks_of = {}
    for rank, share in enumerate(full):
        for index in share:
            ranks_of.setdefault(index, set()).add(rank)
    assert all(len(ranks) == repeats for ranks in ranks_of.values())
    shares = _shares(size, world, repeats, seed=7)
    assert [len(share) for share in shares] == [512 // world] * world
    assert all(share == whole[:len(share)] for share, whole in zip(shares, full))


def test_ra_sampler_gives_every_copy_its_own_seed_and_resumes_part_way():
    sampler = ShardSampler(24, 1, 2, shuffle=True, seed=3, repeats=2)
    sampler.set_epoch(4)
    pairs = list(sampler)
    assert len({seed for _, seed in pairs}) == len(pairs) == 12
    sampler.set_epoch(4, start=5)
    assert list(sampler) == pairs[5:]


def test_an_ra_epoch_without_a_whole_batch_is_refused():
    """500 images on 2 processes: 256 an epoch with --ra-reps, 128 each, too few for -b 200."""
    from image_classification.data.common import train_sampler
    from image_classification.system.runtime import Runtime

    runtime = Runtime(torch.device("cpu"), None, torch.contiguous_format, rank=1, local_rank=1, world_size=2)
    config = DataConfig(data=None, data_backend="pytorch", image_size=32, batch_size=200, ra_reps=3)
    with pytest.raises(UserError, match="--ra-reps 3: .* 128 of the 500 training images.*lower -b"):
        train_sampler(500, config, runtime)
    assert len(train_sampler(500, DataConfig(data=None, data_backend="pytorch", image_size=32, batch_size=128,
                                             ra_reps=3), runtime)) == 128


def _listed_share(order: list[int], repeats: int, rank: int, world: int) -> list[int]:
    """torchvision's RASampler as a list: every index ``repeats`` times, padded from the start, dealt out."""
    repeated = [index for index in order for _ in range(repeats)]
    total = -(-len(repeated) // world) * world
    repeated += repeated[:total - len(repeated)]
    return repeated[rank:total:world]


@pytest.mark.parametrize("size, world", [(1, 1), (1, 8), (2, 7), (5, 3), (23, 2), (300, 8), (600, 4)])
def test_the_repeated_share_is_computed_position_by_position_as_the_list_would_hold_it(size, world):
    """Every rank, repeat count, seed and epoch (padding shorter than a world, and longer than the list,
    included): the share computed from the permutation alone equals the list torchvision builds."""
    for repeats in (2, 3, 5, 9):
        for seed, epoch in ((0, 0), (7, 3)):
            for rank in range(world):
                sampler = ShardSampler(size, rank, world, shuffle=True, seed=seed, repeats=repeats)
                sampler.set_epoch(epoch)
                order = sampler._permutation()
                listed = _listed_share(order, repeats, rank, world)
                share = sampler._repeated(order)
                assert list(share) == listed and share[-1:] == listed[-1:], (repeats, seed, epoch, rank)
                assert [index for index, _ in sampler] == listed[:len(sampler)], (repeats, seed, epoch, rank)


def test_the_repeated_sampler_s_memory_does_not_grow_with_the_repeat_count():
    """An epoch of 20,000 repeats of 1,000 images held a 20-million-item list (160 MB); now only the
    permutation is held, the same as at 2 repeats."""
    import tracemalloc

    peaks = {}
    for repeats in (2, 20_000):
        sampler = ShardSampler(1000, 1, 4, shuffle=True, seed=3, repeats=repeats)
        tracemalloc.start()
        try:
            pairs = list(sampler)
            peaks[repeats] = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert len(pairs) == 192 and {index for index, _ in pairs} <= set(range(1000))
    assert peaks[20_000] < 2 * peaks[2] + 100_000, peaks


def test_more_repeats_than_an_epoch_shows_images_are_refused_in_one_line(image_folder, tmp_path, tiny_arch, capsys):
    """--ra-reps 1000000000 built a list of a billion copies of the dataset (MemoryError); an epoch of 24
    images (3 classes x 8) with 24 or more repeats in a row would be one image throughout."""
    from image_classification.data.common import train_sampler
    from image_classification.system.runtime import Runtime

    runtime = Runtime(torch.device("cpu"), None, torch.contiguous_format, rank=0, local_rank=0, world_size=1)
    config = DataConfig(data=None, data_backend="pytorch", image_size=32, batch_size=4, ra_reps=23)
    assert len({index for index, _ in train_sampler(24, config, runtime)}) == 2  # 23 in a row, then another
    argv = ["-a", tiny_arch, "--image-size", "32", "-b", "4", "--device", "cpu", "--data-backend", "pytorch",
            "-j", "0", "--epochs", "1", "--workspace", str(tmp_path / "run"), str(image_folder)]
    for repeats in ("24", "1000000000"):
        line = refused(cli_run(main, [*argv, "--ra-reps", repeats]), capsys)
        assert line == (f"error: --ra-reps {repeats}: each image that many times in a row fills an epoch's 24 "
                        "images (over 1 process(es)) with one image; give fewer than 24")


# -- the flags: refused values, one line ------------------------------------------------------------------
@pytest.mark.parametrize("argv, message", [
    (["--cutmix", "1e-320"], "argument --cutmix: must be 0 or from 1.175e-38"),
    (["--cutmix", "nan"], "argument --cutmix: must be 0 or from 1.175e-38"),
    (["--cutmix", "-1"], "--cutmix must be 0"),
    (["--mixup-switch-prob", "0.3", "--mixup", "0.2"], "needs both --mixup and --cutmix"),
    (["--mixup-switch-prob", "1.5", "--mixup", "0.2", "--cutmix", "1"], "between 0 and 1"),
    (["--randaugment-magnitude", "5"], "need --augmentation randaugment"),
    (["--augmentation", "randaugment", "--randaugment-magnitude", "31"], "0 to 30"),
    (["--augmentation", "randaugment", "--randaugment-num-ops", "0"], "at least 1"),
    (["--random-erase", "1.01"], "between 0 and 1"),
    (["--ra-reps", "0"], "at least 1"),
])
def test_bad_recipe_flags_are_one_line_and_exit_2(argv, message, capsys):
    assert message in refused(cli_run(main, ["--data-backend", "synthetic", *argv]), capsys)


def test_the_flags_reach_the_run_s_configuration():
    from image_classification.arguments.data import DataConfig
    from image_classification.arguments.optimisation import OptimConfig
    from image_classification.arguments.values import from_args

    args = parse_args(["/data", "--mixup", "0.2", "--cutmix", "1.0", "--mixup-switch-prob", "0.25",
                       "--random-erase", "0.1", "--ra-reps", "3", "--augmentation", "randaugment",
                       "--randaugment-magnitude", "12"])
    optim, data = from_args(OptimConfig, args), from_args(DataConfig, args)
    assert (optim.mixup, optim.cutmix, optim.switch_prob, data.random_erase) == (0.2, 1.0, 0.25, 0.1)
    assert (data.ra_reps, data.augmentation, data.randaugment) == (3, "randaugment", (12, 2))
    defaults = from_args(OptimConfig, parse_args(["/data", "--mixup", "0.2", "--cutmix", "1"]))
    assert defaults.switch_prob == 0.5
    with pytest.raises(UserError):
        parse_args(["/data", "--randaugment-num-ops", "2"])


# -- a resume in the middle of a run that uses every flag ------------------------------------------------
def test_a_crash_after_an_interval_checkpoint_resumes_bitwise_with_every_recipe_flag(image_folder, tmp_path,
                                                                                     tiny_arch):
    run = ["-a", tiny_arch, "--num-classes", "3", "--device", "cpu", "--data-backend", "pytorch", "-j", "0",
           "--image-size", "32", "-b", "4", "-p", "1", "--lr", "0.05", "--seed", "3", "--epochs", "2",
           "--mixup", "0.4", "--cutmix", "1.0", "--mixup-switch-prob", "0.5", "--label-smoothing", "0.1",
           "--random-erase", "0.5", "--ra-reps", "2", "--augmentation", "randaugment", "--checkpoint-interval",
           "2", "--progressive-resize", "32", "64", "0", "1", "--lr-schedule", "triangular", "--lr-peak-epoch", "1",
           "--val-tta", "flip", "--resume", "auto", str(image_folder)]  # epoch 1, where it resumes: 64 px
    assert main(run + ["--workspace", str(tmp_path / "straight")]) == 0
    train_until_crash(run + ["--workspace", str(tmp_path / "crashed")], 9)  # a step after the checkpoint at 8
    saved = torch.load(tmp_path / "crashed" / "checkpoint.pth.tar", weights_only=True)
    assert (saved["epoch"], saved["batch"]) == (1, 2)
    assert main(run + ["--workspace", str(tmp_path / "crashed")]) == 0
    straight = torch.load(tmp_path / "straight" / "checkpoint.pth.tar", weights_only=True)
    resumed = torch.load(tmp_path / "crashed" / "checkpoint.pth.tar", weights_only=True)
    assert resumed["iterations"] == straight["iterations"] == 12
    for name, tensor in straight["state_dict"].items():
        assert torch.equal(tensor, resumed["state_dict"][name]), name


def test_the_readme_s_draw_timing_script_runs(capsys):
    from helpers import load_script

    results = load_script("augment_draws").main(["--batch", "4", "--size", "32"])
    assert set(results) == {0.1, 0.25, 1.0} and all(ms > 0 for ms in results.values())
    assert "--random-erase 0.25:" in capsys.readouterr().out


# -- AutoAugment: whose policy runs where, said at start-up -----------------------------------------------
# The reference's AutoaugmentImageNetPolicy (image_classification/autoaugment.py): (probability, operation,
# magnitude) pairs, its operations named as DALI's auto_aug names them (None: an operation without one).
REFERENCE_AUTOAUGMENT = [
    ((0.8, "equalize", None), (0.8, "shear_y", 4)), ((0.4, "color", 9), (0.6, "equalize", None)),
    ((0.4, "color", 1), (0.6, "rotate", 8)), ((0.8, "solarize", 3), (0.4, "equalize", None)),
    ((0.4, "solarize", 2), (0.6, "solarize", 2)), ((0.2, "color", 0), (0.8, "equalize", None)),
    ((0.4, "equalize", None), (0.8, "solarize_add", 3)), ((0.2, "shear_x", 9), (0.6, "rotate", 8)),
    ((0.6, "color", 1), (1.0, "equalize", None)), ((0.4, "invert", None), (0.6, "rotate", 0)),
    ((1.0, "equalize", None), (0.6, "shear_y", 3)), ((0.4, "color", 7), (0.6, "equalize", None)),
    ((0.4, "posterize", 6), (0.4, "auto_contrast", None)), ((0.6, "solarize", 8), (0.6, "color", 9)),
    ((0.2, "solarize", 4), (0.8, "rotate", 9)), ((1.0, "rotate", 7), (0.8, "translate_y", 9)),
    ((0.0, "shear_x", 0), (0.8, "solarize", 4)), ((0.8, "shear_y", 0), (0.6, "color", 4)),
    ((1.0, "color", 0), (0.6, "rotate", 2)), ((0.8, "equalize", None), (0.0, "equalize", None)),
    ((1.0, "equalize", None), (0.6, "auto_contrast", None)), ((0.4, "shear_y", 7), (0.6, "solarize_add", 7)),
    ((0.8, "posterize", 2), (0.6, "solarize", 10)), ((0.6, "solarize", 8), (0.6, "equalize", None)),
    ((0.8, "color", 6), (0.4, "rotate", 5)),
]


def test_dali_s_autoaugment_policy_is_the_reference_s_and_torchvision_s_is_not():
    """What the start-up line claims: DALI's ImageNet policy, sub-policy for sub-policy, is the reference's
    (an operation of probability 0 left out); torchvision's is another table."""
    auto_augment = pytest.importorskip("nvidia.dali.auto_aug.auto_augment")

    ours = [[(p, op.name, m) for op, p, m in sub] for sub in auto_augment.get_image_net_policy().sub_policies]
    assert ours == [[(p, op, m) for p, op, m in sub if p > 0] for sub in REFERENCE_AUTOAUGMENT]
    theirs = v2.AutoAugment(v2.AutoAugmentPolicy.IMAGENET)._policies
    assert len(theirs) == 25 and theirs[0] == (("Posterize", 0.4, 8), ("Rotate", 0.6, 9))  # the paper's first


@pytest.mark.parametrize("backend, says", [
    ("dali-cpu", "DALI's auto_aug, on the CPU in DALI's threads, with the reference's ImageNet policy"),
    ("dali-gpu", "DALI's auto_aug, on the GPU, with the reference's ImageNet policy"),
    ("pytorch", "torchvision's, on the CPU in the loader workers, with the AutoAugment paper's ImageNet "
                "policy; the reference's policy is DALI's (--data-backend dali-cpu or dali-gpu)"),
    ("pytorch-gpu", "torchvision's, on the GPU, each image's operations drawn in the loader workers, with "
                    "the AutoAugment paper's ImageNet policy; the reference's policy is DALI's"),
    ("synthetic", "not applied, the synthetic batches are not augmented"),
])
def test_the_start_up_line_says_whose_autoaugment_runs_where(backend, says):
    from image_classification.data import augmentation_notice

    assert augmentation_notice(backend, "autoaugment").startswith(f"=> --augmentation autoaugment: {says}")
    assert augmentation_notice(backend, None) is None
    if backend != "synthetic":
        assert "policy" not in augmentation_notice(backend, "trivialaugment")  # one policy: nothing to tell


def test_a_training_run_with_autoaugment_says_where_it_runs(image_folder, tmp_path, tiny_arch, capsys):
    argv = ["-a", tiny_arch, "--image-size", "32", "-b", "4", "--device", "cpu", "--data-backend", "pytorch",
            "-j", "0", "--epochs", "1", "--prof", "1", "--augmentation", "autoaugment", str(image_folder)]
    assert main([*argv, "--training-only", "--workspace", str(tmp_path / "run")]) == 0
    out = capsys.readouterr().out
    assert "=> --augmentation autoaugment: torchvision's, on the CPU in the loader workers" in out
    assert main([*argv, "--evaluate", "--workspace", str(tmp_path / "eval")]) == 0
    assert "=> --augmentation" not in capsys.readouterr().out  # validation is not augmented: no line
