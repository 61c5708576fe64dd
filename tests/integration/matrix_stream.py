"""The streaming rows of the intersection matrix: the scripted streamed replies, and the
invariants ``matrix_check`` adds for them, asserted through the public reader
(``fsm_engine.runtime.stream_read.events``) and the history only.

The ``work`` step of ``stream_short`` and ``stream_long`` (``matrix_machines``) streams one
model call, and each model turn of the agent ``agent_stream`` one (several batches long,
``AGENT``; issue 36): ``SHORT`` ends within the batcher's ``FLUSH_S`` (its rows ride the step's own
commit, or its history holds them: ``stream_inline``), ``LONG`` has ``LONG_DELAY_S``
between pieces (several batches are written before the commit, so a crash can come
mid-stream).

``check(store, records, histories)``, for each final instance of those machines:

1. the reader's log events have offsets 0, 1, 2 … (no gap, none twice), every event's
   cursor is the position after it (``P:S:K`` after the K-th row a step's history holds,
   ``stream_inline``), and each committed step comes once, in order;
2. each attempt opens once, its chunks follow one another (``char_offset`` = the text so
   far) and nothing of it comes after it is superseded; a superseded attempt names one
   opened after it;
3. an attempt that looks complete (an ``end``) is: the whole scripted reply (of one of the
   agent's turns, for ``agent_stream``), ``chars`` its length; one left without ``end`` or
   ``error`` (a crash mid-stream) is superseded;
4. the attempt of each committed ``work`` step or agent turn (its seq, the last attempt)
   ended, is not superseded, and its text is the reply the history keeps
   (``detail.llm_calls``), the scripted one;
5. resuming from a cursor (the first events', each ``superseded``'s, a middle one's, the
   last before ``final``) yields exactly the events after it.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import matrix_agent

from fsm_engine.runtime.stream_read import StreamEvent, events, parse_cursor
from fsm_engine.store import FINAL_STATUSES

#: ``matrix_machines.STREAM_PROMPTS`` (workers load that file without ``tests/`` on the path).
PROMPTS = {"stream_short": "Matrix stream: short", "stream_long": "Matrix stream: long"}
SHORT = ["Short ", "and ", "quick."]
LONG = [f"piece {n}; " for n in range(8)]
#: Seconds between two pieces of ``LONG`` (the batcher writes every ``FLUSH_S`` = 0.02 s).
LONG_DELAY_S = 0.05
REPLIES = {"stream_short": "".join(SHORT), "stream_long": "".join(LONG)}

#: The agent whose turns stream several batches long (``matrix_machines.agent_stream``,
#: issue 36): ``matrix_agent.SCRIPT``'s turns, keyed on its instances' input too, in pieces
#: of ``TURN_PIECE`` characters ``LONG_DELAY_S`` apart.
AGENT = "agent_stream"
TURN_PIECE = 8


def _said(line: dict[str, Any]) -> str:
    """A scripted line's reply text (a ``tool_calls`` line's as ``Scripted`` serves it)."""
    return line.get("text") or json.dumps({"tool_calls": line["tool_calls"]},
                                          ensure_ascii=False)


_TURNS = [line for line in matrix_agent.SCRIPT if "match" in line]
#: Every reply a turn of ``AGENT`` may keep.
TURN_REPLIES = frozenset(_said(line) for line in _TURNS)

#: The scripted replies (keyed: they go before ``matrix_agent.SCRIPT``'s catch-all line).
SCRIPT: list[dict[str, Any]] = [
    {"match": PROMPTS["stream_short"], "chunks": SHORT},
    {"match": PROMPTS["stream_long"], "chunks": LONG, "chunk_delay_s": LONG_DELAY_S},
    *({"match": line["match"], "input": AGENT, "chunk_delay_s": LONG_DELAY_S,
       "chunks": [_said(line)[n:n + TURN_PIECE] for n in range(0, len(_said(line)), TURN_PIECE)]}
      for line in _TURNS),
]

_LOG = frozenset({"open", "chunk", "end", "error", "superseded"})
_STEPS = frozenset({"transition", "fallback", "skip"})
#: Longest a read of one final instance's events may take (seconds): a reader that hangs
#: is a finding, not a hung cell.
READ_S = 60.0


@dataclass
class _Attempt:
    opened: int | None = None  # its open event's offset
    text: str = ""
    end: dict[str, Any] | None = None
    error: bool = False
    by: tuple[int, int] | None = None
    by_at: int = -1
    late: list[str] = field(default_factory=list)  # what came after its superseded


def check(store: Any, records: Sequence[Any], histories: dict[str, list[Any]]) -> list[str]:
    """Every violation of the five streaming invariants (see the module docstring)."""
    problems: list[str] = []
    for rec in records:
        if (rec.machine in REPLIES or rec.machine == AGENT) and rec.status in FINAL_STATUSES:
            problems += asyncio.run(_instance(store, rec, histories[rec.id]))
    return problems


async def _read(store: Any, iid: str, cursor: int | str = 0) -> list[StreamEvent]:
    async def go() -> list[StreamEvent]:
        return [ev async for ev in events(store, iid, cursor)]
    return await asyncio.wait_for(go(), READ_S)


async def _instance(store: Any, rec: Any, rows: list[Any]) -> list[str]:
    try:
        evs = await _read(store, rec.id)
    except TimeoutError:
        return [f"{rec.id}: the reader did not reach final in {READ_S} s"]
    attempts, problems = _attempts(rec.id, evs)
    problems += _positions(rec.id, evs, rows)
    replies = TURN_REPLIES if rec.machine == AGENT else frozenset({REPLIES[rec.machine]})
    problems += _complete(rec.id, attempts, replies)
    problems += _committed(rec.id, attempts, rows, replies)
    return problems + await _resumes(store, rec.id, evs)


def _positions(iid: str, evs: list[StreamEvent], rows: list[Any]) -> list[str]:
    """Log rows at offsets 0, 1, 2 …, each cursor the position after its event; rows a
    step's history holds (``stream_inline``: no position, cursor ``P:S:K``) counted 1, 2 …
    before that step's event; each committed step once, in order; one final, last."""
    problems, logged, inline = [], [], 0
    for e in evs:
        pos, _, k = parse_cursor(e.cursor)
        held = e.kind in _LOG and k > 0
        if e.kind in _LOG and not held:
            logged.append(e.offset)
        inline = inline + 1 if held else 0
        if pos != (e.offset + 1 if e.kind in _LOG and not held else e.offset) or k != inline:
            problems.append(f"{iid}: {e.kind} at offset {e.offset} has cursor {e.cursor}")
    if logged != list(range(len(logged))):
        problems.append(f"{iid}: log offsets {logged}, not 0..{len(logged) - 1}")
    steps = [e.seq for e in evs if e.kind == "step"]
    if steps != [h.seq for h in rows]:
        problems.append(f"{iid}: step events {steps}, history seqs {[h.seq for h in rows]}")
    if not evs or evs[-1].kind != "final" or [e.kind for e in evs].count("final") != 1:
        problems.append(f"{iid}: events end {[e.kind for e in evs[-3:]]}, not one final")
    return problems


