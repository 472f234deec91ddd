"""How far DALI's validation crops are from the pytorch backend's, in grey levels (0-255).

    python scripts/compare_val_backends.py --image-size 224 32

Writes scikit-image's sample photographs as JPEGs into a temporary ImageFolder, runs both backends'
validation pipelines over them and prints the mean absolute difference per image and overall.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from PIL import Image  # noqa: E402

from image_classification.arguments import parse_args  # noqa: E402
from image_classification.data.common import STD_255  # noqa: E402
from image_classification.plan import data_config  # noqa: E402
from image_classification.data.dali import dali_loaders  # noqa: E402
from image_classification.data.folder import folder_loaders  # noqa: E402
from image_classification.data.layout import check_dataset  # noqa: E402
from image_classification.runtime import Runtime  # noqa: E402

PHOTOS = ("astronaut", "chelsea", "coffee", "rocket", "immunohistochemistry", "retina", "hubble_deep_field")


def write_photos(root: Path) -> None:
    from skimage import data as samples

    folder = root / "val" / "photos"
    folder.mkdir(parents=True)
    for name in PHOTOS:
        pixels = getattr(samples, name)()
        if pixels.ndim == 2:
            pixels = np.stack([pixels] * 3, -1)
        Image.fromarray(pixels[..., :3]).save(folder / f"{name}.jpg", quality=92)


def differences(root: Path, image_size: int) -> torch.Tensor:
    """Mean absolute difference of each image's validation crop between dali-cpu and pytorch, in levels."""
    args = parse_args([str(root), "--data-backend", "dali-cpu", "-b", "4", "-j", "1", "--seed", "1"])
    runtime = Runtime(torch.device("cpu"), None, torch.contiguous_format, rank=0, local_rank=0, world_size=1)
    classes = check_dataset(str(root), None, want_train=False, want_val=True)
    config = data_config(args, image_size)
    _, dali = dali_loaders(config, runtime, classes, want_train=False, want_val=True)
    _, pytorch = folder_loaders(config, runtime, classes, want_train=False, want_val=True)
    dali.set_epoch(0)
    pytorch.set_epoch(0)
    std = torch.tensor(STD_255).view(1, 3, 1, 1)
    return torch.cat([((a - b).abs() * std).mean(dim=(1, 2, 3)) for (a, _), (b, _) in zip(dali, pytorch, strict=True)])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--image-size", type=int, nargs="+", default=[224, 32])
    sizes = parser.parse_args().image_size
    with tempfile.TemporaryDirectory() as folder:
        write_photos(Path(folder))
        for size in sizes:
            per_image = differences(Path(folder), size)
            listed = ", ".join(f"{name} {value:.2f}" for name, value in zip(sorted(PHOTOS), per_image.tolist()))
            print(f"{size} px: mean {per_image.mean():.3f} levels ({listed})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
