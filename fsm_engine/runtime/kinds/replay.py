"""Replay a stored instance's recorded steps through a (changed) definition, in memory.

Nothing runs but the guards: each recorded step's outcome (its context delta, the
action's recorded update) is applied to the recorded context before it, and the
definition chooses the transition as the runtime would, its guards reading the run
information the driver gave them (``step.run_info``, from the counters ``Rebuilt``
rebuilds: transitions with re-asks, tokens with the failed attempts).  No action, model
call or side effect runs and nothing is written.  The report names the first step whose
transition differs, every step whose guard results differ, and the states the
history names that the definition no longer has.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from typing import Any

from pydantic import ValidationError

from ...definition.spec import RunInfo
from ...store import details
from ...store.records import TOOL, AttemptRow, HistoryRow, InstanceRecord
from ..compiled import CompiledMachine
from ..step import run_info

#: Recorded kinds whose transition the definition chose (forced moves are not replayed);
#: they are the ones that count against ``max_transitions`` (a fan-out's join included:
#: its guards choose its edge, and a timer's fire: ``kinds.timers``).
CHOSEN = frozenset({"transition", "fallback", "skip", "review", "join", "timer"})


def visit_tokens(attempts: Sequence[AttemptRow], state: str, visit: int) -> int:
    """Tokens the failed attempts of ``state``'s ``visit`` were billed."""
    return sum(a.tokens for a in attempts if a.state == state and a.visit == visit)


@dataclass
class Rebuilt:
    """An instance as its history rebuilds it, row by row (what a fork copies and what
    replay's guards read): context, state, visits, transitions counted (re-asks
    included), tokens billed by the rows and by the failed attempts made before them."""

    context: dict[str, Any]
    state: str
    visits: dict[str, int]
    attempts: Sequence[AttemptRow] = ()
    loops: int = 0
    tokens: int = 0
    _billed: int = 0  # attempts counted in ``tokens`` so far (``attempts`` by time)
    #: Tokens of an agent state's journal rows, by (state, visit).
    _journaled: dict[tuple[str, int], int] = field(default_factory=dict)

    @classmethod
    def start(cls, cm: CompiledMachine, rec: InstanceRecord,
              attempts: Sequence[AttemptRow] = ()) -> Rebuilt:
        return cls(dict(rec.input), cm.spec.initial, {cm.spec.initial: 1},
                   sorted(attempts, key=lambda a: a.at))

    def until(self, at: float) -> None:
        """Count the failed attempts made up to ``at``."""
        while self._billed < len(self.attempts) and self.attempts[self._billed].at <= at:
            self.tokens += self.attempts[self._billed].tokens
            self._billed += 1

    def after(self, h: HistoryRow) -> None:
        """Apply row ``h`` (and the attempts made before it)."""
        self.until(h.at)
        self.context.update(h.delta)
        self.state = h.dest
        if h.kind == TOOL:  # an agent's journal row: its visit goes on
            at = (h.source, self.visits.get(h.source, 1))
            self._journaled[at] = self._journaled.get(at, 0) + h.tokens
        if h.dest != h.source or h.kind in CHOSEN:
            self.visits[h.dest] = self.visits.get(h.dest, 0) + 1
        if h.kind in CHOSEN:
            self.loops += 1 + (details.read(details.StepDetail, h.detail).get("reasks") or 0)
        elif h.kind == TOOL and details.as_object(h.detail).get("agent") == "turn":
            self.loops += 1  # an agent's model turn
        self.tokens += h.tokens

    def run(self, rec: InstanceRecord, cm: CompiledMachine, h: HistoryRow) -> RunInfo:
        """The guards' ``RunInfo`` of the step row ``h`` records (before ``after(h)``)."""
        self.until(h.at)
        state = cm.states[h.source]
        at = replace(rec, loop_count=self.loops, tokens_used=self.tokens)
        earlier, visit = 0, self.visits.get(h.source, 1)
        if state.agent is not None:  # its journaled turns, and every failed one (as the driver)
            earlier = self._journaled.get((h.source, visit), 0) + \
                visit_tokens(self.attempts, h.source, visit)
        elif (details.read(details.StepDetail, h.detail).get("attempt") or 1) > 1:
            earlier = visit_tokens(self.attempts, h.source, visit)
        return run_info(at, state, h.tokens, earlier)


