"""DALI's validation decoding only the centre crop's window, against decoding the whole image: time and pixels.

    python benchmarks/dali_validation.py --split train --image-size 224 -b 32 -j 2 --rounds 5 /tmp/camera

Two ``dali-cpu`` validation loaders over DIR's SPLIT, the same in all but what they decode: the backend's own
(the window of the image that the centre crop keeps, resized to the crop) and the whole image decoded, resized
as torchvision's Resize does and centre-cropped, as DALI's validation did before.  Their passes alternate, after
one pass each to build and warm up; each line gives both loaders' wall-clock and CPU milliseconds per image (the
CPU time of this process, DALI's threads included: less moved by other jobs than the wall clock) and their
ratio, and the last the medians.  The first pass's batches are compared in grey levels (0-255), mean and largest.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from image_classification.errors import UserError  # noqa: E402
from image_classification.system.cli import UserErrorParser, positive_int, run  # noqa: E402


def build_parser() -> UserErrorParser:
    parser = UserErrorParser(prog="dali_validation.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("data", metavar="DIR")
    parser.add_argument("--split", choices=("val", "train"), default="val", help="the images to validate on")
    parser.add_argument("--image-size", type=positive_int, default=224)
    parser.add_argument("-b", "--batch-size", type=positive_int, default=32)
    parser.add_argument("-j", "--workers", type=positive_int, default=2, help="DALI's threads")
    parser.add_argument("--rounds", type=positive_int, default=5)
    return parser


def _whole_image_crop(encoded, spec, height, width):
    """The whole image decoded, resized as torchvision's Resize does, and its centre crop taken."""
    from nvidia.dali import fn, types

    from image_classification.data import dali_pipeline
    from image_classification.models.preprocessing import val_resize_size

    size = spec.image_size
    out_h, out_w = dali_pipeline._val_resized_size(height, width, val_resize_size(size, spec.crop_ratio))
    images = fn.decoders.image(encoded, output_type=types.RGB, **spec.decoder)
    images = fn.resize(images, device=spec.resize_device, resize_x=fn.cast(out_w, dtype=types.FLOAT),
                       resize_y=fn.cast(out_h, dtype=types.FLOAT),
                       interp_type=getattr(types, dali_pipeline._INTERPOLATION[spec.interpolation]), antialias=True)
    position = {}
    for axis, out in (("x", out_w), ("y", out_h)):
        spare = out - size
        spare = spare + fn.cast(spare == 0, dtype=types.INT64)
        position[f"crop_pos_{axis}"] = (fn.cast(dali_pipeline._centre(out, size), dtype=types.FLOAT)
                                        / fn.cast(spare, dtype=types.FLOAT))
    return fn.crop(images, crop=(size, size), **position)


@contextmanager
def decoding_whole_images():
    """While a pipeline is built in it, DALI's validation decodes the whole image."""
    from image_classification.data import dali_pipeline

    window = dali_pipeline._val_crop
    dali_pipeline._val_crop = _whole_image_crop
    try:
        yield
    finally:
        dali_pipeline._val_crop = window


def one_pass(loader) -> tuple[float, float, list[torch.Tensor]]:
    """(wall-clock seconds, CPU seconds, the batches) of a pass of ``loader``."""
    loader.set_epoch(0)
    wall, cpu = time.perf_counter(), time.process_time()
    batches = [images for images, _ in loader]
    return time.perf_counter() - wall, time.process_time() - cpu, batches


def main(argv: list[str] | None = None) -> int:
    opts = build_parser().parse_args(argv)
    from image_classification.data import dali_available

    if not dali_available():  # a machine without DALI (a GPU image may have none): one line, not a traceback
        raise UserError("dali_validation.py times DALI's validation decode, and NVIDIA DALI cannot be imported "
                        "here (pip install nvidia-dali-cuda130)")
    from image_classification.data.common import MEAN_255, STD_255
    from image_classification.data.dali import DaliLoader
    from image_classification.data.dali_pipeline import PipelineSpec
    from image_classification.data.layout import class_folders, open_split
    from image_classification.system import machine
    from image_classification.system.runtime import Runtime

    root = Path(opts.data)
    samples = open_split(root, opts.split, class_folders(root / opts.split))
    spec = PipelineSpec(train=False, image_size=opts.image_size, interpolation="bilinear", crop_scale=(0.08, 1.0),
                        hflip=0.0, batch_size=opts.batch_size, num_threads=opts.workers, device_id=None,
                        gpu_decode=False, channels_last=False)
    runtime = Runtime(torch.device("cpu"), None, torch.contiguous_format, rank=0, local_rank=0, world_size=1)
    print(f"machine: {machine.description()}", flush=True)
    print(f"{len(samples)} images of {root / opts.split}, {opts.image_size} px, batch {opts.batch_size}, "
          f"{opts.workers} threads", flush=True)
    loaders = {"window": DaliLoader(samples, spec, runtime, 0), "whole": DaliLoader(samples, spec, runtime, 0)}
    first = {"window": one_pass(loaders["window"])[2]}
    with decoding_whole_images():
        first["whole"] = one_pass(loaders["whole"])[2]  # builds its pipeline
    scale = torch.tensor(STD_255).view(1, 3, 1, 1), torch.tensor(MEAN_255).view(1, 3, 1, 1)
    levels = [((a * scale[0] + scale[1]).round() - (b * scale[0] + scale[1]).round()).abs()
              for a, b in zip(first["window"], first["whole"], strict=True)]
    print(f"window against whole image: mean {float(torch.cat([d.flatten() for d in levels]).mean()):.4f} grey "
          f"levels, largest {int(max(d.max() for d in levels))}", flush=True)
    times = {name: {"wall": [], "cpu": []} for name in loaders}
    for number in range(opts.rounds):
        for name in ("window", "whole") if number % 2 == 0 else ("whole", "window"):
            wall, cpu, _ = one_pass(loaders[name])
            times[name]["wall"].append(1000 * wall / len(samples))
            times[name]["cpu"].append(1000 * cpu / len(samples))
        print(f"round {number + 1}: " + ", ".join(
            f"{name} {times[name]['wall'][-1]:.2f} ms ({times[name]['cpu'][-1]:.2f} CPU ms)" for name in loaders)
            + f" per image; whole / window {times['whole']['wall'][-1] / times['window']['wall'][-1]:.2f}x", flush=True)
    ratios = {kind: [b / a for a, b in zip(times["window"][kind], times["whole"][kind])] for kind in ("wall", "cpu")}
    print("median: " + ", ".join(f"{name} {statistics.median(times[name]['wall']):.2f} ms "
                                 f"({statistics.median(times[name]['cpu']):.2f} CPU ms)" for name in loaders)
          + " per image; whole / window " + ", ".join(
              f"{kind} {statistics.median(values):.2f}x (rounds {min(values):.2f}-{max(values):.2f})"
              for kind, values in ratios.items())
          + f"; load average {' / '.join(f'{x:.1f}' for x in os.getloadavg())}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(run(main, sys.argv[1:]))
