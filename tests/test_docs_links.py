"""Every relative link of the documentation leads to a file that exists, and to a heading of it that exists.

Pure text: the pages are README.md, the per-model READMEs and docs/*.md; an anchor is a heading's GitHub
slug (lower case, punctuation dropped, spaces to hyphens, ``-1``, ``-2`` for repeats).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from helpers import REPO

PAGES = [REPO / "README.md", *sorted(REPO.glob("*/README.md")), *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def _prose(text: str) -> str:
    """``text`` without its fenced code blocks and inline code, where brackets and hashes are not markdown."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", text)


def anchors(text: str) -> set[str]:
    """The anchors GitHub gives the headings of ``text``."""
    seen: dict[str, int] = {}
    for heading in re.findall(r"^#{1,6}\s+(.+?)\s*#*$", re.sub(r"^```.*?^```", "", text, flags=re.S | re.M),
                              flags=re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        seen[slug] = seen.get(slug, -1) + 1
        if seen[slug]:
            seen[f"{slug}-{seen[slug]}"] = 0
    return set(seen)


def broken_links(page: Path) -> list[str]:
    """The relative links of ``page`` whose file or anchor does not exist."""
    broken = []
    for target in LINK.findall(_prose(page.read_text())):
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists():
            broken.append(f"{target}: no file {linked}")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked.read_text()):
            broken.append(f"{target}: no heading with the anchor #{anchor} in {linked.name}")
    return broken


def test_every_docs_page_is_reached_from_the_readme():
    readme = _prose((REPO / "README.md").read_text())
    for page in (REPO / "docs").glob("*.md"):
        assert f"(docs/{page.name})" in readme, f"README.md does not link docs/{page.name}"


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(REPO)))
def test_relative_links_resolve(page):
    assert broken_links(page) == []


def test_the_checker_finds_a_missing_file_and_a_missing_anchor(tmp_path):
    (tmp_path / "other.md").write_text("# Other page\n\n## Set-up: two `make` commands\n\n## Notes\n\n"
                                       "## Notes\n")
    page = tmp_path / "page.md"
    page.write_text("[a](other.md#set-up-two-make-commands) [b](other.md#notes-1) [c](#here) ![d](gone.png)\n"
                    "[e](other.md#nowhere) [f](https://example.com/x#y)\n\n## Here\n\n"
                    "```bash\n# [g](gone.md)\n```\n")
    assert broken_links(page) == [f"gone.png: no file {tmp_path / 'gone.png'}",
                                  "other.md#nowhere: no heading with the anchor #nowhere in other.md"]
