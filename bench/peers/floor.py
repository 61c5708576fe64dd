"""The raw-SQLite floor: what any durable engine has to pay at least.

W1 (one instance at a time): one transaction inserting the instance row, then
per transition one ``BEGIN IMMEDIATE … COMMIT`` that updates the instance row
(state, JSON context, sequence number) and appends one history row.  W2 (many
in flight): the same statements, group-committed the way the fastest
hand-written code would: every transition that is ready in one event-loop
iteration joins one transaction, and each instance continues once it is
committed.  No framework, no validation, prepared statements on one connection.
With a ``doc`` (W1 at a context size) the context JSON carries it and is
rewritten with every transition, as a hand-written loop storing its state
would.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from ..common import (
    INFER,
    INSERT_HISTORY,
    INSERT_INSTANCE,
    SCHEMA,
    STATES,
    TRANSITIONS,
    UPDATE_INSTANCE,
    connect,
)


class Bench:
    def __init__(self, path: str, synchronous: str, sleep: float) -> None:
        self.path, self.synchronous, self.sleep = path, synchronous, sleep
        self.next_id = 0
        self.doc: str | None = None
        self._pending: list[tuple[asyncio.Future[None], tuple[Any, ...], tuple[Any, ...]]] = []

    async def open(self, workload: str) -> None:
        self.conn = connect(self.path, self.synchronous)
        self.conn.executescript(SCHEMA)

    def _create(self) -> str:
        self.next_id += 1
        iid = f"i{self.next_id}"
        self.conn.execute("BEGIN IMMEDIATE")
        self.conn.execute(INSERT_INSTANCE, (iid, STATES[0], self._ctx(0)))
        self.conn.execute("COMMIT")
        return iid

    def _ctx(self, n: int) -> str:
        ctx: dict[str, Any] = {"n": n} if self.doc is None else {"n": n, "doc": self.doc}
        return json.dumps(ctx, separators=(",", ":"))

    def _rows(self, iid: str, k: int) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
        return ((STATES[k + 1], self._ctx(k + 1), k + 1, iid),
                (iid, k + 1, STATES[k], STATES[k + 1], f"t{k}", time.time()))

    def _transition(self, iid: str, k: int) -> None:
        """Commit the move ``STATES[k] → STATES[k+1]`` (the action set n = k + 1)."""
        ctx = self._ctx(k + 1)
        conn = self.conn
        conn.execute("BEGIN IMMEDIATE")
        conn.execute(UPDATE_INSTANCE, (STATES[k + 1], ctx, k + 1, iid))
        conn.execute(INSERT_HISTORY, (iid, k + 1, STATES[k], STATES[k + 1], f"t{k}", time.time()))
        conn.execute("COMMIT")

    async def sequential(self, n: int) -> None:
        for _ in range(n):
            iid = self._create()
            for k in range(TRANSITIONS):
                self._transition(iid, k)

    def _flush(self) -> None:
        """Commit every transition queued in this loop iteration in one transaction."""
        batch, self._pending = self._pending, []
        conn = self.conn
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany(UPDATE_INSTANCE, [b[1] for b in batch])
        conn.executemany(INSERT_HISTORY, [b[2] for b in batch])
        conn.execute("COMMIT")
        for fut, _, _ in batch:
            fut.set_result(None)

    def _group(self, iid: str, k: int) -> asyncio.Future[None]:
        loop = asyncio.get_running_loop()
        if not self._pending:
            loop.call_soon(self._flush)
        fut = loop.create_future()
        self._pending.append((fut, *self._rows(iid, k)))
        return fut

    async def _one(self, iid: str) -> None:
        for k in range(TRANSITIONS):
            if STATES[k] == INFER:
                await asyncio.sleep(self.sleep)
            await self._group(iid, k)

    async def concurrent(self, n: int) -> dict[str, float]:
        """W2: create the ``n`` instances in one transaction, then run them all at once."""
        started = time.perf_counter()
        ids = [f"i{self.next_id + i + 1}" for i in range(n)]
        self.next_id += n
        self.conn.execute("BEGIN IMMEDIATE")
        self.conn.executemany(INSERT_INSTANCE, [(iid, STATES[0], self._ctx(0)) for iid in ids])
        self.conn.execute("COMMIT")
        start_s = time.perf_counter() - started
        await asyncio.gather(*(self._one(i) for i in ids))
        return {"start_seconds": start_s, "run_seconds": time.perf_counter() - started - start_s}

    async def close(self) -> None:
        done = self.conn.execute("SELECT count(*) FROM instances WHERE state=?",
                                 (STATES[-1],)).fetchone()[0]
        self.conn.close()
        if done != self.next_id:
            raise AssertionError(f"{self.next_id - done} instance(s) not final")
