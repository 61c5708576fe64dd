"""Timer edges at run time (issue 38): arming at entry, firing once due.

A state that waits (``wait=True``, a review, a fan-out; ``definition.timers``) may have
timers: ``Transition(trigger, source, dest, after=...)``.  The waiting kinds
(``kinds.builtin``) consult this module, in their ``enter`` and ``plan``:

* **arming** (``enter``): a transition into the state evaluates each timer's delay once
  (a callable on the new context), records the due times in the entering history row
  (``detail.timers``: trigger -> epoch seconds) and sets ``next_attempt_at`` to the
  earliest (beside a review's SLA: the earlier of the two).  The instance then waits,
  unowned: ``store.claims`` hands a ``waiting`` instance out once ``next_attempt_at`` is
  due — one indexed query per poll, no per-instance work while nothing is due.  A visit
  no row of the instance's own entered — its initial state, or the state a fork starts
  in (the row that entered it is the original's, copied) — is armed by its first step
  (``armed``): the delays evaluated once, from that step's time, on its context, and
  recorded in an in-place row of its own (``kind: armed``, ``store.records.ARMED``,
  source = dest, ``detail.timers``), which then stands for the entering row.  A fork
  thus waits a fresh ``after`` from when it starts, as DBOS's fork re-runs the step it
  starts from (and Temporal's reset re-runs from its reset point): never the time the
  original had left.
* **firing** (``fire``): stepped with ``next_attempt_at`` due, the kind takes the timer
  whose due time is the earliest, through ``DriverAPI.advance`` — an ordinary committed
  step (history ``kind: timer``, ``detail.timer``: ``due``, ``lateness_s``), fenced by
  the version compare-and-set like every step: a ``send``, a decision or another worker
  that moved the instance first makes it stale, and the loser is refused.
* **keeping the due** (``due_of``): a wake before any timer is due (a fan-out's child
  ended: the wake clears ``next_attempt_at`` so a worker claims the parent) waits again
  with the due times read back from the entering row, never recomputed.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any

from ...definition.fanout import CHILDREN
from ...definition.timers import After, constant_s
from ...errors import InvalidInput
from ...store import details
from ...store.records import (
    ARMED,
    PAUSE,
    RECOVERY,
    TIMER,
    TOOL,
    UNPAUSE,
    WAITING,
    HistoryRow,
    InstanceRecord,
    StepCommit,
)

if TYPE_CHECKING:
    from ...definition.spec import State
    from ...store.base import Store
    from ..compiled import CompiledMachine
    from .base import DriverAPI

#: Rows that stay in a state without entering it again.
_IN_PLACE = frozenset({PAUSE, UNPAUSE, RECOVERY, TOOL, "migration"})


def has(cm: CompiledMachine, state: str) -> bool:
    """True when ``state`` of ``cm`` has timers."""
    return state in cm.timers


def _due(cm: CompiledMachine, trigger: str, after: After, ctx: Mapping[str, Any],
         entered: float) -> float:
    """Epoch seconds when the timer ``trigger`` (delay ``after``) entered at ``entered``
    falls due; ``InvalidInput`` for a callable returning no positive delay or aware time."""
    seconds = constant_s(after)
    if seconds is not None:
        return entered + seconds
    try:
        got = after(cm.spec.context.model_validate(dict(ctx)))
    except Exception as exc:  # noqa: BLE001 - user code: its error refuses the step
        raise InvalidInput(f"timer {trigger!r}: after raised {type(exc).__name__}: {exc}") from exc
    if isinstance(got, datetime):
        if got.tzinfo is None or got.utcoffset() is None:
            raise InvalidInput(f"timer {trigger!r}: after returned a naive datetime "
                               "(give it a time zone)")
        return got.timestamp()
    if isinstance(got, (int, float)) and not isinstance(got, bool) and got > 0:
        return entered + float(got)
    raise InvalidInput(f"timer {trigger!r}: after returned {got!r}, not a positive number "
                       "of seconds or an aware datetime")


def dues(cm: CompiledMachine, state: str, ctx: Mapping[str, Any],
         entered: float) -> dict[str, float]:
    """Trigger -> due time (epoch seconds) of each timer of ``state`` entered at
    ``entered`` with context ``ctx`` (see ``_due``)."""
    return {trigger: _due(cm, trigger, after, ctx, entered)
            for trigger, after in cm.timers.get(state, ())}


def _earliest(times: Mapping[str, float]) -> tuple[str, float]:
    """The (trigger, due) due first; ties: the first declared."""
    trigger = min(times, key=lambda t: times[t])
    return trigger, times[trigger]


def enter(cm: CompiledMachine, step: StepCommit) -> StepCommit:
    """``step`` (a transition into a state that waits) with its timers armed: the due
    times in its entering row's ``detail.timers``, ``next_attempt_at`` the earliest
    (or a review's SLA, when that is earlier).  Raises ``InvalidInput`` for a callable
    delay that gives no delay (the step is refused)."""
    new = step.record
    if new.state not in cm.timers or new.status != WAITING or not step.history:
        return step
    row = step.history[-1]  # (a loop cap routing the transition on has its own row)
    if row.dest != new.state:
        return step
    times = dues(cm, new.state, new.context, row.at)
    row.detail["timers"] = times
    first = _earliest(times)[1]
    new.next_attempt_at = first if new.next_attempt_at is None else min(first, new.next_attempt_at)
    return step


def _entry(history: list[HistoryRow], state: str) -> HistoryRow | None:
    """The row that entered ``state`` for its current visit (``None``: the initial one)."""
    for row in reversed(history):
        if row.dest == state and row.kind not in _IN_PLACE:
            return row
        if row.dest != state:
            return None
    return None


def _own_entry(rec: InstanceRecord, history: list[HistoryRow]) -> HistoryRow | None:
    """The row of ``rec``'s own that began its current visit (``_entry``), or an ``armed``
    one; ``None`` when none did: its initial state, or a fork's visit of the state it
    started in (rows up to ``forked_at_seq`` are the original's)."""
    row = _entry(history, rec.state)
    if row is not None and rec.forked_from is not None and row.seq <= (rec.forked_at_seq or 0):
        return None
    return row


def _kept(cm: CompiledMachine, state: str, row: HistoryRow | None) -> dict[str, float]:
    """The due times ``row`` recorded (``detail.timers``) of ``state``'s timers; ``{}``: none."""
    kept = details.due_times(row.detail) if row is not None else {}
    return {t: due for t, due in kept.items() if has_timer(cm, state, t)}


def recorded(cm: CompiledMachine, store: Store, rec: InstanceRecord) -> dict[str, float]:
    """The due times of ``rec``'s timers in its current state, as the row that began its
    visit recorded them (an entering or ``armed`` row; else, for a row that recorded none
    or an instance armed before ``armed`` rows, as they fall from that row's time or the
    instance's ``created_at``)."""
    row = _own_entry(rec, store.history(rec.id))
    return _kept(cm, rec.state, row) or dues(
        cm, rec.state, rec.context, row.at if row is not None else rec.created_at)


def has_timer(cm: CompiledMachine, state: str, trigger: str) -> bool:
    """True when ``trigger`` out of ``state`` is a timer's."""
    return any(t == trigger for t, _ in cm.timers.get(state, ()))


def due_of(cm: CompiledMachine, store: Store, rec: InstanceRecord) -> float | None:
    """The earliest due time of ``rec``'s timers in its state (``None``: it has none)."""
    return _earliest(recorded(cm, store, rec))[1] if rec.state in cm.timers else None


def armed(cm: CompiledMachine, store: Store, step: StepCommit, now: float) -> StepCommit:
    """``step`` (at ``now``, epoch s) leaving its instance waiting in a state with timers,
    ``next_attempt_at`` the earliest of its timers' due times and the one it holds (a
    review's SLA): as recorded by the row that began the visit (a fan-out parent woken
    by a child: the wake cleared it), or, when no row of its own did (its initial state,
    a fork's first step) or that row recorded none (a restarted delayed start, scheduled
    when it entered), evaluated now and recorded in an ``armed`` row the step appends
    (``ARMED``; so once: later steps read it back).  Raises ``InvalidInput``
    for a callable delay that gives no delay (the step is refused)."""
    new = step.record
    if new.state not in cm.timers or new.status != WAITING or new.final:
        return step
    times = _kept(cm, new.state, _own_entry(new, [*store.history(new.id), *step.history]))
    if not times:  # (or its row recorded none: a restart scheduled for later, ``rescheduled``)
        times = dues(cm, new.state, new.context, now)
        new.seq += 1
        step.history = [*step.history, HistoryRow(
            instance_id=new.id, seq=new.seq, source=new.state, dest=new.state, trigger=ARMED,
            at=now, kind=ARMED, detail={"timers": times}, machine_version=new.machine_version)]
    due, held = _earliest(times)[1], new.next_attempt_at
    new.next_attempt_at = due if held is None else min(due, held)
    return step


def firing(cm: CompiledMachine, store: Store, rec: InstanceRecord, now: float,
           other_due: float | None = None) -> tuple[str, float] | None:
    """The timer to fire now, ``(trigger, due)``: ``rec`` waits with ``next_attempt_at``
    due (or, a fan-out parent woken by a child, its earliest recorded due time is) and
    its earliest timer is not later than ``other_due`` (a review's SLA); else ``None``."""
    if rec.state not in cm.timers or rec.final:
        return None
    held = rec.next_attempt_at
    if rec.status == WAITING and (held is None or held > now):
        return None
    if rec.status != WAITING and (held is not None or rec.reason != CHILDREN):
        return None  # only a fan-out parent woken by a child (the wake cleared it) is asked
    first = _known_first(cm, rec.state)
    if first is not None and held is not None and other_due is None:
        trigger, due = first, held  # no history read: the hot path of a fire
    else:
        trigger, due = _earliest(recorded(cm, store, rec))
    if (other_due is not None and other_due < due) or (held is None and due > now):
        return None
    return trigger, due if held is None else min(due, held)


def _known_first(cm: CompiledMachine, state: str) -> str | None:
    """The trigger of ``state``'s timer that falls due first when the definition alone
    tells: its only timer, or the shortest when every delay is a constant (they were armed
    together; ties: the first declared); else None (callables: their recorded due times)."""
    timers = cm.timers.get(state, ())
    if len(timers) == 1:
        return timers[0][0]
    delays = [(constant_s(after), trigger) for trigger, after in timers]
    if not delays or any(d is None for d, _ in delays):
        return None
    return min(delays, key=lambda d: d[0] or 0.0)[1]


def fire(api: DriverAPI, cm: CompiledMachine, rec: InstanceRecord, state: State,
         trigger: str, due: float, now: float) -> StepCommit:
    """The commit firing timer ``trigger`` (due at ``due``) of ``rec``: its edge taken as
    chosen by its guards (none passing fails the instance, ``no_transition``), the row's
    ``kind: timer`` with ``detail.timer`` = ``{due, lateness_s}``; a review's open item is
    closed undecided with it."""
    base = rec
    if rec.reason is not None:  # the wait's reason (children) ends with it
        from .. import outcome
        base = outcome.clone(rec)
        base.reason = None
    commit = api.advance(cm, base, state, None, trigger, {}, 0.0, kind=TIMER)
    commit.before, commit.expected_version = rec, rec.version
    if commit.history:
        commit.history[0].detail["timer"] = {"due": due,
                                              "lateness_s": round(max(0.0, now - due), 6)}
    if state.review is not None:
        commit.close_reviews = ("timer", f"timer {trigger!r} fired")
    return commit
