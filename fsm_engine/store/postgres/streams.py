"""The stream facet on PostgreSQL (``facets.StreamStore``; SQL shared in ``store.streams``).

Writers of one instance's log serialise on a transaction-scoped advisory lock (so
positions never collide between a worker and a late one still streaming), and each write
notifies ``streams.CHANNEL`` with the instance id; ``stream_wait`` waits for one, through a
single LISTEN connection per store read by a daemon thread.
"""

from __future__ import annotations

import builtins
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import psycopg

from ...errors import StoreError
from .. import streams
from ..codec import marks
from ..streams import StreamOp, StreamRow
from .connect import PostgresBase

#: The advisory lock namespace of stream writers (``pg_advisory_xact_lock(int, int)``).
LOCK_SPACE = 0x5354
_MAKING = threading.Lock()


class PostgresStreams(PostgresBase):
    """Stream rows on PostgreSQL; a connection of its own LISTENs for readers."""

    @property
    def _notes(self) -> _Notes:
        """This store's NOTIFY listener (made at first use)."""
        with _MAKING:
            notes: _Notes | None = self.__dict__.get("_notes_")
            if notes is None:
                notes = self.__dict__["_notes_"] = _Notes(self._connect)
            return notes

    def stream_write(self, ops: Sequence[StreamOp]) -> builtins.list[int]:
        if not ops:
            return []

        def go(conn: psycopg.Connection[Any]) -> builtins.list[int]:
            return write(conn, ops)
        return self._run(go, txn=True)

    def stream_read(self, instance_id: str, from_pos: int = 0,
                    limit: int = 500) -> builtins.list[StreamRow]:
        return streams.decode(self._run(lambda conn: conn.execute(
            marks(streams.READ), (instance_id, max(0, from_pos), limit)).fetchall()))

    def stream_wait(self, instance_id: str, timeout: float) -> None:
        """Waits for a NOTIFY on ``streams.CHANNEL`` naming ``instance_id`` up to ``timeout``
        seconds (one listening connection and thread per store, shared by every waiter);
        when the listener cannot connect, sleeps instead."""
        self._notes.wait(instance_id, timeout)

    def stream_prune(self, before: float) -> int:
        return self._run(lambda conn: conn.execute(marks(streams.PRUNE), (before,)).rowcount,
                         txn=True)

    def close(self) -> None:
        notes = self.__dict__.get("_notes_")
        if notes is not None:
            notes.stop()
        super().close()


def write(conn: psycopg.Connection[Any], ops: Sequence[StreamOp]) -> builtins.list[int]:
    """``ops`` in ``conn``'s open transaction (``streams.write``), under the advisory lock
    of each instance (taken in one order: two writers never deadlock), notifying
    ``streams.CHANNEL`` for each; used by ``stream_write`` and by a step's commit
    (``StepCommit.stream``)."""
    ids = sorted({op.instance_id for op in ops})
    with conn.cursor() as cur:
        def execute(sql: str, args: Sequence[Any]) -> Sequence[Any]:
            cur.execute(marks(sql), args)
            return cur.fetchall() if cur.description is not None else []
        cur.execute(_LOCK, (LOCK_SPACE, ids))  # one round trip for all
        out = streams.write(execute, ops)
        cur.execute(_NOTIFY, (streams.CHANNEL, ids))
        return out


#: The advisory locks of instances ``%s`` (an array, sorted), taken in that order
#: (PostgreSQL evaluates a volatile select list after ``ORDER BY``).
_LOCK = ("SELECT pg_advisory_xact_lock(%s, hashtext(i)) "
         "FROM unnest(%s::text[]) WITH ORDINALITY AS t(i, n) ORDER BY n")
#: A notification on channel ``%s`` for each instance of ``%s`` (an array).
_NOTIFY = "SELECT pg_notify(%s, i) FROM unnest(%s::text[]) AS t(i)"


class _Notes:
    """One LISTEN connection and a daemon thread counting notifications per instance;
    waiters sleep on a condition until their instance's count moves."""

    #: Instances remembered at most (past it the counts restart: a waiter then waits out
    #: its timeout once).
    MAX_IDS = 10_000

    def __init__(self, connect: Callable[[], psycopg.Connection[Any]]) -> None:
        self.connect = connect
        self.cond = threading.Condition()
        self.seen: dict[str, int] = {}
        self.thread: threading.Thread | None = None
        self.conn: psycopg.Connection[Any] | None = None
        self.stopped = False

    def wait(self, instance_id: str, timeout: float) -> None:
        with self.cond:
            if self.thread is None or not self.thread.is_alive():
                self.thread = threading.Thread(target=self._listen, daemon=True,
                                               name="fsm-stream-listen")
                self.thread.start()
            start = self.seen.get(instance_id, 0)
            self.cond.wait_for(lambda: self.seen.get(instance_id, 0) != start,
                               max(0.0, timeout))

    def _listen(self) -> None:
        while not self.stopped:
            try:
                if self.conn is None or self.conn.closed or self.conn.broken:
                    self.conn = self.connect()
                    self.conn.execute(f"LISTEN {streams.CHANNEL}")
                for note in self.conn.notifies(timeout=1.0):
                    self._count(note.payload)
            except (psycopg.Error, StoreError):
                if self.conn is not None:
                    self.conn.close()
                self.conn = None
                time.sleep(0.5)

    def _count(self, instance_id: str) -> None:
        with self.cond:
            if len(self.seen) >= self.MAX_IDS:
                self.seen.clear()
            self.seen[instance_id] = self.seen.get(instance_id, 0) + 1
            self.cond.notify_all()

    def stop(self) -> None:
        self.stopped = True
        conn = self.conn
        if conn is not None:
            conn.close()
