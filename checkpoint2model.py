"""Extract the model weights of a training checkpoint as a plain state dict.

Example: ``python checkpoint2model.py --checkpoint-path model_best.pth.tar --weight-path weights.pth [--ema]``
"""

import sys

from image_classification.cli import run
from image_classification.export import checkpoint2model_main

if __name__ == "__main__":
    sys.exit(run(checkpoint2model_main))
