"""``fsm_engine.coverage``: states, edges, guard outcomes and policy exits from history
rows, equal to an independent count over the stored rows, on both backends."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from typing import Any

from fsm_engine.coverage import Edge, from_store
from tests.helpers.cover_machine import machine

pytest_plugins = ["fsm_engine.testing.plugin"]


def _raw_rows(store_url: str) -> list[tuple[str, str, str, str, str]]:
    """(source, trigger, dest, kind, guards JSON) of every history row, read with the
    backend's own driver (not through fsm_engine)."""
    sql = "SELECT source, trigger, dest, kind, guards FROM history"
    if store_url.startswith("postgresql"):
        import psycopg
        with psycopg.connect(store_url) as conn:
            return [tuple(r) for r in conn.execute(sql).fetchall()]  # type: ignore[misc]
    import sqlite3
    with sqlite3.connect(store_url) as conn:
        return [tuple(r) for r in conn.execute(sql).fetchall()]


def _run(engine: Any, inputs: list[dict[str, Any]]) -> None:
    ids = [engine.start(machine, i) for i in inputs]
    asyncio.run(engine.run_many(ids))


def test_coverage_equals_an_independent_count(engine_factory: Any, store_url: str) -> None:
    engine = engine_factory()
    _run(engine, [{"n": 12}, {"n": 3}, {"n": 4}, {"n": -1}, {"n": 7}])
    cov = from_store(engine.store, machine.export())
    rows = _raw_rows(store_url)
    moves = Counter((s, t, d) for s, t, d, _, _ in rows)
    taken = {(e.source, e.trigger, e.dest): n for e, n in cov.edges.items()}
    assert {k: v for k, v in taken.items() if v} == \
        {k: v for k, v in moves.items() if k in taken}
    outcomes: Counter[tuple[str, bool]] = Counter()
    for *_, guards in rows:
        outcomes.update((g, r) for g, r in json.loads(guards or "[]"))
    ours: Counter[tuple[str, bool]] = Counter()
    for (_, guard), c in cov.guards.items():
        ours.update({(guard, r): n for r, n in c.items()})
    assert +ours == +outcomes
    entered = Counter(d for _, _, d, kind, _ in rows if kind != "cancel")
    entered["measure"] += 5
    assert {s: n for s, n in cov.states.items() if n} == dict(entered)
    assert cov.instances == 5
    assert cov.exits[("measure", "fallback")] == 1
    assert cov.exits[("small", "no_transition")] == 1
    assert cov.percent == 100.0


def test_guard_results_are_told_apart_per_transition(engine_factory: Any) -> None:
    engine = engine_factory()
    _run(engine, [{"n": 3}])
    cov = from_store(engine.store, machine.export())
    big = Edge("measure", "big", "large", ("is_big",))
    small = Edge("measure", "small", "small", ("!is_big",))
    assert cov.guards[(big, "is_big")] == Counter({False: 1})
    assert cov.guards[(small, "!is_big")] == Counter({False: 1})  # is_big said False: passed
    assert (big, "is_big", False) in cov.one_sided()
    assert cov.edges[big] == 0 and cov.edges[small] == 1
    assert len(cov.edges) == 6  # five declared and the fallback
    assert round(cov.percent, 1) == 33.3  # measure->small, small->done
    assert cov.states["rescue"] == 0


def _row(seq: int, source: str, trigger: str, dest: str, guards: list[list[Any]],
         kind: str = "transition") -> Any:
    from fsm_engine.store.records import HistoryRow
    return HistoryRow("i", seq, source, dest, trigger, 0.0, kind=kind, guards=guards)


def test_a_fired_trigger_and_a_changed_definition_are_told_apart() -> None:
    from fsm_engine.coverage import collect
    export = machine.export()
    fired = [_row(1, "measure", "small", "small", [["!is_big", False]]),  # fire("small")
             _row(2, "small", "next", "done", [["!is_lucky", False]])]
    changed = [_row(1, "measure", "big", "large", [["is_huge", True]]),  # a guard renamed
               _row(2, "large", "next", "done", [])]
    cov = collect(export, [fired, changed])
    small = Edge("measure", "small", "small", ("!is_big",))
    big = Edge("measure", "big", "large", ("is_big",))
    assert cov.edges[small] == 1 and cov.guards[(small, "!is_big")] == Counter({False: 1})
    assert cov.edges[big] == 1 and not cov.guards[(big, "is_big")]  # counted, guards unseen
    assert cov.instances == 2 and cov.states["done"] == 2 and cov.states["measure"] == 2
    assert [list(p) for p in cov.paths] == [
        [small, Edge("small", "next", "done", ("!is_lucky",))],
        [big, Edge("large", "next", "done")]]
