"""The package's import graph, read from source (no module is imported).

Used by ``tests/test_architecture.py`` to keep the house's shape: which import circles
exist, how long modules are.  An edge ``a -> b`` is any ``import`` / ``from … import`` in
``a`` that names module ``b`` of the package, at module level or inside a function (a
lazy import is still a dependency); imports under ``if TYPE_CHECKING:`` are not edges
(type-only).  Circles are the strongly connected components of more than one module
(Tarjan, "Depth-first search and linear graph algorithms", SIAM J. Comput. 1972).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

__all__ = ["module_names", "import_graph", "circles"]


def module_names(package: Path) -> dict[str, Path]:
    """``{"fsm_engine.store.base": path, …}`` for every ``.py`` file under ``package``."""
    out: dict[str, Path] = {}
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


class _Imports(ast.NodeVisitor):
    """The package modules one file imports (``TYPE_CHECKING`` blocks left out)."""

    def __init__(self, module: str, is_package: bool, known: set[str]) -> None:
        self.base = module.split(".") if is_package else module.split(".")[:-1]
        self.known = known
        self.found: set[str] = set()

    def visit_If(self, node: ast.If) -> None:
        body = node.orelse if _is_type_checking(node.test) else [*node.body, *node.orelse]
        for child in body:
            self.visit(child)
        self.visit(node.test)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level:
            base = self.base[:len(self.base) - (node.level - 1)]
            name = ".".join(base + ([node.module] if node.module else []))
        else:
            name = node.module or ""
        for alias in node.names:
            full = f"{name}.{alias.name}"
            self._add(full if full in self.known else name)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._add(alias.name)

    def _add(self, name: str) -> None:
        if name in self.known:
            self.found.add(name)


def import_graph(package: Path) -> dict[str, set[str]]:
    """Each module of ``package`` -> the package modules it imports (itself excluded)."""
    names = module_names(package)
    graph: dict[str, set[str]] = {}
    for module, path in names.items():
        visitor = _Imports(module, path.name == "__init__.py", set(names))
        visitor.visit(ast.parse(path.read_text(encoding="utf-8"), str(path)))
        graph[module] = visitor.found - {module}
    return graph


def circles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The import circles of ``graph``: components of two or more modules that reach each
    other (Tarjan's algorithm, iterative)."""
    search = _Tarjan(graph)
    for root in graph:
        if root not in search.index:
            search.run(root)
    return search.found


class _Tarjan:
    """Tarjan's strongly connected components, with an explicit stack of iterators."""

    def __init__(self, graph: dict[str, set[str]]) -> None:
        self.graph = graph
        self.index: dict[str, int] = {}
        self.low: dict[str, int] = {}
        self.stack: list[str] = []
        self.on_stack: set[str] = set()
        self.found: list[frozenset[str]] = []

    def _enter(self, node: str, work: list[tuple[str, Iterator[str]]]) -> None:
        self.index[node] = self.low[node] = len(self.index)
        self.stack.append(node)
        self.on_stack.add(node)
        work.append((node, iter(sorted(self.graph.get(node, ())))))

    def run(self, root: str) -> None:
        work: list[tuple[str, Iterator[str]]] = []
        self._enter(root, work)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    parent = work[-1][0]
                    self.low[parent] = min(self.low[parent], self.low[node])
                self._close(node)
            elif child not in self.index:
                self._enter(child, work)
            elif child in self.on_stack:
                self.low[node] = min(self.low[node], self.index[child])

    def _close(self, node: str) -> None:
        """Pop ``node``'s component off the stack once ``node`` is its root."""
        if self.low[node] != self.index[node]:
            return
        component = set()
        while True:
            member = self.stack.pop()
            self.on_stack.discard(member)
            component.add(member)
            if member == node:
                break
        if len(component) > 1:
            self.found.append(frozenset(component))
