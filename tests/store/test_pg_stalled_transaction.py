"""A process stopped inside a transaction does not block the workers that take its
instances over (matrix finding M4; PostgreSQL).

A worker SIGSTOPped between two statements of a transaction keeps its row locks for as
long as it stays stopped; the worker taking its instances over writes those rows on its
event loop (the group commit), and used to block there for good. Every session of ours
now asks the server to end it after ``IDLE_IN_TRANSACTION_S`` seconds idle inside a
transaction: the locks go with it, the writer goes on, and the stalled process meets a
dropped connection when let go on (one line, no traceback). Real processes, a real
cluster.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable

from procs import stopped, wait_until
from pydantic import BaseModel

from fsm_engine import Engine, Machine, State, Transition
from fsm_engine.process import session_name
from fsm_engine.store.pg_read import IDLE_IN_TRANSACTION_S
from fsm_engine.testing.postgres import PostgresCluster

#: The stalled process: our store, a transaction that locks one instance's row, a SIGSTOP
#: between its statements, then the next statement.  ``pipeline``: the row is locked by
#: an UPDATE sent in a pipeline (as the group commit sends them) and a Flush follows the
#: Sync, by a process that registered as a worker whose lease runs out in half a second.
HOLDER = r"""
import os, signal, sys
from fsm_engine.errors import StoreError
from fsm_engine.runtime.fleet.liveness import new_worker
from fsm_engine.store import open_store
store = open_store(sys.argv[1])
pipelined = sys.argv[3] == "pipeline"
if pipelined:
    worker = new_worker()
    worker.lease_until = worker.heartbeat_at + 0.5
    store.put_worker(worker)
def hold(conn):
    if pipelined:
        with conn.pipeline():
            conn.execute("UPDATE instances SET updated_at = updated_at WHERE id = %s",
                         (sys.argv[2],))
        # the Flush psycopg sends behind the pipeline's Sync when results are still unread
        # (most of the time, not always): sent here every time
        conn.pgconn.send_flush_request()
        conn.pgconn.flush()
    else:
        conn.execute("SELECT id FROM instances WHERE id = %s FOR UPDATE", (sys.argv[2],))
    print("locked", flush=True)
    os.kill(os.getpid(), signal.SIGSTOP)
    conn.execute("SELECT 1")
try:
    store._run(hold, txn=True)
except StoreError as exc:
    print(f"error: {exc}", flush=True)
    sys.exit(1)
print("committed", flush=True)
"""


class Ctx(BaseModel):
    n: int = 0


FLOW = Machine("stalled_flow", context=Ctx,
               states=[State("init", action=lambda ctx: {}), State("done", final=True)],
               transitions=[Transition("go", "init", "done")], initial="init")


def _stalled(cluster: PostgresCluster, how: str,
             unblock: Callable[[Engine, threading.Event], bool]) -> None:
    """Run ``HOLDER`` (``how``: ``plain`` or ``pipeline``); a writer then needs the row it
    locked: ``unblock(engine, done)`` must see it through (``done`` set when it wrote).
    The holder's idle session (``pipeline``: its worker row's) is left alone; let go
    on, the holder meets one ``error:`` line (its session was ended), never a commit."""
    store_url = cluster.database()
    engine = Engine(store_url)
    holder = None
    try:
        iid = engine.start(FLOW, {})
        holder = subprocess.Popen([sys.executable, "-c", HOLDER, store_url, iid, how],
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
        assert holder.stdout is not None
        assert holder.stdout.readline().decode().strip() == "locked"
        wait_until(lambda: stopped(holder), 30, "the holder to stop itself", interval=0.01)
        done = threading.Event()
        writer = threading.Thread(target=lambda: (engine.cancel(iid), done.set()), daemon=True)
        writer.start()  # needs the row the stopped process has locked
        assert unblock(engine, done), "the writer is still blocked"
        assert engine.store.get(iid).status == "cancelled"
        idle = cluster.sql("SELECT count(*) FROM pg_stat_activity WHERE state = 'idle' AND "
                           f"application_name = '{session_name(holder.pid)}'")
        assert int(idle[0][0]) == (how == "pipeline")
        holder.send_signal(signal.SIGCONT)
        out, _ = holder.communicate(timeout=30)
        assert holder.returncode == 1, out
        lines = out.decode().strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), out
    finally:
        if holder is not None and holder.poll() is None:
            holder.kill()
            holder.wait(10)
        engine.close()


def test_a_transaction_left_open_by_a_stopped_process_does_not_block_a_writer(
        pg_cluster: PostgresCluster) -> None:
    _stalled(pg_cluster, "plain", lambda _, done: done.wait(IDLE_IN_TRANSACTION_S + 20))


def test_a_dead_workers_transaction_left_open_after_a_pipeline_is_ended_by_a_live_heartbeat(
        pg_cluster: PostgresCluster) -> None:
    """Matrix finding M6: after a pipeline psycopg sends a Flush behind its Sync; the
    server disarms ``idle_in_transaction_session_timeout`` on reading it and does not arm
    it again, so a worker stopped there keeps its row locks for as long as it stays
    stopped, and the rows are skipped by every claim. A live worker's heartbeat ends the
    sessions of workers whose lease ran out (``LeaseStore.fence``)."""
    from fsm_engine.runtime.fleet.ownership import Ownership

    def heartbeats(engine: Engine, done: threading.Event) -> bool:
        live = Ownership(engine.store, writes=engine.ledger, lease_seconds=3.0,
                         max_recoveries=3)
        try:
            for _ in range(int(IDLE_IN_TRANSACTION_S + 20)):
                live.check([])  # one heartbeat
                if done.wait(1.0):
                    return True
            return False
        finally:
            live.close()
    _stalled(pg_cluster, "pipeline", heartbeats)
