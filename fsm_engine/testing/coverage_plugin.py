"""``pytest --fsm-coverage MODULE``: the coverage of a machine across a test session.

Every commit any engine of the session makes goes through the ledger
(``runtime.ledger.OBSERVERS``); the history rows of the applied steps of instances of
MODULE's machine are kept (in memory, per instance) and, at the end of the session, their
coverage (``fsm_engine.coverage``) is printed in the terminal summary, as ``fsm
coverage`` prints it.  ``--fsm-coverage-fail-under PCT`` fails the session (exit 1) when
fewer than PCT % of the edges were taken.  Only this process's engines are seen: steps
made by ``fsm worker`` subprocesses are not.

Loaded with ``fsm_engine.testing.plugin`` (``pytest_plugins = [...]`` or ``-p``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest


class Collector:
    """Keeps the applied history rows of one machine's instances (by instance id)."""

    def __init__(self, module: str) -> None:
        from ..runtime import load_machine
        try:
            self.machine, _ = load_machine(module)
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


_STASH = pytest.StashKey[Collector]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("fsm", "fsm_engine test kit")
    group.addoption("--fsm-coverage", metavar="MODULE", default=None,
                    help="Report which states, edges, guard outcomes and policy exits of "
                         "MODULE's machine the session exercised.")
    group.addoption("--fsm-coverage-fail-under", metavar="PCT", type=float, default=None,
                    help="Fail the session when fewer than PCT %% of the edges were taken.")


def pytest_configure(config: pytest.Config) -> None:
    module = config.getoption("--fsm-coverage", None)
    if not module:
        return
    from ..runtime import ledger
    collector = Collector(module)
    ledger.OBSERVERS.append(collector)
    config.stash[_STASH] = collector


def pytest_unconfigure(config: pytest.Config) -> None:
    collector = config.stash.get(_STASH, None)
    if collector is not None:
        from ..runtime import ledger
        if collector in ledger.OBSERVERS:
            ledger.OBSERVERS.remove(collector)


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    collector = config.stash.get(_STASH, None)
    if collector is None:
        return
    cov = collector.coverage()
    tr = terminalreporter
    tr.section(f"fsm coverage: {cov.machine}")
    taken = sum(1 for n in cov.edges.values() if n)
    tr.write_line(f"{cov.instances} instance(s); edges {taken}/{len(cov.edges)} "
                  f"({cov.percent:.1f} %)")
    for edge, n in cov.edges.items():
        tr.write_line(f"  {edge.label}  {n}" + ("" if n else "  never taken"))
    for edge, guard, result in cov.one_sided():
        tr.write_line(f"  one-sided guard: {guard} only {result} on {edge.label}")
    for state, name in sorted(cov.possible):
        if not cov.exits[(state, name)]:
            tr.write_line(f"  policy exit never seen: {state} {name}")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    collector = session.config.stash.get(_STASH, None)
    under = session.config.getoption("--fsm-coverage-fail-under", None)
    if collector is not None and under is not None and collector.coverage().percent < under:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED

