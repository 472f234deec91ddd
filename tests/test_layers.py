"""The package's layers: imports run one way, from the commands down to the errors, and close no circle.

The import graph is read from the source with ``ast``, the imports inside functions and under
``TYPE_CHECKING`` included: an import deferred into a function still runs, so it may neither point up a
layer nor close a circle.  The README's layout section draws the same order.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from helpers import REPO

PACKAGE = "image_classification"
# Top to bottom.  A module may import the modules of its own layer (without a circle) and of the layers
# below it; a root module belongs to the layer it is listed in, a folder's modules to the folder's.
LAYERS = (
    ("commands", ("commands", "training", "launch", "multiproc", "demo")),
    ("train", ("train",)),
    ("deploy", ("deploy",)),
    ("data", ("data",)),
    ("arguments", ("arguments",)),
    ("models", ("models",)),
    ("system", ("system",)),
    ("records", ("records",)),
    ("base", ("errors", "seeding")),
)
MAX_ROOT_MODULES = 10
DEFERRED = "# deferred:"  # what an import inside a function says on its line


class Import:
    """One import statement of the package's own modules, from ``module`` to ``target``."""

    def __init__(self, module: str, target: str, line: int, in_function: bool, text: str):
        self.module, self.target, self.line, self.in_function, self.text = module, target, line, in_function, text

    def __repr__(self) -> str:
        return f"{self.module}:{self.line} -> {self.target}"


