"""Write main.py's option list into docs/options.md, so that it stays the parser's own text.

    python scripts/readme_options.py           # rewrite the block in docs/options.md
    python scripts/readme_options.py --check   # exit 1 when the block is not the parser's text (no writing)
    python scripts/readme_options.py --print   # print the text

The list sits between ``<!-- options:main.py -->`` and ``<!-- /options:main.py -->``; everything outside
the markers is left as it is.  tests/test_readme.py runs the check.
"""

import os
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from image_classification.arguments import build_parser  # noqa: E402
from image_classification.system.cli import UserErrorParser, run  # noqa: E402

OPTIONS_PAGE = REPO / "docs" / "options.md"
BLOCK = re.compile(r"^(<!-- options:main\.py -->\n).*?^(<!-- /options:main\.py -->)$", re.S | re.M)


def options_text() -> str:
    os.environ["COLUMNS"] = "100"
    return build_parser().format_help()


def with_options(page: str) -> str:
    """``page`` with the text between the markers replaced by the parser's help, as a code block."""
    if not BLOCK.search(page):
        raise KeyError("<!-- options:main.py --> ... <!-- /options:main.py -->")
    text = options_text()
    return BLOCK.sub(lambda match: f"{match.group(1)}```\n{text}```\n{match.group(2)}", page, count=1)


def main(argv: list[str] | None = None) -> int:
    parser = UserErrorParser(prog="readme_options.py", description=__doc__.split("\n\n")[0])
    action = parser.add_mutually_exclusive_group()
    action.add_argument("--check", action="store_true", help="only check that docs/options.md is up to date")
    action.add_argument("--print", action="store_true", help="print the option list instead of writing it")
    args = parser.parse_args(argv)
    if args.print:
        print(options_text(), end="")
        return 0
    page = OPTIONS_PAGE.read_text()
    try:
        updated = with_options(page)
    except KeyError as missing:
        print(f"error: {OPTIONS_PAGE.relative_to(REPO)} lacks the markers {missing}", file=sys.stderr)
        return 1
    if args.check:
        stale = updated != page
        print("docs/options.md is not the parser's text: run python scripts/readme_options.py" if stale
              else "docs/options.md: the parser's text", file=sys.stderr if stale else sys.stdout)
        return 1 if stale else 0
    OPTIONS_PAGE.write_text(updated)
    return 0


if __name__ == "__main__":
    sys.exit(run(main))
