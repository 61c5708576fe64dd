"""``pytest --fsm-coverage MODULE``: the coverage of a machine across a test session.

Every commit any engine of the session makes goes through the ledger
(``runtime.ledger.OBSERVERS``); the history rows of the applied steps of instances of
MODULE's machine are kept (in memory, per instance) and, at the end of the session, their
coverage (``fsm_engine.coverage``) is printed in the terminal summary, as ``fsm
coverage`` prints it (the option repeats: one report per machine).
``--fsm-coverage-fail-under PCT`` fails the session (exit 1) when fewer than PCT % of a
machine's edges were taken; ``--fsm-coverage-diagram DIR`` draws each to
``DIR/<machine>.coverage.svg``.  Only this process's engines are seen: steps made by
``fsm worker`` subprocesses are not.

Loaded with ``fsm_engine.testing.plugin`` (``pytest_plugins = [...]`` or ``-p``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest


class Collector:
    """Keeps the applied history rows of one machine's instances (by instance id)."""

    def __init__(self, module: str) -> None:
        from ..runtime import load_machine
        try:
            self.machine, _ = load_machine(module, named=True)
        except Exception as exc:  # noqa: BLE001 - a usage error, reported as one
            raise pytest.UsageError(f"--fsm-coverage {module}: {exc}") from None
        self.rows: dict[str, list[Any]] = {}

    def __call__(self, steps: Sequence[Any], applied: Sequence[bool]) -> None:
        for step, ok in zip(steps, applied, strict=False):
            if ok:
                self._add(step)

    def _add(self, step: Any) -> None:
        if step.record.machine == self.machine.name and step.history:
            self.rows.setdefault(step.record.id, []).extend(step.history)
        for other in step.also:  # applied with it, all or none
            self._add(other)

    def coverage(self) -> Any:
        """The coverage of the rows kept so far."""
        from ..coverage import collect
        return collect(self.machine.export(), self.rows.values())


_STASH = pytest.StashKey[list[Collector]]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("fsm", "fsm_engine test kit")
    group.addoption("--fsm-coverage", metavar="MODULE", action="append", default=[],
                    help="Report which states, edges, guard outcomes and policy exits of "
                         "MODULE's machine the session exercised (repeatable).")
    group.addoption("--fsm-coverage-fail-under", metavar="PCT", type=float, default=None,
                    help="Fail the session when fewer than PCT %% of a machine's edges "
                         "were taken.")
    group.addoption("--fsm-coverage-diagram", metavar="DIR", default=None,
                    help="Draw each machine's coverage to DIR/<machine>.coverage.svg.")


def pytest_configure(config: pytest.Config) -> None:
    modules = config.getoption("--fsm-coverage", None) or []
    if not modules:
        return
    from ..runtime import ledger
    collectors = [Collector(module) for module in modules]
    ledger.OBSERVERS.extend(collectors)
    config.stash[_STASH] = collectors


def pytest_unconfigure(config: pytest.Config) -> None:
    from ..runtime import ledger
    for collector in config.stash.get(_STASH, []):
        if collector in ledger.OBSERVERS:
            ledger.OBSERVERS.remove(collector)


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    folder = config.getoption("--fsm-coverage-diagram", None)
    for collector in config.stash.get(_STASH, []):
        cov = collector.coverage()
        _summary(terminalreporter, cov)
        if folder:
            from ..diagram.coverage import render_coverage
            path = Path(folder) / (re.sub(r"[^\w.-]", "_", cov.machine) + ".coverage.svg")
            path.parent.mkdir(parents=True, exist_ok=True)
            render_coverage(collector.machine.export(), cov, str(path))
            terminalreporter.write_line(f"  wrote {path}")


def _summary(tr: Any, cov: Any) -> None:
    from ..coverage import verdict
    tr.section(f"fsm coverage: {cov.machine}")
    taken = sum(1 for n in cov.edges.values() if n)
    tr.write_line(f"{cov.instances} instance(s); edges {taken}/{len(cov.edges)} "
                  f"({cov.percent:.1f} %)")
    for edge, n in cov.edges.items():
        tr.write_line(f"  {edge.label}  {n}" + ("" if n else "  never taken"))
    for state, n in cov.states.items():
        if not n:
            tr.write_line(f"  unreached state: {state}")
    for edge, guard, result in cov.one_sided():
        tr.write_line(f"  one-sided guard: {guard} only {result} ({verdict(guard, result)}) "
                      f"on {edge.label}")
    for state, name in sorted(cov.possible):
        if not cov.exits[(state, name)]:
            tr.write_line(f"  policy exit never seen: {state} {name}")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    under = session.config.getoption("--fsm-coverage-fail-under", None)
    if under is None:
        return
    if any(c.coverage().percent < under for c in session.config.stash.get(_STASH, [])):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
