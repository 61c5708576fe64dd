"""A short streamed call kept in its step's history row instead of the stream log.

A streamed call that ends before its first batch (``streams.FLUSH_S``) was seen by no
reader: all its rows would ride its step's commit (``StepCommit.stream``).  When every
streamed call a step holds ended that way, cleanly (an ``end``, no error), and the step
supersedes no attempt of an earlier step (no takeover since the last commit), the commit
writes no stream rows at all: each call's ``detail.llm_calls`` entry, which holds the whole
reply anyway (``reply``, ``finish_reason``), is marked ``"stream": {"json": bool}``
(``mark``), and a reader (``runtime.stream_read``) shows it as the rows it stands for
(``rows``), at the step's place in the merge, just before its ``step`` event: a
``superseded`` row for each attempt of the step still open, then ``open``, ``chunk``
(at most ``store.streams.ROW_CHARS`` characters each), ``end`` — what the log would have held,
numbered after the attempts the log has for that step.  Such rows have no log position
(``pos`` -1): a reader's cursor counts them (``P:S:K``).  A step the store refuses writes
them to the log with its failure (``ops``).  Unwatched, a short streamed call so costs no
stream write: one SELECT and one INSERT less in its step's transaction (``bench/stream.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from ..store import details
from ..store.records import HistoryRow, StepCommit
from ..store.streams import ROW_CHARS, StreamOp, StreamRow

__all__ = ["MARK", "mark", "entries", "rows", "ops"]

#: The ``llm_calls`` entry key marking a streamed call whose rows are the entry itself.
MARK: Final = "stream"


def mark(entry: dict[str, Any], json: bool) -> None:
    """Mark ``entry`` (an ``llm_calls`` entry holding ``reply``) as its call's stream rows."""
    entry[MARK] = {"json": json}


def entries(h: HistoryRow) -> list[details.LlmCall]:
    """The marked ``llm_calls`` entries of ``h``, in call order (``[]``: none)."""
    return [e for e in details.llm_calls(h.detail) if MARK in e]


def _body(instance_id: str, seq: int, attempt: int, entry: details.LlmCall,
          at: float) -> list[StreamRow]:
    """The rows of attempt ``attempt`` after its ``open``: the reply's chunks (at most
    ``ROW_CHARS`` characters each), then its ``end``."""
    text = entry.get("reply") or ""
    out = [StreamRow(instance_id, seq, attempt, "chunk", text[n:n + ROW_CHARS], n, {}, at)
           for n in range(0, len(text), ROW_CHARS)]
    out.append(StreamRow(instance_id, seq, attempt, "end", at=at,
                         info={"finish": entry.get("finish_reason"), "chars": len(text)}))
    return out


def _info(entry: details.LlmCall) -> dict[str, Any]:
    """The ``open`` row's ``info`` of the call ``entry`` stands for."""
    return {"json": True} if (entry.get(MARK) or {}).get("json") else {}


def rows(h: HistoryRow, opened: Sequence[int], top: int) -> list[StreamRow]:
    """The rows ``h``'s marked entries stand for (``pos`` -1), given the attempts of step
    ``h.seq`` the log has that are not superseded (``opened``, ascending) and its highest
    attempt (``top``; 0: none)."""
    out: list[StreamRow] = []
    still = list(opened)
    for entry in entries(h):
        top += 1
        by = {"by": [h.seq, top]}
        out += [StreamRow(h.instance_id, h.seq, a, "superseded", info=by, at=h.at) for a in still]
        out.append(StreamRow(h.instance_id, h.seq, top, "open", info=_info(entry), at=h.at))
        out += _body(h.instance_id, h.seq, top, entry, h.at)
        still = [top]
    return out


def ops(step: StepCommit) -> tuple[StreamOp, ...]:
    """``step``'s marked entries as stream-log writes, for a commit that will not hold its
    history (its ``store_rejected`` failure): one opening op per call (the store numbers
    the attempts and supersedes); ``()``: none."""
    return tuple(StreamOp(h.instance_id, tuple(_body(h.instance_id, h.seq, 0, entry, h.at)),
                          True, h.seq, h.seq, _info(entry), h.at)
                 for h in step.history for entry in entries(h))
