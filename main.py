"""Train, evaluate or benchmark a ResNet-family classifier.  ``python main.py -h`` lists every flag."""

import sys

from image_classification.system.signals import catch_early

catch_early()  # before torch is imported: a SIGTERM during start-up then stops the run cleanly (exit 75)

from image_classification.commands import train  # noqa: E402

if __name__ == "__main__":
    sys.exit(train(prog="main.py"))
