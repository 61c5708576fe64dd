"""The stream facet on SQLite (``facets.StreamStore``; SQL shared in ``store.streams``)."""

from __future__ import annotations

import builtins
import time
from collections.abc import Sequence

from .. import streams
from ..streams import StreamOp, StreamRow
from .connect import SqliteBase

#: How often ``stream_wait`` looks for another connection's commit (seconds).
POLL_S = 0.005


class SqliteStreams(SqliteBase):
    """Stream rows appended under the write lock (``BEGIN IMMEDIATE``), which serialises
    every writer of the file: positions never collide."""

    def stream_write(self, ops: Sequence[StreamOp]) -> builtins.list[int]:
        if not ops:
            return []
        with self._write() as conn:
            return streams.write(lambda sql, args: conn.execute(sql, args).fetchall(), ops)

    def stream_read(self, instance_id: str, from_pos: int = 0,
                    limit: int = 500) -> builtins.list[StreamRow]:
        return streams.decode(self._read(streams.READ, (instance_id, max(0, from_pos), limit),
                                         tuples=True))

    def stream_wait(self, instance_id: str, timeout: float) -> None:
        """Polls ``PRAGMA data_version`` every ``POLL_S`` (it changes when another
        connection commits); returns at the first change or after ``timeout``."""
        end = time.monotonic() + max(0.0, timeout)
        first = self._read("PRAGMA data_version")[0][0]
        while time.monotonic() < end:
            time.sleep(min(POLL_S, max(0.0, end - time.monotonic())))
            if self._read("PRAGMA data_version")[0][0] != first:
                return

    def stream_prune(self, before: float) -> int:
        with self._write() as conn:
            return int(conn.execute(streams.PRUNE, (before,)).rowcount)
