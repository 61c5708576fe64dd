"""An in-place change to the context persists: an action that assigns into its context
(``ctx.steps["preprocess"].status = "done"``) and returns None commits that change, in
every kind of step (plain sync / async / inline action, fan-out child, DAG node), on
both backends; one that cannot be stored fails the step with ``invalid_update`` naming
the field; an action that raises commits none of it (finding 4 of issue 19)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from pydantic import BaseModel

from fsm_engine import Machine, Map, Node, State, Transition, dag
from fsm_engine.views import context_after


class Stage(BaseModel):
    status: str = "pending"
    notes: dict[str, Any] = {}


class Ctx(BaseModel):
    steps: dict[str, Stage] = {}
    tags: list[str] = []
    meta: dict[str, Any] = {}
    seen: str = ""
    items: list[str] = []
    outs: list[Any] = []


START = {"steps": {"preprocess": {"status": "pending", "notes": {"k": {"v": 1}}}},
         "meta": {"deep": {"n": 1}},
         "items": ["x", "y"]}


def mutate(ctx: Ctx) -> None:
    ctx.steps["preprocess"].status = "done"  # a nested model, in place
    ctx.tags.append("seen")                   # a typed list, in place
    ctx.meta["deep"]["n"] = 2                 # plain JSON under an Any, in place
    ctx.steps["preprocess"].notes["k"]["v"] = 3  # under an Any inside a nested model


async def amutate(ctx: Ctx) -> None:
    await asyncio.sleep(0)
    mutate(ctx)


def look(ctx: Ctx) -> dict[str, Any]:
    """The next step: what it sees of the in-place change."""
    stage = ctx.steps["preprocess"]
    return {"seen": f"{stage.status}/{ctx.tags}/{ctx.meta['deep']['n']}/{stage.notes['k']['v']}"}


SEEN = "done/['seen']/2/3"


def chain(name: str, act: Any, inline: bool = False) -> Machine:
    return Machine(name=name, context=Ctx, initial="prep",
                   states=[State("prep", action=act, inline=inline), State("look", action=look),
                           State("end", final=True)],
                   transitions=[Transition("next", "prep", "look"),
                                Transition("next", "look", "end")])


class Item(BaseModel):
    item: str = ""
    steps: dict[str, Stage] = {"preprocess": Stage()}
    seen: str = ""


def child_mutate(ctx: Item) -> None:
    ctx.steps["preprocess"].status = f"done:{ctx.item}"


def child_look(ctx: Item) -> dict[str, Any]:
    return {"seen": ctx.steps["preprocess"].status}


CHILD = Machine(name="inplace_child", context=Item, initial="prep",
                states=[State("prep", action=child_mutate), State("look", action=child_look),
                        State("end", final=True)],
                transitions=[Transition("next", "prep", "look"),
                             Transition("next", "look", "end")])

FAN_OUT = Machine(
    name="inplace_map", context=Ctx, initial="fan",
    states=[State("fan", fan_out=Map(items="items", machine=CHILD, into="outs",
                                     item_field="item")),
            State("end", final=True), State("failed", final=True, failure=True)],
    transitions=[Transition("joined", "fan", "end"), Transition("branch_failed", "fan", "failed")])

DAG = dag("inplace_dag", Ctx, [Node("prep", mutate), Node("other", lambda ctx: {"seen": "x"}),
                               Node("look", look, depends_on=["prep", "other"])])

KINDS = {"sync": chain("inplace_sync", mutate), "async": chain("inplace_async", amutate),
         "inline": chain("inplace_inline", mutate, inline=True)}


def _final(engine: Any, machine: Machine) -> Any:
    iid = engine.start(machine, START)
    rec = asyncio.run(engine.run(iid))
    assert rec.status == "completed", (rec.reason, rec.last_error)
    stored = engine.store.get(iid)
    assert stored.context == rec.context  # what ran on is what was committed
    assert context_after(stored, engine.store.history(iid))[-1] == stored.context
    return stored


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_an_in_place_change_persists_in_a_plain_action(engine_factory, kind: str) -> None:
    stored = _final(engine_factory(), KINDS[kind])
    assert stored.context["steps"]["preprocess"]["status"] == "done"
    assert stored.context["tags"] == ["seen"] and stored.context["meta"]["deep"]["n"] == 2
    assert stored.context["seen"] == SEEN


def test_an_in_place_change_persists_in_a_fan_out_child(engine_factory) -> None:
    engine = engine_factory()
    stored = _final(engine, FAN_OUT)
    assert [o["seen"] for o in stored.context["outs"]] == ["done:x", "done:y"]
    for kid in engine.store.children(stored.id):
        assert kid.context["steps"]["preprocess"]["status"].startswith("done:")


def test_an_in_place_change_persists_in_a_dag_node(engine_factory) -> None:
    stored = _final(engine_factory(), DAG)
    assert stored.context["steps"]["preprocess"]["status"] == "done"
    assert stored.context["seen"] == SEEN


def unstorable(ctx: Ctx) -> None:
    ctx.meta["when"] = {1, 2}  # a set in an untyped field: no JSON form that comes back


def test_an_in_place_change_that_cannot_be_stored_fails_naming_the_field(
        engine_factory) -> None:
    engine = engine_factory()
    iid = engine.start(chain("inplace_bad", unstorable), START)
    rec = asyncio.run(engine.run(iid))
    assert (rec.status, rec.reason) == ("failed", "invalid_update")
    assert "meta.when" in (rec.last_error or "")
    assert engine.store.get(iid).context["meta"] == START["meta"]


def half_then_raise(ctx: Ctx) -> None:
    ctx.steps["preprocess"].status = "half"
    raise RuntimeError("boom")


def test_a_failed_action_commits_none_of_its_in_place_changes(engine_factory) -> None:
    machine = Machine(name="inplace_raise", context=Ctx, initial="prep",
                      states=[State("prep", action=half_then_raise, skippable=True,
                                    default_output={"seen": "skipped"}),
                              State("look", action=look), State("end", final=True)],
                      transitions=[Transition("next", "prep", "look"),
                                   Transition("next", "look", "end")])
    stored = _final(engine_factory(), machine)
    assert stored.context["seen"] == "pending/[]/1/1"
    assert stored.context["steps"]["preprocess"]["status"] == "pending"


def unserialisable(ctx: Ctx) -> None:
    ctx.meta["handle"] = open(__file__)  # noqa: SIM115 - a value with no JSON form


def test_an_in_place_value_with_no_json_form_fails_naming_the_field(engine_factory) -> None:
    engine = engine_factory()
    iid = engine.start(chain("inplace_file", unserialisable), START)
    rec = asyncio.run(engine.run(iid))
    assert (rec.status, rec.reason) == ("failed", "invalid_update")
    assert "meta.handle" in (rec.last_error or "")


def bytes_into_tags(ctx: Ctx) -> None:
    ctx.tags.append(b"raw")  # type: ignore[arg-type] - no JSON form in a list[str]


def test_an_unstorable_value_put_into_a_typed_list_fails_naming_the_field(
        engine_factory) -> None:
    """A ``list[str]`` field is compared with the stored JSON as it is (no dump,
    ``values._as_is``): what an action puts there in place still crosses the boundary."""
    engine = engine_factory()
    iid = engine.start(chain("inplace_tag_bytes", bytes_into_tags), START)
    rec = asyncio.run(engine.run(iid))
    assert (rec.status, rec.reason) == ("failed", "invalid_update")
    assert "tags" in (rec.last_error or "")
    assert engine.store.get(iid).context["tags"] == []


class Flat(BaseModel):
    """A context of plain JSON only (``values.Watched`` compares it with the stored JSON,
    no copy of its fields)."""

    tags: list[str] = []
    meta: dict[str, Any] = {}
    n: int = 0
    seen: str = ""


def flat_mutate(ctx: Flat) -> dict[str, Any]:
    ctx.tags.append("seen")       # a typed list, in place
    ctx.meta["deep"]["n"] = 2     # under an Any, in place
    ctx.n = 7                     # reassigned, not returned
    ctx.seen = "from the action"  # reassigned, and overridden by the update
    return {"seen": "from the update"}


def test_an_in_place_change_to_a_plain_json_context_persists(engine_factory) -> None:
    machine = Machine(name="inplace_flat", context=Flat, initial="prep",
                      states=[State("prep", action=flat_mutate), State("end", final=True)],
                      transitions=[Transition("next", "prep", "end")])
    engine = engine_factory()
    iid = engine.start(machine, {"meta": {"deep": {"n": 1}}, "tags": ["a"]})
    rec = asyncio.run(engine.run(iid))
    assert rec.status == "completed"
    stored = engine.store.get(iid).context
    assert stored == {"tags": ["a", "seen"], "meta": {"deep": {"n": 2}}, "n": 7,
                      "seen": "from the update"}
    [row] = [h for h in engine.store.history(iid) if h.source == "prep"]
    assert sorted(row.delta) == ["meta", "n", "seen", "tags"]
