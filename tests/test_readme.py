"""The README's option list is the parser's own text, so it cannot drift from the code."""

import re
import sys

from helpers import REPO

sys.path.insert(0, str(REPO / "scripts"))

from readme_options import options_text  # noqa: E402


def test_readme_options_block_is_the_parsers_help():
    readme = (REPO / "README.md").read_text()
    assert options_text() in readme, "regenerate the block with: python scripts/readme_options.py"


def test_readme_names_every_long_flag_with_its_default():
    text = options_text()
    flags = set(re.findall(r"(--[a-z][a-z0-9_-]+)", text))
    readme = (REPO / "README.md").read_text()
    assert flags and all(flag in readme for flag in flags)
