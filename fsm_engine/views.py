"""JSON views of stored records for the CLI and for callers who audit instances."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict
from typing import Any

from .store import details
from .store.records import PAUSE, TIMER, UNPAUSE, HistoryRow, InstanceRecord, OutboxRow


def instance_json(rec: InstanceRecord) -> dict[str, Any]:
    """``{id, machine, state, status, reason, loop_count, max_transitions, tokens_used,
    token_budget, tokens_remaining, context, …}`` (times in epoch seconds); a ``scheduled``
    instance's due time also as ``due_at`` (after ``status``)."""
    data = asdict(rec)
    data["tokens_remaining"] = rec.tokens_remaining
    if rec.status == "scheduled":
        data["due_at"] = rec.next_attempt_at
    order = ["id", "machine", "state", "status", *(("due_at",) if "due_at" in data else ()),
             "reason", "loop_count", "max_transitions",
             "tokens_used", "token_budget", "tokens_remaining", "context"]
    return {k: data[k] for k in order} | {k: v for k, v in data.items() if k not in order}


def limits_json(rec: InstanceRecord, rows: Iterable[HistoryRow]) -> dict[str, Any]:
    """What limits did to the instance, each kind apart (``{}``: nothing): ``rate_limited``
    (waiting for a shared rate limit: ``{until, why}``; no attempt spent),
    ``circuit_open`` (steps a model's open breaker moved on: ``[{seq, state, to}]``) and
    ``token_budget`` (steps or the end a spent budget caused: ``[{seq, state, to}]``)."""
    out: dict[str, Any] = {}
    if rec.status == "waiting" and rec.reason == "rate_limited":
        out["rate_limited"] = {"until": rec.next_attempt_at, "why": rec.last_error}
    for row in rows:
        if row.reason in ("circuit_open", "token_budget"):
            out.setdefault(row.reason, []).append(
                {"seq": row.seq, "state": row.source, "to": row.dest, "kind": row.kind})
    return out


def timer_json(rec: InstanceRecord, rows: Iterable[HistoryRow]) -> dict[str, Any] | None:
    """A waiting instance's next timer (timer edges, issue 38): ``{trigger, due, timers}``
    (``due``: epoch seconds, when a worker fires it; ``timers``: every timer of the state,
    trigger -> due, as its entering row recorded them); ``None`` when it waits on none."""
    if rec.final or rec.status != "waiting" or rec.reason == "rate_limited":
        return None
    for row in reversed(list(rows)):
        if row.dest != rec.state:
            return None
        times = details.due_times(row.detail)
        if times:
            trigger = min(times, key=lambda t: times[t])
            return {"trigger": trigger, "due": rec.next_attempt_at or times[trigger],
                    "timers": times}
        if row.source != row.dest:  # the row that entered it: it armed none
            return None
    return None


def context_after(rec: InstanceRecord, rows: Iterable[HistoryRow]) -> list[dict[str, Any]]:
    """The context after each history row: the input with the rows' deltas applied in order."""
    ctx = dict(rec.input)
    out = []
    for row in rows:
        ctx = ctx | row.delta
        out.append(ctx)
    return out


def history_json(rec: InstanceRecord, rows: list[HistoryRow]) -> list[dict[str, Any]]:
    """History rows as dicts ``{seq, source, dest, trigger, kind, guards, tokens, error,
    reason, duration_ms, at, delta, detail, context}``; ``context`` is the context after the row."""
    return [asdict(row) | {"context": ctx} for row, ctx in zip(rows, context_after(rec, rows), strict=False)]


def outbox_json(rows: list[OutboxRow]) -> list[dict[str, Any]]:
    """Outbox rows as dicts ``{key, instance_id, state, visit, status, attempts, …}``."""
    return [asdict(r) for r in rows]


# -- for people: times, ages and the status an operator should see ---------------------------

ORPHANED = "orphaned"


def local_time(ts: float | None, now: float | None = None) -> str:
    """``ts`` (epoch seconds) as local ISO-8601: ``HH:MM:SS`` when it is today, else
    ``YYYY-MM-DD HH:MM:SS`` (``-`` for None)."""
    import time as _time
    if ts is None:
        return "-"
    now = _time.time() if now is None else now
    day, today = _time.localtime(ts)[:3], _time.localtime(now)[:3]
    return _time.strftime("%H:%M:%S" if day == today else "%Y-%m-%d %H:%M:%S",
                          _time.localtime(ts))


def iso_time(ts: float | None) -> str | None:
    """``ts`` as full local ISO-8601 with its UTC offset (``2026-12-01T09:50:54+01:00``)."""
    import datetime as _dt
    if ts is None:
        return None
    return _dt.datetime.fromtimestamp(ts).astimezone().isoformat(timespec="seconds")


def age(ts: float | None, now: float | None = None) -> str:
    """How long ago ``ts`` was: ``just now``, ``42 s ago``, ``5 min ago``, ``3 h ago``, ``2 d ago``;
    a time still ahead (a due time, a next attempt) reads ``in 42 s``, ``in 3 h``."""
    import time as _time
    if ts is None:
        return "-"
    secs = (_time.time() if now is None else now) - ts
    if abs(secs) < 1:
        return "just now"
    span = f"{int(abs(secs))} s"
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if abs(secs) >= size:
            span = f"{int(abs(secs) // size)} {unit}"
            break
    return f"{span} ago" if secs > 0 else f"in {span}"


def when(ts: float | None, now: float | None = None) -> str:
    """``12:03:04 (5 min ago)``."""
    return "-" if ts is None else f"{local_time(ts, now)} ({age(ts, now)})"