def _attempts(iid: str, evs: list[StreamEvent]) -> tuple[dict[tuple[int, int], _Attempt],
                                                         list[str]]:
    """Each attempt the reader shows, built from its events; what is out of order."""
    seen: dict[tuple[int, int], _Attempt] = {}
    problems: list[str] = []
    for e in (e for e in evs if e.kind in _LOG):
        key = (e.seq, e.attempt)
        problems += [f"{iid}: attempt {key}: {p}" for p in _add(seen.setdefault(key, _Attempt()), e)]
    for key, a in seen.items():
        if a.late:
            problems.append(f"{iid}: attempt {key} superseded at {a.by_at} by {a.by}, then "
                            f"{a.late}")
        opened = seen[a.by].opened if a.by in seen else None
        if a.by is not None and (opened is None or opened < a.by_at):
            problems.append(f"{iid}: attempt {key} superseded by {a.by}, not opened after it")
    return seen, problems


def _add(a: _Attempt, e: StreamEvent) -> list[str]:
    """Add log event ``e`` to its attempt ``a``; what is out of order."""
    if a.by is not None:
        a.late.append(f"{e.kind}@{e.offset}")
    if e.kind == "open":
        twice, a.opened = a.opened is not None, e.offset
        return ["opened twice"] if twice else []
    problems = [f"{e.kind} at {e.offset} before its open"] if a.opened is None else []
    if e.kind == "chunk":
        if e.char_offset != len(a.text):
            problems.append(f"chunk at char {e.char_offset}, {len(a.text)} chars before it")
        a.text += e.text
    elif e.kind == "end":
        a.end = e.info
    elif e.kind == "error":
        a.error = True
    else:  # superseded
        a.by, a.by_at = e.by, e.offset
    return problems


