"""The reference machines' own cases (``CASES``) pass on the virtual clock, reach 100 % of
their edges, and their committed coverage diagrams (``diagrams/*.coverage.dot``) are
current."""

from __future__ import annotations

from pathlib import Path

import pytest

from fsm_engine import load_machine
from fsm_engine.diagram.coverage import coverage_dot
from fsm_engine.testing.cases import cases_of, run_cases

ROOT = Path(__file__).resolve().parents[2]
MODULES = sorted(p for p in (ROOT / "machines").glob("*.py") if not p.name.startswith("_"))


@pytest.mark.parametrize("module", MODULES, ids=lambda p: p.stem)
def test_cases_pass_and_reach_every_edge(module: Path) -> None:
    machine, _ = load_machine(str(module))
    results, cov = run_cases(machine, cases_of(str(module), machine))
    failed = {r.name: r.problems for r in results if not r.ok}
    assert not failed, failed
    untaken = [e.label for e, n in cov.edges.items() if not n]
    assert cov.percent == 100.0, untaken
    dot = ROOT / "diagrams" / f"{module.stem}.coverage.dot"
    assert dot.read_text() == coverage_dot(machine.export(), cov), (
        f"{dot} is stale: run `fsm test machines/{module.name} --diagram {dot}` (and .svg)")
    assert dot.with_suffix(".svg").exists()
