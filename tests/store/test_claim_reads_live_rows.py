"""A SQLite claim reads the live rows it may take, not the machine's finished history
(issue 38: "a worker's CPU while nothing is due: one indexed query per poll").

An ``fsm worker`` claims for the machines it loaded (``machines=...``).  With that term
SQLite searched ``idx_instances_machine_status`` by machine alone and read every instance
the machine ever had, finished ones included; after an ``ANALYZE`` (``PRAGMA optimize``
runs one) it scanned the whole table, with or without the term.  A fleet that keeps weeks
of finished instances paid for each of them in every claim and every idle poll.

Measured as SQLite's own count of virtual-machine instructions (a progress handler), not
as time: the claim of 5 due instances beside 4,000 finished ones may cost at most twice
the claim of 5 alone.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from pydantic import BaseModel

from fsm_engine import Engine, Machine, State, Transition


class Ctx(BaseModel):
    n: int = 0


def _go(ctx: Ctx) -> dict[str, int]:
    return {"n": 1}


FLOW = Machine("flow", context=Ctx, states=[State("init", action=_go), State("done", final=True)],
               transitions=[Transition("go", "init", "done")], initial="init")
OTHER = Machine("other", context=Ctx,
                states=[State("init", action=_go), State("done", final=True)],
                transitions=[Transition("go", "init", "done")], initial="init")


def _store(path: Path, finished: int, analyze: bool) -> None:
    """5 pending instances of ``flow`` beside ``finished`` completed ones (and as many of
    another machine), the table analysed when ``analyze``."""
    engine = Engine(str(path))
    try:
        for machine in (FLOW, OTHER):
            if finished:
                engine.start_many(machine, [{}] * finished)
        with sqlite3.connect(path) as conn:
            conn.execute("UPDATE instances SET status = 'completed', next_attempt_at = NULL")
        engine.start_many(FLOW, [{}] * 5)
    finally:
        engine.close()
    if analyze:
        with sqlite3.connect(path) as conn:
            conn.execute("ANALYZE")


def _claim_cost(path: Path, machines: list[str] | None,
                partition_limit: int | None = None) -> tuple[int, int]:
    """SQLite VM instructions (in hundreds) of one claim of up to 10, and how many it got."""
    engine = Engine(str(path))
    try:
        engine.ownership.register()
        conn = engine.store._conn  # noqa: SLF001 - the store's own connection, counted
        ticks = [0]

        def tick() -> int:
            ticks[0] += 1
            return 0
        conn.set_progress_handler(tick, 100)
        try:
            got = engine.ownership.claim(10, machines=machines, partition_limit=partition_limit)
        finally:
            conn.set_progress_handler(None, 0)
        return ticks[0], len(got)
    finally:
        engine.close()


@pytest.mark.parametrize("analyze", [False, True], ids=["no-stats", "analyzed"])
@pytest.mark.parametrize("machines", [["flow"], None], ids=["worker", "any-machine"])
def test_a_claim_costs_the_same_beside_thousands_of_finished_instances(
        tmp_path: Path, analyze: bool, machines: list[str] | None) -> None:
    _store(tmp_path / "fresh.db", 0, analyze)
    _store(tmp_path / "history.db", 4000, analyze)
    alone, got_alone = _claim_cost(tmp_path / "fresh.db", machines)
    beside, got_beside = _claim_cost(tmp_path / "history.db", machines)
    assert got_alone == got_beside == 5
    assert beside <= 2 * alone, (alone, beside)


@pytest.mark.parametrize("analyze", [False, True], ids=["no-stats", "analyzed"])
def test_a_claim_with_a_partition_limit_also_reads_only_live_rows(
        tmp_path: Path, analyze: bool) -> None:
    """The partition-limited claim first counts the candidates of each partition key
    (``claims.claim``): that count reads the same arms."""
    _store(tmp_path / "fresh.db", 0, analyze)
    _store(tmp_path / "history.db", 4000, analyze)
    alone, got_alone = _claim_cost(tmp_path / "fresh.db", ["flow"], partition_limit=3)
    beside, got_beside = _claim_cost(tmp_path / "history.db", ["flow"], partition_limit=3)
    assert got_alone == got_beside == 5
    assert beside <= 2 * alone, (alone, beside)