def _complete(iid: str, attempts: dict[tuple[int, int], _Attempt],
              replies: frozenset[str]) -> list[str]:
    problems = []
    for key, a in attempts.items():
        if a.end is not None and (a.text not in replies or a.end.get("chars") != len(a.text)):
            problems.append(f"{iid}: attempt {key} looks complete (end {a.end}) with "
                            f"{a.text!r}, the reply is one of {sorted(replies)!r}")
        if a.end is None and not a.error and a.by is None:
            problems.append(f"{iid}: attempt {key} left open ({a.text!r}), never superseded")
    return problems


def _committed(iid: str, attempts: dict[tuple[int, int], _Attempt], rows: list[Any],
               replies: frozenset[str]) -> list[str]:
    problems = []
    for row in rows:
        if not _model_step(row):
            continue
        calls = row.detail.get("llm_calls") or [{}]
        said = calls[-1].get("reply")
        mine = sorted(k for k in attempts if k[0] == row.seq)
        if said not in replies:
            problems.append(f"{iid}: step seq {row.seq} keeps reply {said!r}, not one of "
                            f"{sorted(replies)!r}")
        if not mine:
            problems.append(f"{iid}: step seq {row.seq} committed, the reader shows no "
                            "attempt of it")
            continue
        last = attempts[mine[-1]]
        if last.end is None or last.by is not None or last.text != said:
            problems.append(f"{iid}: step seq {row.seq}'s last attempt {mine[-1]} (end "
                            f"{last.end}, superseded by {last.by}) streamed {last.text!r}, "
                            f"the history keeps {said!r}")
    return problems


def _model_step(row: Any) -> bool:
    """True for a committed step that made the streamed call: ``work``'s, or an agent's
    model turn (a ``tool`` row of ``agent: "turn"``, or the final turn's transition)."""
    if row.source == "work":
        return row.kind in _STEPS
    return row.source == "research" and bool(row.detail.get("llm_calls")) and (
        row.kind in _STEPS or row.detail.get("agent") == "turn")


async def _resumes(store: Any, iid: str, evs: list[StreamEvent]) -> list[str]:
    """Resume from a few cursors: each must give exactly the events after it."""
    picks = {0, 1, len(evs) // 2, len(evs) - 2}
    picks |= {n for n, e in enumerate(evs) if e.kind in ("superseded", "step")}
    problems = []
    for n in sorted(p for p in picks if 0 <= p < len(evs) - 1):
        again = await _read(store, iid, evs[n].cursor)
        if again != evs[n + 1:]:
            problems.append(f"{iid}: from cursor {evs[n].cursor} ({evs[n].kind}) the reader "
                            f"gives {[(e.kind, e.offset) for e in again][:8]}, not "
                            f"{[(e.kind, e.offset) for e in evs[n + 1:]][:8]}")
    return problems
