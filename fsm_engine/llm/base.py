"""The provider interface: one async call that turns chat messages into a :class:`Completion`.

A provider raises only :class:`fsm_engine.errors.ProviderError` subclasses for
call failures (``ProviderUnavailable``, ``ProviderTimeout``, ``RateLimited``,
``ServerError``, ``ClientError``); each carries the tokens billed before the
failure so token budgets stay exact.
"""

from __future__ import annotations

import contextvars
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

__all__ = ["Completion", "Provider", "Message", "JsonSchema", "CALLER_INPUT"]

CALLER_INPUT: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
    "fsm_caller_input", default=None)
"""The input of the instance whose step is making the current model call (set by the
runtime around each call; ``None`` outside a step).  Only test providers read it: the
scripted provider keys replies by it, so concurrent instances get their own replies."""

Message = dict[str, str]
"""One OpenAI-style chat message: ``{"role": "system"|"user"|"assistant", "content": str}``."""

JsonSchema = dict[str, Any]
"""A JSON Schema document (draft 2020-12 subset the provider understands)."""


@dataclass(frozen=True, slots=True)
class Completion:
    """The result of one provider call.

    ``prompt_tokens``/``completion_tokens`` are the usage the provider billed
    (tokens); ``finish_reason`` is ``"stop"`` (natural end or stop sequence),
    ``"length"`` (cut at ``max_tokens``) or whatever else the provider reports.
    """

    text: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str
    model: str

    @property
    def total_tokens(self) -> int:
        """Prompt plus completion tokens."""
        return self.prompt_tokens + self.completion_tokens

    @property
    def truncated(self) -> bool:
        """True when the text was cut at ``max_tokens`` (``finish_reason == "length"``)."""
        return self.finish_reason == "length"


@runtime_checkable
class Provider(Protocol):
    """An LLM that completes chat messages.

    ``name`` is the provider kind (``"openai"``, ``"local"``, ``"scripted"``),
    ``model`` the model id.  Implementations may subclass this protocol to
    inherit the no-op :meth:`aclose`.
    """

    name: str
    model: str

    async def complete(self, messages: list[Message], *, max_tokens: int = 256,
                       temperature: float = 0.0, json_schema: JsonSchema | None = None,
                       stop: list[str] | None = None) -> Completion:
        """Complete ``messages`` with at most ``max_tokens`` new tokens.

        ``json_schema`` requests schema-constrained decoding where the provider
        supports it (others ignore it); ``stop`` lists stop sequences.
        Raises a :class:`~fsm_engine.errors.ProviderError` subclass on failure.
        """
        ...

    async def aclose(self) -> None:
        """Release connections, threads or model memory; a no-op by default."""
        return None
