"""DBOS Transact with a SQLite system database.

One workflow per instance; each state's action is a ``@DBOS.step`` whose
result DBOS records under (workflow id, step number) before the workflow
continues: the durable transition.  DBOS also writes the workflow's status
row when it starts and when it ends.

W1: a sync workflow called directly, one after another.  W2: DBOS supports
``async def`` workflows and steps; we start all of them with
``DBOS.start_workflow_async`` and await their handles (no threads of ours).

DBOS opens the system database through SQLAlchemy without touching the
journal mode, so SQLite's rollback journal would be used; for parity we
add a SQLAlchemy ``connect`` listener that sets WAL and our ``synchronous``
level on every connection it opens.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import sqlalchemy as sa
from dbos import DBOS, DBOSConfig, SetWorkflowID

from ..common import INFER, STATES, TRANSITIONS

_PRAGMAS = {"synchronous": "FULL"}


@sa.event.listens_for(sa.engine.Engine, "connect")
def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    if type(dbapi_conn).__module__.startswith("sqlite3"):
        dbapi_conn.execute("PRAGMA journal_mode=WAL")
        dbapi_conn.execute(f"PRAGMA synchronous={_PRAGMAS['synchronous']}")


@DBOS.step()
def bump(n: int) -> int:
    return n + 1


@DBOS.workflow()
def linear() -> int:
    n = 0
    for _ in range(TRANSITIONS):
        n = bump(n)
    return n


@DBOS.step()
async def abump(n: int) -> int:
    return n + 1


@DBOS.step()
async def infer(n: int, sleep: float) -> int:
    await asyncio.sleep(sleep)
    return n + 1


@DBOS.workflow()
async def sleepy(sleep: float) -> int:
    n = 0
    for state in STATES[:TRANSITIONS]:
        n = await (infer(n, sleep) if state == INFER else abump(n))
    return n


def _check(n: int) -> None:
    if n != TRANSITIONS:
        raise AssertionError(f"workflow returned {n}")


class Bench:
    def __init__(self, path: str, synchronous: str, sleep: float) -> None:
        self.path, self.synchronous, self.sleep = path, synchronous, sleep
        self.next_id = 0

    async def open(self, workload: str) -> None:
        _PRAGMAS["synchronous"] = self.synchronous
        config: DBOSConfig = {"name": "fsm-bench", "system_database_url": f"sqlite:///{self.path}",
                              "log_level": "ERROR"}
        DBOS(config=config)
        DBOS.launch()
        logging.getLogger("dbos").setLevel(logging.ERROR)

    def _wid(self) -> str:
        self.next_id += 1
        return f"w{self.next_id}"

    async def sequential(self, n: int) -> None:
        for _ in range(n):
            with SetWorkflowID(self._wid()):
                _check(linear())

    async def concurrent(self, n: int) -> None:
        handles = []
        for _ in range(n):
            with SetWorkflowID(self._wid()):
                handles.append(await DBOS.start_workflow_async(sleepy, self.sleep))
        for n_done in await asyncio.gather(*(h.get_result() for h in handles)):
            _check(n_done)

    async def close(self) -> None:
        try:
            steps = [len(await DBOS.list_workflow_steps_async(f"w{i}"))
                     for i in (1, self.next_id)]
        finally:
            DBOS.destroy()
        if steps != [TRANSITIONS, TRANSITIONS]:
            raise AssertionError(f"{steps} steps recorded for the first and last workflow")
