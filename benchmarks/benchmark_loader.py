"""Time a training data loader on its own: decode, augment, batch, device move and normalise, no model.

    python benchmarks/benchmark_loader.py --data-backend dali-cpu -b 64 -j 2 --epochs 4 --baseline DIR

prints images/s and CPU milliseconds per image for every epoch and, as its last line, ``images/s: N``:
the median over the epochs after the first, which pays for start-up.  ``--baseline`` also times a plain
torchvision ImageFolder loader with the same batch size and workers, alternating epochs with the
measured one, and prints the speed-up: the median of the epoch-by-epoch ratios, with their spread; where
the spread is as large as the difference, it says so and gives no verdict.  CPU time per image counts
the loader's threads and worker processes; it is the steadier figure on a machine shared with other jobs.
``--dali-stages`` profiles the CPU DALI pipeline instead: the decode of the random crop window, resize, mirror
and normalise operators of ``--data-backend dali-cpu`` after DALI's file reader (the backend reads the files
its sampler orders with ``fn.io.file.read``), each stage timed on its own by cutting the pipeline after
it, in CPU milliseconds per image.
``--packed DST`` times the loader on DIR and on DST, DIR packed by ``python -m image_classification.data.pack``,
alternating epochs, and counts the files each opens per epoch (Python's opens, in the process and its loader
workers: DALI's own file reader opens a file per image unseen); it prints the packed copy's speed over the
folder's, with the spread, as ``--baseline`` does.
``--beside B [B ...]`` also times those backends of the toolkit (``pytorch``, ``dali-gpu``, ...) with the same
batch size, workers and device, epochs alternating, and prints the speed of ``--data-backend`` over each, with the
spread: how ``pytorch-gpu`` is held to the ``pytorch`` backend it replaces
(``--data-backend pytorch-gpu --beside pytorch dali-gpu --device cuda``).  Without a GPU, ``pytorch-gpu`` runs
its CPU twin (torchvision's CPU decoder in the training process): a check that it works, not its speed.
``--decoder`` picks the JPEG decoder of the ``pytorch`` and ``pytorch-gpu`` backends (TorchCodec's or torchvision's;
by default the one a run takes, :mod:`image_classification.data.decoders`); ``--beside-decoder NAME`` also times
``--data-backend`` with decoder NAME, epochs alternating, and prints the speed of the first over it
(``--data-backend pytorch --decoder torchcodec --beside-decoder torchvision --device cpu``).
``--make-dataset`` first writes a small JPEG dataset into DIR (photos from scikit-image, cropped and
resized to 500x375); ``--photos`` uses DIR as the photo set, writing it first where it is not there yet;
``--camera`` the same with 12 MP camera photographs (4032x3024, quality 90: scikit-image's photographs upscaled,
with a sensor's grain); ``--baseline-on ORIGINAL`` times plain torchvision on ORIGINAL while the loader reads DIR
(a copy packed with ``--max-size``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.common import ratio_spread, ratio_text, require_scikit_image  # noqa: E402
from image_classification.arguments import DATA_BACKENDS, parse_args  # noqa: E402
from image_classification.data import get_loaders  # noqa: E402
from image_classification.data.common import MEAN_255, STD_255  # noqa: E402
from image_classification.data.decoders import LIBRARIES, decoder_notice, installed, use_decoder  # noqa: E402
from image_classification.errors import UserError  # noqa: E402
from image_classification.models.preprocessing import DECODE_SCALES  # noqa: E402
from image_classification.system import machine  # noqa: E402
from image_classification.system.cli import UserErrorParser, run  # noqa: E402
from image_classification.system.runtime import Runtime, make_runtime  # noqa: E402
from image_classification.arguments.data import data_config  # noqa: E402
from image_classification.train.progress import Heartbeat  # noqa: E402

PHOTOS = ("astronaut", "coffee", "chelsea", "rocket", "hubble_deep_field", "immunohistochemistry")
# The photo set: real photographs only, a class per photograph, 300 cuts of each.
PHOTO_SET, PHOTO_SET_PER_CLASS = ("astronaut", "coffee", "chelsea", "rocket"), 300


def build_parser() -> argparse.ArgumentParser:
    parser = UserErrorParser(prog="benchmark_loader.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("data", metavar="DIR", help="dataset root holding train/<class>/<image>")
    backends = [b for b in DATA_BACKENDS if b != "synthetic"] + ["torchvision"]
    parser.add_argument("--data-backend", choices=backends, default="dali-cpu",
                        help="loader to time; torchvision is a plain ImageFolder + DataLoader (default: dali-cpu)")
    parser.add_argument("-b", "--batch-size", type=int, default=64, help="images per batch (default: 64)")
    parser.add_argument("-j", "--workers", type=int, default=2, help="loader workers or DALI threads (default: 2)")
    parser.add_argument("--epochs", type=int, default=4, help="passes over train/ (default: 4)")
    parser.add_argument("--image-size", type=int, default=224, help="crop size (default: 224)")
    parser.add_argument("--memory-format", choices=("nchw", "nhwc"), default="nchw",
                        help="layout of the batches (default: nchw)")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                        help="where batches end up (default: auto, CUDA when available)")
    parser.add_argument("--baseline", action="store_true", help="also time the plain torchvision loader")
    parser.add_argument("--beside", metavar="BACKEND", nargs="+", default=[], choices=backends[:-1],
                        help="also time these backends, epochs alternating, and print --data-backend's speed over "
                        "each")
    parser.add_argument("--decoder", choices=("auto", *LIBRARIES), default="auto",
                        help="JPEG decoder of the pytorch and pytorch-gpu backends (default: auto, the one a run takes)")
    parser.add_argument("--decode-scale", choices=DECODE_SCALES, default="auto",
                        help="the pytorch backend's JPEG scale, as main.py's flag: auto decodes at the smallest of "
                        "libjpeg's scales the crop allows (Pillow's draft), full every pixel with --decoder "
                        "(default: auto)")
    parser.add_argument("--beside-decoder", metavar="NAME", choices=LIBRARIES,
                        help="also time --data-backend with this JPEG decoder, epochs alternating, and print "
                        "--decoder's speed over it")
    parser.add_argument("--packed", metavar="DST",
                        help="also time the loader on DST, DIR packed by image_classification.data.pack, alternating "
                        "epochs, and count the files each opens per epoch")
    parser.add_argument("--dali-stages", action="store_true",
                        help="profile the CPU DALI pipeline stage by stage instead (CPU ms per image)")
    parser.add_argument("--make-dataset", metavar="N", type=int, nargs="?", const=200, default=0,
                        help="first write 2 classes x N (default 200) JPEGs of 500x375 into DIR/train "
                        "(needs scikit-image)")
    parser.add_argument("--camera", metavar="N", type=int, nargs="?", const=64, default=0,
                        help=f"DIR is the camera set: N (default 64) JPEGs of {CAMERA_SIZE[0]}x{CAMERA_SIZE[1]}, quality "
                        f"90, {', '.join(PHOTO_SET)} upscaled with grain, a class each; written first where DIR has no "
                        "train/ (needs scikit-image)")
    parser.add_argument("--camera-size", metavar="WxH", type=camera_size, default=CAMERA_SIZE,
                        help=f"the camera photographs' size (default {CAMERA_SIZE[0]}x{CAMERA_SIZE[1]}, 12 MP; "
                        "4000x3000 and 8064x6048 are other phones')")
    parser.add_argument("--baseline-on", metavar="DIR",
                        help="--baseline reads this folder instead of DIR: plain torchvision on the original photographs "
                        "against the loader on a copy packed with --max-size")
    parser.add_argument("--photos", metavar="N", type=int, nargs="?", const=PHOTO_SET_PER_CLASS, default=0,
                        help=f"DIR is the photo set: {len(PHOTO_SET)} classes x N (default {PHOTO_SET_PER_CLASS}) "
                        f"JPEGs of 500x375 cut from scikit-image's {', '.join(PHOTO_SET)}; written first where "
                        "DIR has no train/ (needs scikit-image)")
    return parser


def _sample_photos(names: tuple[str, ...]):
    """scikit-image's sample photographs ``names``, as RGB PIL images."""
    from PIL import Image

    require_scikit_image("the data set")
    import skimage.data

    return [Image.fromarray(getattr(skimage.data, name)()).convert("RGB") for name in names]


