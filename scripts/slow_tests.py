"""The slow tests a change must pass before it is done: those of the test modules that import what it changed.

    python3 scripts/slow_tests.py                 # the test modules, against main
    python3 scripts/slow_tests.py --since HEAD~3  # against another revision
    python3 scripts/slow_tests.py --run -- -n 2   # and run their slow tests (pytest -m slow, then the arguments)

``make test`` (what CI runs) leaves the tests marked ``slow`` out; ``make test-all`` runs them all.  A test
module covers a module when it imports it, or a module that imports it however indirectly (``from
image_classification.data import files``, ``load_script("gpu_report")``, a script's file name); so the slow
tests that can catch a change are those of the test modules that cover a changed file, or that changed
themselves.  It reads each module's AST and imports no torch.
"""

from __future__ import annotations

import ast
import functools
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
PACKAGE = "image_classification"

from image_classification.errors import UserError  # noqa: E402
from image_classification.system.cli import UserErrorParser, run  # noqa: E402  (imports no torch)


def changed_files(since: str) -> list[str]:
    """Files changed since ``since`` (committed, staged or not), relative to the repository."""
    listed = subprocess.run(["git", "diff", "--name-only", since, "--"], cwd=REPO, capture_output=True,
                            text=True, check=True).stdout
    return listed.splitlines()


def module_name(path: Path) -> str:
    """A package file's dotted module (a package's ``__init__`` names the package)."""
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_imports(path: Path) -> set[str]:
    """The package's modules that a package file imports, relative imports resolved (``from .x import y`` names
    ``x`` and ``x.y``, one of which is a module)."""
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = package.split(".")[:len(package.split(".")) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            names.add(module)
            names.update(f"{module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return {name for name in names if name.split(".")[0] == PACKAGE}


@functools.cache
def package_graph() -> dict[str, set[str]]:
    """Each package module and the package's modules it imports."""
    return {module_name(path): package_imports(path) for path in (REPO / PACKAGE).rglob("*.py")}


def affected_names(changed: list[str]) -> set[str]:
    """What a test module may name the change by: each changed package module and every package module that
    imports one of them, however indirectly; a changed script's bare name (scripts are loaded by name)."""
    files = package_graph()
    affected = set()
    for path in changed:
        if path.startswith(f"{PACKAGE}/"):
            affected.add(module_name(REPO / path))
        else:
            affected.add(Path(path).stem)
    grown = True
    while grown:  # the modules that import an affected one are affected
        before = len(affected)
        affected |= {module for module, imports in files.items() if imports & affected}
        grown = len(affected) > before
    return affected


@functools.cache
def imported_names(test: Path) -> set[str]:
    """Every module a test module imports (``from a.b import c`` names ``a.b`` and ``a.b.c``), and every string
    constant, which names the scripts it loads."""
    names = set()
    for node in ast.walk(ast.parse(test.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            names.add(Path(node.value).stem)
    return names


def has_slow_tests(test: Path) -> bool:
    return "mark.slow" in test.read_text()


def covering_tests(changed: list[str]) -> list[str]:
    """The test modules with slow tests that import a changed file or are one; for a changed file that is not
    Python (a page of docs/, configs.yml, a recipe), those whose source names it or its folder."""
    code = [path for path in changed if path.endswith(".py")]
    other = [Path(path) for path in changed if not path.endswith(".py")]
    wanted = affected_names(code)
    found = []
    for test in sorted((REPO / "tests").glob("test_*.py")):
        relative, text = str(test.relative_to(REPO)), test.read_text()
        names_other = any(path.name in text or (len(path.parts) > 1 and f'"{path.parts[0]}' in text)
                          for path in other)
        if has_slow_tests(test) and (relative in changed or wanted & imported_names(test) or names_other):
            found.append(relative)
    return found


def main(argv: list[str] | None = None) -> int:
    parser = UserErrorParser(prog="slow_tests.py", description=__doc__.splitlines()[0])
    parser.add_argument("--since", default="main", help="the revision the change is against (default: main)")
    parser.add_argument("--run", action="store_true", help="run their slow tests with pytest -m slow")
    parser.add_argument("pytest_args", nargs="*", help="after --: more arguments for pytest")
    args = parser.parse_args(argv)
    try:
        tests = covering_tests(changed_files(args.since))
    except subprocess.CalledProcessError as error:
        raise UserError(f"git diff {args.since} failed: {error.stderr.strip()}") from None
    print("\n".join(tests) if tests else "no slow test covers the change")
    if not args.run or not tests:
        return 0
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-m", "slow", *args.pytest_args, *tests],
                          cwd=REPO).returncode


if __name__ == "__main__":
    sys.exit(run(main))
