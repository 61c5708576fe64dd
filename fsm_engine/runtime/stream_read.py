"""The read side of streaming: one subscription to an instance's progress (``engine.stream``).

``events`` merges the instance's stream log (``store.streams``: attempts, chunks, ends,
errors, supersessions) with its committed history (steps, then the final status) into one
ordered sequence of ``StreamEvent``s.  Steps of one instance run one after another and a
step's log rows are written before it commits or with it, so the merge is deterministic: a
log row of step ``s`` comes after the committed steps before ``s`` and before step ``s``
itself (a step seen committed is delivered once the log read after it has no more rows).

A step whose short streamed calls left their rows to its history (``stream_inline``:
no stream write at all) is shown as the rows it holds, just before its ``step`` event —
the same events its log rows would have given, without positions of their own.

Positions: each log row has its ``offset`` (0, 1, 2 …, no gaps); every event carries a
``cursor`` ``"P:S"`` — the next log position and the last committed step delivered — from
which a reader resumes exactly (``from_offset``); ``"P:S:K"`` after the ``K``-th row a
step's history holds.  A bare offset ``P`` resumes the log at ``P`` and repeats the commit
of the step the log row ``P - 1`` belongs to (at least once).

Reading is pull: nothing is buffered for a subscriber beyond one batch of rows
(``BATCH``) and, of a JSON reply, the first ``PARTIAL_CHARS`` (``Subscription.held``), so a
subscriber that stops reading holds nothing up; a resume far into a long reply reads the
log before it batch by batch, giving the event loop a turn after each on a local store.
Waiting for new rows is ``Store.stream_wait`` on PostgreSQL (a NOTIFY, in a thread); on
SQLite a look every ``POLL_LOCAL_S`` on the event loop (reads of a local file are short: no
thread is held).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, Awaitable
from dataclasses import asdict, dataclass, field
from typing import Any

from ..errors import InvalidInput
from ..store import details
from ..store.records import FINAL_STATUSES, TOOL, HistoryRow
from ..store.streams import StreamRow
from . import stream_inline

__all__ = ["StreamEvent", "Subscription", "events", "parse_cursor", "after_final", "ended",
           "check_start",
           "BATCH"]

#: Most log rows read at once (a chunk row holds at most ``streams.ROW_CHARS`` characters
#: of text, so a subscription holds at most about 512 KiB of rows).
BATCH = 64
#: Seconds between two looks at a local store (SQLite) for new rows, and the longest wait
#: for a NOTIFY (PostgreSQL) before its history is looked at again.
POLL_LOCAL_S, WAIT_REMOTE_S = 0.01, 0.25


@dataclass(frozen=True, slots=True)
class StreamEvent:
    """One event of an instance's stream.

    ``kind``: a log row's (``open``, ``chunk``, ``end``, ``error``, ``superseded``), or
    ``step`` (a committed history row: ``source``, ``trigger``, ``dest``, ``step_kind``) or
    ``final`` (``status``).  ``seq``/``attempt``: the step and attempt (``step``: its seq;
    ``final``: the last seq).  ``offset``: a log row's position (others: the next one).
    ``text``/``char_offset``: a chunk's text and where it starts in the attempt's reply;
    ``partial``: for a chunk of a JSON reply, the object parsed from the reply so far
    (``None`` until one parses); ``by``: for ``superseded``, the ``(seq, attempt)``
    replacing it; ``info``: the row's other facts (``finish``, ``error``, ``json``; a
    ``step``'s: its ``reason``, or an agent tool call's ``call`` and ``result`` / ``error``,
    ``_tool_result``).  ``cursor``: resume here to get the events after this one.
    """

    kind: str
    seq: int
    attempt: int
    offset: int
    cursor: str
    text: str = ""
    char_offset: int = 0
    partial: Any = None
    by: tuple[int, int] | None = None
    source: str | None = None
    trigger: str | None = None
    dest: str | None = None
    step_kind: str | None = None
    status: str | None = None
    info: dict[str, Any] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        """The event as a JSON object (fields that do not apply to its kind left out)."""
        return {k: v for k, v in asdict(self).items()
                if v not in (None, "", {}) or k in ("kind", "seq", "offset")}


#: The largest number a cursor part may hold: a signed 64-bit integer, what both stores'
#: positions and seqs are (``OverflowError`` from sqlite3, a range error from PostgreSQL,
#: past it).
MAX_CURSOR = (1 << 63) - 1
#: Its digits: a longer part is refused before ``int`` reads it (CPython refuses strings of
#: over 4,300 digits with a ``ValueError`` of its own).
MAX_DIGITS = len(str(MAX_CURSOR))


def parse_cursor(value: int | str) -> tuple[int, int | None, int]:
    """``(position, last step delivered or None, inline rows of the next step delivered)``
    from an offset or a ``"P:S"`` / ``"P:S:K"`` cursor (``"P:S:0"``: the ``final``
    event's, ``after_final``); ``InvalidInput`` for anything else."""
    text = str(value).strip()
    parts = text.split(":")
    if len(parts) > 3 or not all(p.isascii() and p.isdigit() and len(p) <= MAX_DIGITS
                                 and int(p) <= MAX_CURSOR for p in parts):
        raise InvalidInput(f"bad stream offset {text[:40]!r}: expected N, N:S or N:S:K "
                           f"(integers from 0 to {MAX_CURSOR})")
    return (int(parts[0]), int(parts[1]) if len(parts) > 1 else None,
            int(parts[2]) if len(parts) > 2 else 0)


def after_final(value: int | str) -> bool:
    """True for the ``final`` event's cursor, ``"P:S:0"`` (a valid cursor): a resume from it
    gives nothing more while the instance stays final at step ``S`` with no row from
    ``P`` on (the viewer answers 204)."""
    parts = str(value).strip().split(":")
    return len(parts) == 3 and parts[2].isdigit() and int(parts[2]) == 0


def ended(store: Any, instance_id: str, cursor: int | str) -> bool:
    """True when a subscription from ``cursor`` would end with no event: it is the
    ``final`` event's (``after_final``) and the instance is still final at that step, with
    no log row from its position on."""
    if not after_final(cursor):
        return False
    pos, seq, _ = parse_cursor(cursor)
    rec = store.get(instance_id)
    return rec.status in FINAL_STATUSES and rec.seq <= (seq or 0) \
        and not store.stream_read(instance_id, pos, 1)


def check_start(store: Any, instance_id: str, pos: int) -> None:
    """``InvalidInput`` when log position ``pos`` is past the end of the instance's stream
    log (no row before it, none at or after it: a subscription there would miss the rows
    written next, at lower positions)."""
    if pos > 0 and not store.stream_read(instance_id, pos - 1, 1) \
            and not store.stream_read(instance_id, pos, 1):
        raise InvalidInput(f"stream offset {pos} is past the end of instance {instance_id}'s "
                           "stream log: start at 0, or resume from an event's cursor")


class _Merge:
    """The state of one subscription: where it is and what it has seen."""

    def __init__(self, store: Any, instance_id: str, pos: int, last_seq: int) -> None:
        self.store, self.instance_id = store, instance_id
        self.remote = bool(getattr(store, "remote", False))
        self.pos, self.last_seq = pos, last_seq
        self.json: set[tuple[int, int]] = set()
        self.texts: dict[tuple[int, int], str] = {}
        #: Attempts the log opened, by step: not superseded yet (``opened``), the highest.
        self.opened: dict[int, list[int]] = {}
        self.top: dict[int, int] = {}
        self.skip = 0  # inline rows of the next step already delivered (a ``P:S:K`` cursor)
        self.batch: list[StreamRow] = []  # the rows read last
        self.stopped = False  # ``Subscription.stop``

    async def start(self, from_offset: int | str) -> None:
        """Begin at ``from_offset``: the instance checked, the attempts before it learnt;
        with a bare offset, the commits from the step of the row before it on."""
        pos, after, self.skip = parse_cursor(from_offset)
        self.pos = pos
        await self.call(self.store.get, self.instance_id)  # InstanceNotFound
        if pos > 0:
            before = await self.call(self.store.stream_read, self.instance_id, pos - 1, 1)
            if not before:
                await self.call(check_start, self.store, self.instance_id, pos)
            if after is None:
                after = before[0].seq - 1 if before else 0
        self.last_seq = after or 0
        await self.resume()

    async def read(self, pos: int, limit: int) -> list[StreamRow]:
        """At most ``limit`` rows from ``pos``; on a local store, a turn of the event loop
        given to others after it (reads there are inline: a long log read batch after
        batch must not hold the loop)."""
        rows: list[StreamRow] = await self.call(self.store.stream_read, self.instance_id, pos,
                                                limit)
        if not self.remote and rows:
            await asyncio.sleep(0)
        return rows

    def held(self) -> int:
        """Characters of reply text held (``Subscription.held``)."""
        return sum(len(r.text) for r in self.batch) + sum(map(len, self.texts.values()))

    async def call(self, fn: Any, *args: Any) -> Any:
        """``fn(*args)``: in a thread for a remote store, inline for a local file (a short
        indexed read: the thread hand-off would cost more, and threads are few)."""
        if self.remote:
            return await asyncio.to_thread(fn, *args)
        return fn(*args)

    async def wait(self) -> None:
        """Until the log may have grown: a NOTIFY (remote store, in a thread, at most
        ``WAIT_REMOTE_S``), else ``POLL_LOCAL_S`` on the event loop."""
        if self.remote:
            await asyncio.to_thread(self.store.stream_wait, self.instance_id, WAIT_REMOTE_S)
        else:
            await asyncio.sleep(POLL_LOCAL_S)

    def cursor(self, inline: int = 0) -> str:
        return f"{self.pos}:{self.last_seq}:{inline}" if inline else f"{self.pos}:{self.last_seq}"

    def note(self, row: StreamRow) -> None:
        """Remember what a row says about its attempt (JSON or not, text so far, open or
        superseded)."""
        key = (row.seq, row.attempt)
        if row.kind == "open":
            if row.info.get("json"):
                self.json.add(key)
            self.opened.setdefault(row.seq, []).append(row.attempt)
            self.top[row.seq] = max(self.top.get(row.seq, 0), row.attempt)
        elif row.kind == "chunk" and key in self.json:  # (its partial object: at most
            if row.offset + len(row.text) <= PARTIAL_CHARS:  # ``PARTIAL_CHARS`` kept)
                self.texts[key] = self.texts.get(key, "") + row.text
            else:
                self.texts.pop(key, None)
        elif row.kind == "superseded" and row.attempt in self.opened.get(row.seq, ()):
            self.opened[row.seq].remove(row.attempt)

    def event(self, row: StreamRow, inline: int = 0) -> StreamEvent:
        """The event of ``row``: a log row's, or the ``inline``-th row a step's history
        holds (``stream_inline``: no position of its own)."""
        self.note(row)
        if not inline:
            self.pos = row.pos + 1
        key = (row.seq, row.attempt)
        by = row.info.get("by")  # [seq, attempt] or none (store.streams.StreamInfo)
        return StreamEvent(row.kind, row.seq, row.attempt, row.pos if not inline else self.pos,
                           self.cursor(inline), row.text, row.offset,
                           _partial(self.texts.get(key)) if row.kind == "chunk"
                           and key in self.json else None,
                           (by[0], by[1]) if by else None,
                           info={k: v for k, v in row.info.items() if k != "by"})

    def step(self, h: HistoryRow) -> list[StreamEvent]:
        """The events of committed step ``h``: the rows its history holds, then its own."""
        out = []
        held = stream_inline.rows(h, sorted(self.opened.get(h.seq, ())), self.top.get(h.seq, 0))
        for n, row in enumerate(held, 1):
            if n > self.skip:
                out.append(self.event(row, n))
            else:  # (delivered before the cursor: only learnt)
                self.note(row)
        self.skip, self.last_seq = 0, h.seq
        for seq in [s for s in self.top if s <= h.seq]:  # (done with: what it holds is read)
            self.opened.pop(seq, None)
            del self.top[seq]
        for key in [k for k in self.texts if k[0] <= h.seq]:
            del self.texts[key]
        out.append(StreamEvent("step", h.seq, 0, self.pos, self.cursor(), source=h.source,
                               trigger=h.trigger, dest=h.dest, step_kind=h.kind,
                               info=_tool_result(h) if h.kind == TOOL
                               else {"reason": h.reason} if h.reason else {}))
        return out

    async def steps(self, through: int | None = None) -> list[StreamEvent]:
        """Events of the committed steps after ``last_seq`` (up to ``through``)."""
        rows = await self.call(self.store.history, self.instance_id)
        return [ev for h in rows if h.seq > self.last_seq and (through is None or h.seq <= through)
                for ev in self.step(h)]

    async def committed(self, rec: Any) -> list[StreamEvent] | None:
        """Events of ``rec``'s steps committed after ``last_seq`` (up to its ``seq``), or
        None when the log has rows after ``pos``: written with those steps or before them,
        they come first."""
        if rec.seq <= self.last_seq:
            return []
        if await self.call(self.store.stream_read, self.instance_id, self.pos, 1):
            return None
        return await self.steps(rec.seq)

    async def after(self, rec: Any, start: tuple[int, int] | None) -> list[StreamEvent] | None:
        """After the events of ``rec`` (the instance as read last): None to go on (it is
        not final: waited for new rows; or rows came meanwhile), else the events to end
        with — its ``final`` event (cursor ``P:S:0``), or none when the subscription
        began at that very cursor (``start``: where a ``P:S:0`` cursor began it) and
        nothing came since."""
        if rec.status not in FINAL_STATUSES:
            await self.wait()
            return None
        if await self.call(self.store.stream_read, self.instance_id, self.pos, 1):
            return None
        if start == (self.pos, self.last_seq):
            return []
        return [StreamEvent("final", rec.seq, 0, self.pos, f"{self.cursor()}:0",
                            status=rec.status)]

    async def resume(self) -> None:
        """Learn the attempts begun before ``pos`` (JSON or not, text so far)."""
        seen = 0
        while seen < self.pos:
            rows = self.batch = await self.read(seen, min(BATCH, self.pos - seen))
            if not rows:
                return
            for row in rows:
                self.note(row)
            seen = rows[-1].pos + 1


#: Most characters of an agent tool call's result (its JSON) a ``step`` event carries.
RESULT_CHARS = 300


def _tool_result(h: HistoryRow) -> dict[str, Any]:
    """What the ``step`` event of an agent's tool-call row (kind ``tool``, ``agent:
    "call"``) says of it: ``call`` (its id) and its ``result`` (JSON, at most
    ``RESULT_CHARS`` characters) or ``error``; ``{}`` for the agent's other rows."""
    d = details.as_object(h.detail)  # (each field shown through str() or json.dumps)
    if d.get("agent") != "call":
        return {}
    out: dict[str, Any] = {"call": str(d.get("call"))[:40]}
    if "error" in d:
        out["error"] = str(d["error"])[:RESULT_CHARS]
    else:
        out["result"] = json.dumps(d.get("result"), ensure_ascii=False,
                                   default=str)[:RESULT_CHARS]
    return out


#: Longest reply (characters) whose partial object is parsed at each chunk (each parse
#: reads the reply so far: past this, chunks carry no partial object).
PARTIAL_CHARS = 65_536


def _partial(text: str | None) -> Any:
    """The JSON value ``text`` starts (``pydantic_core``'s partial parsing), or None (none
    yet, not JSON, or longer than ``PARTIAL_CHARS``)."""
    if not text or len(text) > PARTIAL_CHARS:
        return None
    from pydantic_core import from_json
    try:
        return from_json(text, allow_inf_nan=False, allow_partial=True)
    except ValueError:
        return None


class Subscription:
    """What ``events`` returns: an async iterator of ``StreamEvent``s (``aclose`` ends it).
    ``held``: the characters of reply text it holds now — the rows of one batch (at most
    ``BATCH`` rows of ``ROW_CHARS``) and, per JSON attempt not done with, its reply so far
    while that is at most ``PARTIAL_CHARS`` (what the partial object is parsed from) —
    however long the reply or far the resume."""

    __slots__ = ("_merge", "_events", "stopped")

    def __init__(self, store: Any, instance_id: str, from_offset: int | str) -> None:
        self._merge: _Merge | None = None
        self.stopped = False
        self._events = self._run(store, instance_id, from_offset)

    def __aiter__(self) -> Subscription:
        return self

    def __anext__(self) -> Awaitable[StreamEvent]:
        return self._events.__anext__()

    async def aclose(self) -> None:
        await self._events.aclose()

    def stop(self) -> None:
        """End the events at the next read of rows (within ``WAIT_REMOTE_S``): no ``final``
        event (the viewer shutting down; a client resumes from its last cursor)."""
        self.stopped = True
        if self._merge is not None:
            self._merge.stopped = True

    @property
    def held(self) -> int:
        merge = self._merge
        return 0 if merge is None else merge.held()

    async def _run(self, store: Any, instance_id: str, from_offset: int | str
                   ) -> AsyncGenerator[StreamEvent, None]:
        merge = _Merge(store, instance_id, 0, 0)
        self._merge, merge.stopped = merge, self.stopped
        await merge.start(from_offset)
        start = (merge.pos, merge.last_seq) if after_final(from_offset) else None
        while not merge.stopped:
            rows = merge.batch = await merge.read(merge.pos, BATCH)
            for row in rows:
                if row.seq - 1 > merge.last_seq:
                    for ev in await merge.steps(row.seq - 1):
                        yield ev
                yield merge.event(row)
            if rows:
                continue
            rec = await merge.call(store.get, instance_id)
            done = await merge.committed(rec)
            if done is None:
                continue
            for ev in done:
                yield ev
            last = await merge.after(rec, start)
            if last is not None:
                for ev in last:
                    yield ev
                return


def events(store: Any, instance_id: str, from_offset: int | str = 0) -> Subscription:
    """The instance's events from ``from_offset`` (an offset or a cursor) until it is final:
    log rows and committed steps in order, then one ``final`` event (a ``Subscription``).
    Raises ``InstanceNotFound`` for an unknown id and ``InvalidInput`` for a bad offset,
    at the first ``__anext__``, before any event; ``StoreError`` for a malformed row, when
    it comes."""
    return Subscription(store, instance_id, from_offset)


