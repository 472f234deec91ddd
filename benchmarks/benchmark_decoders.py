"""Time the JPEG decoders a loader could use, on the same images: whole, at libjpeg's reduced scales (1/2, 1/4,
1/8) and, where a library decodes a region, a centred half of the image.

    python benchmarks/benchmark_decoders.py DIR [--images 16] [--rounds 3]

DIR holds JPEGs (any depth below it; ``benchmark_loader.py --camera N DIR`` writes 12 MP ones).  Each decoder
decodes every image once per round, rounds alternating between decoders, so load from other jobs hits them
alike; the table gives each one's median milliseconds per image over the rounds and its speed over torchvision's
whole decode.  A library that is not installed is listed as such: install candidates beside the project's
environment (``pip install --target /tmp/jpeglibs simplejpeg opencv-python-headless`` and
``PYTHONPATH=/tmp/jpeglibs``) to compare them without adding them to it.
"""

from __future__ import annotations

import io
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from image_classification.errors import UserError  # noqa: E402
from image_classification.system import machine  # noqa: E402
from image_classification.system.cli import UserErrorParser, run  # noqa: E402

SCALES = (1, 2, 4, 8)


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


def _torchvision() -> Callable[[bytes], object]:
    import torch
    from torchvision.io import ImageReadMode, decode_jpeg

    return lambda raw: decode_jpeg(torch.frombuffer(bytearray(raw), dtype=torch.uint8), mode=ImageReadMode.RGB).shape


def _torchcodec() -> Callable[[bytes], object]:
    from torchcodec.decoders import decode_jpeg  # an ImportError here lists TorchCodec as unavailable

    return lambda raw: decode_jpeg(raw, mode="RGB").shape


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
        "torchvision decode_jpeg (whole)": _torchvision,
        "TorchCodec decode_jpeg (whole)": _torchcodec,
    }
    for scale in SCALES:
        what = "whole" if scale == 1 else f"1/{scale}"
        makers[f"Pillow {'open + load' if scale == 1 else 'draft'} ({what})"] = lambda s=scale: _pillow(s)
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
    times: dict[str, list[float]] = {name: [] for name in usable}
    for decode in usable.values():  # warm-up: libraries load, buffers grow
        decode(images[0])
    for _ in range(opts.rounds):
        for name, decode in usable.items():
            started = time.perf_counter()
            for raw in images:
                decode(raw)
            times[name].append(1000 * (time.perf_counter() - started) / len(images))
    print(f"machine: {machine.description()}")
    print(f"{len(images)} JPEGs of {sum(map(len, images)) / len(images) / 1e6:.2f} MB on average from {opts.data}, "
          f"{opts.rounds} rounds; milliseconds per image, median over the rounds (min-max)")
    base = statistics.median(times["torchvision decode_jpeg (whole)"])
    print("| decoder | ms per image | vs torchvision's whole decode |")
    print("|---|---|---|")
    for name, outcome in candidates.items():
        if not callable(outcome):
            print(f"| {name} | {outcome} | |")
            continue
        median = statistics.median(times[name])
        print(f"| {name} | {median:.1f} ({min(times[name]):.1f}-{max(times[name]):.1f}) | {base / median:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(run(main))
