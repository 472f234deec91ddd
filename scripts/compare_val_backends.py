"""How far a backend's validation is from the pytorch backend's: in grey levels, or in one model's top-1.

    python scripts/compare_val_backends.py --image-size 224 32
    python scripts/compare_val_backends.py --backend pytorch-gpu --checkpoint workspace/digits/model_best.pth.tar data/digits

Without ``--checkpoint``: writes scikit-image's sample photographs as JPEGs into a temporary ImageFolder, runs
the validation pipelines of ``--backend`` (default ``dali-cpu``) and of the pytorch backend over them and prints
the mean absolute difference per image and overall, in grey levels (0-255).  The pytorch backend decodes every
pixel there (``--decode-scale full``), as the other backends do, so the figure is the resampling's alone;
``--decode-scale auto`` adds its reduced decoding of the images large enough for it.

With ``--checkpoint CKPT DIR``: evaluates the checkpoint's model on DIR/val with both backends, in the
preprocessing the checkpoint records, and prints each top-1, their difference in points and how many
predictions differ; it exits 1 where the top-1s differ by more than ``--within`` points (default 0.2).  On a
machine without a GPU, ``pytorch-gpu`` runs on the CPU with torchvision's CPU decoder (``--device cuda`` on a GPU
machine measures nvJPEG's).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from PIL import Image  # noqa: E402

from benchmarks.common import require_scikit_image  # noqa: E402
from image_classification.data import DataConfig, get_loaders  # noqa: E402
from image_classification.data.common import STD_255  # noqa: E402
from image_classification.errors import UserError  # noqa: E402
from image_classification.system import machine  # noqa: E402
from image_classification.system.cli import UserErrorParser, run  # noqa: E402
from image_classification.system.runtime import Runtime, make_runtime  # noqa: E402

PHOTOS = ("astronaut", "chelsea", "coffee", "rocket", "immunohistochemistry", "retina", "hubble_deep_field")
BACKENDS = ("dali-cpu", "dali-gpu", "pytorch-gpu")


def write_photos(root: Path) -> None:
    from skimage import data as samples

    folder = root / "val" / "photos"
    folder.mkdir(parents=True)
    for name in PHOTOS:
        pixels = getattr(samples, name)()
        if pixels.ndim == 2:
            pixels = np.stack([pixels] * 3, -1)
        Image.fromarray(pixels[..., :3]).save(folder / f"{name}.jpg", quality=92)


def val_batches(config: DataConfig, runtime: Runtime):
    """The validation loader ``config`` describes, set to its first pass."""
    _, val = get_loaders(config, runtime, want_train=False, want_val=True)
    val.set_epoch(0)
    return val


def differences(root: Path, image_size: int, backend: str, runtime: Runtime, decode_scale: str) -> torch.Tensor:
    """Mean absolute difference of each image's validation crop between ``backend`` and pytorch (decoding at
    ``decode_scale``), in levels."""
    config = DataConfig(data=str(root), data_backend=backend, image_size=image_size, batch_size=4, workers=1, seed=1)
    theirs = val_batches(config, runtime)
    ours = val_batches(dataclasses.replace(config, data_backend="pytorch", decode_scale=decode_scale), runtime)
    std = torch.tensor(STD_255).view(1, 3, 1, 1)
    return torch.cat([((a.cpu() - b.cpu()).abs() * std).mean(dim=(1, 2, 3))
                      for (a, _), (b, _) in zip(theirs, ours, strict=True)])


def predictions(checkpoint: str, data: str, backend: str, runtime: Runtime, batch_size: int, workers: int):
    """(predicted classes, labels) of the checkpoint's model on ``data``/val, read by ``backend`` in the
    preprocessing the checkpoint records."""
    from image_classification.deploy.inference import load_model

    loaded = load_model(None, checkpoint, log=lambda line: None)
    preprocessing = loaded.resolve_preprocessing(None, log=lambda line: None)
    config = DataConfig(data=data, data_backend=backend, batch_size=batch_size, workers=workers,
                        preprocessing=preprocessing, num_classes=loaded.num_classes)
    model = loaded.model.to(runtime.device)
    predicted, labels = [], []
    with torch.inference_mode():
        for images, targets in val_batches(config, runtime):
            predicted.append(model(images).argmax(dim=1).cpu())
            labels.append(targets.cpu())
    return torch.cat(predicted), torch.cat(labels)


def compare_top1(opts: argparse.Namespace, runtime: Runtime) -> int:
    results = {backend: predictions(opts.checkpoint, opts.data, backend, runtime, opts.batch_size, opts.workers)
               for backend in ("pytorch", opts.backend)}
    (base, labels), (ours, their_labels) = results["pytorch"], results[opts.backend]
    if not torch.equal(labels, their_labels):
        print(f"error: {opts.backend} and pytorch read different validation images", file=sys.stderr)
        return 1
    top1 = {name: 100.0 * float((predicted == labels).double().mean()) for name, (predicted, _) in results.items()}
    difference = top1[opts.backend] - top1["pytorch"]
    print(f"machine: {machine.description(runtime.device.type)}")
    print(f"{len(labels)} images of {opts.data}/val: pytorch top-1 {top1['pytorch']:.2f}%, {opts.backend} top-1 "
          f"{top1[opts.backend]:.2f}%, difference {difference:+.2f} points; {int((base != ours).sum())} of "
          f"{len(labels)} predictions differ")
    agree = abs(difference) <= opts.within
    print(f"agree within {opts.within} points" if agree else f"differ by more than {opts.within} points")
    return 0 if agree else 1


def build_parser() -> argparse.ArgumentParser:
    parser = UserErrorParser(prog="compare_val_backends.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("data", metavar="DIR", nargs="?", help="with --checkpoint: the dataset (holds val/)")
    parser.add_argument("--backend", choices=BACKENDS, default="dali-cpu",
                        help="the backend held to the pytorch backend (default: dali-cpu)")
    parser.add_argument("--image-size", type=int, nargs="+", default=[224, 32],
                        help="without --checkpoint: the crop sizes to compare at (default: 224 32)")
    parser.add_argument("--decode-scale", choices=("full", "auto"), default="full",
                        help="without --checkpoint: the pytorch backend's JPEG scale, as main.py's flag (default: "
                             "full, every pixel, as the other backends decode)")
    parser.add_argument("--checkpoint", metavar="CKPT", help="compare the top-1 of this checkpoint's model on DIR")
    parser.add_argument("--within", metavar="POINTS", type=float, default=0.2,
                        help="with --checkpoint: the largest top-1 difference that agrees (default: 0.2)")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                        help="where the batches and the model go (default: auto, CUDA when available)")
    parser.add_argument("-b", "--batch-size", type=int, default=64, help="with --checkpoint (default: 64)")
    parser.add_argument("-j", "--workers", type=int, default=2, help="loader workers (default: 2)")
    return parser


def main(argv: list[str] | None = None) -> int:
    opts = build_parser().parse_args(argv)
    runtime = make_runtime(opts.device, log=lambda line: None)
    if opts.checkpoint:
        if opts.data is None:
            raise UserError("--checkpoint needs DIR, the dataset whose val/ the model is evaluated on")
        return compare_top1(opts, runtime)
    require_scikit_image("compare_val_backends.py without --checkpoint")
    with tempfile.TemporaryDirectory() as folder:
        write_photos(Path(folder))
        for size in opts.image_size:
            per_image = differences(Path(folder), size, opts.backend, runtime, opts.decode_scale)
            listed = ", ".join(f"{name} {value:.2f}" for name, value in zip(sorted(PHOTOS), per_image.tolist()))
            print(f"{size} px, {opts.backend} against pytorch (--decode-scale {opts.decode_scale}): mean "
                  f"{per_image.mean():.3f} levels ({listed})")
    return 0


if __name__ == "__main__":
    sys.exit(run(main))
