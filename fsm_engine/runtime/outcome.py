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

from ..redaction import redact
from ..store import details
from ..store.records import (
    CANCELLED,
    COMPLETED,
    FAILED,
    PAUSE,
    PAUSED,
    PENDING,
    RATE_LIMITED,
    RUNNING,
    SCHEDULED,
    UNPAUSE,
    WAITING,
    AttemptRow,
    HistoryRow,
    InstanceRecord,
    ReviewItem,
    Status,
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
                      trigger=trigger, at=now, machine_version=rec.machine_version, **fields)


def _enter(cm: CompiledMachine, rec: InstanceRecord, dest: str) -> None:
    rec.state = dest
    rec.visits[dest] = rec.visits.get(dest, 0) + 1
    rec.attempt, rec.next_attempt_at = 1, None
    spec = cm.states[dest]
    rec.queue = spec.queue
    if spec.final:
        rec.status = FAILED if spec.failure else COMPLETED
        rec.owner = None
    elif dest in cm.parks:  # its kind parks on entry (wait, review: ``definition.kind``)
        rec.status, rec.owner = WAITING, None
    else:
        rec.status = RUNNING


def force_fail(cm: CompiledMachine, rec: InstanceRecord, reason: str, now: float,
               error: str | None = None, kind: str = "fail") -> HistoryRow:
    """Move ``rec`` (in place) to the failure state, or fail it where it stands."""
    source = rec.state
    dest = cm.failure_state or source
    error = redact(error) if error else error  # stored text never holds a credential
    row = _row(rec, source, dest, kind, now, kind=kind, error=error, reason=reason)
    rec.state, rec.queue = dest, cm.states[dest].queue
    if dest != source:
        rec.visits[dest] = rec.visits.get(dest, 0) + 1
    rec.status, rec.reason, rec.owner = FAILED, reason, None
    rec.last_error = error or rec.last_error
    rec.next_attempt_at = None
    rec.updated_at = now
    return row


def review_id(instance_id: str, state: str, visit: int) -> str:
    """The id of the review item of (instance, state, visit): 12 hex digits of SHA-256."""
    import hashlib
    key = f"{instance_id}\x00{state}\x00{visit}".encode()
    return hashlib.sha256(key).hexdigest()[:12]


def open_review(cm: CompiledMachine, rec: InstanceRecord, now: float) -> ReviewItem | None:
    """The review item ``rec`` (in place) waits on when its state is a review state (its
    SLA timer set as ``next_attempt_at``); ``None`` for any other state."""
    review = cm.states[rec.state].review
    if review is None:
        return None
    visit = rec.visits.get(rec.state, 1)
    due = None if review.sla_s is None else now + review.sla_s
    rec.next_attempt_at = due
    show = {f: rec.context.get(f) for f in review.show}
    return ReviewItem(id=review_id(rec.id, rec.state, visit), instance_id=rec.id,
                      machine=rec.machine, state=rec.state, visit=visit, prompt=review.prompt,
                      show=show, choices=list(review.choices),
                      editable=list(review.editable_fields), created_at=now, due_at=due,
                      on_timeout=review.on_timeout)


def _routed(cm: CompiledMachine, rec: InstanceRecord, dest: str, reason: str, now: float,
            error: str | None, kind: str) -> HistoryRow:
    """Move ``rec`` (in place) to the review state ``dest`` instead of failing it."""
    error = redact(error) if error else error
    row = _row(rec, rec.state, dest, kind, now, kind=kind, error=error, reason=reason)
    _enter(cm, rec, dest)
    rec.reason, rec.updated_at = reason, now
    rec.last_error = error or rec.last_error
    return row


def _loop_cap(cm: CompiledMachine, rec: InstanceRecord, now: float) -> HistoryRow | None:
    """The row for ``rec`` (in place) reaching its loop cap: routed to the machine's
    ``on_loop_limit`` review state, or failed; ``None`` when it already waits there."""
    error = f"reached max_transitions={rec.max_transitions}"
    route = cm.spec.on_loop_limit
    if route is None:
        return force_fail(cm, rec, "loop_limit", now, kind="loop_limit", error=error)
    if rec.state == route:
        return None
    return _routed(cm, rec, route, "loop_limit", now, error, "loop_limit")


def loop_limited(cm: CompiledMachine, rec: InstanceRecord, now: float) -> StepCommit:
    """Record an instance found at its loop cap before a step (failed, or routed)."""
    new = clone(rec)
    row = _loop_cap(cm, new, now)
    return StepCommit(new, rec.version, [row] if row else [], before=rec,
                      review_open=open_review(cm, new, now))


def routed(cm: CompiledMachine, rec: InstanceRecord, dest: str, reason: str, now: float, *,
           error: str | None = None, tokens: int = 0, duration_ms: float = 0.0,
           detail: dict[str, Any] | None = None) -> StepCommit:
    """Record a failure sent to the review state ``dest`` (e.g. an open breaker)."""
    new = clone(rec)
    new.tokens_used += tokens
    row = _routed(cm, new, dest, reason, now, error, "fail")
    row.tokens, row.duration_ms, row.detail = tokens, duration_ms, detail or {}
    return StepCommit(new, rec.version, [row], before=rec, review_open=open_review(cm, new, now))


