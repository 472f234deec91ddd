"""How long the host takes to draw ``--random-erase``'s rectangles for one batch: the part of the
device-batch augmentation that runs on the training loop's thread (the erasing itself runs on the device).

``python scripts/augment_draws.py [--batch 256] [--size 224]`` prints milliseconds per batch (the best of
five) for a few erase probabilities, on one thread.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from image_classification.system.cli import UserErrorParser, positive_int, run  # noqa: E402
from image_classification.train.batch_augment import erase_box  # noqa: E402


def draw_ms(batch: int, size: int, p: float, repeats: int = 5) -> float:
    """Best-of-``repeats`` milliseconds to draw one batch's erase rectangles at probability ``p``."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(batch):
            erase_box(size, size, p)
        best = min(best, time.perf_counter() - start)
    return best * 1e3


def main(argv: list[str] | None = None) -> dict[float, float]:
    parser = UserErrorParser(prog="augment_draws.py", description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=positive_int, default=256)
    parser.add_argument("--size", type=positive_int, default=224)
    opts = parser.parse_args(argv)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    results = {p: draw_ms(opts.batch, opts.size, p) for p in (0.1, 0.25, 1.0)}
    print(f"torch {torch.__version__}, batch {opts.batch}, {opts.size} px")
    for p, ms in results.items():
        print(f"--random-erase {p}: {ms:.1f} ms per batch")
    return results


def command(argv: list[str] | None = None) -> int:
    main(argv)
    return 0


if __name__ == "__main__":
    sys.exit(run(command))
