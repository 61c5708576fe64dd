"""Source of a machine module (written to a file by the tests): ``rf`` fans out to one
``rf_item`` child per number, each child waiting in a review (approve / reject)."""

from __future__ import annotations

MACHINE = '''
from pydantic import BaseModel
from fsm_engine import Machine, State, Transition
from fsm_engine.definition.fanout import Map
from fsm_engine.definition.review import Review


class Item(BaseModel):
    n: int
    seen: bool = False


def look(ctx):
    return {"seen": True}


item = Machine(name="rf_item", context=Item, initial="look", states=[
    State("look", action=look),
    State("review", review=Review(prompt="ok?", show=["n"], choices=["approve", "reject"])),
    State("done", final=True), State("rejected", final=True, failure=True)],
    transitions=[Transition("ok", "look", "review"), Transition("approve", "review", "done"),
                 Transition("reject", "review", "rejected")])


class Job(BaseModel):
    ns: list[int] = []
    got: list = []


machine = Machine(name="rf", context=Job, initial="fan", states=[
    State("fan", fan_out=Map(items="ns", machine=item, item_field="n", into="got")),
    State("done", final=True)],
    transitions=[Transition("joined", "fan", "done")])
'''
