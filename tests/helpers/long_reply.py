"""A long JSON reply in an instance's stream log (issue 36 item 9): ``write_long`` starts an
instance of the streamed machine (never run) and writes one JSON attempt of ``chars``
characters to its log directly, in rows of ``ROW_CHARS``; it returns the id and the number
of rows after the ``open`` one."""

from __future__ import annotations

import time
from typing import Any

from streamed_machine import machine

from fsm_engine.store.streams import ROW_CHARS, StreamOp, StreamRow

#: The size cap of one call's reply (16 MiB).
CAP = 16 << 20


def write_long(engine: Any, chars: int = CAP) -> tuple[str, int]:
    iid = engine.start(machine(), {"topic": "long"})
    n = chars // ROW_CHARS
    piece = "x" * ROW_CHARS
    rows = tuple(StreamRow(iid, 1, 0, "chunk", ('{"a": "' + piece)[:ROW_CHARS] if k == 0
                           else piece, k * ROW_CHARS) for k in range(n))
    for first in range(0, n, 256):  # (a few writes: no huge transaction)
        part = rows[first:first + 256]
        engine.store.stream_write([StreamOp(iid, part, True, 1, 1, {"json": True}, time.time())
                                   if first == 0 else StreamOp(iid, part)])
    return iid, n
