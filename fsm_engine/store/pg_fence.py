"""Fencing a dead worker's PostgreSQL sessions: a live worker's heartbeat ends the
sessions a worker whose lease ran out left inside a transaction (matrix finding M6).

Why the server's own ``idle_in_transaction_session_timeout`` (``pg_read``) is not
enough: the server arms it only when it sends ReadyForQuery, and disarms it whenever a
message arrives.  After a pipeline psycopg sends a Sync and then, with results still to
read, a Flush (``psycopg/_pipeline_base.py``, ``_exit_gen``); the server answers the
Sync, arms the timeout, reads the Flush, disarms it, and waits for the next message with
no timeout at all (PostgreSQL ``src/backend/tcop/postgres.c``, ``PostgresMain``: step
(4) disables it, only ``send_ready_for_query`` enables it).  A worker stopped there
(SIGSTOP, a frozen VM) — or between two statements of a pipeline, where no
ReadyForQuery was sent yet — keeps its row locks for as long as it stays stopped, and
every claim skips the rows it locked (``FOR UPDATE SKIP LOCKED``): the instances, and a
fan-out's whole family, never finish.

The fence: every session of ours is named ``process.session_name()``
(``fsm_engine:PID:START``), which a worker's row (``pid``, ``pid_start``) maps to.  When
every row of a process has a lease that ran out by the fencer's clock, the process is
dead to the fleet (any worker may take its instances, ``store.leases``), and its sessions
inside a transaction (any state but ``idle``, unchanged for ``IDLE_IN_TRANSACTION_S``)
are ended with ``pg_terminate_backend``:
the transaction rolls back, the locks go, and the stopped process meets a dropped
connection if it ever goes on (its commits were fenced by version anyway).  A process
that rolled over to a new id (a live lease) is left alone; so is any session of another
role or database, and any idle one (it holds no row lock).
"""

from __future__ import annotations

#: The sessions to end, and ``pg_terminate_backend`` ending each.  Its arguments:
#:
#: * this process's ``session_name``: never its own sessions (a worker whose loop is stuck
#:   on such a lock gets going again once the holder's are ended);
#: * the seconds a session must have sat in its state (``pg_read.IDLE_IN_TRANSACTION_S``:
#:   none of our transactions waits that long between statements, so a short one in
#:   flight when its process's lease ran out is left to finish);
#: * the lease assumed for a row without ``lease_until``, then the fencer's ``now``
#:   (epoch seconds).
#:
#: Returns ``(application_name, ended)`` per session.
FENCE = (
    "SELECT a.application_name, pg_terminate_backend(a.pid) FROM pg_stat_activity a "
    "WHERE a.datname = current_database() AND a.usename = current_user "
    "AND a.application_name <> %s AND a.state <> 'idle' "
    "AND a.state_change < now() - make_interval(secs => %s) "
    "AND a.application_name IN ("
    "SELECT 'fsm_engine:' || pid || ':' || pid_start FROM workers WHERE pid_start <> '' "
    "GROUP BY pid, pid_start HAVING max(COALESCE(lease_until, heartbeat_at + %s)) < %s)")
