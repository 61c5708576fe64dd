"""Streaming on the real embedded model (issue 22): llama.cpp's tokens reach the step and
the stream log as it generates them, through the model's child server (Server-Sent
Events)."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from typing import Any

import pytest
from conftest import MACHINES, license_files
from llm_fixtures import qwen_path  # noqa: F401  (fixture)

from fsm_engine import Engine
from fsm_engine.llm.base import Piece, Provider
from fsm_engine.llm.local import LocalLlama

sys.path.insert(0, str(MACHINES.parent))
from machines.moderation import SYSTEM  # noqa: E402

pytestmark = [pytest.mark.model, pytest.mark.slow]


class Counting(Provider):
    """``inner``, counting the pieces of each streamed call (``pieces``)."""

    def __init__(self, inner: LocalLlama) -> None:
        self.inner, self.name = inner, inner.name
        self.pieces: list[int] = []

    @property
    def model(self) -> str:  # type: ignore[override]
        return self.inner.model

    async def complete(self, messages: Any, **kwargs: Any) -> Any:
        return await self.inner.complete(messages, **kwargs)

    async def stream(self, messages: Any, **kwargs: Any) -> AsyncIterator[Piece]:  # type: ignore[override]
        at = len(self.pieces)  # this call's counter (calls may overlap)
        self.pieces.append(0)
        async for piece in self.inner.stream(messages, **kwargs):
            self.pieces[at] += 1 if isinstance(piece, str) else len(piece) \
                if isinstance(piece, list) else 0  # (a list: the pieces of one read)
            yield piece

    async def count_tokens(self, messages: Any) -> int:  # type: ignore[override]
        return await self.inner.count_tokens(messages)

    async def aclose(self) -> None:
        await self.inner.aclose()


def test_the_embedded_model_streams_a_moderation_answer_in_pieces(qwen_path: str,  # noqa: F811
                                                                   db_path: str) -> None:
    llm = Counting(LocalLlama(qwen_path))
    engine = Engine(db_path, llm=llm, seed=7)
    try:
        iid = engine.start(str(MACHINES / "moderation.py"), {"path": license_files()[0]})
        rec = asyncio.run(engine.run(iid))
        assert rec.final
        assert llm.pieces and llm.pieces[0] >= 5, llm.pieces  # token by token, not at the end
        infer = next(h for h in engine.store.history(iid) if h.source == "infer")
        reply = infer.detail["llm_calls"][0]["reply"]
        first = [r for r in engine.store.stream_read(iid) if (r.seq, r.attempt) == (infer.seq, 1)]
        chunks = [r for r in first if r.kind == "chunk"]
        assert "".join(r.text for r in chunks) == reply  # the log holds what the history keeps
        assert first[0].info == {"json": True} and first[-1].kind == "end"
        assert len(chunks) >= 2  # written while generated (batched every 20 ms), not at once
    finally:
        engine.close()
        asyncio.run(llm.aclose())


def test_instances_streaming_at_once_each_get_their_whole_answer(qwen_path: str,  # noqa: F811
                                                                 db_path: str) -> None:
    """Two instances at once on one embedded model: while one streams, the other's budget
    check asks the child to count tokens.  llama_cpp.server interrupts a streaming
    generation when another request arrives (``interrupt_requests``, on by default): the
    streamed reply ended empty, and the main job's verdicts went to the re-ask and the
    constrained decoding.  The child runs with it off: every answer is whole."""
    llm = Counting(LocalLlama(qwen_path))
    engine = Engine(db_path, llm=llm, seed=7, concurrency=2)
    try:
        ids = [engine.start(str(MACHINES / "moderation.py"), {"path": p})
               for p in license_files()[:3]]
        records = asyncio.run(engine.run_many(ids))
        assert [r.context["verdict_source"] for r in records] == ["model"] * 3
        assert len(llm.pieces) == 3 and min(llm.pieces) >= 5, llm.pieces
        for rec in records:  # billed by the model's tokenizer, not the client's estimate
            call = next(c for h in engine.store.history(rec.id) if h.source == "infer"
                        for c in h.detail["llm_calls"])
            messages = [{"role": "system", "content": SYSTEM}, {
                "role": "user", "content": f"Text to moderate:\n\n{rec.context['text']}"
                                           "\n\nJSON verdict:"}]
            counted = asyncio.run(llm.inner.count_tokens(messages))
            assert call["prompt_tokens"] == counted, (call["prompt_tokens"], counted)
    finally:
        engine.close()
        asyncio.run(llm.aclose())
