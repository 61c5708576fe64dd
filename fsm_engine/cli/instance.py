"""``fsm show`` and ``fsm cancel``: one instance."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

import typer
from rich.text import Text

from ..terminal import shown
from .common import DB, _find, _open, _print_json, app, out


def _schedule(store: Any, instance_id: str) -> dict[str, Any]:
    """``{"schedule": {name, tick, next_fire}}`` for a schedule's tick instance, else ``{}``."""
    from ..runtime.schedule_spec import iso
    from ..runtime.schedules import started_by
    found = started_by(store, instance_id)
    if found is None:
        return {}
    row, tick = found
    return {"schedule": {"name": row.name, "tick": iso(tick),
                         "next_fire": None if row.paused else iso(row.next_fire)}}


@app.command()
def show(instance_id: str = typer.Argument(..., help="Instance id (or an unambiguous prefix)."),
         db: str = DB, as_json: bool = typer.Option(False, "--json", help="Print it as JSON.")) -> None:
    """Show one instance, with its failed attempts (errors, tokens billed, next try)."""
    store = _open(db)
    rec = _find(store, instance_id)
    from ..views import instance_json, limits_json, timer_json
    data = instance_json(rec) | {"attempts": [asdict(a) for a in store.attempts(rec.id)]}
    rows = store.history(rec.id)
    limits = limits_json(rec, rows)
    if limits:  # rate-limit waits, breaker-open fallbacks, budget exhaustion: each apart
        data["limits"] = limits
    data.update(_schedule(store, rec.id))
    timer = timer_json(rec, rows)
    if timer is not None:  # a waiting instance's next timer edge (issue 38)
        data["timer"] = timer
    kids = store.children(rec.id)
    if kids:
        data["children"] = [{"id": k.id, "branch": k.branch, "machine": k.machine,
                             "state": k.state, "status": k.status, "reason": k.reason,
                             "tokens_used": k.tokens_used} for k in kids]
    if as_json:
        _print_json(data)
        return
    for key, value in data.items():
        out.print(Text.assemble((key, "bold"), ": " + shown(json.dumps(value, ensure_ascii=False)),
                                (_time_note(key, value), "dim")),
                  highlight=False, soft_wrap=True)  # one line per field: the value stays JSON


#: The fields of ``fsm show`` holding epoch seconds (``InstanceRecord``, ``views.instance_json``).
_TIMES = frozenset({"created_at", "updated_at", "next_attempt_at", "deadline", "due_at"})


def _time_note(key: str, value: object) -> str:
    """After a field of epoch seconds, its local time and age (``  (12:03:04 (in 5 min))``);
    after ``timer``, its trigger and due time; else ``""``."""
    from ..views import when
    if key in _TIMES and isinstance(value, int | float) and not isinstance(value, bool):
        return f"  ({when(value)})"
    if key == "timer" and isinstance(value, dict) and isinstance(value.get("due"), int | float):
        return f"  ({value.get('trigger')} due {when(value['due'])})"
    return ""
