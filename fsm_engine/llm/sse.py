"""The Server-Sent Events of one streamed chat completion (OpenAI's ``stream: true``),
read line by line: hostile input, so every ``data:`` line is strict JSON whose shapes are
checked, and a line that never ends is refused rather than grown."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from pydantic_core import from_json

from fsm_engine import json_input
from fsm_engine.errors import InvalidInput, ServerError
from fsm_engine.llm.tool_deltas import ToolDeltas
from fsm_engine.redaction import redact

__all__ = ["SseEvents", "MAX_EVENT_CHARS", "DRAIN_CHARS", "DRAIN_S", "drain"]

#: Longest line of a streamed reply's events (characters).
MAX_EVENT_CHARS = 1 << 20
#: What is read of a body after its ``[DONE]`` (the chunked body's end, usually in the same
#: packet), so the connection goes back to the pool instead of being closed: at most
#: these characters, within these seconds (more, or later: the connection is dropped).
DRAIN_CHARS, DRAIN_S = 65_536, 0.1


class SseEvents:
    """What the Server-Sent Events of one streamed reply said: its pieces, usage, finish
    reason, model and tool calls (``tools``, ``llm.tool_deltas``: their pieces shown as the
    agent protocol's text; text after the first call is kept, not shown).  Each ``data:``
    line is strict JSON read here (hostile: shapes are checked); ``data: [DONE]`` ends it
    (``done``); an event holding ``error`` raises ``ServerError`` naming ``where``."""

    def __init__(self, where: str) -> None:
        self.where = where
        self.parts: list[str] = []
        self.prompt: int | None = None
        self.completion: int | None = None
        self.finish: str | None = None
        self.model: str | None = None
        self.done = False
        #: The reply's tool calls (``delta.tool_calls``), once one came.
        self.tools: ToolDeltas | None = None

    async def read(self, texts: AsyncIterator[str]) -> AsyncIterator[list[str]]:
        """The pieces each received stretch of the body adds, until ``[DONE]`` (then what
        is left of the body is read, ``drain``) or its end."""
        tail = ""
        async for text in texts:
            *lines, tail = (tail + text).split("\n")
            if len(tail) > MAX_EVENT_CHARS:  # (a line that never ends: refused, not grown)
                raise ServerError(f"{self.where} sent an event over {MAX_EVENT_CHARS:,} "
                                  "characters")
            yield [p for p in map(self.line, lines) if p]
            if self.done:
                await drain(texts)
                return
        yield [p for p in [self.line(tail)] if p]

    def line(self, line: str) -> str:
        """Note one line of the stream; the text it adds (``""``: none)."""
        if not line.startswith("data:"):
            return ""  # a comment, an ``event:``/``id:`` field, the blank between events
        data = line[5:].strip()  # (a CR before the line's end too)
        if data == "[DONE]":
            self.done = True
            return ""
        try:  # strict JSON: pydantic-core's parser, ~1 µs an event less than ``json``'s
            event = from_json(data)
        except ValueError:  # (it refuses lone surrogates: ``json``, as before, decides)
            try:
                event = json_input.parse(data, "event")
            except InvalidInput:
                raise ServerError(f"{self.where} sent an event that is not JSON") from None
        if type(event) is not dict:
            return ""
        if event.get("error") is not None:
            raise ServerError(f"{self.where} failed mid-stream: "
                              f"{redact(str(event['error']))[:300]}")
        return self.take(event)

    def take(self, event: dict[str, Any]) -> str:
        """Note one event; the text it adds (``""``: none).  (Parsed JSON holds plain
        ``dict``/``list``/``str``/``int``: its types are compared exactly.)"""
        usage = event.get("usage")
        if type(usage) is dict:
            prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
            if type(prompt) is int and type(completion) is int:
                self.prompt, self.completion = prompt, completion
        model = event.get("model")
        if type(model) is str:
            self.model = model
        choices = event.get("choices")
        if type(choices) is not list or not choices or type(first := choices[0]) is not dict:
            return ""
        finish = first.get("finish_reason")
        if type(finish) is str:
            self.finish = finish
        delta = first.get("delta")
        if type(delta) is not dict:
            return ""
        piece = delta.get("content")
        if type(piece) is str and piece:
            self.parts.append(piece)
            return piece if self.tools is None else ""  # (not inside the calls' text)
        calls = delta.get("tool_calls")
        if calls is None:
            return ""
        if self.tools is None:
            self.tools = ToolDeltas(self.where)
        return self.tools.take(calls, bool(self.parts))


async def drain(texts: AsyncIterator[str]) -> None:
    """Read ``texts`` to its end, ignored, so its connection can be reused — giving up
    (never raising) past ``DRAIN_CHARS`` characters or ``DRAIN_S`` seconds: the reply is
    whole already, a server that goes on only loses its connection."""
    left = DRAIN_CHARS
    with contextlib.suppress(Exception):
        async with asyncio.timeout(DRAIN_S):
            async for text in texts:
                left -= len(text)
                if left < 0:
                    return
