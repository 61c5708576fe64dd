"""DBOS Transact on PostgreSQL, the peer of ``bench/scale_out.py``: one worker process.

    python -m bench.peers.dbos_scale URL EXECUTOR_ID CONCURRENCY POLL_S DELAY_S

Launches DBOS with ``URL`` as its system database and serves the ``fsm_bench``
queue (``worker_concurrency`` CONCURRENCY, polled every POLL_S seconds) until
SIGTERM.  The workflow is the reference machine's shape: seven ``@DBOS.step``s
(each recorded under (workflow id, step number) before the workflow goes on:
a durable transition), the third an ``async`` model call answering after
DELAY_S seconds.  ``enqueue`` / ``done`` are used by the bench process (a
``DBOSClient``: it only talks to the system database).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
import threading
from typing import Any

from dbos import DBOS, DBOSConfig

QUEUE = "fsm_bench"
WORKFLOW = "moderation7"
STEPS = 7
_DELAY = [0.05]


@DBOS.step()
async def light(n: int) -> int:
    return n + 1


@DBOS.step()
async def infer(n: int) -> int:
    await asyncio.sleep(_DELAY[0])
    return n + 1


@DBOS.workflow(name=WORKFLOW)
async def moderation7() -> int:
    n = 0
    for i in range(STEPS):
        n = await (infer(n) if i == 2 else light(n))
    return n


def serve(url: str, executor: str, concurrency: int, poll: float, delay: float) -> None:
    _DELAY[0] = delay
    config: DBOSConfig = {"name": "fsm-bench", "system_database_url": url,
                          "log_level": "ERROR", "executor_id": executor}
    DBOS(config=config)
    DBOS.launch()
    DBOS.register_queue(QUEUE, worker_concurrency=concurrency, polling_interval_sec=poll)
    logging.getLogger("dbos").setLevel(logging.ERROR)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    print("ready", flush=True)
    stop.wait()
    DBOS.destroy(workflow_completion_timeout_sec=0)


def enqueue(url: str, n: int) -> list[str]:
    """Enqueue ``n`` workflows on the queue; their ids."""
    from dbos import DBOSClient
    client = DBOSClient(system_database_url=url)
    try:
        return [client.enqueue({"workflow_name": WORKFLOW, "queue_name": QUEUE})
                .get_workflow_id() for _ in range(n)]
    finally:
        client.destroy()


def done(conn: Any) -> int:
    """Workflows that ended successfully (read from DBOS's status table)."""
    return conn.execute("SELECT count(*) FROM dbos.workflow_status "
                        "WHERE status = 'SUCCESS'").fetchone()[0]


if __name__ == "__main__":
    serve(sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5]))
