"""Extract the model weights of a training checkpoint as a plain state dict.

Example: ``python checkpoint2model.py --checkpoint-path model_best.pth.tar --weight-path weights.pth [--ema]``
"""

import sys

from image_classification.commands import checkpoint2model

if __name__ == "__main__":
    sys.exit(checkpoint2model())
