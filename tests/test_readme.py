"""The option list of docs/options.md is the parser's own text, so it cannot drift from the code."""

import re

from helpers import REPO, load_script

options = load_script("readme_options")


def test_the_option_list_is_the_parsers_help():
    page = (REPO / "docs/options.md").read_text()
    assert options.with_options(page) == page, "regenerate the block with: python scripts/readme_options.py"
    assert options.main(["--check"]) == 0


def test_the_docs_name_every_long_flag():
    flags = set(re.findall(r"(--[a-z][a-z0-9_-]+)", options.options_text()))
    docs = "".join(page.read_text() for page in [REPO / "README.md", *(REPO / "docs").glob("*.md")])
    assert flags and all(flag in docs for flag in flags)


def test_the_block_is_rewritten_between_its_markers_and_nowhere_else():
    page = "# Options\n\ntext\n<!-- options:main.py -->\n```\nstale list\n```\n" \
           "<!-- /options:main.py -->\nafter\n"
    rewritten = options.with_options(page)
    assert rewritten.startswith("# Options\n\ntext\n<!-- options:main.py -->\n```\nusage: main.py")
    assert rewritten.endswith("```\n<!-- /options:main.py -->\nafter\n") and "stale list" not in rewritten


def test_a_stale_option_list_fails_the_check(tmp_path, monkeypatch, capsys):
    page = tmp_path / "options.md"
    page.write_text("<!-- options:main.py -->\n```\nusage: main.py [-h]\n```\n<!-- /options:main.py -->\n")
    monkeypatch.setattr(options, "OPTIONS_PAGE", page)
    monkeypatch.setattr(options, "REPO", tmp_path)
    assert options.main(["--check"]) == 1 and "not the parser's text" in capsys.readouterr().err
    assert options.main([]) == 0 and options.main(["--check"]) == 0  # written, then up to date
    page.write_text("no markers\n")
    assert options.main(["--check"]) == 1 and "lacks the markers" in capsys.readouterr().err


def test_the_readme_s_first_screen_says_what_this_is_and_the_two_set_up_commands():
    """A newcomer sees what the repository is and how to start before anything else (the comparison with the
    reference comes later): both set-up commands within the first 24 lines."""
    lines = (REPO / "README.md").read_text().splitlines()
    assert lines[0].startswith("# ConvNets for PyTorch") and "re-implementation" in " ".join(lines[1:5])
    first_screen = lines[:24]
    assert any(line.startswith("make demo ") for line in first_screen)
    assert any(line.startswith("make test ") for line in first_screen)
