"""The Server-Sent Events of one streamed chat completion (OpenAI's ``stream: true``),
read line by line: hostile input, so every ``data:`` line is strict JSON whose shapes are
checked, and a line that never ends is refused rather than grown."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from fsm_engine.errors import ServerError
from fsm_engine.redaction import redact

__all__ = ["SseEvents", "MAX_EVENT_CHARS"]

#: Longest line of a streamed reply's events (characters).
MAX_EVENT_CHARS = 1 << 20


class SseEvents:
    """What the Server-Sent Events of one streamed reply said: its pieces, usage, finish
    reason and model.  Each ``data:`` line is strict JSON read here (hostile: shapes are
    checked); ``data: [DONE]`` ends it (``done``); an event holding ``error`` raises
    ``ServerError`` naming ``where``."""

    def __init__(self, where: str) -> None:
        self.where = where
        self.parts: list[str] = []
        self.prompt: int | None = None
        self.completion: int | None = None
        self.finish: str | None = None
        self.model: str | None = None
        self.done = False

    async def read(self, texts: AsyncIterator[str]) -> AsyncIterator[list[str]]:
        """The pieces each received stretch of the body adds, until ``[DONE]`` or its end."""
        tail = ""
        async for text in texts:
            *lines, tail = (tail + text).split("\n")
            if len(tail) > MAX_EVENT_CHARS:  # (a line that never ends: refused, not grown)
                raise ServerError(f"{self.where} sent an event over {MAX_EVENT_CHARS:,} "
                                  "characters")
            yield [p for p in map(self.line, lines) if p]
            if self.done:
                return
        yield [p for p in [self.line(tail)] if p]

    def line(self, line: str) -> str:
        """Note one line of the stream; the text it adds (``""``: none)."""
        line = line.rstrip("\r")
        if not line.startswith("data:"):
            return ""  # a comment, an ``event:``/``id:`` field, the blank between events
        data = line[5:].strip()
        if data == "[DONE]":
            self.done = True
            return ""
        try:
            event = json.loads(data)
        except ValueError:
            raise ServerError(f"{self.where} sent an event that is not JSON") from None
        if not isinstance(event, dict):
            return ""
        if event.get("error") is not None:
            raise ServerError(f"{self.where} failed mid-stream: "
                              f"{redact(str(event['error']))[:300]}")
        return self.take(event)

    def take(self, event: dict[str, Any]) -> str:
        """Note one event; the text it adds (``""``: none)."""
        usage = event.get("usage")
        if isinstance(usage, dict):
            prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
            if type(prompt) is int and type(completion) is int:
                self.prompt, self.completion = prompt, completion
        if isinstance(event.get("model"), str):
            self.model = event["model"]
        choices = event.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            return ""
        if isinstance(choices[0].get("finish_reason"), str):
            self.finish = choices[0]["finish_reason"]
        delta = choices[0].get("delta")
        piece = delta.get("content") if isinstance(delta, dict) else None
        if isinstance(piece, str) and piece:
            self.parts.append(piece)
            return piece
        return ""