@dataclass
class Replay:
    """What a replay found; ``identical`` when nothing differs.

    ``divergence``: ``{seq, source, recorded: [trigger, dest], now: [trigger, dest] | None,
    why}`` of the first step that goes elsewhere; ``guards``: ``{seq, recorded, now}`` per
    step whose guard results differ; ``missing_states``: ``{seq, state}`` per state the
    history names that the definition lacks (first mention each).
    """

    instance_id: str
    steps: int
    divergence: dict[str, Any] | None = None
    guards: list[dict[str, Any]] = field(default_factory=list)
    missing_states: list[dict[str, Any]] = field(default_factory=list)

    @property
    def identical(self) -> bool:
        return self.divergence is None and not self.guards and not self.missing_states

    def as_json(self) -> dict[str, Any]:
        return asdict(self) | {"identical": self.identical}


def _missing(cm: CompiledMachine, history: Sequence[HistoryRow]) -> list[dict[str, Any]]:
    seen: dict[str, int] = {}
    for h in history:
        for name in (h.source, h.dest):
            if name not in cm.states and name not in seen:
                seen[name] = h.seq
    return [{"seq": seq, "state": name} for name, seq in seen.items()]


def _choose(cm: CompiledMachine, h: HistoryRow, obj: Any, run: Callable[[], RunInfo]) -> Any:
    """The definition's choice for recorded row ``h``: free selection first; a forced or
    fired trigger (fallback, skip, a review's choice, an action's ``fire``) when only
    that reproduces the recorded move; a join's trigger's edges only."""
    if h.kind in ("join", "timer"):  # its trigger is given (the children's outcome, the
        # timer's): only that one's edges
        return cm.choose(h.source, obj, run, h.trigger) \
            if cm.has_trigger(h.source, h.trigger) else None
    free = cm.choose(h.source, obj, run)
    recorded = (h.trigger, h.dest)
    if h.kind == "transition" and free is not None and (free.trigger, free.dest) == recorded:
        return free
    if cm.has_trigger(h.source, h.trigger):
        forced = cm.choose(h.source, obj, run, h.trigger)
        if forced is not None and (h.kind != "transition" or forced.guards == h.guards):
            return forced
    return free


def replay(cm: CompiledMachine, rec: InstanceRecord, history: Sequence[HistoryRow],
           attempts: Sequence[AttemptRow] = ()) -> Replay:
    """Replay ``rec``'s ``history`` through ``cm`` (pure; guards are evaluated; ``attempts``:
    its failed attempts, ``Store.attempts``, whose tokens the guards' counts include)."""
    out = Replay(rec.id, len(history), missing_states=_missing(cm, history))
    now = Rebuilt.start(cm, rec, attempts)
    for h in history:
        if h.kind in CHOSEN:
            out.divergence = _step(cm, rec, now, h, out)
            if out.divergence is not None:
                break
        now.after(h)
    return out


def _step(cm: CompiledMachine, rec: InstanceRecord, now: Rebuilt, h: HistoryRow,
          out: Replay) -> dict[str, Any] | None:
    """The divergence of chosen row ``h`` (``None``: the definition goes the same way);
    a differing guard result is added to ``out.guards``."""
    def diverged(now_: list[str] | None, why: str) -> dict[str, Any]:
        return {"seq": h.seq, "source": h.source, "recorded": [h.trigger, h.dest],
                "now": now_, "why": why}
    if h.source not in cm.states:
        return diverged(None, f"state {h.source!r} no longer exists")
    try:
        obj = cm.spec.context.model_validate({**now.context, **h.delta})
    except ValidationError as exc:
        return diverged(None, "the recorded context fails the context model: "
                        f"{exc.errors()[0]['msg']}")
    try:
        choice = _choose(cm, h, obj, partial(now.run, rec, cm, h))
    except Exception as exc:  # noqa: BLE001 - a guard raising is a finding, not a crash
        choice, why = None, f"a guard raised {type(exc).__name__}: {exc}"
    else:
        why = "no transition passes its guards" if choice is None else "another transition"
    if choice is not None and [list(g) for g in choice.guards] != [list(g) for g in h.guards]:
        out.guards.append({"seq": h.seq, "recorded": h.guards, "now": choice.guards})
    if choice is None or (choice.trigger, choice.dest) != (h.trigger, h.dest):
        return diverged(None if choice is None else [choice.trigger, choice.dest], why)
    return None
