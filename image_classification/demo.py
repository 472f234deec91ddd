"""``make demo``: train a ResNet-18 on scikit-learn's bundled handwritten digits, end to end on a CPU.

The 1,797 8x8 digits are written once as a JPEG ImageFolder under ``data/digits/`` (every fifth image
goes to val/), then main.py's training runs on them with the recipe below and prints the val top1 and
where the checkpoint and raport are.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from PIL import Image

from .cli import run
from .errors import UserError
from .training import main as train_main

DATA_DIR = Path("data/digits")
WORKSPACE = Path("workspace/digits")
IMAGE_SIZE = 32
RECIPE = [
    "--data-backend", "pytorch", "--arch", "resnet18", "--num-classes", "10",
    "--image-size", str(IMAGE_SIZE), "--crop-scale", "0.6", "1.0", "--hflip", "0",
    "--batch-size", "64", "--epochs", "6", "--lr", "0.05", "--lr-schedule", "cosine",
    "--label-smoothing", "0.1", "--weight-decay", "5e-4", "--workers", "2", "--print-freq", "10",
    "--seed", "1", "--workspace", str(WORKSPACE),
]


def write_digits(root: Path, size: int = IMAGE_SIZE) -> Path:
    """Write the digits as ``root/{train,val}/<digit>/<n>.jpg``, grey ink on black, ``size`` pixels square."""
    try:
        from sklearn.datasets import load_digits
    except ImportError as error:  # the digits come with scikit-learn, an optional dependency
        raise UserError(f"the demo needs scikit-learn, whose digits it trains on ({error}); pip install "
                        ".[demo] in the repository, or pip install scikit-learn") from None

    digits = load_digits()
    for index, (pixels, label) in enumerate(zip(digits.images, digits.target)):
        split = "val" if index % 5 == 0 else "train"
        folder = root / split / str(label)
        folder.mkdir(parents=True, exist_ok=True)
        image = Image.fromarray((pixels * (255 / 16)).astype(np.uint8)).resize((size, size), Image.BICUBIC)
        image.convert("RGB").save(folder / f"{index:04d}.jpg", quality=95)
    return root


def main(argv: list[str] | None = None) -> int:
    if not (DATA_DIR / "val").is_dir():
        print(f"=> writing scikit-learn's handwritten digits to {DATA_DIR}/", flush=True)
        write_digits(DATA_DIR)
    command = RECIPE + list(argv or []) + [str(DATA_DIR)]
    if (WORKSPACE / "checkpoint.pth.tar").exists():
        print(f"=> replacing the earlier demo run in {WORKSPACE}/ (copy it elsewhere first to keep it)", flush=True)
        command.insert(0, "--overwrite")
    print("=> python main.py " + " ".join(command), flush=True)
    return train_main(command)


if __name__ == "__main__":
    sys.exit(run(main, sys.argv[1:]))
