"""Print main.py's option list as the README shows it: ``python scripts/readme_options.py``.

The README's "Command-line options" block is this output, so it stays the parser's own text;
tests/test_readme.py checks that they agree.
"""

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from image_classification.arguments import build_parser  # noqa: E402


def options_text() -> str:
    os.environ["COLUMNS"] = "100"
    return build_parser().format_help()


if __name__ == "__main__":
    print(options_text(), end="")
