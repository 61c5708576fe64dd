"""Fork: a new instance that starts from a prefix of another's history (pure, no I/O, but
for ``lineage_delivery``, which reads the store).

The fork copies the original's history rows 1..N (the same rows under the new id)
and the instance as it stood after row N, rebuilt from those rows: the input with
deltas 1..N applied, the state row N entered, visits, transitions counted, tokens
billed by those rows and by the failed attempts made before row N.  Its lineage
(``forked_from``, ``forked_at_seq``) is stored with it.  Side effects the original
delivered are not repeated: the driver replays the original's recorded outcome for
a side-effect visit the original completed (``delivered``).  The fork keeps the
machine version (and fingerprint) of the rows it copied: a fork of rows written
under an older version is upcast when it first steps, like any stored instance.
A fork standing in a state with timers arms them afresh at its first step: a fresh
``after`` from then, not the original's time left (``runtime.kinds.timers.armed``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import replace

from ...errors import FsmError, InvalidInput
from ...store.base import Store
from ...store.records import (
    ARMED,
    PAUSE,
    PENDING,
    RECOVERY,
    RUNNING,
    TOOL,
    UNPAUSE,
    AttemptRow,
    HistoryRow,
    InstanceRecord,
    OutboxRow,
)
from ..compiled import CompiledMachine
from .replay import CHOSEN as _COUNTED
from .replay import Rebuilt


def fork_point(history: Sequence[HistoryRow], *, seq: int | None = None,
               state: str | None = None, failure: bool = False) -> int:
    """How many rows a fork copies: ``seq`` itself; before the latest visit of ``state``
    is left (the row that entered it, or 0 for the state it started in and never entered
    again: an agent's journal rows, kind ``tool``, go on its visit and enter nothing, so
    the fork starts before the visit's first turn; nor does an ``armed`` row, which
    records its timers); or before the last failure (the row that failed).
    ``InvalidInput`` when there is no such point."""
    if seq is not None:
        if not 0 <= seq <= len(history):
            raise InvalidInput(f"--from-seq {seq} is outside 0..{len(history)}")
        return seq
    if state is not None:
        entered = [h.seq for h in history
                   if h.dest == state
                   and h.kind not in ("cancel", RECOVERY, PAUSE, UNPAUSE, TOOL, ARMED)]
        if entered:
            return entered[-1]
        if history and history[0].source == state:  # the state it started in: from the input
            return 0
        raise InvalidInput(f"the instance never entered state {state!r}")
    if failure:
        failed = [h.seq for h in history if h.kind in ("fail", "loop_limit") or h.error]
        if not failed:
            raise InvalidInput("the instance has no failure to fork from")
        return failed[-1] - 1
    raise InvalidInput("say where to fork from: --from-seq, --from-state or --from-failure")


def forked(cm: CompiledMachine, orig: InstanceRecord, history: Sequence[HistoryRow],
           attempts: Sequence[AttemptRow], n: int, now: float,
           new_id: str | None = None, *, reuse_llm: bool = False,
           redeliver: bool = False, by: str | None = None
           ) -> tuple[InstanceRecord, list[HistoryRow]]:
    """The fork of ``orig`` after its first ``n`` history rows, and its copied rows
    (``reuse_llm`` / ``redeliver`` / ``by``, the operator: its ``fork_options``)."""
    rows = [replace(h, instance_id="") for h in history[:n]]
    built = Rebuilt.start(cm, orig, attempts)
    for h in rows:
        built.after(h)
    built.until(rows[-1].at if rows else orig.created_at)
    context, visits, state = built.context, built.visits, built.state
    now_named = state if state in cm.states else cm.spec.renamed_states.get(state, state)
    if cm.states.get(now_named) is None:
        raise InvalidInput(f"state {state!r} no longer exists in machine {cm.name!r}")
    if cm.states[now_named].final:
        raise InvalidInput(f"row {n} ends in final state {state!r}: nothing to run; fork "
                           "from an earlier row")
    iid = new_id or os.urandom(6).hex()
    for h in rows:
        h.instance_id = iid
    rec = InstanceRecord(
        id=iid, machine=orig.machine, module=orig.module, fingerprint=orig.fingerprint,
        state=state, status=RUNNING if n else PENDING, context=context, input=dict(orig.input),
        max_transitions=orig.max_transitions, token_budget=orig.token_budget,
        created_at=now, updated_at=now, seq=n, loop_count=built.loops, tokens_used=built.tokens,
        visits=visits, forked_from=orig.id, forked_at_seq=n,
        machine_version=(rows[-1] if rows else history[0]).machine_version if history
        else orig.machine_version,  # the input is in the shape of the first row's version
        fork_options={k: v for k, v in (("reuse_llm", reuse_llm), ("redeliver", redeliver),
                                        ("by", by)) if v},
        queue=cm.states[now_named].queue, partition_key=orig.partition_key,
        priority=orig.priority)
    return rec, rows


def outbox_key(rec: InstanceRecord, state: str, visit: int) -> str:
    """The idempotency key of ``rec``'s side effect in ``state``'s ``visit``:
    ``instance:state:visit``, for a fork ``original>fork:state:visit`` (its lineage)."""
    if rec.forked_from is None:
        return f"{rec.id}:{state}:{visit}"
    return f"{rec.forked_from}>{rec.id}:{state}:{visit}"


#: How many forks up a lineage ``ancestors`` goes (a bound for a damaged store's cycle).
MAX_LINEAGE = 100


def ancestors(rec: InstanceRecord, get: Callable[[str], InstanceRecord]) -> list[str]:
    """The ids up ``rec``'s lineage, nearest first: the instance it was forked from, that
    one's own original, and so on (``get``: ``Store.get``).  An ancestor that was pruned
    is listed, the walk stops there (its own original is no longer known)."""
    out: list[str] = []
    up = rec.forked_from
    while up is not None and up not in out and len(out) < MAX_LINEAGE:
        out.append(up)
        try:
            up = get(up).forked_from
        except FsmError:  # pruned: nothing further up is known
            break
    return out


def delivered(rec: InstanceRecord, state: str, visit: int,
              outbox: Sequence[OutboxRow]) -> OutboxRow | None:
    """An ancestor's completed delivery of ``state``'s ``visit``, when ``rec`` is a fork
    that reached a side effect that ancestor already delivered (``outbox``: the
    ancestor's rows, one of ``ancestors``); ``None`` too for a fork asked to
    ``redeliver``."""
    if rec.forked_from is None or rec.fork_options.get("redeliver"):
        return None
    return next((o for o in outbox if o.state == state and o.visit == visit
                 and o.status == "done"), None)


def recorded_outcome(history: Sequence[HistoryRow], state: str, visit: int) -> HistoryRow | None:
    """The original's history row that ended ``state``'s ``visit`` (its trigger and delta)."""
    ends = [h for h in history if h.source == state and h.kind in _COUNTED]
    return ends[visit - 1] if len(ends) >= visit else None


def lineage_delivery(store: Store, rec: InstanceRecord, state: str, visit: int
                     ) -> tuple[OutboxRow, HistoryRow] | None:
    """The nearest ancestor's completed delivery of ``state``'s ``visit`` (``ancestors``)
    and the history row that ended that visit there; ``None`` when no ancestor delivered
    it, ``rec`` is not a fork, or it was asked to ``redeliver``.  An ancestor pruned is
    passed over."""
    if rec.forked_from is None or rec.fork_options.get("redeliver"):
        return None
    for up in ancestors(rec, store.get):
        try:
            done = delivered(rec, state, visit, store.outbox(up))
            row = recorded_outcome(store.history(up), state, visit) if done else None
        except FsmError:  # that ancestor was pruned: look further up
            continue
        if done is not None and row is not None:
            return done, row
    return None
