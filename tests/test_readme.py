"""The pages themselves: docs/options.md's option list is the parser's own text, each docs page starts with its
commands and says what they need, each measured figure names its machine, the Makefile agrees with the README."""

import re

import pytest

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


DOCS_PAGES = sorted((REPO / "docs").glob("*.md"))


def _top(page) -> str:
    """A docs page above its contents line (or its first section, where it has none)."""
    text = page.read_text()
    return re.split(r"^(?:Contents:|## )", text, maxsplit=1, flags=re.M)[0]


@pytest.mark.parametrize("page", DOCS_PAGES, ids=lambda page: page.name)
def test_every_docs_page_starts_with_its_first_commands_in_one_block(page):
    """What a user types first on a page comes first: a bash block within its first lines, above the contents
    and the reference material."""
    top = _top(page)
    assert top.count("```bash\n") == 1, f"{page.name}: no command block above its contents"
    assert page.read_text().splitlines().index("```bash") < 8, f"{page.name}: the command block starts too low"


@pytest.mark.parametrize("page", DOCS_PAGES, ids=lambda page: page.name)
def test_every_docs_page_says_in_one_line_what_its_commands_need(page):
    """`make demo` installs requirements.txt: a page whose commands need more (the test requirements, scikit-image
    for the photo sets) says so above its contents, in one line of text that names requirements-dev.txt."""
    needs = [paragraph for paragraph in _top(page).split("\n\n") if paragraph.startswith("Needs ")]
    assert len(needs) == 1, f"{page.name}: no 'Needs ...' line above the contents"
    commands = page.read_text()
    if re.search(r"-m pytest|--photos|--camera|--make-dataset|compare_val_backends|peer_timm", commands):
        assert "requirements-dev.txt" in needs[0], f"{page.name}: {needs[0]}"


# a figure that depends on the machine: a rate, a time, a speed-up; and what names a machine
MEASURED = re.compile(r"\b\d[\d,.]*\s?(images/s|img/s|ms|s|seconds|min|minutes)\b|\b\d+\.\d+x\b")
MACHINE = re.compile(r"EPYC|Xeon|H100|A100|V100|DGX|T4\b|Measured on")


def figures_without_a_machine(text: str) -> list[str]:
    """The paragraphs (code blocks aside) that state a measured figure where neither they nor an earlier
    paragraph of their section names the machine."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    found = []
    for section in re.split(r"^(?=#{1,4} )", text, flags=re.M):
        named = False
        for paragraph in section.split("\n\n"):
            named = named or bool(MACHINE.search(paragraph))
            if MEASURED.search(paragraph) and not named:
                found.append(paragraph.strip())
    return found


@pytest.mark.parametrize("page", [REPO / "README.md", *DOCS_PAGES], ids=lambda page: page.name)
def test_every_measured_figure_names_the_machine_it_came_from(page):
    """The pages' CPU figures come from AVX512 machines and another CPU runs them at another speed: each says
    where it was measured, in its paragraph or earlier in its section."""
    unnamed = [paragraph for paragraph in figures_without_a_machine(page.read_text())
               if not re.search(r"--dist-timeout|at most 30 s|10m 02s", paragraph)]  # limits and examples
    assert not unnamed, f"{page.name}: {unnamed[0][:300]}"


def test_the_machine_check_finds_a_figure_without_its_machine():
    assert figures_without_a_machine("## A\n\nIt runs 1.3x faster.\n")
    assert not figures_without_a_machine("## A\n\nMeasured on a Xeon.\n\nIt runs 1.3x faster.\n")


def test_the_makefile_gives_no_demo_time_of_its_own_but_points_to_the_readme():
    """The README measures the demo (a figure of its own, with its machine): the Makefile's comment cannot
    disagree with it."""
    line = next(line for line in (REPO / "Makefile").read_text().splitlines() if line.startswith("demo:"))
    comment = line.split("##", 1)[1]
    assert "README.md" in comment
    assert not re.search(r"\d+ ?(s|min)\b|minute|second|hour", comment), comment
