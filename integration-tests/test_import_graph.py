"""No import cycles between roll's modules, and no config changed after validation.

The import graph has one edge per module-level import (``import roll.x`` / ``from roll.x import y``, where ``y``
may itself be a module) of any roll package's source. Imports inside functions and under ``if TYPE_CHECKING:``
are left out: they do not run when the module is imported. A cycle means a module may see another one half
initialized, depending on which of them is imported first.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SOURCES = sorted((REPO / "packages").glob("roll-*/src"))


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(path, root): path for root in SOURCES for path in root.rglob("*.py")}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _module_level_imports(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    """Imports that run on import: top level, and inside top-level if/try blocks (except TYPE_CHECKING)."""
    found: list[ast.Import | ast.ImportFrom] = []
    pending: list[ast.stmt] = list(tree.body)
    while pending:
        node = pending.pop()
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append(node)
        elif isinstance(node, ast.If):
            if not _is_type_checking(node.test):
                pending += node.body
            pending += node.orelse
        elif isinstance(node, ast.Try):
            pending += node.body + node.orelse + node.finalbody
            for handler in node.handlers:
                pending += handler.body
    return found


def _resolve(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        for node in _module_level_imports(tree):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                source = _resolve(node, name, path.name == "__init__.py")
                # `from package import submodule` depends on the submodule (a package's own __init__ is the
                # implicit parent of every submodule, as for any import, and is not counted as an edge).
                submodules = [f"{source}.{alias.name}" for alias in node.names if f"{source}.{alias.name}" in modules]
                names = [alias.name for alias in node.names if f"{source}.{alias.name}" not in modules]
                targets = submodules + ([source] if names else [])
            graph[name].update(t for t in targets if t in modules and t != name)
    return graph


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected component with more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in sorted(graph[node]):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return components


def test_the_import_graph_has_no_cycles():
    graph = import_graph()
    assert "roll.pipelines.rlvr.pipeline" in graph and "roll.protocol" in graph  # the walk found the sources
    assert find_cycles(graph) == []


def test_the_cycle_finder_finds_cycles():
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert find_cycles({"a": {"b"}, "b": set()}) == []


def test_no_config_is_changed_after_validation():
    """Derived config values are filled in before validation (or are properties), never written afterwards."""
    pattern = re.compile(r"object\.__setattr__\(")
    offenders = [
        f"{path.relative_to(REPO)}:{number}"
        for package in ("roll-strategies", "roll-pipelines", "roll-agentic")
        for path in (REPO / "packages" / package / "src").rglob("*.py")
        for number, line in enumerate(path.read_text().splitlines(), start=1)
        if pattern.search(line)
    ]
    assert offenders == []