def shown_reason(rec: InstanceRecord, now: float | None = None) -> str:
    """The reason to show: the stored one, else for a ``scheduled`` instance its due time
    (``due 12:03:04 (in 5 min)``), else ``""``; a ``waiting`` instance with a due time (a
    timer edge's, a review's SLA: issue 38) shows it after its reason
    (``children · due 12:03:04 (in 5 min)``)."""
    if rec.status not in ("waiting", "scheduled") or rec.next_attempt_at is None:
        return rec.reason or ""
    if rec.status == "scheduled" and rec.reason:
        return rec.reason
    due = f"due {when(rec.next_attempt_at, now)}"  # formatted only where it is shown
    return f"{rec.reason} · {due}" if rec.reason else due


def shown_status(rec: InstanceRecord, live: set[str] | frozenset[str]) -> str:
    """The status to show: ``orphaned`` for a pending or running instance whose owner is
    no live worker (``fsm resume`` adopts it), else the stored status."""
    if rec.status in ("pending", "running") and rec.owner is not None and rec.owner not in live:
        return ORPHANED
    return rec.status


def guard_reading(name: str, result: Any) -> tuple[str, bool]:
    """A recorded guard ``[name, result]`` as people read it: (label, passed).

    A ``conditions`` guard passes when it returned true; an ``unless`` guard (recorded
    as ``!name`` with the function's own result) reads ``not name`` and passes when the
    function returned false.
    """
    if name.startswith("!"):
        return f"not {name[1:]}", not bool(result)
    return name, bool(result)


_CAUSES = {"process_gone": "its process was gone", "lease_expired": "its lease expired",
           "deregistered": "it had stopped without giving the instance back"}


def _worker(wid: Any, host: Any, pid: Any) -> str:
    return f"{host} pid {pid}" if host and pid is not None else str(wid)


def recovery_note(detail: dict[str, Any]) -> str | None:
    """A ``recovery`` history row's ``detail`` as one sentence (``None`` for other rows):
    ``taken over by hostB pid 7 from hostA pid 41 (its process was gone) mid-step: the
    step runs again``."""
    info = detail.get("recovery")
    if not isinstance(info, dict):  # (by hand: each field is shown through str() or as a
        return None                 # flag, whatever it holds; only the object is checked)
    text = (f"taken over by {_worker(info.get('to'), info.get('to_host'), info.get('to_pid'))}"
            f" from {_worker(info.get('from'), info.get('from_host'), info.get('from_pid'))}")
    cause = _CAUSES.get(str(info.get("cause")))
    if cause:
        text += f" ({cause})"
    if info.get("mid_step"):
        text += f" mid-step: the step runs again (recovery {info.get('recoveries', 1)})"
    else:
        text += f" while {info.get('status', 'idle')}"
    return text



def pause_note(row: dict[str, Any]) -> str | None:
    """A ``pause`` / ``unpause`` history row (as ``fsm history --json`` gives it) as one
    line, ``None`` for other rows: ``paused by ann: audit``, ``paused by its policy:
    retries_exhausted`` (with the last attempt's error after it), ``unpaused by bob after
    12.5 s``."""
    pause = details.read(details.PauseDetail, row.get("detail"))
    by = pause.get("operator")
    who = f"by {by}" if by is not None else "by its policy"
    if row.get("kind") == PAUSE:
        note = f"paused {who}: {row.get('reason') or 'paused'}"
        return f"{note}; {row['error']}" if row.get("error") else note
    if row.get("kind") == UNPAUSE:
        unpause = details.read(details.UnpauseDetail, row.get("detail"))
        took, by = unpause.get("paused_s"), unpause.get("operator")
        after = f" after {took:g} s" if took is not None else ""
        return f"unpaused{f' by {by}' if by is not None else ''}{after}"
    return None


def timer_note(row: dict[str, Any], now: float | None = None) -> str | None:
    """A timer's history row (as ``fsm history --json`` gives it) as one line, ``None``
    for other rows: a fire (kind ``timer``) ``timer fired 0.4 s late (due 12:03:04)``, a
    row that armed its state's timers ``timer expire due 12:03:04`` (the soonest first)."""
    detail = row.get("detail")
    if row.get("kind") == TIMER:
        fired = details.fired_timer(detail)
        late, due = fired.get("lateness_s"), fired.get("due")
        note = "timer fired" + (f" {late:.1f} s late" if late is not None else "")
        return note + (f" (due {local_time(due, now)})" if due is not None else "")
    times = details.due_times(detail)
    if not times:
        return None
    soonest = sorted(times.items(), key=lambda item: item[1])
    return ", ".join(f"timer {t} due {local_time(due, now)}" for t, due in soonest)


def agent_note(detail: dict[str, Any]) -> str | None:
    """An agent journal row's ``detail`` (kind ``tool``) as one line (``None`` for other
    rows): ``turn 2: add {"a": 2}, echo {…}``, ``call 1.1 add → 5``, ``ask 2.1 send_report``,
    ``approve 2.1 by ann``; values cut to 80 characters."""
    import json
    kind = detail.get("agent")

    def short(value: Any) -> str:
        dumped = json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)
        return dumped if len(dumped) <= 80 else dumped[:79] + "…"
    if kind == "turn":
        calls = details.read(details.AgentDetail, detail).get("calls") or []
        asked = ", ".join(f"{c.get('tool')} {short(c.get('arguments'))}" for c in calls
                          if c is not None)
        return f"turn {detail.get('turn')}: {asked or 'no call'}"
    if kind == "call":
        got = short(detail["result"]) if "result" in detail else "error"
        return f"call {detail.get('call')} {detail.get('tool')} → {got}"
    if kind == "ask":
        return f"ask {detail.get('call')} {detail.get('tool')} {short(detail.get('arguments'))}"
    if kind == "decision":
        by = details.reviewer(detail)
        return f"{detail.get('choice')} {detail.get('call')} by {by}"
    return None
