"""Train, evaluate or benchmark with a preset from configs.yml: see ``python launch.py -h`` and ``--list``."""

import sys

from image_classification.cli import run
from image_classification.launch import main

if __name__ == "__main__":
    sys.exit(run(main))
