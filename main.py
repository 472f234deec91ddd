"""Train, evaluate or benchmark a ResNet-family classifier.  ``python main.py -h`` lists every flag."""

import sys

from image_classification.cli import run
from image_classification.training import main

if __name__ == "__main__":
    sys.exit(run(main))
