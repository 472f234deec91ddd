"""Start one training process per GPU: ``python multiproc.py --nproc_per_node 8 main.py ARGS`` (see -h)."""

import sys

from image_classification.commands import multiproc

if __name__ == "__main__":
    sys.exit(multiproc())
