"""A JPEG data set for the loader and training benchmarks, written from numpy and Pillow alone.

    python benchmarks/jpeg_set.py --images 15360 -j 14 -o DIR/jpeg_set.json DIR

writes DIR/train/class_<c>/img_<i>.jpg: ``--images`` JPEGs of 500x375 at quality 90, spread over
``--classes`` folders, each a field of random "pink" noise whose amplitude falls as 1/f^1.6 with the
spatial frequency f, in three correlated colour channels.  Photographs have such a falling spectrum, and
the exponent is chosen so that the files are about the size of the photo set's (``benchmarks/benchmark_loader.py
--photos``, random cuts of scikit-image's photographs; docs/performance.md compares the two).  JPEG decoding
costs in proportion to the entropy-coded bytes and the pixels, so the set stands in for photographs where
none can be had: no download, no scikit-image (a GPU machine may have neither), and the same pixels on every
machine, image ``i`` drawn from its own seed whatever ``-j``.

Its last line, and ``-o``'s JSON: the count, the size, the mean bytes per file, the seconds it took and what one
image cost one process (its wall milliseconds), and the BLAS threads each encoding process had (one: see
:data:`ONE_THREAD`).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import json
import multiprocessing
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402

from image_classification.errors import UserError  # noqa: E402
from image_classification.system.cli import UserErrorParser, run  # noqa: E402

SIZE = (500, 375)  # width, height: the photo set's and --make-dataset's
QUALITY = 90
ALPHA = 1.6  # the spectrum's fall: 1.0 gives files three times a photograph's, 2.0 half of it
# How the channels mix one field each: neighbouring colours move together, as in photographs.
COLOURS = np.array([[1.0, 0.8, 0.6], [0.8, 1.0, 0.8], [0.6, 0.8, 1.0]], dtype=np.float32)
SEED = 0


@functools.lru_cache(maxsize=None)
def _amplitude(size: tuple[int, int], alpha: float) -> np.ndarray:
    """1/f^alpha over the half spectrum of a (height, width) field, its constant term kept finite."""
    width, height = size
    fy, fx = np.fft.fftfreq(height)[:, None], np.fft.rfftfreq(width)[None, :]
    return (np.maximum(np.hypot(fx, fy), 1 / max(size)) ** -alpha).astype(np.float32)


def pink_noise(index: int, size: tuple[int, int] = SIZE, alpha: float = ALPHA) -> np.ndarray:
    """Image ``index`` of the set: uint8 pixels (height, width, 3), from its own seed."""
    width, height = size
    rng = np.random.default_rng([SEED, index])
    shape = (3, height, width // 2 + 1)
    real, imaginary = (rng.standard_normal(shape, dtype=np.float32) for _ in range(2))
    spectrum = (real + 1j * imaginary).astype(np.complex64) * _amplitude(size, alpha)
    fields = np.fft.irfft2(spectrum, s=(height, width)).reshape(3, -1)
    mixed = COLOURS @ fields
    pixels = (mixed - mixed.mean()) / mixed.std() * 50 + 128
    return np.clip(pixels, 0, 255).astype(np.uint8).reshape(3, height, width).transpose(1, 2, 0)


def encode(index: int) -> bytes:
    """Image ``index`` as a quality-90 JPEG."""
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(pink_noise(index)).save(buffer, "JPEG", quality=QUALITY)
    return buffer.getvalue()


def image_path(root: Path, index: int, classes: int) -> Path:
    return root / "train" / f"class_{index % classes}" / f"img_{index:06d}.jpg"


# The variables that size the BLAS and OpenMP thread pools numpy may start, read once when numpy loads.  Each
# encoding process runs on one core of its own, so each gets one thread: with the machine's count in every
# process (numpy's default), the colour mixing's matrix product oversubscribes the cores and the set takes about
# twice as long (2 cores, 2 processes: 11-19 s against 25-26 s for 150 images, under load).
ONE_THREAD = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


@contextlib.contextmanager
def one_thread_each(workers: int):
    """A pool of ``workers`` fresh processes (spawned, so each loads numpy anew) with one BLAS thread each; this
    process's own environment is as it was once they have started."""
    before = {name: os.environ.get(name) for name in ONE_THREAD}
    os.environ.update({name: "1" for name in ONE_THREAD})
    try:
        pool = multiprocessing.get_context("spawn").Pool(workers)  # every process starts here, with the variables
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    with pool:
        yield pool


def blas_threads() -> int | None:
    """The threads of this process's BLAS pools (their largest), where threadpoolctl can tell; else None."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return None
    return max((pool["num_threads"] for pool in threadpool_info()), default=None)


def write_set(root: Path, images: int, classes: int, workers: int) -> tuple[int, int | None]:
    """Write the set into root/train; the bytes written, and the BLAS threads of an encoding process (None where
    that cannot be told)."""
    for label in range(classes):
        (root / "train" / f"class_{label}").mkdir(parents=True, exist_ok=True)
    total = 0
    with one_thread_each(workers) as pool:
        threads = pool.apply(blas_threads)
        for index, data in enumerate(pool.imap(encode, range(images), chunksize=16)):
            image_path(root, index, classes).write_bytes(data)
            total += len(data)
    return total, threads


def build_parser() -> argparse.ArgumentParser:
    parser = UserErrorParser(prog="jpeg_set.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("data", metavar="DIR", help="a new or empty folder; the images go into DIR/train")
    parser.add_argument("--images", type=int, default=1000, help="how many JPEGs (default: 1000)")
    parser.add_argument("--classes", type=int, default=4, help="class folders they are spread over (default: 4)")
    parser.add_argument("-j", "--workers", type=int, default=1, help="processes encoding them (default: 1)")
    parser.add_argument("-o", "--output", metavar="JSON", help="also write the summary there")
    return parser


def main(argv: list[str] | None = None) -> int:
    opts = build_parser().parse_args(argv)
    root = Path(opts.data)
    if opts.images < 1 or opts.classes < 1 or opts.workers < 1:
        raise UserError("--images, --classes and -j must be at least 1")
    if root.exists() and (not root.is_dir() or any(root.iterdir())):
        raise UserError(f"{root} is not an empty folder: the set is written into a new one")
    start = time.monotonic()
    total, threads = write_set(root, opts.images, opts.classes, opts.workers)
    seconds = time.monotonic() - start
    summary = {"images": opts.images, "classes": opts.classes, "width": SIZE[0], "height": SIZE[1],
               "quality": QUALITY, "alpha": ALPHA, "mean_bytes": round(total / opts.images),
               "seconds": round(seconds, 1), "workers": opts.workers, "blas_threads_per_worker": threads,
               "ms_per_image_per_worker": round(1000 * seconds * opts.workers / opts.images, 1)}
    if opts.output:
        from benchmarks.common import write_json  # imports torch: only where a JSON is asked for

        write_json(summary, opts.output)
    print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(run(main))
