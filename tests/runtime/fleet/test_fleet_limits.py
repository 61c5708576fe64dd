"""The fleet's limits kept in the store (``fsm limits``, ``runtime.fleet.limits``): their stored
shape, how a worker's own limits tighten them, an engine obeying stored rate limits it
was never given, and the command line.  Real ``fsm worker`` processes obeying them (and
a change while they run): ``tests/runtime/fleet/test_scale_limits.py``."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from cli import run_main
from queued_machine import MACHINE, replies

from fsm_engine.errors import StoreError
from fsm_engine.policies import RateLimit
from fsm_engine.runtime.fleet.adoption import claim_request
from fsm_engine.runtime.fleet.limits import FleetLimits, merge_rates, parse_queue_limits
from fsm_engine.runtime.fleet.queues import QueuePlan
from fsm_engine.store import open_store


def test_limits_round_trip_through_their_stored_json() -> None:
    limits = FleetLimits({"llm": 8}, 2, {"*": RateLimit(rpm=5, tpm=900, window_s=2.0)})
    assert FleetLimits.from_json(json.loads(json.dumps(limits.to_json()))) == limits
    assert FleetLimits.from_json(None) == FleetLimits() and FleetLimits().to_json() == {}


def test_unusable_stored_limits_name_every_problem() -> None:
    bad = {"queue_limits": {"llm": 0, "no good": 3}, "partition_limit": "2",
           "rate_limits": {"p": {"rpm": -1}, "q": {"burst": 3}}, "extra": 1}
    with pytest.raises(StoreError) as err:
        FleetLimits.from_json(bad)
    text = str(err.value)
    for needle in ("'extra'", "'llm'", "'no good'", "partition_limit '2'", "'p'", "'q'"):
        assert needle in text, text


def test_a_workers_own_limits_only_tighten_the_stored_ones() -> None:
    own = QueuePlan(total=16, global_limits={"llm": 2, "io": 50}, partition_limit=None)
    plan = own.tightened(FleetLimits({"llm": 8, "io": 5, "batch": 1}, 3))
    assert dict(plan.global_limits) == {"llm": 2, "io": 5, "batch": 1}
    assert plan.partition_limit == 3 and plan.total == 16
    assert QueuePlan(partition_limit=1).tightened(FleetLimits(partition_limit=4)) \
        .partition_limit == 1
    rates = merge_rates({"*": RateLimit(rpm=10, tpm=None), "mine": RateLimit(tpm=7)},
                        {"*": RateLimit(rpm=100, tpm=500, window_s=2.0)})
    assert rates == {"*": RateLimit(rpm=10, tpm=500, window_s=2.0), "mine": RateLimit(tpm=7)}


def test_queue_limit_values_and_removals_parse() -> None:
    assert parse_queue_limits(["llm=8,io=none", "batch=2"]) == {"llm": 8, "io": None,
                                                                "batch": 2}


def test_an_engine_given_no_rate_limit_obeys_the_stored_one(engine_factory) -> None:
    engine = engine_factory(llm=replies())
    engine.store.put_limits(FleetLimits(rate_limits={
        "*": RateLimit(tpm=60, window_s=0.3)}).to_json())  # one ~31-token call at a time
    ids = [engine.start(MACHINE, {}) for _ in range(3)]
    done = asyncio.run(engine.run_many(ids))
    assert [r.status for r in done] == ["completed"] * 3
    waited = [r for r in done if r.last_error and "rate limit" in r.last_error]
    assert waited and all(engine.store.attempts(r.id) == [] for r in done)
    assert engine.models.rate_limits == {"*": RateLimit(tpm=60, window_s=0.3)}


def test_unreadable_stored_limits_keep_an_engine_running(engine_factory, monkeypatch) -> None:
    engine = engine_factory(llm=replies())

    def broken() -> None:
        raise StoreError("stored fleet limits are not JSON")
    monkeypatch.setattr(engine.store, "get_limits", broken)
    ids = [engine.start(MACHINE, {}) for _ in range(2)]
    assert [r.status for r in asyncio.run(engine.run_many(ids))] == ["completed"] * 2


def test_fsm_limits_sets_shows_removes_and_clears(tmp_path: Path, capsys) -> None:
    db = str(tmp_path / "l.db")
    code, _, err = run_main(["limits", "--db", db, "--queue-limit", "llm=8,io=3",
                             "--partition-limit", "2", "--rate-limit",
                             "default=rpm:5,tpm:100,window:2"], capsys)
    assert code == 0, err
    code, out, _ = run_main(["limits", "--db", db, "--queue-limit", "io=none", "--json"],
                            capsys)
    assert code == 0 and json.loads(out) == {
        "queue_limits": {"llm": 8}, "partition_limit": 2,
        "rate_limits": {"*": {"rpm": 5, "tpm": 100, "window_s": 2.0, "hold_s": 300.0}}}
    code, out, _ = run_main(["limits", "--db", db], capsys)
    assert code == 0 and "llm" in out and "5 calls + 100 tokens per 2s" in out
    code, out, _ = run_main(["limits", "--db", db, "--partition-limit", "none",
                             "--rate-limit", "default=none", "--json"], capsys)
    assert json.loads(out) == {"queue_limits": {"llm": 8}}
    code, out, _ = run_main(["limits", "--db", db, "--clear", "--json"], capsys)
    assert code == 0 and json.loads(out) == {}
    store = open_store(db)
    try:
        assert store.get_limits() is None
    finally:
        store.close()


@pytest.mark.parametrize("argv, needle", [
    (["--queue-limit", "llm=0"], "--queue-limit"),
    (["--queue-limit", "8"], "--queue-limit"),
    (["--partition-limit", "two"], "--partition-limit"),
    (["--rate-limit", "primary=tpm:nope"], "rate limit"),
    (["--rate-limit", "default=rpm:3,window:inf"], "finite"),
    (["--rate-limit", "default=rpm:3,hold:inf"], "finite"),
    (["--queue-limit", "llm=99999999999999999999"], "1,000,000"),
    (["--partition-limit", "0"], "--partition-limit"),
    ([], "no database"),
])
def test_bad_limits_are_one_line_and_write_nothing(tmp_path: Path, capsys, argv,
                                                   needle) -> None:
    code, _, err = run_main(["limits", "--db", str(tmp_path / "x.db"), *argv], capsys)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("fsm: error: "), err
    assert needle in lines[0]
    assert not (tmp_path / "x.db").exists()


def test_an_unusable_stored_value_is_named_and_clear_replaces_it(tmp_path: Path, capsys) -> None:
    db = str(tmp_path / "c.db")
    store = open_store(db, create=True)
    try:
        with store._write() as conn:  # another tool (or a bad hand edit) wrote it
            conn.execute("INSERT INTO fsm_meta(key, value) VALUES ('limits', 'not json')")
    finally:
        store.close()
    for argv in (["limits"], ["limits", "--partition-limit", "3"]):
        code, _, err = run_main([*argv, "--db", db], capsys)
        assert code == 2 and "not JSON" in err and "--clear" in err, err
    code, out, err = run_main(["limits", "--db", db, "--clear", "--partition-limit", "3",
                               "--json"], capsys)
    assert code == 0 and json.loads(out) == {"partition_limit": 3}, err


def test_stored_limits_refuse_infinite_windows() -> None:
    with pytest.raises(StoreError, match="finite"):
        FleetLimits.from_json({"rate_limits": {"*": {"rpm": 3, "window_s": float("inf")}}})


def test_a_limit_named_for_a_states_model_binds_the_default_provider(engine_factory) -> None:
    """`llm="primary"` on a state, one unnamed provider serving it: a limit named
    `primary` (the README's example) applies to it."""
    from queued_machine import Ctx, ask

    from fsm_engine import Machine, State, Transition
    named = Machine(name="named", context=Ctx, initial="ask",
                    states=[State("ask", action=ask, llm="primary"), State("done", final=True)],
                    transitions=[Transition("next", "ask", "done")])
    engine = engine_factory(llm=replies(), rate_limits={"primary": RateLimit(tpm=40,
                                                                             window_s=30.0)})
    a, b = engine.start(named, {}), engine.start(named, {})
    assert asyncio.run(engine.run(a, family=False)).status == "completed"
    second = asyncio.run(engine.run(b, family=False))
    assert (second.status, second.reason) == ("waiting", "rate_limited")
    other = engine.start(MACHINE, {})  # a state that names no model: not this limit's
    assert asyncio.run(engine.run(other, family=False)).status == "completed"


def test_a_sweep_forgets_dead_workers_that_hold_nothing(engine_factory) -> None:
    from fsm_engine.runtime.fleet.ownership import FORGET_S
    from fsm_engine.store.records import WorkerRow
    engine = engine_factory(llm=replies())
    store, own = engine.store, engine.ownership
    own.register()
    now = engine.clock()
    old = now - FORGET_S - 10
    store.put_worker(WorkerRow("gone", "h2", 7, "1", old - 60, old - 5, lease_until=old))
    store.put_worker(WorkerRow("holding", "h2", 8, "1", old - 60, old - 5, lease_until=old))
    store.put_worker(WorkerRow("recent", "h2", 9, "1", now - 100, now - 90, lease_until=now - 60))
    iid = engine.start(MACHINE, {})
    engine.ledger.release(own.id, [iid])
    [rec] = store.claim(claim_request("holding", now=old - 1, limit=1))
    assert rec.owner == "holding"
    assert own.sweep(now) == 1
    assert sorted(w.id for w in store.workers()) == sorted([own.id, "holding", "recent"])


@pytest.mark.parametrize(("value", "needle"), [
    ([1, 2], "not a JSON object"), ("limits", "not a JSON object"),
    ({"queue_limits": [1]}, "queue_limits"), ({"queue_limits": {"llm": True}}, "'llm'"),
    ({"queue_limits": {"llm": 10**30}}, "'llm'"), ({"queue_limits": {"llm": 2.0}}, "'llm'"),
    ({"partition_limit": 0}, "partition_limit 0"), ({"partition_limit": [2]}, "partition_limit"),
    ({"rate_limits": "x"}, "rate_limits"), ({"rate_limits": {"p": [1]}}, "'p'"),
    ({"rate_limits": {"p": {"rpm": "5"}}}, "'p'"), ({"rate_limits": {"p": {}}}, "'p'"),
    ({"rate_limits": {"p": {"rpm": 5, "window_s": "60"}}}, "'p'"),
    ({"rate_limits": {"p": {"rpm": 5, "hold_s": {"a": [1]}}}}, "'p'"),
    ({"rate_limits": {"p": {"tpm": 10**400}, "q": {"rpm": 1}}}, "'p'"),
])
def test_a_hostile_stored_value_is_one_store_error_naming_the_part(value: object,
                                                                  needle: str) -> None:
    with pytest.raises(StoreError) as err:
        FleetLimits.from_json(value)
    assert needle in str(err.value) and "\n" not in str(err.value), err.value


def test_stored_limits_read_back_as_written_with_ints_as_seconds() -> None:
    got = FleetLimits.from_json({"queue_limits": {"llm": 8}, "partition_limit": None,
                                 "rate_limits": {"*": {"tpm": 9, "window_s": 2, "hold_s": 5}}})
    assert got == FleetLimits({"llm": 8}, None, {"*": RateLimit(tpm=9, window_s=2, hold_s=5)})
    assert FleetLimits.from_json({"queue_limits": None, "rate_limits": {}}) == FleetLimits()
