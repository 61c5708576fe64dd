"""Shared fixtures of the store contract: records, history rows, leases, a small fleet.

The contract's mixins (``contract*.py``) import these; ``contract.py`` re-exports them
for third-party backends' own tests.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any, cast

from ..store import AttemptRow, HistoryRow, InstanceRecord, StepCommit, Store, WorkerRow
from ..store.records import Status

__all__ = ["UNICODE", "record", "moved", "hist", "live", "attempt", "concurrently", "fleet"]


UNICODE = {"text": "审核 中 — naïve café ☃ 🚀 \u202e", "nested": {"ключ": ["é", 1, None, True, 2.5]},
           "quote": 'say "hi"\n\ttab'}


def record(iid: str, *, machine: str = "m", status: Status = "pending", owner: str | None = None,
           state: str = "start", at: float = 1000.0) -> InstanceRecord:
    """A new instance record as ``Engine.start`` would create it."""
    return InstanceRecord(
        id=iid, machine=machine, module="/x/m.py", fingerprint="0123456789abcdef", state=state,
        status=status, context={"n": 0, "s": "x"}, input={"n": 0, "s": "x"},
        max_transitions=10, token_budget=500, created_at=at, updated_at=at, owner=owner,
        visits={state: 1})


def moved(rec: InstanceRecord, dest: str, *, tokens: int = 0, **changes: Any) -> InstanceRecord:
    """``rec`` after one transition to ``dest``."""
    visits = dict(rec.visits)
    visits[dest] = visits.get(dest, 0) + 1
    status = cast(Status, changes.pop("status", "running"))
    return replace(rec, state=dest, status=status, seq=rec.seq + 1,
                   loop_count=rec.loop_count + 1, tokens_used=rec.tokens_used + tokens,
                   updated_at=rec.updated_at + 1, visits=visits, **changes)


def hist(iid: str, seq: int, source: str, dest: str, **kw: object) -> HistoryRow:
    return HistoryRow(instance_id=iid, seq=seq, source=source, dest=dest, trigger=f"t{seq}",
                      at=1000.0 + seq, **kw)  # type: ignore[arg-type]


def live(store: Store, *ids: str, until: float = 1e12) -> None:
    """Register workers ``ids`` whose leases hold until ``until`` (epoch seconds)."""
    for wid in ids:
        store.put_worker(WorkerRow(wid, "h", 1, "1", 0.0, 0.0, lease_until=until))


def attempt(iid: str, n: int = 1) -> AttemptRow:
    return AttemptRow(instance_id=iid, state="start", visit=1, attempt=n,
                      error_class="ServerError", error="HTTP 502", tokens=7, next_at=1002.0,
                      at=1001.0 + n)


# -- the read side ----------------------------------------------------------------------
def concurrently(target: Callable[[int, Store], None], store: Store,
                 others: list[Store]) -> None:
    """Run ``target(n, s)`` for ``store`` and each of ``others`` (other connections to the
    same database) in a thread each, wait for all, then close ``others``."""
    import threading
    threads = [threading.Thread(target=target, args=(n, s))
               for n, s in enumerate([store, *others])]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for s in others:
        s.close()


def fleet(store: Store) -> None:
    """Five instances of two machines in several states, with history, attempts and outbox."""
    specs: list[tuple[str, str, Status, str, str | None, int, int, float, dict[str, Any]]] = [
        ("a", "m1", "completed", "done", None, 30, 3, 1000.0, {"src": "model", "n": 1}),
        ("b", "m1", "failed", "failed", "timeout", 10, 2, 1010.0, {"src": "rules", "n": 2}),
        ("c", "m1", "running", "work", None, 50, 1, 1020.0, {"src": "model", "n": 3}),
        ("d", "m2", "completed", "done", None, 0, 1, 1030.0, {"note": "Needle here"}),
        ("e", "m1", "pending", "start", None, 0, 0, 1040.0, {"src": "rules", "n": 5}),
    ]
    for iid, machine, status, state, reason, tokens, steps, at, ctx in specs:
        rec = record(iid, machine=machine, at=at)
        rec.context, rec.input = ctx, dict(ctx)  # as a run of it would hold: its history replays
        store.create(rec)
        rows, path = [], ["start", "work", "check", state][:steps] + [state]
        for seq in range(1, steps + 1):
            src, dst = path[seq - 1], (path[seq] if seq < steps else state)
            rows.append(hist(iid, seq, src, dst, tokens=tokens // max(steps, 1), duration_ms=2.0 * seq,
                             kind="fallback" if iid == "b" and seq == 2 else "transition",
                             detail={"attempt": 2, "reasks": 1, "llm_calls": [{}, {}]} if seq == 1 else {}))
        new = replace(rec, state=state, status=status, reason=reason, tokens_used=tokens,
                      seq=steps, loop_count=steps, updated_at=at + 100 + steps)
        store.commit([StepCommit(new, 0, rows)])
    store.outbox_begin("a:work:1", "a", "work", 1, 1001.0)
    b = store.get("b")  # a failed attempt's tokens count in tokens_used, as in a real run
    store.commit([StepCommit(replace(b, tokens_used=b.tokens_used + 7), b.version,
                             attempt=attempt("b"))])