def awaiting_review(cm: CompiledMachine, rec: InstanceRecord, now: float) -> StepCommit:
    """Wait in the review state ``rec`` stands in (its item opened if it was not)."""
    new = clone(rec)
    item = open_review(cm, new, now)
    new.status, new.owner, new.updated_at = WAITING, None, now
    return StepCommit(new, rec.version, before=rec, review_open=item)


def reset(cm: CompiledMachine, rec: InstanceRecord, dest: str, context: dict[str, Any],
          at_seq: int, now: float) -> StepCommit:
    """Record a forced re-run in place: ``rec`` goes back to ``dest`` with the context it
    had after history row ``at_seq``, as one appended history row (``kind: rerun``, its
    delta setting back every field that changed since); nothing is rewritten."""
    new = clone(rec)
    delta = {k: v for k, v in context.items() if rec.context.get(k, object()) != v}
    row = _row(new, rec.state, dest, "rerun", now, kind="rerun", delta=delta,
               detail={"reset_to_seq": at_seq})
    new.context = dict(context)
    _enter(cm, new, dest)
    new.reason, new.owner, new.updated_at = None, None, now
    return StepCommit(new, rec.version, [row], before=rec, review_open=open_review(cm, new, now))


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
    error = redact(error) if error else error
    new.last_error = error or rec.last_error  # kept: a completed instance shows what it survived
    rows = [_row(new, source, dest, trigger, now, kind=kind, guards=guards or [],
                 duration_ms=duration_ms, tokens=tokens, error=error, reason=reason,
                 delta=delta or {}, detail=detail or {})]
    _enter(cm, new, dest)
    if new.status == FAILED:
        new.reason = reason or trigger
    if not new.final and new.loop_count >= new.max_transitions:
        cap = _loop_cap(cm, new, now)
        if cap is not None:
            rows.append(cap)
    return StepCommit(new, rec.version, rows, outbox_done=outbox_done, before=rec,
                      review_open=open_review(cm, new, now))


def failed(cm: CompiledMachine, rec: InstanceRecord, reason: str, now: float, *,
           error: str | None = None, tokens: int = 0, duration_ms: float = 0.0,
           detail: dict[str, Any] | None = None, kind: str = "fail",
           guards: list[list[Any]] | None = None) -> StepCommit:
    """Record a runtime-forced failure (no declared transition could be taken; ``guards``:
    the ``[name, result]`` of each guard that refused, for the history row)."""
    new = clone(rec)
    new.tokens_used += tokens
    row = force_fail(cm, new, reason, now, error=error, kind=kind)
    row.tokens, row.duration_ms, row.detail = tokens, duration_ms, detail or {}
    row.guards = guards or []
    return StepCommit(new, rec.version, [row], before=rec)


def retry_later(rec: InstanceRecord, *, error: BaseException, tokens: int, next_at: float,
                now: float) -> StepCommit:
    """Record a failed attempt and when the next one is due (no transition)."""
    new = clone(rec)
    new.tokens_used += tokens
    new.attempt += 1
    new.status = RUNNING
    new.next_attempt_at = next_at
    text = redact(error)
    new.last_error = f"{type(error).__name__}: {text}"
    new.updated_at = now
    row = AttemptRow(instance_id=rec.id, state=rec.state, visit=rec.visits.get(rec.state, 1),
                     attempt=rec.attempt, error_class=type(error).__name__, error=text,
                     tokens=tokens, next_at=next_at, at=now)
    return StepCommit(new, rec.version, attempt=row, before=rec)


def rate_limited(rec: InstanceRecord, *, error: str, tokens: int, next_at: float,
                 now: float) -> StepCommit:
    """Record a step ended by a full rate limit: the instance waits, unowned, until
    ``next_at`` (status ``waiting``, reason ``rate_limited``); no attempt is spent, no
    history row written, tokens billed before the limit was hit are kept."""
    new = clone(rec)
    new.tokens_used += tokens
    new.status, new.reason, new.owner = WAITING, RATE_LIMITED, None
    new.next_attempt_at, new.last_error, new.updated_at = next_at, error, now
    return StepCommit(new, rec.version, before=rec)


def cancelled(rec: InstanceRecord, now: float, reason: str = "cancelled",
              operator: str | None = None, *, paused_due: float | None = None
              ) -> StepCommit:
    """Record a cancellation (the instance stays in its state, status ``cancelled``);
    ``operator``: who asked (``detail.operator``); a delayed start not started yet keeps
    its due time in ``detail.scheduled_due`` (epoch s: a restart schedules it again),
    paused or not (``paused_due``: a paused one's, from its pause row, ``scheduled_due``).
    A waiting or paused instance's open review items are closed undecided with it
    (``StepCommit.close_reviews``)."""
    new = clone(rec)
    row = _row(new, rec.state, rec.state, "cancel", now, kind="cancel", reason=reason,
               detail={} if operator is None else {"operator": operator})
    due = {SCHEDULED: rec.next_attempt_at, PAUSED: paused_due}.get(rec.status)
    if due is not None:
        row.detail["scheduled_due"] = due
    new.status, new.reason, new.updated_at = CANCELLED, reason, now
    new.next_attempt_at = new.pause_request = None  # a pending pause request ends with it
    step = StepCommit(new, rec.version, [row], before=rec)
    if rec.status in (WAITING, PAUSED):  # its open review items can no longer be decided
        step.close_reviews = (operator or "fsm", f"instance cancelled: {reason}")
    return step


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


