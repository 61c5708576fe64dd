"""``transitions`` (pytransitions) with hand-written SQLite persistence.

One ``Machine`` (or ``AsyncMachine`` for W2) is shared by every instance
(``add_model``/``remove_model``, the library's documented way to drive many
models with one machine).  The action is the transition's ``before``
callback; ``after_state_change`` commits one transaction per transition:
update the instance row and insert a history row (same schema and
statements as the floor).
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from transitions import Machine
from transitions.extensions.asyncio import AsyncMachine

from ..common import (
    FINAL,
    INFER,
    INSERT_HISTORY,
    INSERT_INSTANCE,
    SCHEMA,
    STATES,
    TRANSITIONS,
    UPDATE_INSTANCE,
    connect,
)


class Item:
    """The model object ``transitions`` decorates with ``state`` and ``next()``."""

    def __init__(self, iid: str) -> None:
        self.id, self.n, self.seq = iid, 0, 0


class Bench:
    def __init__(self, path: str, synchronous: str, sleep: float) -> None:
        self.path, self.synchronous, self.sleep = path, synchronous, sleep
        self.next_id = 0
        self.doc: str | None = None  # W1 at a context size: carried in the context JSON

    async def open(self, workload: str) -> None:
        self.conn = connect(self.path, self.synchronous)
        self.conn.executescript(SCHEMA)

    def _table(self, action: Any, infer: Any) -> list[dict[str, Any]]:
        return [{"trigger": "next", "source": STATES[k], "dest": STATES[k + 1],
                 "before": infer if STATES[k] == INFER else action}
                for k in range(TRANSITIONS)]

    # -- callbacks ------------------------------------------------------------
    @staticmethod
    def _bump(event: Any) -> None:
        event.model.n += 1

    async def _abump(self, event: Any) -> None:
        event.model.n += 1

    async def _infer(self, event: Any) -> None:
        await asyncio.sleep(self.sleep)
        event.model.n += 1

    def _persist(self, event: Any) -> None:
        item = event.model
        item.seq += 1
        ctx = json.dumps({"n": item.n} if self.doc is None else {"n": item.n, "doc": self.doc},
                         separators=(",", ":"))
        conn = self.conn
        conn.execute("BEGIN IMMEDIATE")
        conn.execute(UPDATE_INSTANCE, (event.transition.dest, ctx, item.seq, item.id))
        conn.execute(INSERT_HISTORY, (item.id, item.seq, event.transition.source,
                                      event.transition.dest, event.event.name, time.time()))
        conn.execute("COMMIT")

    def _create(self) -> Item:
        self.next_id += 1
        item = Item(f"i{self.next_id}")
        self.conn.execute("BEGIN IMMEDIATE")
        ctx = '{"n":0}' if self.doc is None else json.dumps({"n": 0, "doc": self.doc},
                                                            separators=(",", ":"))
        self.conn.execute(INSERT_INSTANCE, (item.id, STATES[0], ctx))
        self.conn.execute("COMMIT")
        return item

    @staticmethod
    def _check(item: Any) -> None:
        if item.state != FINAL or item.n != TRANSITIONS:
            raise AssertionError(f"instance {item.id} ended in {item.state} with n={item.n}")

    # -- workloads --------------------------------------------------------------
    async def sequential(self, n: int) -> None:
        machine = Machine(model=None, states=list(STATES), initial=STATES[0],
                          transitions=self._table(self._bump, self._bump),
                          after_state_change=self._persist, send_event=True,
                          auto_transitions=False)
        for _ in range(n):
            item = self._create()
            machine.add_model(item)
            while item.state != FINAL:
                item.next()
            self._check(item)
            machine.remove_model(item)

    async def concurrent(self, n: int) -> None:
        machine = AsyncMachine(model=None, states=list(STATES), initial=STATES[0],
                               transitions=self._table(self._abump, self._infer),
                               after_state_change=self._persist, send_event=True,
                               auto_transitions=False)

        async def one(item: Any) -> None:
            while item.state != FINAL:
                await item.next()
            self._check(item)
            machine.remove_model(item)

        items = [self._create() for _ in range(n)]
        for item in items:
            machine.add_model(item)
        await asyncio.gather(*(one(i) for i in items))

    async def close(self) -> None:
        self.conn.close()