def _cut(photo, rng, size: tuple[int, int]):
    """A random crop of half to all of ``photo``'s width and height, resized to ``size``, flipped half the time."""
    from PIL import Image

    width, height = photo.size
    crop_w, crop_h = int(width * rng.uniform(0.5, 1)), int(height * rng.uniform(0.5, 1))
    left, top = rng.integers(width - crop_w + 1), rng.integers(height - crop_h + 1)
    image = photo.crop((left, top, left + crop_w, top + crop_h)).resize(size, Image.BILINEAR)
    return image.transpose(Image.FLIP_LEFT_RIGHT) if rng.random() < 0.5 else image


def make_dataset(root: Path, classes: int = 2, per_class: int = 200, size=(500, 375), seed: int = 0,
                 progress=None) -> None:
    """Random crops of scikit-image's sample photos, resized to ``size`` and saved as quality-90 JPEGs;
    ``progress.update()`` after each (a :class:`~image_classification.train.progress.Heartbeat`)."""
    import numpy as np

    photos = _sample_photos(PHOTOS)
    rng = np.random.default_rng(seed)
    for label in range(classes):
        folder = root / "train" / f"class_{label}"
        folder.mkdir(parents=True, exist_ok=True)
        for index in range(per_class):
            _cut(photos[rng.integers(len(photos))], rng, size).save(folder / f"img_{index:04d}.jpg", quality=90)
            if progress is not None:
                progress.update()