def marked(rec: InstanceRecord, reason: str, error: str, now: float) -> StepCommit:
    """Say why ``rec`` cannot go on (e.g. ``needs_migration`` and its cause) without moving
    it: only its reason and last error change (no history row, owner kept)."""
    new = clone(rec)
    new.reason, new.last_error, new.updated_at = reason, error, now
    return StepCommit(new, rec.version, before=rec)


def scheduled_due(pause: HistoryRow | None) -> float | None:
    """The due time (epoch s) of the delayed start ``pause`` (a ``kind: pause`` row)
    paused: its ``detail.scheduled_due`` (``pause_in_place``), else the time it had left
    after the row's ``at`` (a row written before it was kept); None when it paused
    anything else."""
    d = details.read(details.PauseDetail, None if pause is None else pause.detail)
    if pause is None or d.get("status") != SCHEDULED:
        return None
    due, left = d.get("scheduled_due"), d.get("timer_left_s")
    return due if due is not None else None if left is None else pause.at + left


def _left(until: float | None, now: float) -> float | None:
    return None if until is None else max(0.0, until - now)


def pause_in_place(rec: InstanceRecord, now: float, *, by: str | None, reason: str,
                   error: str | None = None) -> HistoryRow:
    """Pause ``rec`` (in place) where it stands: status ``paused``, unowned, its timers
    stopped; the returned row (``kind: pause``) keeps what unpausing restores in
    ``detail``: ``status``, ``reason``, ``timer_left_s`` (retry backoff, SLA or rate
    wait) and ``deadline_left_s`` (seconds, ``None``: no timer), with ``operator``, and a
    delayed start's due time (``scheduled_due``, epoch s: a cancel keeps it for a
    restart); a pending pause request is spent."""
    error = redact(error) if error else error
    detail = {"operator": by, "status": rec.status, "reason": rec.reason,
              "timer_left_s": _left(rec.next_attempt_at, now),
              "deadline_left_s": _left(rec.deadline, now)}
    if rec.status == SCHEDULED and rec.next_attempt_at is not None:
        detail["scheduled_due"] = rec.next_attempt_at
    row = _row(rec, rec.state, rec.state, PAUSE, now, kind=PAUSE, reason=reason, error=error,
               detail=detail)
    rec.status, rec.reason, rec.owner = PAUSED, reason, None
    rec.next_attempt_at, rec.updated_at, rec.pause_request = None, now, None
    rec.last_error = error or rec.last_error
    return row


def paused(rec: InstanceRecord, now: float, *, by: str | None, reason: str = "paused",
           error: str | None = None, tokens: int = 0, duration_ms: float = 0.0,
           detail: dict[str, Any] | None = None) -> StepCommit:
    """Record a pause of ``rec`` (``pause_in_place``), by an operator ``by`` or by a
    policy (``by`` None: retries or budget ran out, ``error`` and ``tokens`` the last
    attempt's)."""
    new = clone(rec)
    new.tokens_used += tokens
    row = pause_in_place(new, now, by=by, reason=reason, error=error)
    row.tokens, row.duration_ms = tokens, duration_ms
    row.detail.update(detail or {})
    return StepCommit(new, rec.version, [row], before=rec)


def unpaused(rec: InstanceRecord, pause: HistoryRow, now: float, *, by: str | None
             ) -> StepCommit:
    """Record the end of ``rec``'s pause (``pause``: its ``kind: pause`` row): the status
    and reason it had come back, its timers restart with the time they had left, and an
    instance paused by a policy gets a fresh set of attempts.  A parent paused while it
    waited for its children runs its join again (a child that ended meanwhile woke no one)."""
    new = clone(rec)
    d = details.read(details.PauseDetail, pause.detail)
    status: Status = RUNNING
    for known in (PENDING, WAITING, SCHEDULED):  # (a delayed start: due when its time is up)
        if d.get("status") == known:
            status = known
    reason = d.get("reason")
    if status == WAITING and reason == "children":
        status = RUNNING
    new.status, new.reason, new.owner, new.updated_at = status, reason, None, now
    left, deadline_left = d.get("timer_left_s"), d.get("deadline_left_s")
    new.next_attempt_at = None if left is None else now + left
    if deadline_left is not None:
        new.deadline = now + deadline_left
    if d.get("operator") is None:  # paused by a policy: its retries start over
        new.attempt, new.next_attempt_at = 1, None
    row = _row(new, rec.state, rec.state, UNPAUSE, now, kind=UNPAUSE,
               detail={"operator": by, "paused_s": round(max(0.0, now - pause.at), 3)})
    return StepCommit(new, rec.version, [row], before=rec)
