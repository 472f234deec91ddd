"""Where a training sample's time goes in the ``pytorch`` backend's worker: read, header, decode (at the scale the
box allows), resize of the box, flip and hand-over (the HWC tensor), and the batch's normalise, per image.

    python benchmarks/profile_decode.py DIR [--images 32] [--image-size 224] [--decode-scale auto]

Each stage is timed on its own, in this process (one core), on DIR's training images with epoch 0's draws; the
figures are milliseconds per image, the median over three passes.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from PIL import Image  # noqa: E402

from image_classification.data import reduced  # noqa: E402
from image_classification.data.common import DataConfig, MEAN_255, STD_255, sample_seed  # noqa: E402
from image_classification.data.files import decode_rgb_tensor  # noqa: E402
from image_classification.data.layout import class_folders, open_split  # noqa: E402
from image_classification.data.transforms import INTERPOLATION, TrainTransform, resized_crop, seeded  # noqa: E402
from image_classification.system import machine  # noqa: E402
from image_classification.system.cli import UserErrorParser, positive_int, run  # noqa: E402

STAGES = ("read", "header and draw", "decode", "resize", "flip and hand-over", "normalise")


def one_pass(split, transform: TrainTransform, count: int, size: int, auto: bool) -> dict[str, float]:
    spent = dict.fromkeys(STAGES, 0.0)
    mean, std = torch.tensor(MEAN_255).view(3, 1, 1), torch.tensor(STD_255).view(3, 1, 1)
    for index in range(count):
        clock = time.perf_counter()
        raw = split.read(index)
        now = time.perf_counter(); spent["read"] += now - clock; clock = now
        jpeg = reduced.scalable_jpeg(raw)
        draw = seeded(sample_seed(0, 0, index), transform.draw, jpeg.height, jpeg.width)
        scale = reduced.crop_scale(draw.box[2], draw.box[3], size) if auto else 1
        now = time.perf_counter(); spent["header and draw"] += now - clock; clock = now
        if scale > 1:
            image, x, y = jpeg.reduced(scale)  # decoded at 1/scale and turned by its EXIF orientation
            now = time.perf_counter(); spent["decode"] += now - clock; clock = now
            top, left, height, width = draw.box
            x, y = x + left / scale, y + top / scale
            box = (x, y, x + width / scale, y + height / scale)
            out = image.resize((size, size), Image.BILINEAR, box=box)
            crop = torch.from_numpy(np.array(out)).permute(2, 0, 1)
        else:
            image = decode_rgb_tensor(raw)
            now = time.perf_counter(); spent["decode"] += now - clock; clock = now
            crop = resized_crop(image, draw.box, size, INTERPOLATION["bilinear"])
        now = time.perf_counter(); spent["resize"] += now - clock; clock = now
        crop = crop.flip(-1) if draw.flip else crop
        handed = crop.permute(1, 2, 0).contiguous()
        now = time.perf_counter(); spent["flip and hand-over"] += now - clock; clock = now
        handed.permute(2, 0, 1).float().sub_(mean).div_(std)
        spent["normalise"] += time.perf_counter() - clock
    return {stage: 1000 * seconds / count for stage, seconds in spent.items()}


def main(argv: list[str] | None = None) -> int:
    parser = UserErrorParser(prog="profile_decode.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("data", metavar="DIR")
    parser.add_argument("--images", type=positive_int, default=32)
    parser.add_argument("--image-size", type=positive_int, default=224)
    parser.add_argument("--decode-scale", choices=("auto", "full"), default="auto")
    opts = parser.parse_args(argv)
    torch.set_num_threads(1)
    root = Path(opts.data)
    split = open_split(root, "train", class_folders(root / "train"))
    count = min(opts.images, len(split))
    transform = TrainTransform(DataConfig(str(root), "pytorch", opts.image_size, 1))
    passes = [one_pass(split, transform, count, opts.image_size, opts.decode_scale == "auto") for _ in range(3)]
    print(f"machine: {machine.description()}")
    medians = {stage: statistics.median(p[stage] for p in passes) for stage in STAGES}
    print(f"{count} images of {opts.data}, {opts.image_size} px crops, --decode-scale {opts.decode_scale}: "
          + ", ".join(f"{stage} {ms:.2f}" for stage, ms in medians.items())
          + f" ms per image; {sum(medians.values()):.2f} in all")
    return 0


if __name__ == "__main__":
    sys.exit(run(main))
