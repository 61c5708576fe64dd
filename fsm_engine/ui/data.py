"""What the viewer's pages show, computed from a read-only store (no HTML here).

Diagrams come from what the store holds, never from code: the definition's
export the store kept when the instance's machine version was registered
(``Store.get_definition``, format 11), else — a store written before that —
the states and moves the history shows, with a note saying so.  No page imports
the module a row names (whoever can write a row could name any file).
SVG is drawn by Graphviz's ``dot``; every label is escaped on the way into DOT
(see :mod:`fsm_engine.diagram.dot`), so no text from the database becomes markup.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from ..diagram import build_graph, to_dot
from ..diagram.dot import pipe
from ..diagram.overlays import aggregate_overlay, instance_overlay
from ..errors import FsmError, InvalidInput, StoreError
from ..runtime.fleet.liveness import live_ids
from ..runtime.schedules import started_by
from ..store import details
from ..store.base import Store
from ..store.records import (
    NOT_MOVES,
    ORDERS,
    STATUSES,
    HistoryRow,
    InstanceFilter,
    InstanceRecord,
)
from ..views import (
    agent_note,
    guard_reading,
    history_json,
    instance_json,
    iso_time,
    pause_note,
    recovery_note,
    shown_reason,
    shown_status,
    when,
)

PAGE_SIZES = (20, 50, 100, 200)
#: Most (machine, status) statistics kept (least recently computed dropped first): a
#: client asking for ever new machine names cannot grow the viewer's memory.
STATS_CACHE_MAX = 64
#: Forks of one instance listed on its page (the newest; the page says how many there are).
FORKS_SHOWN = 50
_SVG_HEAD = re.compile(r"^.*?(?=<svg\b)", re.S)
_COMMENT = re.compile(r"<!--.*?-->", re.S)


@dataclass
class ListQuery:
    """The instance list's filters, order and page, read from query parameters."""

    machine: str = ""
    status: str = ""
    state: str = ""
    reason: str = ""
    q: str = ""
    sort: str = "created"
    dir: str = "desc"
    page: int = 1
    per: int = 50

    @classmethod
    def parse(cls, params: Mapping[str, str]) -> ListQuery:
        """Read parameters leniently: an unknown sort, direction or size falls back to
        the default, a bad status is ``InvalidInput`` (shown as a 400 page)."""
        def text(key: str) -> str:
            return str(params.get(key, "")).strip()[:200]
        status = text("status")
        if status and status not in (*STATUSES, "orphaned"):
            raise InvalidInput(f"unknown status {status!r}")
        try:
            page = max(1, int(params.get("page", 1)))
            per = int(params.get("per", 50))
        except ValueError:
            raise InvalidInput("page and per must be whole numbers") from None
        return cls(machine=text("machine"), status=status, state=text("state"),
                   reason=text("reason"), q=text("q"),
                   sort=text("sort") if text("sort") in ORDERS else "created",
                   dir="asc" if text("dir") == "asc" else "desc", page=page,
                   per=per if per in PAGE_SIZES else 50)

    def filter(self) -> InstanceFilter:
        """The store filter (``orphaned`` is pending/running, narrowed afterwards)."""
        statuses: tuple[str, ...] | None = None
        if self.status == "orphaned":
            statuses = ("pending", "running")
        elif self.status:
            statuses = (self.status,)
        return InstanceFilter(machine=self.machine or None, statuses=statuses,
                              states=(self.state,) if self.state else None,
                              reasons=(self.reason,) if self.reason else None,
                              text=self.q or None)

    def link(self, **changes: Any) -> str:
        """Query string of this query with ``changes`` (defaults left out)."""
        from urllib.parse import urlencode
        data = asdict(self) | changes
        defaults = asdict(ListQuery())
        return "?" + urlencode({k: v for k, v in data.items() if v != defaults[k]})


@dataclass
class Row:
    """One instance as a list row."""

    id: str
    machine: str
    state: str
    status: str
    reason: str
    transitions: int
    tokens: int
    created: str
    updated: str
    created_iso: str | None
    updated_iso: str | None
    error: str