def package_modules(root: Path) -> dict[str, Path]:
    """Every module of the package under ``root`` by dotted name (a folder by its ``__init__.py``)."""
    found = {}
    for path in sorted((root / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _function_imports(tree: ast.AST) -> set[int]:
    """The ids of the import statements that sit inside a function."""
    inside = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            inside |= {id(n) for n in ast.walk(node) if isinstance(n, (ast.Import, ast.ImportFrom))}
    return inside


def imports_of(module: str, path: Path, modules: dict[str, Path]) -> list[Import]:
    """What ``module`` imports of the package: ``from X import name`` is the module ``X.name`` where there is
    one, else ``X``; relative imports resolved from the module's package."""
    source = path.read_text()
    lines = source.splitlines()
    tree = ast.parse(source)
    in_function = _function_imports(tree)
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
        else:
            continue
        for target in targets:
            while target not in modules and "." in target:  # ``import a.b.c`` of a name inside a module
                target = target.rsplit(".", 1)[0]
            if target in modules and target.split(".")[0] == PACKAGE and target != module:
                found.append(Import(module, target, node.lineno, id(node) in in_function, lines[node.lineno - 1]))
    return found


def import_graph(root: Path) -> tuple[dict[str, set[str]], list[Import]]:
    """Each module's imports of the package, a package's ``__init__`` included where importing a module runs
    it first (an ancestor of the target that is not one of the importer's own)."""
    modules = package_modules(root)
    graph: dict[str, set[str]] = {name: set() for name in modules}
    statements = []
    for name, path in modules.items():
        for statement in imports_of(name, path, modules):
            statements.append(statement)
            graph[name].add(statement.target)
            parts = statement.target.split(".")
            for end in range(2, len(parts)):
                ancestor = ".".join(parts[:end])
                if not name.startswith(ancestor + ".") and ancestor != name:
                    graph[name].add(ancestor)
    return graph, statements


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One circle through each strongly connected group of modules (Tarjan's algorithm, then a path back)."""
    index, low, stack, on_stack, groups, counter = {}, {}, [], set(), [], [0]

    def visit(node: str) -> None:  # recursion: the package is a few hundred modules deep at most
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for after in sorted(graph[node]):
            if after not in index:
                visit(after)
                low[node] = min(low[node], low[after])
            elif after in on_stack:
                low[node] = min(low[node], index[after])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(set(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    found = []
    for group in groups:
        start = min(group)
        path, seen = [start], {start}
        while True:  # walk inside the group until the start or a repeat closes a circle
            after = min(graph[path[-1]] & group, key=lambda n: (n != start, n in seen, n))
            if after == start or after in seen:
                found.append(path[path.index(after):] + [after] if after in seen and after != start
                             else path + [start])
                break
            path.append(after)
            seen.add(after)
    return found


def layer_of(module: str) -> int | None:
    """The index of ``module``'s layer in LAYERS (0: the top); None for a module no layer lists."""
    parts = module.split(".")
    if len(parts) == 1:
        return 0  # the package's __init__
    for number, (_, members) in enumerate(LAYERS):
        if parts[1] in members:
            return number
    return None


def upward(statements: list[Import]) -> list[str]:
    """Every import of a module in a layer above the importer's, as a line that names both layers."""
    found = []
    for statement in statements:
        below, above = layer_of(statement.module), layer_of(statement.target)
        if below is not None and above is not None and above < below:
            found.append(f"{statement.module} ({LAYERS[below][0]}) imports {statement.target} "
                         f"({LAYERS[above][0]}) at line {statement.line}")
    return found


# ------------------------------------------------------------------------------------------------
# The package
# ------------------------------------------------------------------------------------------------
def test_every_module_of_the_package_is_in_a_layer():
    unplaced = [name for name in package_modules(REPO) if layer_of(name) is None]
    assert unplaced == [], f"modules in no layer of LAYERS (place them, and in the README's layout): {unplaced}"


def test_the_package_root_holds_at_most_ten_modules():
    root = sorted(path.stem for path in (REPO / PACKAGE).glob("*.py") if path.name != "__init__.py")
    assert len(root) <= MAX_ROOT_MODULES, root


def test_every_folder_says_what_it_holds_and_what_it_may_import():
    for init in sorted((REPO / PACKAGE).glob("*/__init__.py")):
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        assert "May import" in doc, f"{init.relative_to(REPO)}: its docstring names no layers it may import"


def test_imports_close_no_circle_counting_those_inside_functions():
    graph, _ = import_graph(REPO)
    assert circles(graph) == [], "\n".join(" -> ".join(circle) for circle in circles(graph))


def test_no_module_imports_a_layer_above_its_own():
    _, statements = import_graph(REPO)
    assert upward(statements) == [], "\n".join(upward(statements))


def test_an_import_inside_a_function_says_what_it_defers():
    """Inside a function, an import of the package's own modules is there to keep a heavy one (torch, PyYAML,
    DALI) out of a start-up that does not need it, and its line says which."""
    _, statements = import_graph(REPO)
    silent = list(dict.fromkeys(f"{s.module}:{s.line}: {s.text.strip()}" for s in statements
                                if s.in_function and DEFERRED not in s.text))
    assert silent == [], "\n".join(silent)


# ------------------------------------------------------------------------------------------------
# The checks themselves, on a made-up package
# ------------------------------------------------------------------------------------------------
@pytest.fixture
def made_up(tmp_path: Path) -> Path:
    """A package where records/ reaches up into a command from inside a function, closing a circle."""
    files = {
        "__init__.py": "",
        "errors.py": "class UserError(Exception): ...\n",
        "launch.py": "from .records import workspace\n",
        "records/__init__.py": '"""Records.  May import: base."""\n',
        "records/workspace.py": "from ..errors import UserError\n\n\ndef lock():\n    from ..launch import main\n",
    }
    for name, text in files.items():
        path = tmp_path / PACKAGE / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def test_a_circle_through_an_import_inside_a_function_is_found_and_named(made_up):
    graph, _ = import_graph(made_up)
    assert circles(graph) == [[f"{PACKAGE}.launch", f"{PACKAGE}.records.workspace", f"{PACKAGE}.launch"]]


def test_an_import_of_a_higher_layer_is_found_with_both_layers_named(made_up):
    _, statements = import_graph(made_up)
    assert upward(statements) == [f"{PACKAGE}.records.workspace (records) imports {PACKAGE}.launch (commands) "
                                  "at line 5"]
    (silent,) = [s for s in statements if s.in_function]
    assert DEFERRED not in silent.text


def test_importing_a_module_counts_its_package_s_init(made_up):
    """``from .records.workspace import x`` runs records/__init__.py first: an edge to it as well."""
    graph, _ = import_graph(made_up)
    assert graph[f"{PACKAGE}.launch"] == {f"{PACKAGE}.records", f"{PACKAGE}.records.workspace"}
