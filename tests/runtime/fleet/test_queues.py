"""Queues, partitions and shared rate limits in one process: the pure plans, the hand-off
at a queue boundary, a durable rate-limited wait, and the CLI's options."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from pathlib import Path

import pytest
from cli import run_main
from queued_machine import MACHINE, Ctx, fetch, replies

from fsm_engine import Machine, State, Transition
from fsm_engine.errors import InvalidInput
from fsm_engine.policies import RateLimit
from fsm_engine.runtime.fleet.adoption import claim_request
from fsm_engine.runtime.fleet.queues import QueueClaim, QueuePlan, parse_counts
from fsm_engine.runtime.fleet.rates import limits_from_specs
from fsm_engine.store.claims import share


def swallow(ctx: Ctx, step) -> dict:
    try:
        step.llm.complete_sync([{"role": "user", "content": "hi"}], max_tokens=20)
    except Exception:  # noqa: BLE001 - an action hiding the wait must not get past it
        pass
    return {"answer": "guessed"}


SWALLOW = Machine(
    name="swallow", context=Ctx, initial="ask",
    states=[State("ask", action=swallow, queue="llm"), State("done", final=True)],
    transitions=[Transition("next", "ask", "done")])


# -- the pure parts ------------------------------------------------------------------------
def test_share_gives_least_loaded_partitions_slots_round_robin() -> None:
    groups = [("big", 1, 500), ("small", 900, 10), (None, 5, 3)]
    assert dict(share(groups, {"big": 1}, 2, 10)) == {"big": 1, "small": 2, None: 3}
    assert share(groups, {"big": 2, "small": 2}, 2, 10) == [(None, 3)]
    # one slot: the unloaded key before the loaded one, though the loaded one is older
    assert share([("big", 1, 5), ("small", 9, 5)], {"big": 1}, 3, 1) == [("small", 1)]


def test_queue_plan_claims_limited_queues_apart() -> None:
    plan = QueuePlan(total=10, per_queue={"llm": 2}, global_limits={"io": 5})
    assert plan.claims(Counter({"llm": 1})) == [
        QueueClaim(("io",), (), 9, 5), QueueClaim(("llm",), (), 1, None),
        QueueClaim(None, ("io", "llm"), 9)]
    served = QueuePlan(total=4, serve=("llm", "default"), per_queue={"llm": 2})
    assert served.claims(Counter({"llm": 2})) == [QueueClaim(("default",), (), 2)]
    assert served.claims(Counter({"default": 4})) == []


def test_queue_plan_hands_off_where_it_must() -> None:
    plan = QueuePlan(total=10, serve=("io", "llm", "default"), per_queue={"llm": 1},
                     global_limits={"io": 3})
    assert plan.hands_off("other", Counter())  # not served here
    assert plan.hands_off("io", Counter())  # limited over all workers: claimed again
    assert not plan.hands_off("llm", Counter()) and plan.hands_off("llm", Counter({"llm": 1}))
    assert not plan.hands_off("default", Counter({"default": 9}))


def test_counts_and_rate_limit_specs_parse_or_say_why() -> None:
    assert parse_counts(["64"], "--concurrency") == (64, {})
    assert parse_counts(["llm=4,io=32", "8"], "--concurrency") == (8, {"llm": 4, "io": 32})
    for bad in ("llm=0", "x", "9q=2", "=3"):
        with pytest.raises(InvalidInput, match="--concurrency"):
            parse_counts([bad], "--concurrency")
    got = limits_from_specs(["primary=rpm:10,tpm:500,window:2"], {"FSM_RATE_LIMIT_DEFAULT": "tpm:9"})
    assert got == {"primary": RateLimit(rpm=10, tpm=500, window_s=2.0), "*": RateLimit(tpm=9)}
    for bad in ("primary", "p=tpm:0", "p=tpm:x", "p=speed:3", "p=window:3"):
        with pytest.raises(InvalidInput):
            limits_from_specs([bad], {})


def test_a_bad_state_queue_is_a_definition_error() -> None:
    from fsm_engine.errors import DefinitionError
    from fsm_engine.runtime.compiled import compile_machine
    bad = Machine(name="b", context=Ctx, initial="a",
                  states=[State("a", action=fetch, queue="no spaces"), State("z", final=True)],
                  transitions=[Transition("t", "a", "z")])
    with pytest.raises(DefinitionError, match="queue must be a name"):
        compile_machine(bad)


# -- one engine ------------------------------------------------------------------------------
def test_queue_follows_the_state_and_a_worker_hands_off_at_the_boundary(engine_factory) -> None:
    engine = engine_factory(llm=replies())
    iid = engine.start(MACHINE, {}, partition="tenant-a")
    engine.ledger.release(engine.worker.id)
    assert (engine.store.get(iid).queue, engine.store.get(iid).partition_key) == \
        ("io", "tenant-a")
    engine.driver.hand_off = lambda before, after: after.queue == "llm"
    [rec] = engine.ownership.claim(5, queues=["io"])
    engine._known[rec.id] = rec  # as a worker does with what it claimed
    rec = asyncio.run(engine.run(rec.id, family=False))
    stored = engine.store.get(iid)
    assert (stored.state, stored.queue, stored.status, stored.owner) == \
        ("ask", "llm", "running", None)  # given back in the commit that moved it
    assert engine.ownership.claim(5, queues=["io"]) == []
    [again] = engine.ownership.claim(5, queues=["llm"], queue_limit=1, partition_limit=1)
    engine._known[again.id] = again
    assert asyncio.run(engine.run(again.id, family=False)).status == "completed"
    assert engine.store.get(iid).queue == "default"  # the final state's


def test_a_rate_limited_call_waits_durably_without_spending_an_attempt(engine_factory,
                                                                       store_url, capsys) -> None:
    limit = RateLimit(tpm=40, window_s=30.0)  # one call (~31 estimated, 15 billed) per window…
    engine = engine_factory(llm=replies(), rate_limits={"*": limit})
    a, b = engine.start(SWALLOW, {}), engine.start(SWALLOW, {})
    first = asyncio.run(engine.run(a, family=False))
    assert first.status == "completed" and first.context["answer"] == "guessed"
    second = asyncio.run(engine.run(b, family=False))  # … so this one must wait
    assert (second.status, second.reason, second.owner, second.attempt, second.state) == \
        ("waiting", "rate_limited", None, 1, "ask")
    assert second.next_attempt_at > engine.clock() + 10  # the first call counts for a window
    assert engine.store.attempts(b) == [] and engine.store.history(b) == []
    assert "rate limit of 'scripted:scripted'" in second.last_error
    code, out, _ = run_main(["show", b, "--db", store_url, "--json"], capsys)
    assert code == 0
    shown = json.loads(out)["limits"]["rate_limited"]
    assert shown["until"] == second.next_attempt_at and "rate limit" in shown["why"]
    # not claimable before its time, claimable (and running again) after it
    assert engine.ownership.claim(5) == []
    [back] = engine.store.claim(claim_request(engine.worker.id, second.next_attempt_at + 0.01))
    assert (back.status, back.reason) == ("running", None)


def test_a_local_run_waits_for_the_window_then_completes(engine_factory) -> None:
    limit = RateLimit(tpm=60, window_s=0.3)
    engine = engine_factory(llm=replies(), rate_limits={"*": limit})
    ids = [engine.start(MACHINE, {}) for _ in range(3)]
    done = asyncio.run(engine.run_many(ids))
    assert [r.status for r in done] == ["completed"] * 3
    waited = [r for r in done if r.last_error and "rate limit" in r.last_error]
    assert waited and all(engine.store.attempts(r.id) == [] for r in done)


def test_a_store_fault_lets_rate_limited_calls_through(engine_factory, monkeypatch) -> None:
    from fsm_engine.errors import StoreError
    engine = engine_factory(llm=replies(), rate_limits={"*": RateLimit(rpm=1)})

    def broken(*args, **kwargs):
        raise StoreError("database restarting")
    monkeypatch.setattr(engine.store, "rate_acquire", broken)
    ids = [engine.start(MACHINE, {}) for _ in range(2)]
    assert [r.status for r in asyncio.run(engine.run_many(ids))] == ["completed"] * 2


# -- the command line -----------------------------------------------------------------------
@pytest.mark.parametrize("argv, needle", [
    (["--concurrency", "llm=0"], "--concurrency"),
    (["--queue-limit", "8"], "--queue-limit"),
    (["--queue", "no good"], "--queue"),
    (["--rate-limit", "primary=tpm:nope"], "rate limit"),
])
def test_bad_worker_options_are_one_line(tmp_path: Path, capsys, argv, needle) -> None:
    code, _, err = run_main(["worker", "--db", str(tmp_path / "x.db"), *argv], capsys)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("fsm: error: "), err
    assert needle in lines[0]
    assert not (tmp_path / "x.db").exists()  # nothing written


def test_start_records_the_partition(tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.chdir(Path(__file__).resolve().parents[3])
    (tmp_path / "in.json").write_text('{"path": "/usr/share/common-licenses/MIT"}')
    db = str(tmp_path / "s.db")
    code, out, err = run_main(["start", "machines/moderation.py", "--input",
                               str(tmp_path / "in.json"), "--db", db, "--partition", "t1"], capsys)
    assert code == 0, err
    from fsm_engine.store import open_store
    store = open_store(db)
    [rec] = store.list()
    assert (rec.id, rec.partition_key, rec.queue, rec.owner) == (out.strip(), "t1", "default", None)
    store.close()
    assert claim_request("w", 1.0).partition_limit is None


def test_show_tells_rate_waits_breaker_fallbacks_and_budget_ends_apart() -> None:
    from fsm_engine.store import HistoryRow
    from fsm_engine.testing.contract import record
    from fsm_engine.views import limits_json
    rec = record("a", status="waiting")
    rec.reason, rec.next_attempt_at, rec.last_error = "rate_limited", 5.0, "rate limit of 'p:m'"
    rows = [HistoryRow("a", 1, "infer", "degraded", "fallback", 1.0, kind="fallback",
                       reason="circuit_open"),
            HistoryRow("a", 2, "degraded", "cheap", "budget_exhausted", 2.0, kind="fallback",
                       reason="token_budget"),
            HistoryRow("a", 3, "cheap", "ask", "next", 3.0)]
    assert limits_json(rec, rows) == {
        "rate_limited": {"until": 5.0, "why": "rate limit of 'p:m'"},
        "circuit_open": [{"seq": 1, "state": "infer", "to": "degraded", "kind": "fallback"}],
        "token_budget": [{"seq": 2, "state": "degraded", "to": "cheap", "kind": "fallback"}]}
    rec.status = "running"
    assert limits_json(rec, rows[2:]) == {}
