"""Apache Burr with its SQLite persister.

Six actions ``s0 … s5`` (``s5`` is the last, its completion plays ``s6``),
linear transitions, and the persistence recipe from Burr's docs:
``initialize_from(persister, resume_at_next_action=True, …)`` plus
``with_state_persister(persister)``, one ``app_id`` per instance.  Burr saves
the state after every action (one INSERT + commit).

W1: ``SQLitePersister`` and ``app.run``; W2: ``AsyncSQLitePersister``
(aiosqlite), ``abuild`` and ``app.arun`` under ``asyncio.gather``, one
persister shared by all applications.  We hand both persisters a connection
in WAL mode with our ``synchronous`` level (Burr's default is the rollback
journal).
"""

from __future__ import annotations

import asyncio
import sqlite3
from typing import Any

import aiosqlite
from burr.core import ApplicationBuilder, State, action
from burr.core.persistence import SQLitePersister
from burr.integrations.persisters.b_aiosqlite import AsyncSQLitePersister

from ..common import INFER, STATES, TRANSITIONS

ACTIONS = STATES[:TRANSITIONS]


@action(reads=["n"], writes=["n"])
def bump(state: State) -> State:
    return state.update(n=state["n"] + 1)


@action(reads=["n"], writes=["n"])
async def abump(state: State) -> State:
    return state.update(n=state["n"] + 1)


def _check(state: Any) -> None:
    if state["n"] != TRANSITIONS:
        raise AssertionError(f"application ended with n={state['n']}")


class Bench:
    def __init__(self, path: str, synchronous: str, sleep: float) -> None:
        self.path, self.synchronous, self.sleep = path, synchronous, sleep
        self.next_id = 0

    async def open(self, workload: str) -> None:
        self.persister: Any = None
        self.apersister: Any = None
        if workload == "W1":
            conn = sqlite3.connect(self.path, check_same_thread=False)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute(f"PRAGMA synchronous={self.synchronous}")
            self.persister = SQLitePersister(self.path, connection=conn)
            self.persister.initialize()
            self.actions = {name: bump for name in ACTIONS}
            return
        aconn = await aiosqlite.connect(self.path)
        await aconn.execute("PRAGMA journal_mode=WAL")
        await aconn.execute(f"PRAGMA synchronous={self.synchronous}")
        self.apersister = AsyncSQLitePersister(aconn)
        await self.apersister.initialize()
        sleep = self.sleep

        @action(reads=["n"], writes=["n"])
        async def infer(state: State) -> State:
            await asyncio.sleep(sleep)
            return state.update(n=state["n"] + 1)

        self.actions = {name: infer if name == INFER else abump for name in ACTIONS}

    def _builder(self, persister: Any) -> ApplicationBuilder:
        self.next_id += 1
        return (ApplicationBuilder()
                .with_actions(**self.actions)
                .with_transitions(*zip(ACTIONS, ACTIONS[1:], strict=False))
                .initialize_from(persister, resume_at_next_action=True,
                                 default_state={"n": 0}, default_entrypoint=ACTIONS[0])
                .with_state_persister(persister)
                .with_identifiers(app_id=f"a{self.next_id}"))

    async def sequential(self, n: int) -> None:
        for _ in range(n):
            app = self._builder(self.persister).build()
            _, _, state = app.run(halt_after=[ACTIONS[-1]])
            _check(state)

    async def concurrent(self, n: int) -> None:
        async def one() -> None:
            app = await self._builder(self.apersister).abuild()
            _, _, state = await app.arun(halt_after=[ACTIONS[-1]])
            _check(state)
        await asyncio.gather(*(one() for _ in range(n)))

    async def close(self) -> None:
        sql = "SELECT count(*) FROM burr_state"
        if self.persister is not None:
            rows = self.persister.connection.execute(sql).fetchone()[0]
            self.persister.connection.close()
        else:
            async with self.apersister.connection.execute(sql) as cur:
                rows = (await cur.fetchone())[0]
            await self.apersister.close()
        if rows != self.next_id * TRANSITIONS:
            raise AssertionError(f"{rows} states saved, expected {self.next_id * TRANSITIONS}")
