"""torchvision's recipe (``launch.py --recipe torchvision-v2``), shrunk to the handwritten digits at 32 px,
trains as well as the demo's recipe: its val top-1 after the same number of epochs is at most 2 points
below the demo's.  Both run the ``tiny`` architecture on scikit-learn's digits, written as ``make demo``
writes them.

What the shrinking changes, and why; every other value is the preset's (SGD momentum 0.9, cosine, label
smoothing 0.1, MixUp 0.2, CutMix 1.0, TrivialAugment, random erasing 0.1, weight decay 2e-5 without norm
weight decay, EMA every 32 steps, repeated augmentation x4):

- 32 px everywhere (train crop, validation resize and crop).  The FixRes sizes do not shrink: at 32 px a
  ResNet's last feature map is 1x1, and validating larger crops than it trained on measured 13-21% top-1
  after 6 epochs instead of 93%.
- 30 epochs for both recipes instead of 600 (the warm-up, 5/600 of the run, rounds to none).  The heavy
  regularisation pays off slowly, the more so as TrivialAugment's translations reach 32 px whatever the
  image size (the whole image here, a seventh of a 224 px crop).  Measured with this architecture, seeds
  1-3, one thread: at the demo's own 6 epochs 93.3% against 98.3% (seed 1); at 20 epochs gaps of 2.2, 1.4
  and 0.8 points; at 30 epochs 98.6-98.9% against 100.0% (seed 1).  The test takes about two minutes on
  one core, so it is marked slow (`make test-all`).
- Batch 64 without gradient accumulation (the preset's 1,024 would be one optimizer step per epoch here),
  with the learning rate scaled linearly: 0.5 x 64 / 1,024.
- What the demo sets for the digits rather than for a recipe: no flips (digits are not mirror images of
  themselves) and crops of 60-100% of the image (smaller crops cut the digit away).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers import launch_on
from image_classification import demo, launch
from image_classification.records.raport import read_raport
from image_classification.training import main as train_main

EPOCHS = 30
DIGITS_SETTINGS = ["--hflip", "0", "--crop-scale", "0.6", "1.0"]  # also in the demo's recipe
SHRUNK = ["-b", "64", "--optimizer-batch-size", "-1", "--lr", str(0.5 * 64 / 1024), "--warmup", "0",
          "--image-size", "32", "--train-crop-size", "32", "--val-resize-size", "32", "--val-crop-size", "32",
          *DIGITS_SETTINGS]


@pytest.fixture(scope="module")
def digits(tmp_path_factory) -> Path:
    return demo.write_digits(tmp_path_factory.mktemp("digits"))


def _last_top1(workspace: Path) -> float:
    scores = [record["data"]["val.top1"] for record in read_raport(workspace / "experiment_raport.json")
              if record.get("type") == "LOG" and "val.top1" in record.get("data", {})]
    assert len(scores) >= EPOCHS, scores
    return scores[-1]


@pytest.mark.slow
def test_the_shrunk_torchvision_recipe_scores_within_2_points_of_the_demo_s(digits, tiny_arch, tmp_path):
    common = ["-a", tiny_arch, "--num-classes", "10", "--epochs", str(EPOCHS), "--seed", "1", "--workers", "0",
              "--print-freq", "100"]
    assert all(flag in demo.RECIPE for flag in DIGITS_SETTINGS)
    assert train_main([*demo.RECIPE, *common, "--workspace", str(tmp_path / "demo"), str(digits)]) == 0
    recipe = ["--model", "resnet50", "--precision", "FP32", "--mode", "convergence", "--platform", "CPU",
              "--recipe", "torchvision-v2", *common, *SHRUNK, "--workspace", str(tmp_path / "recipe"), str(digits)]
    assert launch_on(recipe, False) == 0

    demo_top1, recipe_top1 = _last_top1(tmp_path / "demo"), _last_top1(tmp_path / "recipe")
    assert demo_top1 > 95  # the baseline itself trained
    assert recipe_top1 >= demo_top1 - 2, (recipe_top1, demo_top1)
