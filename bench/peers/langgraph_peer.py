"""LangGraph with ``langgraph-checkpoint-sqlite``.

A ``StateGraph`` of six nodes ``s0 … s5`` (each node is a state's action;
the edge out of ``s5`` goes to ``END``, which plays ``s6``), compiled with a
checkpointer; each instance is a thread (``thread_id``).  Runs use
``durability="sync"``: the checkpoint of a super-step is committed before
the next one starts (the default, ``"async"``, writes it in the background).

W1 uses ``SqliteSaver`` and ``graph.invoke``; W2 uses ``AsyncSqliteSaver``
(aiosqlite) and ``graph.ainvoke`` under ``asyncio.gather``.  Both connections
get ``PRAGMA synchronous`` set by us; ``setup()`` itself turns on WAL.
"""

from __future__ import annotations

import asyncio
import sqlite3
from typing import Any, TypedDict

import aiosqlite
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
from langgraph.graph import END, START, StateGraph

from ..common import INFER, STATES, TRANSITIONS


class Counter(TypedDict):
    n: int


def bump(state: Counter) -> dict[str, int]:
    return {"n": state["n"] + 1}


async def abump(state: Counter) -> dict[str, int]:
    return {"n": state["n"] + 1}


def _graph(action: Any, infer: Any) -> StateGraph:
    builder = StateGraph(Counter)
    nodes = STATES[:TRANSITIONS]
    for name in nodes:
        builder.add_node(name, infer if name == INFER else action)
    builder.add_edge(START, nodes[0])
    for a, b in zip(nodes, nodes[1:], strict=False):
        builder.add_edge(a, b)
    builder.add_edge(nodes[-1], END)
    return builder


def _check(out: dict[str, Any]) -> None:
    if out["n"] != TRANSITIONS:
        raise AssertionError(f"graph ended with n={out['n']}")


class Bench:
    def __init__(self, path: str, synchronous: str, sleep: float) -> None:
        self.path, self.synchronous, self.sleep = path, synchronous, sleep
        self.next_id = 0

    async def open(self, workload: str) -> None:
        self.conn: Any = None
        self.aconn: Any = None
        if workload == "W1":
            self.conn = sqlite3.connect(self.path, check_same_thread=False)
            self.conn.execute(f"PRAGMA synchronous={self.synchronous}")
            saver = SqliteSaver(self.conn)
            saver.setup()
            self.graph = _graph(bump, bump).compile(checkpointer=saver)
            return
        self.aconn = await aiosqlite.connect(self.path)
        await self.aconn.execute(f"PRAGMA synchronous={self.synchronous}")
        asaver = AsyncSqliteSaver(self.aconn)
        await asaver.setup()
        sleep = self.sleep

        async def infer(state: Counter) -> dict[str, int]:
            await asyncio.sleep(sleep)
            return {"n": state["n"] + 1}

        self.graph = _graph(abump, infer).compile(checkpointer=asaver)

    def _config(self) -> dict[str, Any]:
        self.next_id += 1
        return {"configurable": {"thread_id": f"t{self.next_id}"}}

    async def sequential(self, n: int) -> None:
        for _ in range(n):
            _check(self.graph.invoke({"n": 0}, self._config(), durability="sync"))

    async def concurrent(self, n: int) -> None:
        outs = await asyncio.gather(*(self.graph.ainvoke({"n": 0}, self._config(),
                                                         durability="sync")
                                      for _ in range(n)))
        for out in outs:
            _check(out)

    async def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
        if self.aconn is not None:
            await self.aconn.close()
