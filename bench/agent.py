"""Agent states (issue 23): engine CPU per tool call against a plain step's.

    python bench/agent.py [--n 20] [--backends sqlite,postgres]

``n`` instances, one after another, of two machines on the same store:

* **agent**: one agent state, 8 turns of 3 calls of a no-op tool, then the final answer
  (scripted model, 0 ms per reply): 9 model turns and 24 tool calls, each its own commit
  (33 commits an instance);
* **plain**: one state whose no-op action loops 33 times (33 commits an instance).

Client CPU (this process, ``time.process_time``) per commit of each and, on PostgreSQL,
the server's CPU too; and the **marginal CPU of one tool call**: the same loop with 6
calls a turn instead of 3, less the 3-call loop, over the 24 extra calls (what a call adds:
its journal commit, validation, thread hand-off, the longer prompt of the next turn).
The ratios are what to compare (the machine is shared).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from pydantic import BaseModel  # noqa: E402

from fsm_engine import Agent, Engine, Machine, State, Transition  # noqa: E402
from fsm_engine.llm import Scripted  # noqa: E402

TURNS, CALLS = 8, 3
COMMITS = TURNS + 1 + TURNS * CALLS  # 9 turns (the last one answers) + 24 calls


class Ctx(BaseModel):
    question: str = "?"
    answer: str = ""
    n: int = 0


class Answer(BaseModel):
    answer: str


def noop() -> int:
    """Do nothing."""
    return 0


def tick(ctx: Ctx) -> dict[str, Any]:
    return {"n": ctx.n + 1}


def more(ctx: Ctx) -> bool:
    return ctx.n < COMMITS


AGENT = Machine(
    name="bench-agent", context=Ctx, initial="loop", max_transitions=1000,
    states=[State("loop", agent=Agent(tools=[noop], output=Answer, max_turns=TURNS + 1)),
            State("done", final=True), State("turns_exhausted", final=True),
            State("budget_exhausted", final=True)],
    transitions=[Transition("done", "loop", "done"),
                 Transition("turns_exhausted", "loop", "turns_exhausted"),
                 Transition("budget_exhausted", "loop", "budget_exhausted")])

PLAIN = Machine(
    name="bench-plain", context=Ctx, initial="tick", max_transitions=1000,
    states=[State("tick", action=tick), State("done", final=True)],
    transitions=[Transition("again", "tick", "tick", conditions=more),
                 Transition("stop", "tick", "done")])


def replies(calls: int = CALLS) -> list[dict[str, Any]]:
    turn = {"tool_calls": [{"name": "noop", "arguments": {}}] * calls}
    return [turn] * TURNS + [{"text": json.dumps({"final": {"answer": "ok"}})}]


def cpu_per_commit(db: str, machine: Machine, n: int, server: Any = None,
                   calls: int = CALLS) -> tuple[float, float]:
    """(client µs, server µs) per commit (of a ``COMMITS``-commit instance: compare like
    with like) over ``n`` instances of ``machine`` run in turn."""
    engine = Engine(db, llm=Scripted.from_replies(replies(calls)), seed=1, tracer=None)
    try:
        warm = engine.start(machine, {})
        asyncio.run(engine.run(warm))  # imports, compile, first connection
        ids = [engine.start(machine, {}) for _ in range(n)]
        before_server = server() if server else {}
        start = time.process_time()

        async def go() -> None:
            for iid in ids:
                rec = await engine.run(iid)
                assert rec.state == "done", (rec.state, rec.reason)
        asyncio.run(go())
        client = time.process_time() - start
        from scale_out import spent
        srv = spent(before_server, server()) if server else 0.0
    finally:
        engine.close()
    return client / (n * COMMITS) * 1e6, srv / (n * COMMITS) * 1e6


def report(name: str, db: str, n: int, server: Any = None) -> None:
    agent_c, agent_s = cpu_per_commit(db, AGENT, n, server)
    plain_c, plain_s = cpu_per_commit(db, PLAIN, n, server)
    wide_c, wide_s = cpu_per_commit(db, AGENT, n, server, calls=2 * CALLS)
    extra = TURNS * CALLS
    per_call = (wide_c - agent_c) * COMMITS / extra
    per_call_s = (wide_s - agent_s) * COMMITS / extra
    print(f"{name}: plain step {plain_c:.0f} µs client"
          + (f" + {plain_s:.0f} µs server" if server else "")
          + f"; agent commit (turn or call) {agent_c:.0f} µs client"
          + (f" + {agent_s:.0f} µs server" if server else "")
          + f" = {agent_c / plain_c:.2f}× the plain step; one more tool call: {per_call:.0f} µs"
          + (f" + {per_call_s:.0f} µs server" if server else "")
          + f" = {per_call / plain_c:.2f}× the plain step; loop of {TURNS}×{CALLS}: "
          f"{agent_c * COMMITS / 1000:.1f} ms client")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=20)
    parser.add_argument("--backends", default="sqlite,postgres")
    args = parser.parse_args()
    backends = args.backends.split(",")
    if "sqlite" in backends:
        with tempfile.TemporaryDirectory() as tmp:
            report("sqlite", str(Path(tmp) / "fsm.db"), args.n)
    if "postgres" in backends:
        from scale_out import server_cpu

        from fsm_engine.testing.postgres import PostgresCluster
        cluster = PostgresCluster().start()
        try:
            report("postgres", cluster.database(), args.n, lambda: server_cpu(cluster))
        finally:
            cluster.stop()


if __name__ == "__main__":
    main()
