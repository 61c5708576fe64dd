"""JSON views of stored records for the CLI and for callers who audit instances."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any, Iterable

from .store.records import HistoryRow, InstanceRecord, OutboxRow


def instance_json(rec: InstanceRecord) -> dict[str, Any]:
    """``{id, machine, state, status, reason, loop_count, max_transitions, tokens_used,
    token_budget, tokens_remaining, context, …}`` (times in epoch seconds)."""
    data = asdict(rec)
    data["tokens_remaining"] = rec.tokens_remaining
    order = ["id", "machine", "state", "status", "reason", "loop_count", "max_transitions",
             "tokens_used", "token_budget", "tokens_remaining", "context"]
    return {k: data[k] for k in order} | {k: v for k, v in data.items() if k not in order}


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
    return [asdict(row) | {"context": ctx} for row, ctx in zip(rows, context_after(rec, rows))]


def outbox_json(rows: list[OutboxRow]) -> list[dict[str, Any]]:
    """Outbox rows as dicts ``{key, instance_id, state, visit, status, attempts, …}``."""
    return [asdict(r) for r in rows]
