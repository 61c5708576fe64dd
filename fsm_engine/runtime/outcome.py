"""Turn what happened in a step into the ``StepCommit`` that records it (pure, no I/O).

Each builder copies the instance record, applies the step's effects and
returns a commit with its history row(s).  Runtime-forced moves (fail,
cancel, loop_limit) do not count against ``max_transitions``; declared
transitions, fallbacks and skips do.
"""

from __future__ import annotations

import operator
from dataclasses import fields
from typing import Any

from ..store.records import (
    CANCELLED, COMPLETED, FAILED, RUNNING, WAITING, AttemptRow, HistoryRow, InstanceRecord,
    StepCommit,
)
from .compiled import CompiledMachine


_FIELDS = operator.attrgetter(*(f.name for f in fields(InstanceRecord)))


def clone(rec: InstanceRecord) -> InstanceRecord:
    """A copy safe to mutate (context and visits are copied one level deep)."""
    new = InstanceRecord(*_FIELDS(rec))
    new.context = dict(rec.context)
    new.visits = dict(rec.visits)
    return new


def _row(rec: InstanceRecord, source: str, dest: str, trigger: str, now: float,
         **fields: Any) -> HistoryRow:
    rec.seq += 1
    return HistoryRow(instance_id=rec.id, seq=rec.seq, source=source, dest=dest,
                      trigger=trigger, at=now, **fields)


def _enter(cm: CompiledMachine, rec: InstanceRecord, dest: str) -> None:
    rec.state = dest
    rec.visits[dest] = rec.visits.get(dest, 0) + 1
    rec.attempt, rec.next_attempt_at = 1, None
    spec = cm.states[dest]
    if spec.final:
        rec.status = FAILED if spec.failure else COMPLETED
        rec.owner = None
    elif spec.wait:
        rec.status, rec.owner = WAITING, None
    else:
        rec.status = RUNNING


def force_fail(cm: CompiledMachine, rec: InstanceRecord, reason: str, now: float,
               error: str | None = None, kind: str = "fail") -> HistoryRow:
    """Move ``rec`` (in place) to the failure state, or fail it where it stands."""
    source = rec.state
    dest = cm.failure_state or source
    row = _row(rec, source, dest, kind, now, kind=kind, error=error, reason=reason)
    rec.state = dest
    if dest != source:
        rec.visits[dest] = rec.visits.get(dest, 0) + 1
    rec.status, rec.reason, rec.owner = FAILED, reason, None
    rec.last_error = error or rec.last_error
    rec.next_attempt_at = None
    rec.updated_at = now
    return row


def transition(cm: CompiledMachine, rec: InstanceRecord, *, trigger: str, dest: str,
               now: float, context: dict[str, Any] | None = None,
               delta: dict[str, Any] | None = None, kind: str = "transition",
               guards: list[list[Any]] | None = None, tokens: int = 0,
               duration_ms: float = 0.0, error: str | None = None,
               reason: str | None = None, detail: dict[str, Any] | None = None,
               outbox_done: tuple[str, dict[str, Any]] | None = None,
               extra_loops: int = 0) -> StepCommit:
    """Record a taken transition (declared, fallback or skip) and everything it implies.

    ``extra_loops`` adds re-asks made inside the step to ``loop_count``.
    """
    new = clone(rec)
    source = rec.state
    if context is not None:
        new.context = context
    new.tokens_used += tokens
    new.loop_count += 1 + extra_loops
    new.updated_at = now
    new.last_error = error or rec.last_error  # kept: a completed instance shows what it survived
    rows = [_row(new, source, dest, trigger, now, kind=kind, guards=guards or [],
                 duration_ms=duration_ms, tokens=tokens, error=error, reason=reason,
                 delta=delta or {}, detail=detail or {})]
    _enter(cm, new, dest)
    if new.status == FAILED:
        new.reason = reason or trigger
    if not new.final and new.loop_count >= new.max_transitions:
        rows.append(force_fail(cm, new, "loop_limit", now, kind="loop_limit",
                               error=f"reached max_transitions={new.max_transitions}"))
    return StepCommit(new, rec.version, rows, outbox_done=outbox_done, before=rec)


def failed(cm: CompiledMachine, rec: InstanceRecord, reason: str, now: float, *,
           error: str | None = None, tokens: int = 0, duration_ms: float = 0.0,
           detail: dict[str, Any] | None = None, kind: str = "fail") -> StepCommit:
    """Record a runtime-forced failure (no declared transition could be taken)."""
    new = clone(rec)
    new.tokens_used += tokens
    row = force_fail(cm, new, reason, now, error=error, kind=kind)
    row.tokens, row.duration_ms, row.detail = tokens, duration_ms, detail or {}
    return StepCommit(new, rec.version, [row], before=rec)


def retry_later(rec: InstanceRecord, *, error: BaseException, tokens: int, next_at: float,
                now: float) -> StepCommit:
    """Record a failed attempt and when the next one is due (no transition)."""
    new = clone(rec)
    new.tokens_used += tokens
    new.attempt += 1
    new.status = RUNNING
    new.next_attempt_at = next_at
    new.last_error = f"{type(error).__name__}: {error}"
    new.updated_at = now
    row = AttemptRow(instance_id=rec.id, state=rec.state, visit=rec.visits.get(rec.state, 1),
                     attempt=rec.attempt, error_class=type(error).__name__, error=str(error),
                     tokens=tokens, next_at=next_at, at=now)
    return StepCommit(new, rec.version, attempt=row, before=rec)


def cancelled(rec: InstanceRecord, now: float, reason: str = "cancelled") -> StepCommit:
    """Record a cancellation (the instance stays in its state, status ``cancelled``)."""
    new = clone(rec)
    row = _row(new, rec.state, rec.state, "cancel", now, kind="cancel", reason=reason)
    new.status, new.reason, new.updated_at = CANCELLED, reason, now
    new.next_attempt_at = None
    return StepCommit(new, rec.version, [row], before=rec)


def claimed(rec: InstanceRecord, owner: str, now: float) -> StepCommit:
    """Take ownership of ``rec`` (no history row)."""
    new = clone(rec)
    new.owner, new.updated_at = owner, now
    if new.status not in (WAITING,):
        new.status = RUNNING
    return StepCommit(new, rec.version, before=rec)


def parked(rec: InstanceRecord, reason: str, error: str, now: float,
           until: float | None) -> StepCommit:
    """Leave ``rec`` alone because this worker cannot run it (``reason``
    ``machine_unavailable`` or ``fingerprint_mismatch``): owner cleared, the reason and
    error shown, not claimed again before ``until`` (no history row)."""
    new = clone(rec)
    new.owner, new.reason, new.last_error, new.updated_at = None, reason, error, now
    if until is not None:
        new.next_attempt_at = max(until, rec.next_attempt_at or 0.0)
    return StepCommit(new, rec.version, before=rec)


def unparked(rec: InstanceRecord) -> StepCommit:
    """Clear a ``parked`` reason once a worker that can run ``rec`` holds it."""
    new = clone(rec)
    new.reason = None
    return StepCommit(new, rec.version, before=rec)
