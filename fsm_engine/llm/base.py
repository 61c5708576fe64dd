"""The provider interface: one async call that turns chat messages into a :class:`Completion`,
and the same call as it is generated (``Provider.stream``: text pieces, then the completion).

A provider raises only :class:`fsm_engine.errors.ProviderError` subclasses for
call failures (``ProviderUnavailable``, ``ProviderTimeout``, ``RateLimited``,
``ServerError``, ``ClientError``); each carries the tokens billed before the
failure so token budgets stay exact.
"""

from __future__ import annotations

import contextvars
import inspect
import math
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

__all__ = ["Completion", "Provider", "Message", "JsonSchema", "CALLER_INPUT", "estimate_tokens",
           "accepts_timeout", "estimate_prompt_tokens", "BYTES_PER_TOKEN", "MESSAGE_OVERHEAD",
           "Piece"]

CALLER_INPUT: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
    "fsm_caller_input", default=None)
"""The input of the instance whose step is making the current model call (set by the
runtime around each call; ``None`` outside a step).  Only test providers read it: the
scripted provider keys replies by it, so concurrent instances get their own replies."""

#: The documented conservative estimate: one token per 3 bytes of UTF-8.  BPE tokenizers
#: (GPT, Llama, Gemma) average about 4 characters per token on English and about one per
#: CJK character (3 bytes), so this over-counts English by about a third and CJK slightly:
#: a budget checked with it refuses a call early rather than late.
BYTES_PER_TOKEN = 3
#: Tokens a chat template adds per message (role markers, separators), and per prompt
#: (the assistant's opening), after OpenAI's published count for chat models (3–4).
MESSAGE_OVERHEAD = 4


def accepts_timeout(provider: Any) -> bool:
    """True when ``provider.complete`` takes a ``timeout`` keyword (seconds for this call)."""
    fn = getattr(provider, "complete", None)
    try:
        params = inspect.signature(fn).parameters.values() if fn is not None else ()
    except (TypeError, ValueError):
        return False
    return any(p.name == "timeout" or p.kind is p.VAR_KEYWORD for p in params)


def estimate_tokens(text: str) -> int:
    """Conservative token count of ``text`` (``BYTES_PER_TOKEN``); 0 for ``""``."""
    return math.ceil(len(text.encode("utf-8", "surrogatepass")) / BYTES_PER_TOKEN)


def estimate_prompt_tokens(messages: list[Message]) -> int:
    """Conservative token count of a chat prompt: every message's role and content plus
    ``MESSAGE_OVERHEAD`` per message and once for the reply's opening."""
    return MESSAGE_OVERHEAD + sum(
        MESSAGE_OVERHEAD + estimate_tokens(str(m.get("content") or ""))
        + estimate_tokens(str(m.get("role") or "")) for m in messages)

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
    ``usage_missing`` is True when the provider reported no usage and the counts
    are estimates (its tokenizer, else :func:`estimate_tokens`), never a silent 0.
    """

    text: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str
    model: str
    usage_missing: bool = False

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
    """An LLM that completes chat messages: the one contract every provider implements
    (``openai_compat.OpenAICompatible``, ``local.LocalLlama``, ``scripted.Scripted``,
    ``faults.FaultInjector``) and every model-call layer (``runtime.calls``) wraps.

    ``name`` is the provider kind (``"openai"``, ``"local"``, ``"scripted"``),
    ``model`` the model id.  ``complete`` may also take ``timeout`` (seconds for this
    call): the engine then passes what is left of the calling step's timeout
    (:func:`accepts_timeout` tells).  Implementations may subclass this protocol to
    inherit the default :meth:`count_tokens` and the no-op :meth:`aclose`.
    """

    name: str
    model: str

    async def complete(self, messages: list[Message], *, max_tokens: int = 256,
                       temperature: float = 0.0, json_schema: JsonSchema | None = None,
                       stop: list[str] | None = None) -> Completion:
        """Complete ``messages`` with at most ``max_tokens`` new tokens.

        ``json_schema`` requests schema-constrained decoding where the provider
        supports it (others ignore it); ``stop`` lists stop sequences.  A
        provider whose ``complete`` also takes ``timeout`` (seconds) is passed
        what is left of the calling step's timeout.
        Raises a :class:`~fsm_engine.errors.ProviderError` subclass on failure.
        """
        ...

    def stream(self, messages: list[Message], *, max_tokens: int = 256,
               temperature: float = 0.0, json_schema: JsonSchema | None = None,
               stop: list[str] | None = None) -> AsyncIterator[Piece]:
        """``complete`` as it is generated: an async iterator of the reply's text pieces
        (``str``; or a ``list`` of ``str``, pieces that reached the process together, such
        as the events of one network read; in order, joined they are the reply) ending
        with its ``Completion`` (whole text, usage), the last item.  Same keywords and
        errors as ``complete``; an error may come after some pieces (the reply was cut).
        The default yields the whole reply of ``complete`` as one piece (a provider that
        cannot stream)."""
        return _whole(self, messages, {"max_tokens": max_tokens, "temperature": temperature,
                                       "json_schema": json_schema, "stop": stop})

    def count_tokens(self, messages: list[Message]) -> int | Awaitable[int]:
        """Tokens ``messages`` take as a prompt, counted before a call to check the token
        budget.  The default is the conservative :func:`estimate_prompt_tokens`; a
        provider with a tokenizer overrides it (it may be ``async def``).  Optional:
        the engine estimates for a provider that does not define it."""
        return estimate_prompt_tokens(messages)

    async def aclose(self) -> None:
        """Release connections, threads or model memory; a no-op by default."""
        return None


Piece = str | list[str] | Completion
"""What ``Provider.stream`` yields: text pieces (``str``, or a ``list`` of the pieces that
arrived together: the engine hands such a list on in one step, not one async-iteration
step per piece), then the ``Completion``."""


async def _whole(provider: Provider, messages: list[Message],
                 kwargs: dict[str, Any]) -> AsyncIterator[Piece]:
    """``provider.complete`` as a stream of one piece and its completion."""
    out = await provider.complete(messages, **kwargs)
    if out.text:
        yield out.text
    yield out
