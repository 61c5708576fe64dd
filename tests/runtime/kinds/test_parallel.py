"""Fan-out states (``Parallel``, ``Map``): completion policies, reducers, bad input, the
family's budget, cancellation and deadlines, and workers — on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio

import parallel_machines as pm
import pytest
from pydantic import BaseModel

from fsm_engine import DefinitionError, Machine, State, Transition, fire
from fsm_engine.definition.fanout import Map, Parallel
from fsm_engine.llm import Scripted
from fsm_engine.policies import Completion
from fsm_engine.runtime.worker import Worker


def _run(engine, machine, words, **kw):
    iid = engine.start(machine, {"words": words}, **kw)
    return iid, asyncio.run(engine.run(iid))


def _kids(engine, iid):
    return engine.store.children(iid)


# -- the policy's pure maths ------------------------------------------------------------
@pytest.mark.parametrize("policy,total,ok,bad,expect", [
    (Completion(), 0, 0, 0, True), (Completion(), 1, 1, 0, True), (Completion(), 3, 2, 0, None),
    (Completion(), 3, 0, 1, False), (Completion("all_completed"), 3, 0, 3, True),
    (Completion("all_completed"), 3, 2, 0, None), (Completion("first_successful"), 3, 1, 0, True),
    (Completion("first_successful"), 0, 0, 0, False), (Completion("first_successful"), 2, 0, 2, False),
    (Completion(min_successful=2), 4, 2, 0, True), (Completion(min_successful=2), 4, 1, 2, None),
    (Completion(min_successful=2), 4, 1, 3, False), (Completion(min_successful=1), 0, 0, 0, False),
    (Completion(tolerated_failures=1), 3, 2, 1, True), (Completion(tolerated_failures=1), 3, 0, 2, False),
    (Completion(tolerated_failure_ratio=0.2), 10, 8, 2, True),
    (Completion(tolerated_failure_ratio=0.2), 10, 0, 3, False),
])
def test_completion_policy_decides(policy, total, ok, bad, expect) -> None:
    assert policy.decide(total, ok, bad) is expect


def test_completion_policy_problems() -> None:
    assert Completion("sometimes").problems() and Completion(tolerated_failure_ratio=2).problems()
    assert Completion(min_successful=-1).problems() and not Completion(min_successful=0).problems()


# -- joins under each policy, on both backends ------------------------------------------------
def test_map_joins_outputs_in_item_order(engine_factory) -> None:
    engine = engine_factory()
    iid, rec = _run(engine, pm.fan, ["a", "b", "c"])
    assert (rec.state, rec.status) == ("done", "completed")
    assert [r["out"] for r in rec.context["results"]] == ["A", "B", "C"]
    kids = _kids(engine, iid)
    assert [(k.branch, k.status, k.parent_id) for k in kids] == \
        [("0", "completed", iid), ("1", "completed", iid), ("2", "completed", iid)]
    join = engine.store.history(iid)[-1]
    assert (join.kind, join.trigger, join.detail["branches"]["succeeded"]) == ("join", "joined", 3)
    assert all(len(engine.store.history(k.id)) == 1 for k in kids)  # each ran its step once


def test_parallel_branches_are_actions_keyed_by_name(engine_factory) -> None:
    engine = engine_factory()
    iid = engine.start(pm.pair, {})
    rec = asyncio.run(engine.run(iid))
    assert rec.status == "completed" and rec.context["both"] == {"l": {"a": "left"},
                                                                 "r": {"b": "right"}}
    assert sorted(k.branch for k in _kids(engine, iid)) == ["l", "r"]


@pytest.mark.parametrize("machine,words,state,outs", [
    (pm.fan, ["a", "fail", "c"], "broken", None),
    (pm.fan, ["fail"], "broken", None),
    (pm.fan_completed, ["a", "fail", "c"], "done", ["A", None, "C"]),
    (pm.fan_completed, ["fail", "fail"], "done", [None, None]),
    (pm.fan_min2, ["a", "fail", "c"], "done", None),
    (pm.fan_min2, ["fail", "fail", "c"], "broken", None),
    (pm.fan_tol1, ["a", "fail", "c"], "done", ["A", None, "C"]),
    (pm.fan_tol1, ["fail", "fail", "c"], "broken", None),
    (pm.fan_ratio, ["a", "b", "c", "d", "fail"], "done", ["A", "B", "C", "D", None]),
    (pm.fan_ratio, ["a", "b", "c", "fail", "fail"], "broken", None),
    (pm.fan_first, ["fail", "fail"], "broken", None),
])
def test_each_policy_with_scripted_outcomes(engine_factory, machine, words, state, outs) -> None:
    engine = engine_factory()
    iid, rec = _run(engine, machine, words)
    assert rec.state == state, (rec.reason, rec.last_error)
    if outs is not None:
        assert [r and r["out"] for r in rec.context["results"]] == outs
    assert all(k.final for k in _kids(engine, iid))
    assert [h.kind for h in engine.store.history(iid)].count("join") == 1


def test_first_successful_cancels_the_branches_still_running(engine_factory) -> None:
    engine = engine_factory()
    iid, rec = _run(engine, pm.fan_first, ["slow", "a", "slow"])
    assert rec.state == "done" and rec.context["results"][1]["out"] == "A"
    assert [k.status for k in _kids(engine, iid)] == ["cancelled", "completed", "cancelled"]
    assert engine.store.history(iid)[-1].detail["branches"]["running"] == 2


def test_an_empty_map_joins_at_once(engine_factory) -> None:
    engine = engine_factory()
    iid, rec = _run(engine, pm.fan, [])
    assert rec.state == "done" and rec.context["results"] == [] and _kids(engine, iid) == []
    iid, rec = _run(engine, pm.fan_first, [])
    assert rec.state == "broken"  # nothing can succeed first: explained, recorded


def test_max_concurrency_starts_children_as_others_finish(engine_factory) -> None:
    engine = engine_factory()
    iid, rec = _run(engine, pm.fan_one_at_a_time, ["a", "b", "c", "d"])
    assert rec.state == "done" and [r["out"] for r in rec.context["results"]] == list("ABCD")
    kids = _kids(engine, iid)
    assert [k.key for k in kids] == sorted(k.key for k in kids)
    # with one at a time, each child was created after the previous one ended
    assert all(b.created_at >= a.updated_at for a, b in zip(kids, kids[1:], strict=False))


def test_a_skippable_branch_contributes_its_default(engine_factory) -> None:
    engine = engine_factory()
    iid, rec = _run(engine, pm.fan_skip, ["a", "fail"])
    assert rec.state == "done"
    assert [r["out"] for r in rec.context["results"]] == ["A", "skipped"]
    assert engine.store.history(iid)[-1].detail["branches"]["skipped"] == 1


def test_a_reducer_that_raises_fails_the_parent_and_keeps_the_children(engine_factory) -> None:
    engine = engine_factory()
    iid, rec = _run(engine, pm.fan_boom, ["a", "b"])
    assert (rec.status, rec.reason) == ("failed", "reducer_error")
    assert "RuntimeError: no digest today" in rec.last_error
    assert [k.status for k in _kids(engine, iid)] == ["completed", "completed"]


def test_a_reducer_output_the_model_rejects_is_explained(engine_factory) -> None:
    engine = engine_factory()
    iid, rec = _run(engine, pm.fan_bad_output, ["a"])
    assert (rec.status, rec.reason) == ("failed", "invalid_join_output")
    assert "results" in rec.last_error


def test_a_reducer_may_return_updates(engine_factory) -> None:
    engine = engine_factory()
    _, rec = _run(engine, pm.fan_count, ["a", "b", "c"])
    assert rec.status == "completed" and rec.context["count"] == 3


def test_the_joins_guards_route_on_the_childrens_results(engine_factory) -> None:
    """Issue 36 item 5: a guard on a ``joined`` transition is evaluated on the context after
    the join and recorded, like any guard; none passing fails the parent (no_transition);
    coverage counts the edge whose guard passed."""
    from fsm_engine.coverage import collect
    engine = engine_factory()
    big, rec = _run(engine, pm.fan_routed, ["a", "b", "c"])
    assert (rec.state, rec.status) == ("big", "completed")
    join = engine.store.history(big)[-1]
    assert (join.kind, join.trigger, join.dest, join.guards) == \
        ("join", "joined", "big", [["many", True]])
    small, rec = _run(engine, pm.fan_routed, ["a"])
    assert (rec.state, rec.status) == ("done", "completed")
    assert engine.store.history(small)[-1].guards == [["many", False]]
    cov = collect(pm.fan_routed.export(), [engine.store.history(i) for i in (big, small)])
    taken = {e.dest: n for e, n in cov.edges.items() if e.trigger == "joined"}
    assert taken == {"big": 1, "done": 1}
    assert [(e.dest, g, dict(c)) for (e, g), c in cov.guards.items()] == \
        [("big", "many", {True: 1, False: 1})]
    from fsm_engine.runtime.compiled import compile_machine
    from fsm_engine.runtime.kinds.replay import Rebuilt, replay
    for iid in (big, small):  # replay evaluates the join's guards again
        report = replay(compile_machine(pm.fan_routed), engine.store.get(iid),
                        engine.store.history(iid))
        assert report.identical, report.as_json()
    changed = replay(compile_machine(pm.fan_routed_only), engine.store.get(small),
                     engine.store.history(small))
    assert changed.divergence is not None and changed.divergence["recorded"] == \
        ["joined", "done"] and changed.divergence["now"] is None
    built = Rebuilt.start(compile_machine(pm.fan_routed), engine.store.get(big))
    for h in engine.store.history(big):
        built.after(h)
    assert built.loops == engine.store.get(big).loop_count  # a fork counts the join too
    stuck, rec = _run(engine, pm.fan_routed_only, ["a"])
    assert (rec.status, rec.reason) == ("failed", "no_transition")
    last = engine.store.history(stuck)[-1]
    assert (last.guards, last.tokens) == ([["many", False]], 0)
    assert "passed its guards" in (rec.last_error or "")
    assert [k.status for k in _kids(engine, stuck)] == ["completed"]


def test_an_item_that_does_not_fit_starts_no_child(engine_factory) -> None:
    class Num(BaseModel):
        n: int

    class P(BaseModel):
        xs: list = []
        out: list = []
    child = Machine(name="num", context=Num, initial="s", states=[
        State("s", action=lambda c: None), State("d", final=True)],
        transitions=[Transition("ok", "s", "d")])
    m = Machine(name="bad_items", context=P, initial="go", states=[
        State("go", action=lambda c: None), State("map", fan_out=Map(items="xs", machine=child,
                                                                    into="out")),
        State("done", final=True), State("failed", final=True, failure=True)],
        transitions=[Transition("next", "go", "map"), Transition("joined", "map", "done")])
    engine = engine_factory()
    iid = engine.start(m, {"xs": [{"n": 1}, {"n": "two"}, 3]})
    rec = asyncio.run(engine.run(iid))
    assert (rec.status, rec.reason) == ("failed", "invalid_item")
    assert "item 1 of 'xs'" in rec.last_error and _kids(engine, iid) == []


def test_a_branch_machine_failing_its_check_is_a_definition_error() -> None:
    class C(BaseModel):
        xs: list = []
    broken = Machine(name="broken_branch", context=C, initial="nowhere",
                     states=[State("done", final=True)], transitions=[])
    with pytest.raises(DefinitionError) as info:
        from fsm_engine.runtime.compiled import compile_machine
        compile_machine(Machine(name="outer", context=C, initial="m", states=[
            State("m", fan_out=Parallel(branches={"x": broken, "y": "no_such_action"})),
            State("done", final=True)], transitions=[]))
    text = str(info.value)
    assert "branch 'x' (machine 'broken_branch')" in text and "'nowhere'" in text
    assert "branch 'y'" in text and "no_such_action" in text
    assert "needs a 'joined' transition" in text and "into" in text


# -- one budget for the family ---------------------------------------------------------------
def test_the_family_stops_at_the_shared_budget(engine_factory) -> None:
    replies = [{"text": "ok", "prompt_tokens": 10, "completion_tokens": 20}]
    engine = engine_factory(llm=Scripted.from_replies(replies, model="m"))
    iid, rec = _run(engine, pm.fan_one_at_a_time, [f"llm{i}" for i in range(6)], token_budget=100)
    kids = _kids(engine, iid)
    assert (rec.state, rec.reason) == ("over", "token_budget")
    # 90 spent, 10 left: the 4th call's prompt alone needs more, so it is refused
    assert [k.tokens_used for k in kids] == [30, 30, 30, 0]
    assert kids[-1].reason == "token_budget" and len(kids) == 4  # the rest never started
    assert rec.tokens_used == sum(k.tokens_used for k in kids) == 90


# -- cancellation and deadlines reach every child ----------------------------------------------
def test_cancelling_the_parent_cancels_every_running_child(engine_factory) -> None:
    engine, other = engine_factory(lease_seconds=1.0), engine_factory()

    async def go() -> tuple:
        iid = engine.start(pm.fan, {"words": ["slow", "slow", "a"]})
        task = asyncio.ensure_future(engine.run(iid))
        while [k.final for k in engine.store.children(iid)] != [False, False, True]:
            await asyncio.sleep(0.02)  # (children run here are created owned: no claim)
        other.cancel(iid)  # as `fsm cancel` would, from another process
        return iid, await asyncio.wait_for(task, 10)
    iid, rec = asyncio.run(go())
    assert rec.status == "cancelled"
    assert [k.status for k in _kids(engine, iid)] == ["cancelled", "cancelled", "completed"]


def test_the_parents_deadline_reaches_its_children(engine_factory) -> None:
    engine = engine_factory()
    iid, rec = _run(engine, pm.fan, ["slow", "slow"], deadline_s=0.5)
    assert (rec.status, rec.reason) == ("failed", "deadline")
    kids = _kids(engine, iid)
    assert all(k.deadline == rec.deadline for k in kids)
    assert all(k.status == "failed" and k.reason == "timeout" for k in kids)


# -- workers: children are ordinary instances -----------------------------------------------------
def test_workers_run_the_children_and_the_join(engine_factory) -> None:
    starter = engine_factory()
    engines = [engine_factory(lease_seconds=2.0) for _ in range(2)]
    iid = starter.start_many(pm.fan, [{"words": list("abcdefgh")}], enqueue=True)[0]

    async def serve() -> None:
        workers = [Worker(e, concurrency=3, poll=0.05) for e in engines]
        tasks = [asyncio.ensure_future(w.serve()) for w in workers]
        while not starter.store.get(iid).final:
            await asyncio.sleep(0.05)
        for w in workers:
            w.stop()
        await asyncio.gather(*tasks)
    asyncio.run(asyncio.wait_for(serve(), 60))
    rec = starter.store.get(iid)
    assert rec.state == "done" and [r["out"] for r in rec.context["results"]] == list("ABCDEFGH")
    assert [h.kind for h in starter.store.history(iid)].count("join") == 1


# -- DAGs ----------------------------------------------------------------------------------
from fsm_engine import Node, dag  # noqa: E402


class Shot(BaseModel):
    image: str = "shot.png"
    ui: str = ""
    copy_text: str = ""
    suggestion: str = ""


def _ui(ctx: Shot) -> dict:
    return {"ui": f"layout of {ctx.image}"}


def _copy(ctx: Shot) -> dict:
    raise ValueError("no text found")


def _suggest(ctx: Shot) -> dict:
    return {"suggestion": f"{ctx.ui} / {ctx.copy_text}"}


def test_dag_errors_are_listed_together() -> None:
    with pytest.raises(DefinitionError) as info:
        dag("bad", Shot, [Node("a", _ui, depends_on=["c"]), Node("b", _ui, depends_on=["zz"]),
                          Node("c", _ui, depends_on=["a"]), Node("b", _ui)])
    problems = info.value.problems
    assert any("'b' is declared more than once" in p for p in problems)
    assert any("unknown node 'zz'" in p for p in problems)
    assert any("cycle" in p and "a" in p and "c" in p for p in problems)
    assert len(problems) == 3


def test_dag_runs_independent_nodes_in_parallel_then_the_dependent_one(engine_factory) -> None:
    m = dag("shot", Shot, [
        Node("analyze_ui", _ui),
        Node("analyze_copy", _copy, skippable=True, default_output={"copy_text": "(none)"}),
        Node("suggest", _suggest, depends_on=["analyze_ui", "analyze_copy"])])
    assert [s.name for s in m.states][:2] == ["analyze_ui & analyze_copy", "suggest"]
    engine = engine_factory()
    iid = engine.start(m, {})
    rec = asyncio.run(engine.run(iid))
    assert rec.status == "completed"
    assert rec.context["suggestion"] == "layout of shot.png / (none)"
    assert sorted((k.branch, k.status) for k in _kids(engine, iid)) == \
        [("analyze_copy", "failed"), ("analyze_ui", "completed")]


def test_cancelling_the_parent_stops_children_running_on_workers(engine_factory) -> None:
    """The children run on two workers; the parent is cancelled from elsewhere: the same
    commit cancels every child, and each worker stops its running ones at its next
    heartbeat (every ``lease_seconds / 3``), leaving no task running any of them."""
    starter = engine_factory()
    engines = [engine_factory(lease_seconds=1.0) for _ in range(2)]
    iid = starter.start_many(pm.fan, [{"words": ["slow"] * 4}], enqueue=True)[0]

    def running() -> set[str]:
        return {k for w in workers for k in w._running}

    async def serve() -> set[str]:
        tasks = [asyncio.ensure_future(w.serve()) for w in workers]
        kids: set[str] = set()
        while len(kids) < 4:  # every child running on a worker
            await asyncio.sleep(0.02)
            kids = running() & {k.id for k in starter.store.children(iid)}
        starter.cancel(iid)
        assert all(k.status == "cancelled" for k in starter.store.children(iid))
        while running() & kids:
            await asyncio.sleep(0.02)
        for w in workers:
            w.stop()
        await asyncio.gather(*tasks)
        return kids
    workers = [Worker(e, concurrency=3, poll=0.05) for e in engines]
    kids = asyncio.run(asyncio.wait_for(serve(), 60))
    assert len(kids) == 4
    assert starter.store.get(iid).status == "cancelled"
    assert [(k.status, k.reason) for k in starter.store.children(iid)] == \
        [("cancelled", "parent_cancelled")] * 4


# -- per-node policies in a DAG, a child's own loop cap, items that are not a list ---------------
_calls: dict[str, int] = {}


def _flaky(ctx: Shot) -> dict:
    """Fails on its first attempt, then answers (a retry makes it)."""
    _calls["flaky"] = _calls.get("flaky", 0) + 1
    if _calls["flaky"] == 1:
        raise ConnectionError("first attempt lost")
    return {"ui": "second try"}


async def _hang(ctx: Shot) -> dict:
    await asyncio.sleep(30)
    return {"copy_text": "never"}


def _rescue(ctx: Shot) -> dict:
    return {"copy_text": "from the fallback"}


def test_dag_nodes_keep_retry_timeout_and_fallback_in_a_parallel_layer(engine_factory) -> None:
    from fsm_engine.policies import RetryPolicy
    _calls.clear()
    m = dag("shot_policies", Shot, [
        Node("analyze_ui", _flaky, retry=RetryPolicy(max_attempts=2, initial_interval=0.01, jitter=0.0)),
        Node("analyze_copy", _hang, timeout=0.2, fallback=_rescue),
        Node("suggest", _suggest, depends_on=["analyze_ui", "analyze_copy"])])
    engine = engine_factory()
    iid = engine.start(m, {})
    rec = asyncio.run(engine.run(iid))
    assert rec.status == "completed"
    assert rec.context["suggestion"] == "second try / from the fallback"
    kids = {k.branch: k for k in _kids(engine, iid)}
    assert [a.error for a in engine.store.attempts(kids["analyze_ui"].id)] == \
        ["first attempt lost"]  # one failed attempt, then the retry
    copy_rows = engine.store.history(kids["analyze_copy"].id)
    assert [r.kind for r in copy_rows] == ["fallback", "transition"]


class Looping(BaseModel):
    word: str
    out: str = ""


looper = Machine(name="looper", context=Looping, initial="ping", max_transitions=3, states=[
    State("ping", action=lambda c: fire("next")), State("pong", action=lambda c: fire("next")),
    State("done", final=True)],
    transitions=[Transition("next", "ping", "pong"), Transition("next", "pong", "ping"),
                 Transition("stop", "pong", "done")])  # never fired: it loops to its cap


def test_the_loop_cap_applies_per_instance(engine_factory) -> None:
    m = Machine(name="fan_loops", context=pm.Parent, initial="map", max_transitions=3, states=[
        State("map", fan_out=Map(items="words", machine=looper, item_field="word",
                                 into="results", completion="all_completed")),
        State("done", final=True)], transitions=[Transition("joined", "map", "done")])
    engine = engine_factory()
    iid, rec = _run(engine, m, ["a", "b", "c", "d"])  # 4 children x 3 transitions > parent's 3
    assert (rec.state, rec.status) == ("done", "completed") and rec.loop_count == 1
    assert [(k.status, k.reason, k.loop_count) for k in _kids(engine, iid)] == \
        [("failed", "loop_limit", 3)] * 4


def test_items_that_are_not_a_list_are_a_recorded_reason(engine_factory) -> None:
    class Loose(BaseModel):
        xs: object = None
        out: list = []
    m = Machine(name="loose_items", context=Loose, initial="map", states=[
        State("map", fan_out=Map(items="xs", machine=pm.item, item_field="word", into="out")),
        State("done", final=True)], transitions=[Transition("joined", "map", "done")])
    engine = engine_factory()
    iid = engine.start(m, {"xs": "abc"})
    rec = asyncio.run(engine.run(iid))
    assert (rec.status, rec.reason) == ("failed", "invalid_item")
    assert "'xs' is not a list" in rec.last_error and _kids(engine, iid) == []
