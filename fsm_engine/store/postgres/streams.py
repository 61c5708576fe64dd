"""The stream facet on PostgreSQL (``facets.StreamStore``; SQL shared in ``store.streams``).

Writers of one instance's log serialise on a transaction-scoped advisory lock (so
positions never collide between a worker and a late one still streaming), and each write
notifies ``streams.CHANNEL`` with the instance id; ``stream_wait`` LISTENs on it.
"""

from __future__ import annotations

import builtins
import threading
import time
from collections.abc import Sequence
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

    _stream_listener: psycopg.Connection[Any] | None = None

    @property
    def _stream_lock(self) -> threading.Lock:
        """This store's lock around its listening connection (made at first use)."""
        with _MAKING:
            lock: threading.Lock | None = self.__dict__.get("_stream_lock_")
            if lock is None:
                lock = self.__dict__["_stream_lock_"] = threading.Lock()
            return lock

    def stream_write(self, ops: Sequence[StreamOp]) -> builtins.list[int]:
        if not ops:
            return []
        ids = sorted({op.instance_id for op in ops})

        def go(conn: psycopg.Connection[Any]) -> builtins.list[int]:
            with conn.cursor() as cur:
                def execute(sql: str, args: Sequence[Any]) -> Sequence[Any]:
                    cur.execute(marks(sql), args)
                    return cur.fetchall() if cur.description is not None else []
                for instance_id in ids:  # in one order: two writers never deadlock
                    cur.execute("SELECT pg_advisory_xact_lock(%s, hashtext(%s))",
                                (LOCK_SPACE, instance_id))
                out = streams.write(execute, ops)
                for instance_id in ids:
                    cur.execute("SELECT pg_notify(%s, %s)", (streams.CHANNEL, instance_id))
                return out
        return self._run(go, txn=True)

    def stream_read(self, instance_id: str, from_pos: int = 0,
                    limit: int = 500) -> builtins.list[StreamRow]:
        return streams.decode(self._run(lambda conn: conn.execute(
            marks(streams.READ), (instance_id, max(0, from_pos), limit)).fetchall()))

    def stream_wait(self, instance_id: str, timeout: float) -> None:
        """Waits for a NOTIFY on ``streams.CHANNEL`` naming ``instance_id`` up to ``timeout``
        seconds; when the listening connection cannot be had, sleeps instead."""
        end = time.monotonic() + max(0.0, timeout)
        with self._stream_lock:
            try:
                listener = self._stream_listening()
                while (left := end - time.monotonic()) > 0:
                    for note in listener.notifies(timeout=left, stop_after=1):
                        if note.payload == instance_id:
                            return
            except (psycopg.Error, StoreError):
                if self._stream_listener is not None:
                    self._stream_listener.close()
                self._stream_listener = None
                time.sleep(max(0.0, end - time.monotonic()))

    def _stream_listening(self) -> psycopg.Connection[Any]:
        conn = self._stream_listener
        if conn is None or conn.closed or conn.broken:
            conn = self._stream_listener = self._connect()
            conn.execute(f"LISTEN {streams.CHANNEL}")
        return conn

    def stream_prune(self, before: float) -> int:
        return self._run(lambda conn: conn.execute(marks(streams.PRUNE), (before,)).rowcount,
                         txn=True)

    def close(self) -> None:
        with self._stream_lock:
            if self._stream_listener is not None:
                self._stream_listener.close()
            self._stream_listener = None
        super().close()
