"""Fault injection: wrap any provider and make a chosen share of its calls fail or misbehave.

Per call at most one fault is drawn (rates are probabilities that sum to <= 1):

==========  ==================================================  ===============
kind        effect                                              usage reported
==========  ==================================================  ===============
timeout     sleep ``timeout_s``, raise ProviderTimeout          0 (inner not called)
hang        sleep ``hang_s``, then answer normally; the          inner's
            engine's state timeout is meant to cut it
http429     raise RateLimited, ``retry_after`` drawn from        0 (inner not called)
            the ``retry_after`` range (seconds)
http500     call inner, then raise ServerError (a gateway        inner's, on the error
            failing after the model ran: usage was billed)
malformed   inner's text turned into invalid JSON                inner's
fenced      inner's text wrapped in a ```json fence with prose   inner's
truncated   first half of inner's text, finish_reason "length"  inner's
huge        inner's text padded to ``huge_bytes`` bytes          inner's
==========  ==================================================  ===============

Counters (``calls``, ``faults``, ``prompt_tokens``, ``completion_tokens``)
add up every token reported to callers, through completions and through
errors alike, so tests can check that instances recorded exactly that usage.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random
import threading
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

from fsm_engine.errors import InvalidInput, ProviderError, ProviderTimeout, RateLimited, ServerError
from fsm_engine.llm.base import (
    Completion,
    JsonSchema,
    Message,
    Piece,
    Provider,
    accepts_timeout,
)

__all__ = ["FaultInjector", "parse_fault_spec", "FAULT_KINDS", "mangle_json"]

FAULT_KINDS = ("timeout", "hang", "http429", "http500", "malformed", "fenced",
               "truncated", "huge")
#: The faults that change the reply's text (a streamed call then answers whole).
_DISTORTIONS = frozenset({"malformed", "fenced", "truncated", "huge"})


def parse_fault_spec(spec: str | None) -> dict[str, float]:
    """Parse ``"timeout=0.1,hang=0.05"`` into ``{"timeout": 0.1, "hang": 0.05}``.

    Rates are probabilities per call in [0, 1] summing to <= 1.  An empty or
    None spec gives ``{}``.  Raises InvalidInput (one line) on an unknown
    kind, a repeated kind, a bad rate or a sum above 1.
    """
    rates: dict[str, float] = {}
    for item in (spec or "").split(","):
        if not item.strip():
            continue
        kind, sep, value = (part.strip() for part in item.partition("="))
        if kind not in FAULT_KINDS:
            raise InvalidInput(f"unknown fault {kind!r} in {spec!r}; "
                               f"expected kind=rate with kind one of {', '.join(FAULT_KINDS)}")
        if kind in rates:
            raise InvalidInput(f"fault {kind!r} given twice in {spec!r}")
        try:
            rates[kind] = float(value) if sep else float("nan")
        except ValueError:
            rates[kind] = float("nan")
    return _check_rates(rates, spec)


def _check_rates(rates: dict[str, float], spec: object) -> dict[str, float]:
    checked: dict[str, float] = {}
    for kind, rate in rates.items():
        if kind not in FAULT_KINDS:
            raise InvalidInput(f"unknown fault {kind!r}; expected one of {', '.join(FAULT_KINDS)}")
        ok = isinstance(rate, (int, float)) and not isinstance(rate, bool) and 0 <= rate <= 1
        if not ok:  # also rejects NaN
            raise InvalidInput(f"fault {kind!r} in {spec!r} needs a rate between 0 and 1")
        checked[kind] = float(rate)
    if sum(checked.values()) > 1.0 + 1e-9:
        raise InvalidInput(f"fault rates in {spec!r} sum to {sum(checked.values()):g}, above 1")
    return checked


def mangle_json(text: str) -> str:
    """Return ``text`` as JSON that no strict parser accepts (a comma before the closing bracket).

    Prose is first wrapped as ``{"text": ...}`` so the result always looks like broken JSON.
    """
    body = text.strip()
    if not body.startswith(("{", "[")):
        body = json.dumps({"text": body})
    return body[:-1].rstrip() + ", " + body[-1]


def _fence(text: str) -> str:
    return f"Sure! Here is the JSON you asked for:\n```json\n{text}\n```\nHope this helps."


def _pad(text: str, size: int) -> str:
    filler = " lorem ipsum dolor sit amet"
    missing = max(0, size - len(text.encode("utf-8")))
    return text + (filler * (missing // len(filler) + 1))[:missing]


class FaultInjector(Provider):
    """Wrap ``inner`` and inject faults at ``rates`` (see the module docstring).

    ``seed`` makes the fault sequence reproducible.  Times are seconds:
    ``timeout_s`` is the sleep before a ProviderTimeout, ``hang_s`` the sleep
    of a hang, ``retry_after`` the (low, high) range of RateLimited.retry_after.
    ``huge_bytes`` is the size of a ``huge`` reply.  Raises InvalidInput on
    bad rates.
    """

    def __init__(self, inner: Provider, rates: dict[str, float], seed: int | None = None, *,
                 hang_s: float = 30.0, timeout_s: float = 0.05,
                 retry_after: tuple[float, float] = (0.01, 0.05),
                 huge_bytes: int = 200 * 1024) -> None:
        self.inner = inner
        self.rates = _check_rates(rates, rates)
        # its own breaker: injected faults say nothing about the real provider's health
        self.name = f"faults+{inner.name}"
        self.hang_s, self.timeout_s = hang_s, timeout_s
        self.retry_after, self.huge_bytes = retry_after, huge_bytes
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self.calls = 0
        self.faults: Counter[str] = Counter()
        self.prompt_tokens = 0
        self.completion_tokens = 0

    def __repr__(self) -> str:
        return f"FaultInjector({self.inner!r}, {self.rates!r})"

    @property
    def model(self) -> str:  # type: ignore[override]
        """The wrapped provider's model (which it may learn only at its first call)."""
        return self.inner.model

    @property
    def total_tokens(self) -> int:
        """All tokens reported to callers so far (completions and errors)."""
        return self.prompt_tokens + self.completion_tokens

    def _draw(self) -> tuple[str | None, float]:
        """Count the call and pick its fault (or None) and a retry_after value."""
        with self._lock:
            self.calls += 1
            roll, retry = self._rng.random(), self._rng.uniform(*self.retry_after)
            for kind, rate in self.rates.items():
                if roll < rate:
                    self.faults[kind] += 1
                    return kind, retry
                roll -= rate
        return None, retry

    def _bill(self, prompt: int, completion: int) -> None:
        with self._lock:
            self.prompt_tokens += prompt
            self.completion_tokens += completion

    async def complete(self, messages: list[Message], *, max_tokens: int = 256,
                       temperature: float = 0.0, json_schema: JsonSchema | None = None,
                       stop: list[str] | None = None, timeout: float | None = None
                       ) -> Completion:
        """Call ``inner`` unless the drawn fault prevents it, then apply the fault.

        Raises ProviderTimeout, RateLimited or ServerError for those faults and
        passes on whatever ProviderError ``inner`` raises.
        """
        kind, retry = self._draw()
        kwargs: dict[str, Any] = {"max_tokens": max_tokens, "temperature": temperature,
                                  "json_schema": json_schema, "stop": stop}
        return await self._answer(kind, retry, messages, kwargs, timeout)

    async def _answer(self, kind: str | None, retry: float, messages: list[Message],
                      kwargs: dict[str, Any], timeout: float | None) -> Completion:
        """``complete`` once its fault is drawn."""
        await self._before(kind, retry)
        try:
            done = await self.inner.complete(messages, **kwargs, **self._timed(timeout))
        except ProviderError as exc:
            self._bill(exc.prompt_tokens, exc.completion_tokens)
            raise
        self._bill(done.prompt_tokens, done.completion_tokens)
        self._after(kind, done)
        return self._distort(kind, done)

    async def _before(self, kind: str | None, retry: float) -> None:
        """The faults that strike before ``inner`` is called (timeout, http429, hang)."""
        if kind == "timeout":
            await asyncio.sleep(self.timeout_s)
            raise ProviderTimeout(f"injected timeout after {self.timeout_s:g}s")
        if kind == "http429":
            raise RateLimited("injected HTTP 429", status=429, retry_after=retry)
        if kind == "hang":
            await asyncio.sleep(self.hang_s)

    @staticmethod
    def _after(kind: str | None, done: Completion) -> None:
        """The fault that strikes after the model ran (http500: its usage billed)."""
        if kind == "http500":
            raise ServerError("injected HTTP 500 after the model ran", status=500,
                              prompt_tokens=done.prompt_tokens,
                              completion_tokens=done.completion_tokens)

    def _timed(self, timeout: float | None) -> dict[str, Any]:
        """``timeout=`` for ``inner`` when it takes one."""
        return {"timeout": timeout} if timeout is not None and accepts_timeout(self.inner) else {}

    async def stream(self, messages: list[Message], *, max_tokens: int = 256,
                     temperature: float = 0.0, json_schema: JsonSchema | None = None,
                     stop: list[str] | None = None, timeout: float | None = None
                     ) -> AsyncIterator[Piece]:
        """``inner.stream`` under the faults of ``complete``: timeout, http429 and hang
        strike before the call, http500 after the pieces (the error comes instead of the
        completion: a reply cut at its end); a distortion (malformed, fenced, truncated,
        huge) answers whole, as ``complete``, in one piece (its text is not the model's
        pieces), as does an ``inner`` that cannot stream."""
        kind, retry = self._draw()
        kwargs: dict[str, Any] = {"max_tokens": max_tokens, "temperature": temperature,
                                  "json_schema": json_schema, "stop": stop}
        if kind in _DISTORTIONS or type(self.inner).stream is Provider.stream:
            whole = await self._answer(kind, retry, messages, kwargs, timeout)
            if whole.text:
                yield whole.text
            yield whole
            return
        await self._before(kind, retry)
        done: Completion | None = None
        try:
            async for piece in self.inner.stream(messages, **kwargs, **self._timed(timeout)):
                if isinstance(piece, Completion):
                    done = piece
                else:
                    yield piece
        except ProviderError as exc:
            self._bill(exc.prompt_tokens, exc.completion_tokens)
            raise
        if done is None:
            raise ServerError(f"the stream of model {self.model!r} ended without its reply")
        self._bill(done.prompt_tokens, done.completion_tokens)
        self._after(kind, done)
        yield done

    def _distort(self, kind: str | None, done: Completion) -> Completion:
        text = done.text
        if kind == "malformed":
            return dataclasses.replace(done, text=mangle_json(text))
        if kind == "fenced":
            return dataclasses.replace(done, text=_fence(text))
        if kind == "truncated":
            return dataclasses.replace(done, text=text[: len(text) // 2], finish_reason="length")
        if kind == "huge":
            return dataclasses.replace(done, text=_pad(text, self.huge_bytes))
        return done

    def count_tokens(self, messages: list[Message]) -> Any:
        """The wrapped provider's count (its tokenizer, or the estimate)."""
        count = getattr(self.inner, "count_tokens", None)
        return count(messages) if count is not None else super().count_tokens(messages)

    async def aclose(self) -> None:
        """Close the wrapped provider."""
        await self.inner.aclose()