class Viewer:
    """Page data over one read-only store (safe to share between request threads)."""

    def __init__(self, store: Store, *, lease_seconds: float = 10.0,
                 stats_ttl_s: float = 5.0) -> None:
        self.store = store
        self.lease_seconds = lease_seconds
        self.stats_ttl_s = stats_ttl_s
        self._stats: OrderedDict[tuple[str, str], tuple[float, Any]] = OrderedDict()
        self._lock = threading.Lock()

    # -- common ----------------------------------------------------------------------
    def live(self) -> set[str]:
        """Ids of the live workers now."""
        return live_ids(self.store.workers(), time.time(), self.lease_seconds)

    def machines(self) -> dict[str, int]:
        """Machine name -> instances."""
        counts = self.store.count(InstanceFilter(), "machine")
        return {str(k): v for k, v in sorted(counts.items(), key=lambda kv: str(kv[0]))}

    def _row(self, rec: InstanceRecord, live: set[str], now: float) -> Row:
        return Row(rec.id, rec.machine, rec.state, shown_status(rec, live), shown_reason(rec, now),
                   rec.loop_count, rec.tokens_used, when(rec.created_at, now),
                   when(rec.updated_at, now), iso_time(rec.created_at), iso_time(rec.updated_at),
                   (rec.last_error or "")[:300])

    # -- pages -----------------------------------------------------------------------
    def instances(self, q: ListQuery) -> dict[str, Any]:
        """The list page: rows of the requested page, the total and the paging links."""
        where, live, now = q.filter(), self.live(), time.time()
        offset = (q.page - 1) * q.per
        if q.status == "orphaned":  # a derived status: filtered here, over the candidates
            candidates = self.store.query(where, order=q.sort, descending=q.dir == "desc",
                                          limit=None)
            matched = [r for r in candidates if shown_status(r, live) == "orphaned"]
            total, records = len(matched), matched[offset:offset + q.per]
        else:
            total = self.store.count(where).get(None, 0)
            records = self.store.query(where, order=q.sort, descending=q.dir == "desc",
                                       limit=q.per, offset=offset)
        rows = [self._row(r, live, now) for r in records]
        pages = max(1, -(-total // q.per))
        running = any(r.status in ("pending", "running", "orphaned") for r in rows)
        return {"rows": rows, "total": total, "query": q, "pages": pages,
                "first": offset + 1 if rows else 0, "last": offset + len(rows),
                "machines": self.machines(), "statuses": (*STATUSES, "orphaned"),
                "orders": ORDERS, "sizes": PAGE_SIZES, "running": running}

    def family(self, rec: InstanceRecord, live: set[str], now: float) -> dict[str, Any]:
        """``rec``'s relatives: ``children`` (its fan-outs' child instances, as list rows
        with their ``branch``), ``parent`` (the fan-out parent's id, or None), ``forks``
        (up to ``FORKS_SHOWN`` newest instances forked from it, as list rows) and
        ``forks_total``; its own lineage is ``rec.forked_from`` / ``rec.forked_at_seq`` and
        ``forked_by`` (the operator who made it, or None)."""
        kids = [(self._row(k, live, now), k.branch or "") for k in self.store.children(rec.id)]
        where = InstanceFilter(forked_from=rec.id)
        forks = self.store.query(where, limit=FORKS_SHOWN)
        total = len(forks) if len(forks) < FORKS_SHOWN else self.store.count(where).get(None, 0)
        return {"children": kids, "parent": rec.parent_id,
                "forks": [self._row(f, live, now) for f in forks], "forks_total": total,
                "forked_from": rec.forked_from, "forked_at_seq": rec.forked_at_seq,
                "forked_by": _name(rec.fork_options.get("by"))}

    def instance(self, instance_id: str) -> dict[str, Any]:
        """One instance: record, diagram, history, attempts, outbox rows and its family
        (``family``: fan-out children and parent, fork lineage)."""
        rec = self.store.get(instance_id)
        history = self.store.history(rec.id)
        attempts = self.store.attempts(rec.id)
        live, now = self.live(), time.time()
        rows = [_history_row(h, now) for h in history_json(rec, history)]
        export, note = self._export(rec, history, rec.state)
        svg, svg_error = _svg(export, instance_overlay(rec, history, attempts))
        status = shown_status(rec, live)
        return {"rec": rec, "row": self._row(rec, live, now), "status": status,
                "history": rows, "attempts": [asdict(a) | {"at_text": when(a.at, now),
                                                           "next_text": when(a.next_at, now)}
                                              for a in attempts],
                "outbox": [asdict(o) | {"updated_text": when(o.updated_at, now)}
                           for o in self.store.outbox(rec.id)],
                "context": _pretty(rec.context), "input": _pretty(rec.input),
                "svg": svg, "svg_error": svg_error, "diagram_note": note,
                "refresh": not rec.final and status != "orphaned",
                "family": self.family(rec, live, now), "tick": self._tick(rec, now),
                "open_reviews": [i.id for i in self.store.reviews(statuses=["open"],
                                                                  instance_id=rec.id)]}

    def schedules(self) -> dict[str, Any]:
        """The schedules page: each schedule with when it ticks, its next and last tick and
        the last tick's instance (``runtime.schedules``)."""
        now, rows = time.time(), []
        for r in self.store.schedules():
            rows.append({"name": r.name, "machine": r.machine,
                         "when": f"every {r.every_s:g}s" if r.every_s is not None
                         else f"cron {r.cron}", "tz": r.tz, "paused": r.paused,
                         "next_text": "paused" if r.paused else when(r.next_fire, now),
                         "last_text": when(r.last_fire, now), "last_instance": r.last_instance,
                         "overlap": r.overlap, "catchup": r.catchup, "skipped": r.skipped,
                         "missed": r.missed})
        return {"schedules": rows, "running": False}

    def _tick(self, rec: InstanceRecord, now: float) -> dict[str, Any] | None:
        """The schedule and tick that started ``rec`` (None: none did)."""
        found = started_by(self.store, rec.id)
        if found is None:
            return None
        row, tick = found
        return {"name": row.name, "tick_text": when(tick, now), "tick_iso": iso_time(tick)}

    def whole(self, instance_id: str) -> dict[str, Any]:
        """One instance with nothing cut: ``instance_json`` of the record plus
        ``history``, ``attempts`` and ``outbox`` rows (the page caps each value)."""
        rec = self.store.get(instance_id)
        return instance_json(rec) | {
            "history": [asdict(h) for h in self.store.history(rec.id)],
            "attempts": [asdict(a) for a in self.store.attempts(rec.id)],
            "outbox": [asdict(o) for o in self.store.outbox(rec.id)]}

    def machine(self, name: str, status: str = "") -> dict[str, Any]:
        """One machine: the aggregate diagram and the statistics behind it."""
        if status and status not in STATUSES:
            raise InvalidInput(f"unknown status {status!r}")
        where = InstanceFilter(machine=name, statuses=(status,) if status else None)
        figures, as_of = self._machine_stats(name, status, where)
        newest = self.store.query(InstanceFilter(machine=name), limit=1)
        if not newest:
            raise InvalidInput(f"no instances of machine {name!r}")
        rec = newest[0]
        if figures is None:
            return {"name": name, "stats": None, "svg": None, "svg_error": None,
                    "diagram_note": None, "status": status, "statuses": STATUSES,
                    "running": False, "as_of": when(as_of)}
        export, note = self._export(rec, _edge_rows(figures.edges))
        svg, svg_error = _svg(export, aggregate_overlay(figures))
        running = any(figures.by_status.get(s) for s in ("pending", "running"))
        return {"name": name, "stats": figures, "svg": svg, "svg_error": svg_error,
                "diagram_note": note, "status": status, "statuses": STATUSES,
                "running": running, "as_of": when(as_of)}

    def _machine_stats(self, name: str, status: str, where: InstanceFilter) -> tuple[Any, float]:
        """``machine_stats`` for one machine, computed at most every ``stats_ttl_s`` seconds
        per (machine, status) (a machine page over 100,000 instances takes seconds)."""
        from ..stats import machine_stats
        now = time.time()
        with self._lock:
            cached = self._stats.get((name, status))
        if cached is not None and now - cached[0] < self.stats_ttl_s:
            return cached[1], cached[0]
        figures = machine_stats(self.store, where).get(name)
        with self._lock:
            self._stats[(name, status)] = (now, figures)
            self._stats.move_to_end((name, status))
            while len(self._stats) > STATS_CACHE_MAX:
                self._stats.popitem(last=False)
        return figures, now

    # -- diagrams --------------------------------------------------------------------
    def _export(self, rec: InstanceRecord, history: Iterable[Any],
                current: str | None = None) -> tuple[dict[str, Any], str | None]:
        """The definition of ``rec``'s machine version as the store keeps it (note None),
        or one drawn from ``history`` with a note saying why; never imports anything."""
        try:
            row = self.store.get_definition(rec.machine, rec.machine_version, rec.fingerprint)
        except StoreError as exc:
            why = f"its stored definition is unreadable ({str(exc)[:200]})"
        else:
            if row is not None:
                return row.export, None
            why = (f"no definition of {rec.machine} v{rec.machine_version} is stored (it was "
                   "started before fsm_engine kept definitions, store format 11)")
        return observed_export(rec.machine, history, current), (
            f"{why}: drawn from the recorded history only; the viewer never imports "
            "machine code")


def observed_export(machine: str, history: Iterable[Any],
                    current: str | None = None) -> dict[str, Any]:
    """A definition-shaped export of the states and moves seen in ``history`` (rows or
    dicts with source, dest, trigger) and of the ``current`` state, for drawing when the
    module is gone."""
    states: dict[str, None] = {}
    moves: dict[tuple[str, str, str], None] = {}
    for row in history:
        get = row.get if isinstance(row, dict) else lambda k, r=row: getattr(r, k)
        if get("kind") in NOT_MOVES:
            continue  # a takeover or a migration, not a move
        src, dst, trig = str(get("source")), str(get("dest")), str(get("trigger"))
        states.update({src: None, dst: None})
        moves[(src, dst, trig)] = None
    if current is not None:
        states.setdefault(current, None)
    names = list(states) or ["?"]
    return {"name": machine, "initial": names[0],
            "states": [{"name": n} for n in names],
            "transitions": [{"source": s, "dest": d, "trigger": t} for s, d, t in moves]}


def _edge_rows(edges: Iterable[Any]) -> list[dict[str, Any]]:
    return [{"source": e.source, "dest": e.dest, "trigger": e.trigger} for e in edges]


def _svg(export: dict[str, Any], overlay: dict[str, Any]) -> tuple[str | None, str | None]:
    """Inline SVG (prolog, doctype and comments stripped) or the reason there is none."""
    try:
        source = to_dot(build_graph(export, overlay))
        svg = pipe(source, "svg").decode("utf-8")
    except (FsmError, OSError, ValueError, KeyError) as exc:
        return None, str(exc).splitlines()[0][:300]
    except Exception as exc:  # noqa: BLE001 - graphviz.CalledProcessError and kin
        return None, f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"
    return _COMMENT.sub("", _SVG_HEAD.sub("", svg, count=1)), None


def _name(value: Any) -> str | None:
    """A stored operator name as text (at most 200 characters), or None (none, or not a
    string: a stored value is not trusted to be one)."""
    return value[:200] if isinstance(value, str) and value else None


def _pretty(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, indent=2, sort_keys=False)


def _history_row(row: dict[str, Any], now: float) -> dict[str, Any]:
    found = row.get("detail")
    detail = details.as_object(found)
    raw = details.structured_outputs(found)
    if "raw" in detail:
        raw.append({"raw": detail.get("raw"), "errors": detail.get("errors"),
                    "repairs": detail.get("repairs")})
    pause = pause_note(row)  # a pause row's reason is no error: its note says who and why
    return row | ({"reason": None, "error": None} if pause else {}) | {
                  "at_text": when(row["at"], now), "at_iso": iso_time(row["at"]),
                  "guards_text": [guard_reading(str(g[0]), g[1] if len(g) > 1 else False)
                                  for g in row.get("guards") or ()],
                  "delta_text": _pretty(row["delta"]) if row["delta"] else "",
                  "detail_text": _pretty(found) if found else "", "outputs": raw,
                  "note": pause or recovery_note(detail) or agent_note(detail) or ""}


__all__ = ["Viewer", "ListQuery", "observed_export", "HistoryRow"]
