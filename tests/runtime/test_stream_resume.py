"""Resuming far into a long JSON reply (issue 36 item 9): a subscription holds one batch of
rows and at most ``PARTIAL_CHARS`` of a JSON reply, however long the reply or far the
resume, and the events after the cursor are those a full read gives; on both backends."""

from __future__ import annotations

import asyncio
from typing import Any

from long_reply import write_long

from fsm_engine.runtime.stream_read import BATCH, PARTIAL_CHARS, events
from fsm_engine.store.streams import ROW_CHARS

BOUND = BATCH * ROW_CHARS + PARTIAL_CHARS


def test_a_subscription_holds_a_batch_however_long_the_json_reply(engine_factory) -> None:
    engine = engine_factory(seed=1)
    iid, n = write_long(engine, 4 << 20)  # (512 rows, 8 batches)

    async def read(cursor: str, upto: int) -> tuple[list[Any], int]:
        sub, seen, most = events(engine.store, iid, cursor), [], 0
        async for ev in sub:
            most = max(most, sub.held)
            seen.append(ev)
            if ev.offset >= upto:
                break
        await sub.aclose()
        return seen, most
    whole, most = asyncio.run(read("0", n))
    assert [e.kind for e in whole[:2]] == ["open", "chunk"] and whole[-1].offset == n
    assert 0 < most <= BOUND  # (it held the whole reply: 4 MiB)
    assert isinstance(whole[1].partial, dict) and whole[-1].partial is None
    late, most = asyncio.run(read(f"{n - 2}:0", n))
    assert late == whole[n - 2:]  # exactly the events after the cursor
    assert 0 < most <= BOUND
