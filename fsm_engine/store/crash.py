"""Crash points for fault-injection tests: a process stops itself at a chosen store write.

``FSM_CRASH_AT=METHOD:WHEN:N[:LABEL[:SIGNAL]]`` (read when a store is opened by
``open_store``; unset, nothing is wrapped and nothing is paid) makes the process send
itself ``SIGNAL`` (``kill``: SIGKILL, the default; ``stop``: SIGSTOP, so a test can
take its work over, restart the database, then SIGCONT it) at the ``N``-th call
(1-based, counted in this process) of the store's ``METHOD`` (``commit``, ``create``,
``claim``, ``outbox_begins``, ``stream_write``) whose labels include ``LABEL`` (any call when omitted),
``before`` the call (nothing of it written) or ``after`` it returned (written, nothing
done with the result). A commit's labels are, per step, each history row's ``kind``
(``transition``, ``join``, ``review``, ``rerun``, ``migration``, ``recovery`` …) and
``src=STATE``, plus ``create`` (it inserts a fan-out's children), ``child`` (the
instance has a parent), ``wake``, ``outbox`` (it marks a delivery done), ``final`` and,
for an agent state's journal rows (kind ``tool``), ``agent=turn``, ``agent=call``,
``agent=ask`` or ``agent=decision``;
a ``create``'s are ``fork`` for a forked record, else ``start``; a ``stream_write``'s (a
batch of streamed rows, ``runtime.streams.Batcher``) are ``open`` when it begins an attempt
and the kinds of the rows it appends (``chunk``, ``end``, ``error``); a ``claim``'s and an
``outbox_begins``' are their method's name. A malformed value raises ``ValueError``
when the store is opened.
"""

from __future__ import annotations

import functools
import os
import signal
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

#: The environment variable holding the crash point.
ENV = "FSM_CRASH_AT"
_METHODS = ("commit", "create", "claim", "outbox_begins", "stream_write")
_SIGNALS = {"kill": signal.SIGKILL, "stop": signal.SIGSTOP}


@dataclass
class CrashPoint:
    """One parsed ``FSM_CRASH_AT``; ``seen`` counts the matching calls so far."""

    method: str
    when: str
    n: int
    label: str | None
    signal: int
    seen: int = 0

    @classmethod
    def parse(cls, spec: str) -> CrashPoint:
        """``METHOD:WHEN:N[:LABEL[:SIGNAL]]`` -> a ``CrashPoint``; ``ValueError`` if bad."""
        parts = spec.split(":")
        if len(parts) < 3 or parts[0] not in _METHODS or parts[1] not in ("before", "after") \
                or not parts[2].isdigit() or int(parts[2]) < 1:
            raise ValueError(f"{ENV}={spec!r}: want METHOD:before|after:N[:LABEL[:kill|stop]]"
                             f" with METHOD one of {', '.join(_METHODS)}")
        sig = parts[4] if len(parts) > 4 else "kill"
        if sig not in _SIGNALS:
            raise ValueError(f"{ENV}={spec!r}: the signal is kill or stop, not {sig!r}")
        return cls(parts[0], parts[1], int(parts[2]), parts[3] or None if len(parts) > 3
                   else None, _SIGNALS[sig])

    def hit(self, labels: set[str]) -> bool:
        """Count a call with ``labels``; True when it is the one to crash at."""
        if self.label is not None and self.label not in labels:
            return False
        self.seen += 1
        return self.seen == self.n


def _step_labels(step: Any) -> set[str]:
    labels = {row.kind for row in step.history} | {f"src={row.source}" for row in step.history}
    labels |= {f"agent={row.detail['agent']}" for row in step.history
               if row.kind == "tool" and "agent" in row.detail}
    flags = {"create": bool(step.create), "child": bool(step.record.parent_id),
             "wake": bool(step.wake), "outbox": bool(step.outbox_done),
             "final": step.record.status in ("completed", "failed", "cancelled")}
    return labels | {name for name, on in flags.items() if on}


def labels(method: str, args: Sequence[Any]) -> set[str]:
    """The labels of one call of the store's ``method`` with positional ``args``."""
    if method == "commit":
        return set().union(*(_step_labels(s) for s in args[0])) if args[0] else set()
    if method == "create":
        return {"fork" if getattr(r, "forked_from", None) else "start" for r in args}
    if method == "stream_write":
        return {row.kind for op in args[0] for row in op.rows} | (
            {"open"} if any(op.open for op in args[0]) else set())
    return {method}


def _wrap(point: CrashPoint, call: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(call)
    def crashing(*args: Any, **kwargs: Any) -> Any:
        fire = point.hit(labels(point.method, args))
        if fire and point.when == "before":
            os.kill(os.getpid(), point.signal)
        result = call(*args, **kwargs)
        if fire and point.when == "after":
            os.kill(os.getpid(), point.signal)
        return result
    return crashing


def arm(store: Any) -> Any:
    """``store``, its ``FSM_CRASH_AT`` method wrapped when that variable is set."""
    spec = os.environ.get(ENV)
    if spec:
        point = CrashPoint.parse(spec)
        setattr(store, point.method, _wrap(point, getattr(store, point.method)))
    return store
