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

from procs import stopped, wait_until
from pydantic import BaseModel

from fsm_engine import Engine, Machine, State, Transition
from fsm_engine.process import session_name
from fsm_engine.store.pg_read import IDLE_IN_TRANSACTION_S
from fsm_engine.testing.postgres import PostgresCluster

#: The stalled process: our store, a transaction that locks one instance's row, a SIGSTOP
#: between its statements, then the next statement.
HOLDER = r"""
import os, signal, sys
from fsm_engine.errors import StoreError
from fsm_engine.store import open_store
store = open_store(sys.argv[1])
def hold(conn):
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


def test_a_transaction_left_open_by_a_stopped_process_does_not_block_a_writer(
        pg_cluster: PostgresCluster) -> None:
    store_url = pg_cluster.database()
    engine = Engine(store_url)
    holder = None
    try:
        iid = engine.start(FLOW, {})
        holder = subprocess.Popen([sys.executable, "-c", HOLDER, store_url, iid],
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
        assert holder.stdout is not None
        assert holder.stdout.readline().decode().strip() == "locked"
        wait_until(lambda: stopped(holder), 30, "the holder to stop itself", interval=0.01)
        done = threading.Event()
        writer = threading.Thread(target=lambda: (engine.cancel(iid), done.set()), daemon=True)
        writer.start()  # needs the row the stopped process has locked
        assert done.wait(IDLE_IN_TRANSACTION_S + 20), "the writer is still blocked"
        assert engine.store.get(iid).status == "cancelled"
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


#: A worker stopped right after a pipeline inside a transaction (how the group commit
#: sends its UPDATEs): the worker's row says its lease runs out in half a second.
PIPELINED = r"""
import os, signal, sys, time
from fsm_engine.errors import StoreError
from fsm_engine.runtime.fleet.liveness import new_worker
from fsm_engine.store import open_store
store = open_store(sys.argv[1])
worker = new_worker()
worker.lease_until = worker.heartbeat_at + 0.5
store.put_worker(worker)
def hold(conn):
    with conn.pipeline():
        conn.execute("UPDATE instances SET updated_at = updated_at WHERE id = %s",
                     (sys.argv[2],))
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


def test_a_dead_workers_transaction_left_open_after_a_pipeline_is_ended_by_a_live_heartbeat(
        pg_cluster: PostgresCluster) -> None:
    """Matrix finding M6: after a pipeline psycopg sends a Flush behind its Sync; the
    server disarms ``idle_in_transaction_session_timeout`` on reading it and does not arm
    it again, so a worker stopped there keeps its row locks for as long as it stays
    stopped, and the rows are skipped by every claim. A live worker's heartbeat ends the
    sessions of workers whose lease ran out (``LeaseStore.fence``)."""
    from fsm_engine.runtime.fleet.ownership import Ownership
    store_url = pg_cluster.database()
    engine = Engine(store_url)
    holder = None
    try:
        iid = engine.start(FLOW, {})
        holder = subprocess.Popen([sys.executable, "-c", PIPELINED, store_url, iid],
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
        assert holder.stdout is not None
        assert holder.stdout.readline().decode().strip() == "locked"
        wait_until(lambda: stopped(holder), 30, "the holder to stop itself", interval=0.01)
        done = threading.Event()
        writer = threading.Thread(target=lambda: (engine.cancel(iid), done.set()), daemon=True)
        writer.start()  # needs the row the stopped process has locked
        live = Ownership(engine.store, lease_seconds=3.0, max_recoveries=3)
        live.renew()
        ended = False
        for _ in range(int(IDLE_IN_TRANSACTION_S + 20)):
            live.check([])  # one heartbeat
            if done.wait(1.0):
                ended = True
                break
        assert ended, "the writer is still blocked"
        assert engine.store.get(iid).status == "cancelled"
        idle = pg_cluster.sql("SELECT count(*) FROM pg_stat_activity WHERE state = 'idle' AND "
                              f"application_name = '{session_name(holder.pid)}'")
        assert int(idle[0][0]) == 1  # the holder's idle heartbeat session was left alone
        holder.send_signal(signal.SIGCONT)
        out, _ = holder.communicate(timeout=30)
        assert holder.returncode == 1, out
        lines = out.decode().strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), out
        live.close()
    finally:
        if holder is not None and holder.poll() is None:
            holder.kill()
            holder.wait(10)
        engine.close()
