"""The house's shape (issue 20): import circles and module sizes may only shrink.

Each known exception is listed with the redesign step that removes it; a new circle or a
module growing past 500 lines fails here.  The graph is read from source
(``fsm_engine.testing.architecture``), so the tests import nothing of the package's
runtime.  Test modules import no other test module: what two of them share lives in
``tests/helpers/``.
"""

from __future__ import annotations

import ast
import logging
from pathlib import Path

import pytest

import fsm_engine
from fsm_engine.testing.architecture import circles, import_graph

PACKAGE = Path(fsm_engine.__file__).resolve().parent
TESTS = Path(__file__).resolve().parent
MAX_LINES = 500

#: Circles allowed: none since issue 20's rooms step (a new one fails; list one only with the
#: redesign step that removes it).
KNOWN_CIRCLES: set[frozenset[str]] = set()

#: Modules allowed over MAX_LINES, with their size then (may shrink, not grow): none since
#: issue 20's rooms step.
KNOWN_LONG: dict[str, int] = {}


def test_no_import_circle_beyond_the_known_ones() -> None:
    found = set(circles(import_graph(PACKAGE)))
    new = [sorted(c) for c in found if not any(c <= known for known in KNOWN_CIRCLES)]
    assert not new, f"new import circle(s): {new}"


def test_known_circles_that_are_gone_are_struck_from_the_list() -> None:
    found = set(circles(import_graph(PACKAGE)))
    gone = [sorted(k) for k in KNOWN_CIRCLES if not any(c & k for c in found)]
    assert not gone, f"remove from KNOWN_CIRCLES (fixed): {gone}"


def test_modules_stay_under_500_lines() -> None:
    sizes = {str(p.relative_to(PACKAGE.parent)): len(p.read_text(encoding="utf-8").splitlines())
             for p in PACKAGE.rglob("*.py")}
    too_long = {name: n for name, n in sizes.items()
                if n > KNOWN_LONG.get(name, MAX_LINES)}
    assert not too_long, f"modules over their limit: {too_long}"


def test_the_graph_reader_sees_a_circle_and_skips_type_only_imports(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from . import b\n")
    (pkg / "b.py").write_text("def f():\n    from .a import x\n")
    (pkg / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                              "    from .a import y\n")
    graph = import_graph(pkg)
    assert graph["pkg.a"] == {"pkg.b"} and graph["pkg.b"] == {"pkg.a"}
    assert graph["pkg.c"] == set()
    assert circles(graph) == [frozenset({"pkg.a", "pkg.b"})]


def imports_of_test_modules(root: Path) -> list[str]:
    """``"path:line: name"`` for each ``import`` / ``from … import`` (module level or inside
    a function) in a ``.py`` file under ``root`` that names a ``test_*`` module: any dotted
    part of the module, or an imported name (``from tests.cli import test_cli``)."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or "", *(a.name for a in node.names)]
            else:
                continue
            found += [f"{path.relative_to(root)}:{node.lineno}: {name}" for name in names
                      if any(part.startswith("test_") for part in name.split("."))]
    return found


def test_no_test_module_imports_another() -> None:
    found = imports_of_test_modules(TESTS)
    assert not found, f"move what these share into tests/helpers/: {found}"


def test_the_test_import_reader_sees_both_forms_inside_functions_too(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "a.py").write_text("import test_x\nimport helpers.cli\n")
    (tmp_path / "sub" / "b.py").write_text("def f():\n    from test_y import z\n")
    (tmp_path / "c.py").write_text("from tests.cli import test_cli\nfrom procs import stop\n"
                                   "from fsm_engine.testing import contract\n")
    assert imports_of_test_modules(tmp_path) == ["a.py:1: test_x", "c.py:1: test_cli",
                                                 "sub/b.py:2: test_y"]


def test_the_tower_holds_as_written_in_pyproject() -> None:
    """The layering of ``[tool.importlinter]`` (pyproject.toml): cli and ui above the test
    kit above runtime above definition and llm above store above the ground floor, and
    runtime/'s own floors; no import climbs."""
    importlinter_cli = pytest.importorskip("importlinter.cli", reason="the [test] extra brings import-linter")
    loggers = [lg for lg in logging.root.manager.loggerDict.values()
               if isinstance(lg, logging.Logger)]
    enabled = [lg for lg in loggers if not lg.disabled]
    try:
        code = importlinter_cli.lint_imports(
            config_filename=str(PACKAGE.parent / "pyproject.toml"), no_cache=True, no_logo=True)
    finally:  # its logging set-up disables every logger that exists (fsm_engine's too): the
        for lg in enabled:  # later tests of this process would capture no log line
            lg.disabled = False
    assert code == 0, "an import climbs the tower: see lint-imports' report above"
