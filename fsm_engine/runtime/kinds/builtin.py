"""The built-in kinds of step on the ``kinds.base`` protocol, registered in dispatch order:
review, wait, fan-out/join, agent (the plain action is ``base.PLAIN``, the default).
The three that wait consult ``timers`` (timer edges, issue 38) in ``enter`` and ``plan``.

Each class is a thin adapter: the kind's logic stays in its module (``reviews``,
``fanout``, ``agent``), reached through the driver's public surface (``base.DriverAPI``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...definition.fanout import CHILDREN
from ...errors import StaleWrite
from ...store.records import InstanceRecord, StepCommit
from .. import outcome
from . import agent, fanout, reviews, timers
from .base import DriverAPI, StepKind, register, waiting

if TYPE_CHECKING:
    from ...definition.spec import State
    from ..compiled import CompiledMachine


class Review(StepKind):
    """A person decides (``State.review``): the instance waits for ``Engine.decide``, or
    its SLA timer's choice once due."""

    name = "review"
    bounded = False

    def matches(self, state: State) -> bool:
        return state.review is not None

    def plan(self, api: DriverAPI, cm: CompiledMachine, rec: InstanceRecord, state: State,
             now: float) -> StepCommit | None:
        if timers.has(cm, state.name):  # a timer beside the SLA: the earlier fires
            fired = timers.firing(cm, api.store, rec, now, reviews.sla_due(cm, api.store, rec))
            if fired is not None:
                return timers.fire(api, cm, rec, state, *fired, now)
        if reviews.timer_due(rec, now) and state.review is not None \
                and state.review.on_timeout is not None:
            return reviews.timed_out(cm, rec, api.store, now, api.advance)
        return timers.armed(cm, api.store, outcome.awaiting_review(cm, rec, now), now)

    def enter(self, api: DriverAPI, cm: CompiledMachine, step: StepCommit,
              rec: InstanceRecord) -> StepCommit:
        return timers.enter(cm, step)


class Wait(StepKind):
    """Waits for ``Engine.send`` (``State.wait``): status ``waiting``, holding no worker."""

    name = "wait"
    bounded = False

    def matches(self, state: State) -> bool:
        return state.wait

    def plan(self, api: DriverAPI, cm: CompiledMachine, rec: InstanceRecord, state: State,
             now: float) -> StepCommit | None:
        if not timers.has(cm, state.name):
            return waiting(rec, now)
        fired = timers.firing(cm, api.store, rec, now)
        if fired is not None:  # races ``send``: the version compare-and-set picks one
            return timers.fire(api, cm, rec, state, *fired, now)
        return timers.armed(cm, api.store, waiting(rec, now), now)

    def enter(self, api: DriverAPI, cm: CompiledMachine, step: StepCommit,
              rec: InstanceRecord) -> StepCommit:
        return timers.enter(cm, step)


class FanOut(StepKind):
    """Children per branch or item (``State.fan_out``), then a join (``kinds.fanout``)."""

    name = "fan_out"
    families = True

    def matches(self, state: State) -> bool:
        return state.fan_out is not None

    def plan(self, api: DriverAPI, cm: CompiledMachine, rec: InstanceRecord, state: State,
             now: float) -> StepCommit | None:
        if not timers.has(cm, state.name):
            return fanout.step(cm, api.store, rec, now, api.host(rec))
        fired = timers.firing(cm, api.store, rec, now)
        if fired is not None:  # the children still running are cancelled with it
            return fanout.timed_out(api.store, rec, now,
                                    timers.fire(api, cm, rec, state, *fired, now))
        step = fanout.step(cm, api.store, rec, now, api.host(rec))
        return timers.armed(cm, api.store, step, now)

    async def commit(self, api: DriverAPI, cm: CompiledMachine,
                     rec: InstanceRecord) -> InstanceRecord:
        """Read again while a child moves on under it (the commit is fenced on the
        children it read)."""
        while True:
            step = await api.decide(cm, rec)
            if await api.submit(step):
                return step.record
            if api.store.get(rec.id).version != rec.version:  # the parent itself moved
                raise StaleWrite(f"instance {rec.id} changed under this worker",
                                 instance_id=rec.id, state=rec.state)

    def enter(self, api: DriverAPI, cm: CompiledMachine, step: StepCommit,
              rec: InstanceRecord) -> StepCommit:
        return timers.enter(cm, fanout.enter(cm, step, api.clock(), api.host(rec)))

    def awaits_family(self, rec: InstanceRecord) -> bool:
        return rec.reason == CHILDREN  # its children created, not yet joined


class Agent(StepKind):
    """A tool-calling loop (``State.agent``): one model turn or tool call per commit."""

    name = "agent"

    def matches(self, state: State) -> bool:
        return state.agent is not None

    async def run(self, api: DriverAPI, cm: CompiledMachine, rec: InstanceRecord,
                  state: State, now: float) -> StepCommit:
        return await agent.step(api, cm, rec, state, now)


for _kind in (Review(), Wait(), FanOut(), Agent()):
    register(_kind)
