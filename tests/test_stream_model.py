"""Streaming on the real embedded model (issue 22): llama.cpp's tokens reach the stream log
as it generates them, through the model's child server (Server-Sent Events)."""

from __future__ import annotations

import asyncio

import pytest
from conftest import MACHINES, license_files
from llm_fixtures import qwen_path  # noqa: F401  (fixture)

from fsm_engine import Engine
from fsm_engine.llm.local import LocalLlama

pytestmark = [pytest.mark.model, pytest.mark.slow]


def test_the_embedded_model_streams_a_moderation_answer_in_pieces(qwen_path: str,  # noqa: F811
                                                                   db_path: str) -> None:
    llm = LocalLlama(qwen_path)

    async def pieces() -> tuple[list[str], str]:
        reply = llm.stream([{"role": "user", "content": "Say hello in five words."}],
                           max_tokens=24)
        got = [p async for p in reply if isinstance(p, str)]
        return got, "".join(got)
    got, text = asyncio.run(pieces())
    assert len(got) >= 5 and text.strip()  # token by token, not one reply at the end
    engine = Engine(db_path, llm=llm, seed=7)
    try:
        iid = engine.start(str(MACHINES / "moderation.py"), {"path": license_files()[0]})
        rec = asyncio.run(engine.run(iid))
        assert rec.final
        infer = next(h for h in engine.store.history(iid) if h.source == "infer")
        reply = infer.detail["llm_calls"][0]["reply"]
        log = engine.store.stream_read(iid)
        first = [r for r in log if (r.seq, r.attempt) == (infer.seq, 1)]
        chunks = [r for r in first if r.kind == "chunk"]
        assert "".join(r.text for r in chunks) == reply
        assert first[-1].kind == "end" and first[0].info == {"json": True}
        # llama.cpp emits about a token per piece; the writes batch them every 20 ms, so
        # the count of rows is a floor: the pieces themselves were each seen by the step
        pieces_seen = infer.detail["llm_calls"][0]["completion_tokens"]
        assert pieces_seen >= 5, infer.detail["llm_calls"][0]
        assert len(chunks) >= 2  # written while generated, not at the end in one row
    finally:
        engine.close()
        asyncio.run(llm.aclose())