CAMERA_SIZE = (4032, 3024)  # a 12 MP phone photograph, landscape
CAMERA_GRAIN = 6.0  # the grain's standard deviation, in grey levels: a sensor's noise at ordinary light


def camera_size(text: str) -> tuple[int, int]:
    """``--camera-size WxH``: a width and height of at least 32 pixels each."""
    match = re.fullmatch(r"(\d+)x(\d+)", text.strip())
    if match is None or min(int(match[1]), int(match[2])) < 32:
        raise argparse.ArgumentTypeError(f"{text!r} is not WIDTHxHEIGHT of 32 pixels or more, e.g. "
                                         f"{CAMERA_SIZE[0]}x{CAMERA_SIZE[1]}")
    return int(match[1]), int(match[2])


def camera_photo(photo, rng, size: tuple[int, int] = CAMERA_SIZE):
    """A photograph of ``size`` with a real one's texture: a 4:3 cut of ``photo`` upscaled (bicubic), with
    per-pixel grain added, as a phone's sensor leaves it (what makes its JPEG 3-4 MB, not a few hundred KB)."""
    import numpy as np
    from PIL import Image

    width, height = photo.size
    crop_w = min(width, height * 4 // 3)
    crop_w = int(crop_w * rng.uniform(0.7, 1))
    crop_h = crop_w * 3 // 4
    left, top = rng.integers(width - crop_w + 1), rng.integers(height - crop_h + 1)
    image = photo.crop((left, top, left + crop_w, top + crop_h)).resize(size, Image.BICUBIC)
    if rng.random() < 0.5:
        image = image.transpose(Image.FLIP_LEFT_RIGHT)
    pixels = np.asarray(image, dtype=np.float32)
    grain = rng.normal(0, CAMERA_GRAIN, size=pixels.shape[:2] + (1,)).astype(np.float32)  # luminance grain
    grain = grain + rng.normal(0, CAMERA_GRAIN / 3, size=pixels.shape).astype(np.float32)  # and a little colour
    return Image.fromarray(np.clip(np.rint(pixels + grain), 0, 255).astype(np.uint8))


def make_camera_set(root: Path, count: int, size: tuple[int, int] = CAMERA_SIZE, seed: int = 0,
                    progress=None) -> None:
    """``count`` camera photographs (:func:`camera_photo`) of PHOTO_SET's photographs, a class per photograph,
    saved as quality-90 JPEGs (4:2:0, as phones save them) under DIR/train; a DIR that already has train/ is used
    as it is.  ``progress.update()`` after each image."""
    import numpy as np

    if (root / "train").is_dir():
        return
    rng = np.random.default_rng(seed)
    photos = _sample_photos(PHOTO_SET)
    for index in range(count):
        label = index % len(PHOTO_SET)
        folder = root / "train" / PHOTO_SET[label]
        folder.mkdir(parents=True, exist_ok=True)
        camera_photo(photos[label], rng, size).save(folder / f"img_{index:04d}.jpg", quality=90)
        if progress is not None:
            progress.update()


def make_photo_set(root: Path, per_class: int = PHOTO_SET_PER_CLASS, size=(500, 375), seed: int = 0,
                   progress=None) -> None:
    """The photo set: a class per photograph of PHOTO_SET, ``per_class`` quality-90 JPEG cuts of it; a DIR
    that already has train/ is used as it is.  ``progress.update()`` after each image."""
    import numpy as np

    if (root / "train").is_dir():
        return
    rng = np.random.default_rng(seed)
    for name, photo in zip(PHOTO_SET, _sample_photos(PHOTO_SET)):
        folder = root / "train" / name
        folder.mkdir(parents=True, exist_ok=True)
        for index in range(per_class):
            _cut(photo, rng, size).save(folder / f"img_{index:04d}.jpg", quality=90)
            if progress is not None:
                progress.update()


class TorchvisionLoader:
    """The plain loader we compare with: ImageFolder, RandomResizedCrop, flip, ToTensor, Normalize."""

    def __init__(self, opts: argparse.Namespace, runtime: Runtime):
        from torch.utils.data import DataLoader
        from torchvision import datasets, transforms

        transform = transforms.Compose([
            transforms.RandomResizedCrop(opts.image_size),
            transforms.RandomHorizontalFlip(),
            transforms.ToTensor(),
            transforms.Normalize([m / 255 for m in MEAN_255], [s / 255 for s in STD_255]),
        ])
        dataset = datasets.ImageFolder(str(Path(opts.baseline_on or opts.data) / "train"), transform)
        self.runtime = runtime
        self.loader = DataLoader(
            dataset, batch_size=opts.batch_size, shuffle=True, num_workers=opts.workers, drop_last=True,
            pin_memory=runtime.is_cuda, persistent_workers=opts.workers > 0,
        )

    def set_epoch(self, epoch: int) -> None:
        pass

    def __iter__(self):
        for images, targets in self.loader:
            images = images.to(self.runtime.device, non_blocking=True)
            yield images.contiguous(memory_format=self.runtime.memory_format), targets.to(self.runtime.device)


def project_loader(opts: argparse.Namespace, runtime: Runtime, data: str | None = None, backend: str | None = None):
    """The training loader of ``backend`` (``--data-backend`` when None) on ``data`` (DIR when None)."""
    argv = [data or opts.data, "--data-backend", backend or opts.data_backend, "-b", str(opts.batch_size), "-j",
            str(opts.workers), "--seed", "0", "--memory-format", opts.memory_format, "--decode-scale", opts.decode_scale]
    args = parse_args(argv)
    train, _ = get_loaders(data_config(args, opts.image_size), runtime, want_train=True, want_val=False)
    return train


def cpu_seconds() -> float:
    """CPU time of this process's threads and its live children (loader workers); Linux counts both."""
    total = time.process_time()
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == os.getpid():  # fields: state, ppid, ..., utime (11), stime (12)
            total += (int(fields[11]) + int(fields[12])) / tick
    return total


@dataclass
class Timing:
    name: str
    rates: list[float] = field(default_factory=list)  # images/s per epoch
    cpu_ms: list[float] = field(default_factory=list)  # CPU milliseconds per image per epoch
    decoder: str | None = None  # the JPEG decoder its epochs use (its workers, forked in the first, keep it)
    cpu_decoded: int = 0  # pytorch-gpu: the JPEGs its device's decoder refused, decoded on the CPU, over every epoch

    def epoch(self, loader, number: int, runtime: Runtime) -> None:
        loader.set_epoch(number)
        start, cpu_start = time.perf_counter(), cpu_seconds()
        images = 0
        with use_decoder(self.decoder) if self.decoder else contextlib.nullcontext():
            for batch, _ in loader:
                images += batch.shape[0]
        runtime.synchronize()
        elapsed, cpu = time.perf_counter() - start, cpu_seconds() - cpu_start
        self.rates.append(images / elapsed)
        self.cpu_ms.append(1000 * cpu / max(images, 1))
        on_cpu = getattr(loader, "pass_counts", dict)().get("cpu_decoded")
        self.cpu_decoded += on_cpu or 0
        print(f"{self.name} epoch {number}: {images} images in {elapsed:.2f} s, {self.rates[-1]:.1f} images/s, "
              f"{self.cpu_ms[-1]:.2f} CPU ms/image" + ("" if on_cpu is None else f", {on_cpu} decoded on the CPU"),
              flush=True)

    def median(self, values: list[float]) -> float:
        """The median over the epochs after the first, which pays for start-up."""
        return statistics.median(values[1:] if len(values) > 1 else values)

    def against(self, base: "Timing") -> tuple[float, float | None, str]:
        """This loader's speed over ``base``'s, epochs side by side: the median of the epochs' own ratios,
        their spread, and the spread in words."""
        ratio = self.median([ours / plain for ours, plain in zip(self.rates, base.rates)])
        spread = ratio_spread(self.rates[1:], base.rates[1:])
        return ratio, spread, ("spread unknown" if spread is None
                               else f"spread {spread:.1%} over {len(self.rates) - 1} epochs")


DALI_STAGES = ("read", "decode", "resize", "normalise")


def dali_stage_pipeline(files: list[str], stage: str, opts: argparse.Namespace):
    """The CPU training pipeline of the dali-cpu backend up to ``stage`` (its decode, resize and normalise
    operators at the defaults: crop area 0.08-1, linear interpolation, a flip half of the time; the files
    read by DALI's file reader), its output the stage's."""
    from nvidia.dali import fn, pipeline_def, types

    size = opts.image_size

    @pipeline_def(batch_size=opts.batch_size, num_threads=opts.workers, device_id=None, seed=0)
    def pipeline():
        encoded, labels = fn.readers.file(files=files, labels=[0] * len(files), random_shuffle=True,
                                          dont_use_mmap=True)
        if stage == "read":
            return encoded
        images = fn.decoders.image_random_crop(encoded, output_type=types.RGB, random_area=[0.08, 1.0],
                                               random_aspect_ratio=[3 / 4, 4 / 3], num_attempts=100)
        if stage == "decode":
            return images
        images = fn.resize(images, size=[size, size], interp_type=types.INTERP_LINEAR, antialias=False)
        if stage == "resize":
            return images
        return fn.crop_mirror_normalize(images, dtype=types.FLOAT, crop=(size, size), mean=list(MEAN_255),
                                        std=list(STD_255), mirror=fn.random.coin_flip(), output_layout="CHW")

    return pipeline()


def profile_dali_stages(opts: argparse.Namespace) -> dict[str, float]:
    """CPU ms per image of each stage of the CPU DALI pipeline (each stage's pipeline minus the one before),
    over two passes of train/ after one untimed pass."""
    files = sorted(str(path) for path in Path(opts.data, "train").glob("*/*") if path.is_file())
    if not files:
        raise UserError(f"no training images under {opts.data}/train")
    batches = -(-len(files) // opts.batch_size)
    cumulative = {}
    for stage in DALI_STAGES:
        pipeline = dali_stage_pipeline(files, stage, opts)
        pipeline.build()
        for _ in range(batches):
            pipeline.run()
        start = cpu_seconds()
        for _ in range(2 * batches):
            pipeline.run()
        cumulative[stage] = 1000 * (cpu_seconds() - start) / (2 * batches * opts.batch_size)
        del pipeline
    before, shares = 0.0, {}
    for stage in DALI_STAGES:
        shares[stage], before = max(cumulative[stage] - before, 0.0), cumulative[stage]
    return shares


def write_data(opts: argparse.Namespace) -> None:
    """The data set ``--make-dataset`` or ``--photos`` asks for, written into DIR before anything is timed:
    said before it starts, every minute or so while it lasts, and when it is done; a flag that would write one
    without scikit-image is one line before anything is said or written."""
    root = Path(opts.data)
    unwritten = not (root / "train").is_dir()  # --camera and --photos use a set already there as it is
    for flag, writes in (("--make-dataset", opts.make_dataset), ("--camera", opts.camera and unwritten),
                         ("--photos", opts.photos and unwritten)):
        if writes:
            require_scikit_image(flag)
    if opts.make_dataset:
        _writing(root, 2 * opts.make_dataset, lambda progress: make_dataset(root, per_class=opts.make_dataset,
                                                                           progress=progress))
    if opts.camera and not (root / "train").is_dir():
        width, height = opts.camera_size
        _writing(root, opts.camera, lambda progress: make_camera_set(root, opts.camera, opts.camera_size,
                                                                      progress=progress),
                 f"of {width}x{height}, camera photographs made from scikit-image's photos,")
    if opts.photos and not (root / "train").is_dir():
        _writing(root, len(PHOTO_SET) * opts.photos, lambda progress: make_photo_set(root, per_class=opts.photos,
                                                                                   progress=progress))


def _writing(root: Path, images: int, write, what: str = "cut from scikit-image's photos") -> None:
    def say(line: str) -> None:
        print(f"=> {line}", flush=True)

    say(f"writing {images} JPEG images {what} into {root / 'train'}")
    started = time.monotonic()
    write(Heartbeat(images, "writing", say, unit="images"))
    say(f"wrote {images} images in {time.monotonic() - started:.1f} s")


def main(argv: list[str] | None = None) -> int:
    opts = build_parser().parse_args(argv)
    for flag, library in (("--decoder", opts.decoder), ("--beside-decoder", opts.beside_decoder)):
        if library in LIBRARIES and not installed(library):
            raise UserError(f"{flag} {library}: {library} is not installed here (pip install {library})")
    write_data(opts)
    if opts.dali_stages:
        shares = profile_dali_stages(opts)
        print(f"machine: {machine.description()}", flush=True)
        print(f"CPU DALI pipeline, batch {opts.batch_size}, {opts.workers} threads, {opts.image_size} px crops: "
              + ", ".join(f"{stage} {ms:.2f}" for stage, ms in shares.items())
              + f" CPU ms per image; {sum(shares.values()):.2f} in all", flush=True)
        return 0
    runtime = make_runtime(opts.device, memory_format=opts.memory_format)
    print(f"device: {runtime.device}, batch {opts.batch_size}, workers {opts.workers}, {opts.image_size} px crops",
          flush=True)
    print(f"machine: {machine.description(runtime.device.type)}", flush=True)
    if opts.data_backend != "torchvision":
        with use_decoder(opts.decoder) if opts.decoder != "auto" else contextlib.nullcontext():
            print(decoder_notice(opts.data_backend, runtime.device, opts.decode_scale), flush=True)
    if opts.packed:
        return compare_packed(opts, runtime)
    runs = loaders_to_time(opts, runtime)
    # Epochs alternate between the loaders, so that load from other processes hits both alike.
    for number in range(opts.epochs):
        for timing, loader in runs:
            timing.epoch(loader, number, runtime)
    timing = runs[-1][0]
    for base, _ in runs[:-1]:
        report_against(timing, base)
    if "cpu_decoded" in getattr(runs[-1][1], "pass_counts", dict)():
        print(f"decoded on the CPU: {timing.cpu_decoded} JPEGs of {opts.epochs} epochs (the device's decoder "
              "refused them)", flush=True)
    print(f"images/s: {timing.median(timing.rates):.1f}", flush=True)
    return 0


def loaders_to_time(opts: argparse.Namespace, runtime: Runtime) -> list[tuple[Timing, object]]:
    """(timing, loader) of every loader to time, ``--data-backend``'s last: after the plain torchvision loader
    (``--baseline``) and the ``--beside`` backends."""
    if opts.data_backend == "torchvision":
        return [(Timing("torchvision"), TorchvisionLoader(opts, runtime))]
    runs = [(Timing(backend), project_loader(opts, runtime, backend=backend)) for backend in opts.beside
            if backend != opts.data_backend]
    if opts.baseline:
        runs.insert(0, (Timing("torchvision"), TorchvisionLoader(opts, runtime)))
    decoder = None if opts.decoder == "auto" else opts.decoder
    if opts.beside_decoder:
        runs.append((Timing(f"{opts.data_backend}/{opts.beside_decoder}", decoder=opts.beside_decoder),
                     project_loader(opts, runtime)))
    name = f"{opts.data_backend}/{decoder or 'auto'}" if opts.beside_decoder else opts.data_backend
    return [*runs, (Timing(name, decoder=decoder), project_loader(opts, runtime))]


def report_against(timing: Timing, base: Timing) -> None:
    """``timing``'s speed over ``base``'s: the median of the epochs' ratios, the spread and the verdict."""
    rate, cpu_ms = timing.median(timing.rates), timing.median(timing.cpu_ms)
    base_rate, base_cpu = base.median(base.rates), base.median(base.cpu_ms)
    # Each epoch's ratio pairs two neighbouring epochs, so load that comes and goes cancels out.
    speedup, spread, spread_text = timing.against(base)
    print(f"{base.name}: {base_rate:.1f} images/s, {base_cpu:.2f} CPU ms/image; {timing.name}: "
          f"{rate:.1f} images/s, {cpu_ms:.2f} CPU ms/image; speed-up {speedup:.2f}x ({spread_text}), "
          f"CPU per image {base_cpu / cpu_ms:.2f}x less", flush=True)
    against = "" if base.name == "torchvision" else f" against {base.name}"
    print(f"verdict{against}: {ratio_text(speedup, spread)}", flush=True)


class FileOpens:
    """Files opened under some folders, counted by an audit hook in this process and in the loader workers it
    forks (the count and the switch live in shared memory); a hook cannot be removed, so it counts only while
    switched on."""

    def __init__(self, folders: list[str]):
        import multiprocessing

        self.folders = tuple(os.path.realpath(folder) + os.sep for folder in folders)
        context = multiprocessing.get_context("fork")
        self.count, self.active = context.Value("q", 0), context.RawValue("b", 0)
        sys.addaudithook(self._hook)

    def _hook(self, event: str, args) -> None:
        if self.active.value and event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
            if os.path.realpath(os.fsdecode(args[0])).startswith(self.folders):
                with self.count.get_lock():
                    self.count.value += 1

    def during(self, function, *args):
        """``function(*args)`` and the files opened while it ran."""
        before, self.active.value = self.count.value, 1
        try:
            result = function(*args)
        finally:
            self.active.value = 0
        return result, self.count.value - before


def compare_packed(opts: argparse.Namespace, runtime: Runtime) -> int:
    """``--packed``: the loader on DIR and on its packed copy, epochs alternating; speeds, their ratio and the
    files each opens per epoch."""
    opens = FileOpens([opts.data, opts.packed])
    runs = []
    for name, data in (("folder", opts.data), ("packed", opts.packed)):
        loader, count = opens.during(project_loader, opts, runtime, data)
        runs.append((Timing(f"{opts.data_backend} {name}"), loader))
        print(f"{name}: {count} files opened while the loader was built", flush=True)
    per_epoch: dict[str, list[int]] = {timing.name: [] for timing, _ in runs}
    for number in range(opts.epochs):
        for timing, loader in runs:
            per_epoch[timing.name].append(opens.during(timing.epoch, loader, number, runtime)[1])
    (folder, _), (packed, _) = runs
    ratio, spread, spread_text = packed.against(folder)
    for timing in (folder, packed):
        counted = timing.median(per_epoch[timing.name])
        unseen = timing is folder and opts.data_backend.startswith("dali")  # DALI's C++ reader opens them
        print(f"{timing.name}: {timing.median(timing.rates):.1f} images/s, {timing.median(timing.cpu_ms):.2f} CPU "
              f"ms/image, files opened per epoch: "
              + ("one per image (DALI's own reader, not counted here)" if unseen else f"{counted:.0f}"), flush=True)
    print(f"packed / folder: {ratio:.3f}x ({spread_text})", flush=True)
    print(f"verdict: {ratio_text(ratio, spread)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(run(main))
