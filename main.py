"""Train, evaluate or benchmark a ResNet-family classifier.  ``python main.py -h`` lists every flag."""

import sys

from image_classification.signals import catch_early

catch_early()  # before torch is imported: a SIGTERM during start-up then stops the run cleanly (exit 75)

from image_classification.cli import run  # noqa: E402
from image_classification.training import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(run(main))
