"""The engine split (#20 step 3): ``Engine`` is a face over a registry, a client and a
runner; the worker drives the runner through its public API only; arrows point down."""

from __future__ import annotations

import ast
from pathlib import Path

RUNTIME = Path(__file__).resolve().parents[2] / "fsm_engine" / "runtime"


def private_reach_ins(source: str) -> list[str]:
    """``x._name`` uses (not dunders) where ``x`` is anything but ``self``, and any use of
    a ``driver``: what a module takes from others' insides."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Attribute):
            continue
        owner = ast.unparse(node.value)
        private = node.attr.startswith("_") and not node.attr.startswith("__")
        if (private and owner != "self") or node.attr == "driver":
            found.append(f"line {node.lineno}: {owner}.{node.attr}")
    return found


def imported(name: str) -> set[str]:
    """The runtime modules ``runtime/<name>.py`` imports (relative, one level), by their
    last name: ``from .kinds import families`` and ``from .kinds.families import x`` both
    give ``families`` (and ``kinds``)."""
    tree = ast.parse((RUNTIME / f"{name}.py").read_text(encoding="utf-8"))
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            parts = node.module.split(".") if node.module else []
            out |= set(parts)
            if len(parts) <= 1:  # names from a package may be its modules
                out |= {a.name for a in node.names}
    return out


def test_the_worker_touches_no_private_state_of_the_engine_or_runner() -> None:
    src = (RUNTIME / "worker.py").read_text(encoding="utf-8")
    assert private_reach_ins(src) == []


def test_the_scan_sees_a_reach_in() -> None:
    src = "def f(engine):\n    engine._known[1] = 2\n    engine.driver.hand_off = 3\n" \
          "    self.runner._tasks\n    self._mine\n"
    assert sorted(private_reach_ins(src)) == ["line 2: engine._known", "line 3: engine.driver",
                                      "line 4: self.runner._tasks"]


def test_the_parts_import_downward_only() -> None:
    assert "engine" not in imported("runner") | imported("client") | imported("registry")
    assert not {"runner", "families", "threads", "worker"} & imported("client")
    assert not {"runner", "client", "driver"} & imported("registry")


def test_the_engine_is_a_face_over_the_three_parts(tmp_path: Path) -> None:
    from fsm_engine import Engine
    from fsm_engine.runtime.client import Client
    from fsm_engine.runtime.registry import Registry
    from fsm_engine.runtime.runner import Runner

    engine = Engine(str(tmp_path / "fsm.db"), tracer=None)
    try:
        assert isinstance(engine.registry, Registry)
        assert isinstance(engine.client, Client) and isinstance(engine.runner, Runner)
        assert engine.client.known is engine.runner.known  # one table of records taken up
        engine.concurrency = 3
        assert engine.runner.concurrency == 3
    finally:
        engine.close()
