"""Shared fixtures: tiny real-image datasets built on the fly (nothing is downloaded)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
from PIL import Image

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def load_script(name: str) -> ModuleType:
    """Import ``scripts/<name>.py`` (not a package) as the module ``name``."""
    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def write_image_folder(
    root: Path, num_classes: int = 3, train_per_class: int = 8, val_per_class: int = 4,
    size: tuple[int, int] = (48, 40), seed: int = 0,
) -> Path:
    """Write a JPEG ImageFolder (train/ and val/) whose classes differ by colour, so a model can learn them."""
    rng = np.random.default_rng(seed)
    colours = [(200, 40, 40), (40, 200, 40), (40, 40, 200), (200, 200, 40), (40, 200, 200), (200, 40, 200)]
    for split, count in (("train", train_per_class), ("val", val_per_class)):
        for label in range(num_classes):
            folder = root / split / f"class_{label:02d}"
            folder.mkdir(parents=True, exist_ok=True)
            base = np.array(colours[label % len(colours)], dtype=np.float32)
            for index in range(count):
                noise = rng.normal(0, 25, size=(size[1], size[0], 3))
                pixels = np.clip(base + noise, 0, 255).astype(np.uint8)
                Image.fromarray(pixels).save(folder / f"img_{index:03d}.jpg", quality=90)
    return root


@pytest.fixture(scope="session")
def image_folder(tmp_path_factory) -> Path:
    """A 3-class colour dataset: 8 train and 4 val JPEGs per class, 48x40 pixels."""
    return write_image_folder(tmp_path_factory.mktemp("colours"))
