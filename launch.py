"""Train, evaluate or benchmark with a preset from configs.yml: see ``python launch.py -h`` and ``--list``."""

import sys

from image_classification.system.signals import catch_early

catch_early()  # before torch is imported: a SIGTERM during start-up then stops the run cleanly (exit 75)

from image_classification.commands import launch  # noqa: E402

if __name__ == "__main__":
    sys.exit(launch(prog="launch.py"))
