"""A family two levels deep (top -> groups -> items, each level making model calls of its
own): one budget drawn from at every depth, a child's own cap, the top's ``tokens_used``
equal to the family's spend counted independently from every instance's history and failed
attempts, cancellation reaching the grandchildren; on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio

import parallel_machines as pm

from fsm_engine.llm import Scripted

#: Every call: 10 prompt + 20 completion tokens.
CALL = {"text": "ok", "prompt_tokens": 10, "completion_tokens": 20}


def _family(store, iid):
    """``iid`` and every descendant (ids extend their parent's)."""
    out, todo = [], [store.get(iid)]
    while todo:
        rec = todo.pop()
        out.append(rec)
        todo.extend(store.children(rec.id))
    return out


def _billed(store, rec) -> int:
    """The tokens ``rec``'s own calls were billed: its history's model calls (a join's or a
    parent's end's row carries the children's tokens, not calls) and its failed attempts."""
    calls = sum(c.get("tokens", 0) for h in store.history(rec.id)
                for c in h.detail.get("llm_calls", []))
    return calls + sum(a.tokens for a in store.attempts(rec.id))


def _run(engine, machine, groups, **kw):
    iid = engine.start(machine, {"groups": [{"words": g} for g in groups]}, **kw)
    return iid, asyncio.run(engine.run(iid))


def test_the_top_parent_pays_for_every_call_at_every_depth(engine_factory) -> None:
    engine = engine_factory(llm=Scripted.from_replies([CALL], model="m"))
    iid, rec = _run(engine, pm.deep, [["llm0", "llm1", "llm2"], ["llm3", "x"]], token_budget=10_000)
    assert (rec.state, rec.status) == ("done", "completed")
    family = _family(engine.store, iid)
    assert len(family) == 1 + 2 + 5
    # own call of the top, of each group, and of each llm item: 1 + 2 + 4 calls of 30
    assert rec.tokens_used == sum(_billed(engine.store, r) for r in family) == 7 * 30
    for group in engine.store.children(iid):  # each level holds its own subtree
        assert group.tokens_used == sum(_billed(engine.store, r)
                                        for r in _family(engine.store, group.id))


def test_a_grandchild_is_refused_by_the_top_budget_its_aunt_spent(engine_factory) -> None:
    """180 tokens: the top's call (30), group 0 (30 + 3 x 30), group 1's own call (30) —
    then nothing is left, although group 1 was created when only 30 had been spent."""
    engine = engine_factory(llm=Scripted.from_replies([CALL], model="m"))
    iid, rec = _run(engine, pm.deep, [["llm0", "llm1", "llm2"], ["llm3", "llm4"]],
                    token_budget=180)
    g0, g1 = engine.store.children(iid)
    assert (g0.state, g0.tokens_used) == ("done", 120)
    assert (g1.state, g1.reason, g1.tokens_used) == ("over", "token_budget", 30)
    refused = engine.store.children(g1.id)
    assert [(k.status, k.reason, k.tokens_used) for k in refused] == \
        [("failed", "token_budget", 0)]  # the next call in the family, two levels down
    assert (rec.state, rec.reason) == ("over", "token_budget")
    assert rec.tokens_used == sum(_billed(engine.store, r)
                                  for r in _family(engine.store, iid)) == 180


def test_a_child_with_its_own_cap_stops_at_it_inside_the_family(engine_factory) -> None:
    engine = engine_factory(llm=Scripted.from_replies([CALL], model="m"))
    iid, rec = _run(engine, pm.deep_capped, [["llm0", "llm1"], ["llm2", "llm3"]],
                    token_budget=10_000)
    groups = engine.store.children(iid)  # one at a time: the first failure decides
    assert [(g.state, g.reason, g.tokens_used) for g in groups] == \
        [("over", "token_budget", 60)]  # own call + one item; the next item refused
    assert [k.reason for k in engine.store.children(groups[0].id)] == [None, "token_budget"]
    assert (rec.state, rec.reason, rec.tokens_used) == ("over", "token_budget", 30 + 60)


def test_failed_calls_deep_in_the_family_are_paid_for(engine_factory) -> None:
    replies = [{"match": "llmbad", "error": "http400", "prompt_tokens": 7,
                "completion_tokens": 0}, CALL]
    engine = engine_factory(llm=Scripted.from_replies(replies, model="m"))
    iid, rec = _run(engine, pm.deep_both, [["llm0", "llmbad"], ["llm1"]], token_budget=10_000)
    assert (rec.state, rec.status) == ("broken", "failed")
    family = _family(engine.store, iid)
    bad = next(r for r in family if r.context.get("word") == "llmbad")
    assert bad.status == "failed" and bad.tokens_used == 7
    # group 1 may have run its item or been cancelled by the join: the sum holds either way
    assert rec.tokens_used == sum(_billed(engine.store, r) for r in family)
    assert rec.tokens_used - 7 in (4 * 30, 5 * 30)


def test_cancelling_the_top_cancels_the_grandchildren_and_counts_their_tokens(
        engine_factory) -> None:
    engine = engine_factory(llm=Scripted.from_replies([CALL], model="m"), lease_seconds=1.0)
    other = engine_factory()

    async def go():
        iid = engine.start(pm.deep_both, {"groups": [{"words": ["llm0", "slow"]},
                                                     {"words": ["slow"]}]})
        task = asyncio.ensure_future(engine.run(iid))
        while sum(1 for r in _family(engine.store, iid) if r.context.get("word") == "slow") < 2 \
                or not any(r.status == "completed" for r in _family(engine.store, iid)):
            await asyncio.sleep(0.02)
        other.cancel(iid)  # as `fsm cancel` would, from another process
        return iid, await asyncio.wait_for(task, 30)
    iid, rec = asyncio.run(go())
    assert rec.status == "cancelled"
    family = _family(engine.store, iid)
    assert all(r.final for r in family)
    slow = [r for r in family if r.context.get("word") == "slow"]
    assert [(r.status, r.reason) for r in slow] == [("cancelled", "parent_cancelled")] * 2
    assert rec.tokens_used == sum(_billed(engine.store, r) for r in family) == 4 * 30


def test_fsm_stats_counts_each_token_once_where_the_call_was_made(tmp_path) -> None:
    """The top's ``tokens_used`` holds the whole family's, but ``fsm stats --json`` counts
    each call's tokens in the rows of the instance that made it (a join row's
    ``children_tokens`` left out): per machine and per state, equal to a count of the model
    calls recorded in every instance's history, and in all equal to the top's spend."""
    import json
    from collections import Counter

    from typer.testing import CliRunner

    from fsm_engine import Engine
    from fsm_engine.cli import app
    db = str(tmp_path / "fsm.db")
    engine = Engine(db, llm=Scripted.from_replies([CALL], model="m"))
    iid, rec = _run(engine, pm.deep_both, [["llm0", "llm1"], ["llm2", "x"]],
                    token_budget=10_000)
    assert rec.status == "completed"
    per_machine: Counter = Counter()
    per_state: Counter = Counter()
    for r in _family(engine.store, iid):
        for h in engine.store.history(r.id):
            calls = sum(c["tokens"] for c in h.detail.get("llm_calls", []))
            per_machine[r.machine] += calls
            per_state[(r.machine, h.source)] += calls
    engine.close()
    result = CliRunner().invoke(app, ["stats", "--db", db, "--json"])
    assert result.exit_code == 0, result.output
    figures = json.loads(result.stdout)
    assert {m: f["tokens"]["total"] for m, f in figures.items()} == dict(per_machine)
    assert {(m, s): st["tokens"]["total"] for m, f in figures.items()
            for s, st in f["states"].items() if st["steps"]} == dict(per_state)
    assert figures["deep_both"]["states"]["map"]["tokens"]["total"] == 0  # the join row
    assert sum(per_machine.values()) == rec.tokens_used == 6 * 30
