"""``make demo``: train a ResNet-18 on scikit-learn's bundled handwritten digits, end to end on a CPU.

The 1,797 8x8 digits are written once as a JPEG ImageFolder under ``data/digits/`` (every fifth image
goes to val/), then main.py's training runs on them with the recipe below and prints the val top1 and
where the checkpoint and raport are.

Extra flags go to main.py and win over the recipe's.  A run with any of them is another recipe and goes to
a workspace of its own, ``workspace/digits-<hash of the flags>`` (or the one ``--workspace`` names), said
at the start and the end: ``workspace/digits`` keeps the default recipe's model, which the README's next
commands classify and evaluate.
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path
from typing import Sequence

import numpy as np
from PIL import Image

from .arguments import build_parser, parse_args, raport_file
from .errors import UserError
from .system.cli import run

DATA_DIR = Path("data/digits")
WORKSPACE = Path("workspace/digits")
IMAGE_SIZE = 32
RECIPE = [
    "--data-backend", "pytorch", "--arch", "resnet18", "--num-classes", "10",
    "--image-size", str(IMAGE_SIZE), "--crop-scale", "0.6", "1.0", "--hflip", "0",
    "--batch-size", "64", "--epochs", "6", "--lr", "0.05", "--lr-schedule", "cosine",
    "--label-smoothing", "0.1", "--weight-decay", "5e-4", "--workers", "2", "--print-freq", "10",
    "--seed", "1", "--last_bn_0_init", "false",  # the recipe its published figures were measured with
]


def workspace_for(extra: Sequence[str]) -> Path:
    """``WORKSPACE`` for the default recipe; with ``extra`` flags, a workspace named by a short hash of them:
    the same flags find their earlier run again, other flags never replace the default recipe's model."""
    if not extra:
        return WORKSPACE
    digest = hashlib.sha256("\0".join(extra).encode()).hexdigest()[:8]
    return WORKSPACE.with_name(f"{WORKSPACE.name}-{digest}")


def without_overridden(flags: Sequence[str], extra: Sequence[str]) -> list[str]:
    """``flags`` (each ``--flag`` followed by its values) without those that ``extra`` sets again, abbreviated
    or as ``--flag=value`` too: the command run and echoed names each flag once, with the value it runs with."""
    options = build_parser()._option_string_actions
    overridden = set()
    for token in (token.split("=", 1)[0] for token in extra if token.startswith("-")):
        if token not in options and not token.startswith("--"):
            token = token[:2]  # -b8
        matches = [token] if token in options else [flag for flag in options if flag.startswith(token)]
        overridden |= {options[flag].dest for flag in matches}
    kept, dropping = [], False
    for token in flags:
        if token.startswith("--"):
            dropping = options[token].dest in overridden
        if not dropping:
            kept.append(token)
    return kept


def write_digits(root: Path, size: int = IMAGE_SIZE) -> Path:
    """Write the digits as ``root/{train,val}/<digit>/<n>.jpg``, grey ink on black, ``size`` pixels square."""
    try:
        from sklearn.datasets import load_digits
    except ImportError as error:  # the digits come with scikit-learn, an optional dependency
        raise UserError(f"the demo needs scikit-learn, whose digits it trains on ({error}); pip install "
                        ".[demo] in the repository, or pip install scikit-learn") from None

    digits = load_digits()
    for index, (pixels, label) in enumerate(zip(digits.images, digits.target)):
        split = "val" if index % 5 == 0 else "train"
        folder = root / split / str(label)
        folder.mkdir(parents=True, exist_ok=True)
        image = Image.fromarray((pixels * (255 / 16)).astype(np.uint8)).resize((size, size), Image.BICUBIC)
        image.convert("RGB").save(folder / f"{index:04d}.jpg", quality=95)
    return root


def main(argv: list[str] | None = None) -> int:
    extra = list(argv or [])
    chosen = workspace_for(extra)
    command = [*without_overridden([*RECIPE, "--workspace", str(chosen)], extra), *extra, str(DATA_DIR)]
    args = parse_args(command)  # a mistyped flag stops here, before anything is written
    workspace = Path(args.workspace)
    if workspace == WORKSPACE:
        where = f"=> the run goes to {workspace}/"
    elif workspace == chosen:
        where = (f"=> flags beyond the default recipe: the run goes to {workspace}/ (its own; {WORKSPACE}/ keeps "
                 "the default recipe's model)")
    else:
        where = f"=> the run goes to {workspace}/ (--workspace)"
    print(where, flush=True)
    if not (DATA_DIR / "val").is_dir():
        print(f"=> writing scikit-learn's handwritten digits to {DATA_DIR}/", flush=True)
        write_digits(DATA_DIR)
    from .records.workspace import Workspace  # deferred: torch, once the digits are written
    from .train.startup import earlier_run  # deferred: torch

    checkpoints, raport = earlier_run(args, Workspace(workspace, args.checkpoint_filename, raport_file(args)))
    if workspace == chosen and (checkpoints or raport):
        print(f"=> replacing the earlier run of this recipe in {workspace}/ (copy it elsewhere first to keep it)",
              flush=True)
        command.insert(0, "--overwrite")
    print("=> python main.py " + " ".join(command), flush=True)
    from .training import train  # deferred: torch

    code = train(parse_args(command))
    print(where.replace("goes to", "went to", 1), flush=True)
    return code


if __name__ == "__main__":
    sys.exit(run(main, sys.argv[1:]))
