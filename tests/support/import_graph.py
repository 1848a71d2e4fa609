"""The import graph of services/skiplock, read with ast (nothing is imported): for each module,
every module it imports, at module level or inside a function, with the line and whether the
import sits under `if TYPE_CHECKING:`. tests/unit/test_import_rules.py states the rules over it.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "services" / "skiplock"


def _module_name(path: Path) -> str:
    parts = ["skiplock", *path.relative_to(PACKAGE).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(name: str) -> list[tuple[str, int, bool]]:
    """(imported module, line, under TYPE_CHECKING) for every import statement of a module; a
    name imported from a package counts as its submodule when it is one."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []

    def visit(node: ast.AST, typing_only: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child.test):
                for stmt in child.body:
                    visit_stmt(stmt, True)
                for stmt in child.orelse:
                    visit_stmt(stmt, typing_only)
            else:
                visit_stmt(child, typing_only)

    def visit_stmt(node: ast.AST, typing_only: bool) -> None:
        if isinstance(node, ast.Import):
            found.extend((a.name, node.lineno, typing_only) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                module = ".".join([*base, node.module] if node.module else base)
            else:
                module = node.module or ""
            for a in node.names:
                sub = f"{module}.{a.name}"
                found.append((sub if sub in MODULES else module, node.lineno, typing_only))
        else:
            visit(node, typing_only)

    visit(ast.parse(path.read_text(encoding="utf-8")), False)
    return found


GRAPH = {name: _imports(name) for name in MODULES}


def cycles() -> list[list[str]]:
    """Each strongly connected group of two or more modules (Tarjan), as a sorted list."""
    edges = {m: sorted({i for i, _, typing in GRAPH[m] if i in GRAPH and i != m and not typing}) for m in GRAPH}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for v in sorted(edges):
        if v not in index:
            connect(v)
    return sorted(groups)


def loop(group: list[str]) -> str:
    """One import loop through a group cycles() found, as `a -> b -> a`: what to break."""
    members = set(group)
    start = group[0]
    paths = {start: [start]}
    queue = [start]
    while queue:
        here = queue.pop(0)
        for there, _line, typing in GRAPH[here]:
            if there == start and not typing:
                return " -> ".join([*paths[here], start])
            if there in members and there not in paths and not typing:
                paths[there] = [*paths[here], there]
                queue.append(there)
    raise AssertionError(f"no loop through {start}")
