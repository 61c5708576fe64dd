"""Rate limits as a sliding window of admitted calls: the pure part of ``Store.rate_acquire``.

Each limit ``name`` (a provider + model) has rows in ``rate_calls``: one per call
admitted, holding its tokens and ``until``, when it stops counting (while the call
runs: its admission + ``window_s`` + ``hold_s``; once it ended: its end +
``window_s``, with the tokens the provider billed).  A call is admitted when the
rows still counting, plus it, stay within the limits; the check and the insert
happen in one transaction serialised per ``name`` (an advisory lock on
PostgreSQL, the write lock on SQLite), so workers on many hosts share the limit.
Times are the callers' clocks (epoch seconds), as for leases.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

#: Statements (``?`` placeholders) each backend runs inside its transaction.
EXPIRE = "DELETE FROM rate_calls WHERE name = ? AND until <= ?"
LIVE = "SELECT until, tokens FROM rate_calls WHERE name = ?"
ADMIT = "INSERT INTO rate_calls(name, key, at, until, tokens) VALUES (?, ?, ?, ?, ?)"
SETTLE = "UPDATE rate_calls SET tokens = ?, until = ? WHERE name = ? AND key = ?"

@dataclass(frozen=True, slots=True)
class RateRequest:
    """One call asking a limit for room.

    Args:
        name: the limit (``"provider:model"``).
        key: this call's id (unique; ``rate_settle`` names it).
        now: the caller's clock, epoch seconds.
        tokens: the tokens the call may take (prompt + ``max_tokens``).
        rpm / tpm: most calls / tokens per window (``None``: no limit).
        window_s / hold_s: see ``fsm_engine.policies.RateLimit``.
    """

    name: str
    key: str
    now: float
    tokens: int
    rpm: int | None
    tpm: int | None
    window_s: float
    hold_s: float


def room_in(live: Sequence[tuple[float, int]], req: RateRequest) -> tuple[float, str]:
    """``(0.0, "")`` when ``req`` fits beside the ``live`` (until, tokens) rows, else
    (seconds until it fits, which limit is full: ``"requests"`` or ``"tokens"``)."""
    calls, tokens = len(live), sum(t for _, t in live)

    def full(calls: int, tokens: int) -> str:
        if req.rpm is not None and calls + 1 > req.rpm:
            return "requests"
        if req.tpm is not None and tokens + req.tokens > req.tpm:
            return "tokens"
        return ""
    what = full(calls, tokens)
    if not what:
        return 0.0, ""
    # a call still running (``until`` past a window from now) counts at least until a
    # window after now, the earliest it could end plus its window: retry then
    horizon = req.now + req.window_s
    for until, used in sorted((min(until, horizon), used) for until, used in live):
        calls, tokens = calls - 1, tokens - used
        if not full(calls, tokens):
            return max(0.001, until - req.now), what
    return max(0.001, req.window_s), what  # (a call bigger than the limit: refused earlier)


def acquire(req: RateRequest, execute: Callable[[str, Sequence[Any]], Sequence[Any]]) -> tuple[float, str]:
    """Expire, check and admit in the caller's (serialised) transaction; what
    ``Store.rate_acquire`` returns.  ``execute(sql, args)`` returns the rows read."""
    execute(EXPIRE, [req.name, req.now])
    live = [(float(r[0]), int(r[1])) for r in execute(LIVE, [req.name])]
    wait, what = room_in(live, req)
    if wait == 0.0:
        execute(ADMIT, [req.name, req.key, req.now, req.now + req.window_s + req.hold_s,
                        req.tokens])
    return wait, what
