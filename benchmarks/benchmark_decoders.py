"""Time the JPEG decoders a loader could use, on the same images: the project's CPU decoders (TorchCodec's,
torchvision's, Pillow's: each JPEG whole, to the uint8 tensor training crops from), Pillow's decode to an image
alone, libjpeg's reduced scales (1/2, 1/4, 1/8) and, where a library decodes a region, a centred half of the image.

    python benchmarks/benchmark_decoders.py DIR [--images 16] [--rounds 3]

DIR holds JPEGs (any depth below it; ``benchmark_loader.py --camera N DIR`` writes 12 MP ones).  Each decoder
decodes every image once per round, rounds alternating between decoders, so load from other jobs hits them
alike, after one warm-up decode each (not timed: libraries load, buffers grow); the table gives each one's median
milliseconds per image over the rounds, wall clock and the CPU time of this thread (the steadier figure on a
machine shared with other jobs), and its CPU time's speed over torchvision's whole decode, today's and before
this release the training decode.  A library that is not installed is listed as such: install candidates beside
the project's environment (``pip install --target /tmp/jpeglibs torchcodec simplejpeg opencv-python-headless``
and ``PYTHONPATH=/tmp/jpeglibs``) to compare them without adding them to it.
"""

from __future__ import annotations

import io
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from image_classification.data.decoders import TORCHVISION_DEPRECATION, cpu_decoder  # noqa: E402
from image_classification.errors import UserError  # noqa: E402
from image_classification.system import machine  # noqa: E402
from image_classification.system.cli import UserErrorParser, run  # noqa: E402

SCALES = (1, 2, 4, 8)
BASE = "torchvision decode_jpeg, to a tensor (whole)"


