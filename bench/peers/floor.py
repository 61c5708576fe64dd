"""The raw-SQLite floor: what any durable engine has to pay at least.

Per instance: one transaction inserting the instance row, then per
transition one ``BEGIN IMMEDIATE … COMMIT`` that updates the instance row
(state, JSON context, sequence number) and appends one history row.  No
framework, no validation, prepared statements on one connection.
"""

from __future__ import annotations

import asyncio
import json
import time

from ..common import (
    INFER, INSERT_HISTORY, INSERT_INSTANCE, SCHEMA, STATES, TRANSITIONS, UPDATE_INSTANCE,
    connect,
)


class Bench:
    def __init__(self, path: str, synchronous: str, sleep: float) -> None:
        self.path, self.synchronous, self.sleep = path, synchronous, sleep
        self.next_id = 0

    async def open(self, workload: str) -> None:
        self.conn = connect(self.path, self.synchronous)
        self.conn.executescript(SCHEMA)

    def _create(self) -> str:
        self.next_id += 1
        iid = f"i{self.next_id}"
        self.conn.execute("BEGIN IMMEDIATE")
        self.conn.execute(INSERT_INSTANCE, (iid, STATES[0], '{"n":0}'))
        self.conn.execute("COMMIT")
        return iid

    def _transition(self, iid: str, k: int) -> None:
        """Commit the move ``STATES[k] → STATES[k+1]`` (the action set n = k + 1)."""
        ctx = json.dumps({"n": k + 1}, separators=(",", ":"))
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

    async def _one(self, iid: str) -> None:
        for k in range(TRANSITIONS):
            if STATES[k] == INFER:
                await asyncio.sleep(self.sleep)
            self._transition(iid, k)

    async def concurrent(self, n: int) -> None:
        ids = [self._create() for _ in range(n)]
        await asyncio.gather(*(self._one(i) for i in ids))

    async def close(self) -> None:
        done = self.conn.execute("SELECT count(*) FROM instances WHERE state=?",
                                 (STATES[-1],)).fetchone()[0]
        self.conn.close()
        if done != self.next_id:
            raise AssertionError(f"{self.next_id - done} instance(s) not final")