def _pillow(scale: int) -> Callable[[bytes], object]:
    from PIL import Image

    def decode(raw: bytes):
        with Image.open(io.BytesIO(raw)) as image:
            if scale > 1:
                width, height = image.size
                image.draft("RGB", (-(-width // scale), -(-height // scale)))
            image.load()
            return image.size

    return decode


def _project(library: str) -> Callable[[bytes], object]:
    """The project's decoder of ``library`` (data/decoders.py), as decode_rgb_tensor calls it: the bytes to a uint8
    tensor, TorchCodec's with its EXIF reading hidden."""
    import torch

    from image_classification.data import decoders

    decoder = decoders.load(library)
    if decoder is None:
        raise ImportError(f"{library} is not installed")
    return lambda raw: decoder.decode(torch.frombuffer(bytearray(raw), dtype=torch.uint8)).shape


def _simplejpeg(scale: int):
    import simplejpeg

    return lambda raw: simplejpeg.decode_jpeg(raw, "RGB", min_factor=scale).shape


def _opencv(scale: int):
    import cv2
    import numpy as np

    flag = {1: cv2.IMREAD_COLOR_RGB, 2: cv2.IMREAD_REDUCED_COLOR_2, 4: cv2.IMREAD_REDUCED_COLOR_4,
            8: cv2.IMREAD_REDUCED_COLOR_8}[scale]
    cv2.setNumThreads(1)
    return lambda raw: cv2.imdecode(np.frombuffer(raw, np.uint8), flag).shape


def _nvimgcodec(region: bool):
    from nvidia import nvimgcodec

    decoder = nvimgcodec.Decoder(device_id=nvimgcodec.NVIMGCODEC_DEVICE_CPU_ONLY,
                                 backends=[nvimgcodec.Backend(nvimgcodec.BackendKind.CPU_ONLY)])

    def decode(raw: bytes):
        stream = nvimgcodec.CodeStream(raw)
        if region:
            height, width = stream.height, stream.width
            stream = stream.get_sub_code_stream(region=nvimgcodec.Region(height // 4, width // 4, 3 * height // 4,
                                                                         3 * width // 4))
        return decoder.decode(stream).shape

    return decode


def decoders() -> dict[str, Callable[[bytes], object] | str]:
    """Each candidate's decode function, or why it cannot run here."""
    makers: dict[str, Callable[[], Callable[[bytes], object]]] = {
        BASE: lambda: _project("torchvision"),
        "TorchCodec decode_jpeg, to a tensor (whole)": lambda: _project("torchcodec"),
        "Pillow open + convert, to a tensor (whole)": lambda: _project("pillow"),
    }
    for scale in SCALES:
        what = "whole" if scale == 1 else f"1/{scale}"
        pillow = "open + load (whole, to an image)" if scale == 1 else f"draft ({what})"
        makers[f"Pillow {pillow}"] = lambda s=scale: _pillow(s)
        makers[f"simplejpeg ({what})"] = lambda s=scale: _simplejpeg(s)
        makers[f"OpenCV imdecode ({what})"] = lambda s=scale: _opencv(s)
    makers["nvImageCodec CPU (whole)"] = lambda: _nvimgcodec(False)
    makers["nvImageCodec CPU (centred half region)"] = lambda: _nvimgcodec(True)
    found = {}
    for name, make in makers.items():
        try:
            found[name] = make()
        except Exception as error:  # not installed, or no CPU backend
            found[name] = f"unavailable ({type(error).__name__}: {str(error).splitlines()[0][:80]})"
    return found


def main(argv: list[str] | None = None) -> int:
    parser = UserErrorParser(prog="benchmark_decoders.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("data", metavar="DIR", help="a folder of JPEGs")
    parser.add_argument("--images", type=int, default=16, help="JPEGs to decode each round (default: 16)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds over every decoder (default: 3)")
    opts = parser.parse_args(argv)
    paths = sorted(path for path in Path(opts.data).rglob("*") if path.suffix.lower() in (".jpg", ".jpeg"))
    if not paths:
        raise UserError(f"no JPEGs under {opts.data}")
    images = [path.read_bytes() for path in paths[:opts.images]]
    candidates = decoders()
    usable = {name: decode for name, decode in candidates.items() if callable(decode)}
    if BASE not in usable:
        raise UserError(f"torchvision's decoder, the base of the comparison, cannot run here: {candidates[BASE]}")
    with warnings.catch_warnings():  # torchvision's deprecation of its decoders, at every call from 0.29 on
        warnings.filterwarnings("ignore", TORCHVISION_DEPRECATION, DeprecationWarning)
        wall, cpu = timed(usable, images, opts.rounds)
    print(f"machine: {machine.description()}")
    print(f"{len(images)} JPEGs of {sum(map(len, images)) / len(images) / 1e6:.2f} MB on average from {opts.data}, "
          f"{opts.rounds} rounds after a warm-up decode each; milliseconds per image, median over the rounds "
          f"(min-max); the project's CPU decoder here: {cpu_decoder().name}")
    base = statistics.median(cpu[BASE])
    print("| decoder | wall ms per image | CPU ms per image | CPU time's speed vs torchvision's whole decode |")
    print("|---|---|---|---|")
    for name, outcome in candidates.items():
        if not callable(outcome):
            print(f"| {name} | {outcome} | | |")
            continue
        print(f"| {name} | {_spread(wall[name])} | {_spread(cpu[name])} | {base / statistics.median(cpu[name]):.2f}x |")
    return 0


def timed(usable: dict[str, Callable[[bytes], object]], images: list[bytes], rounds: int):
    """Milliseconds per image of each decoder in each round, wall clock and this thread's CPU time."""
    wall: dict[str, list[float]] = {name: [] for name in usable}
    cpu: dict[str, list[float]] = {name: [] for name in usable}
    for decode in usable.values():  # warm-up: libraries load, buffers grow
        decode(images[0])
    for _ in range(rounds):
        for name, decode in usable.items():
            started, used = time.perf_counter(), time.thread_time()
            for raw in images:
                decode(raw)
            wall[name].append(1000 * (time.perf_counter() - started) / len(images))
            cpu[name].append(1000 * (time.thread_time() - used) / len(images))
    return wall, cpu


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):.1f} ({min(values):.1f}-{max(values):.1f})"


if __name__ == "__main__":
    sys.exit(run(main))
