"""What an action sees besides its context: the ``Step`` handle and its metered LLM."""

from __future__ import annotations

import asyncio
import inspect
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, TypeVar

from ..definition.spec import RunInfo
from ..errors import BudgetExhausted, FsmError, ProviderError, RateLimitWait, StructuredOutputError
from ..llm.base import accepts_timeout, estimate_prompt_tokens

if TYPE_CHECKING:
    from ..definition.spec import State
    from ..llm.base import Completion, Provider
    from ..store.records import InstanceRecord
    from .breaker import Breaker
    from .rates import RateLimiter

T = TypeVar("T")
log = logging.getLogger("fsm_engine")


class MeteredLLM:
    """A provider wrapper bound to one step: enforces the token budgets, counts usage.

    ``used`` is the tokens (prompt + completion) this step has been billed,
    including calls that failed after the provider billed them.  Two budgets
    may apply: the instance's (``tokens_left`` of ``budget``) and the state's
    per-visit one (``state_left`` of ``state_budget``).  Before a call its
    prompt is counted (the provider's ``count_tokens``: its tokenizer, else the
    conservative estimate of ``fsm_engine.llm.base``); a call whose prompt alone
    does not fit what is left of either budget is refused with
    ``BudgetExhausted`` and costs 0 tokens, and a call that starts has its
    ``max_tokens`` cut to what is left after the prompt.  A reply billed above
    what was left (the provider counted more than estimated) is kept and
    recorded with ``budget_overrun`` in its ``llm_calls`` entry; the next call
    is refused.  When a circuit breaker is attached, an open breaker raises
    ``CircuitOpen`` before any call is made; when the model has a shared rate
    limit (``rates``), a call that does not fit it raises ``RateLimitWait`` before
    any call is made, and one that does is charged what the provider billed.
    """

    def __init__(self, provider: "Provider | None", *, tokens_left: int | None,
                 budget: int | None, breaker: "Breaker | None" = None,
                 loop: asyncio.AbstractEventLoop | None = None,
                 state_left: int | None = None, state_budget: int | None = None) -> None:
        self.provider = provider
        self.tokens_left = tokens_left
        self.budget = budget
        self.state_left = state_left
        self.state_budget = state_budget
        self.breaker = breaker
        self.used = 0
        self.reasks = 0
        self.loops_left = 1 << 30
        #: What ``structured`` saw: raw text, repairs, validation errors (for the history).
        self.outputs: list[dict[str, Any]] = []
        self.calls: list[dict[str, Any]] = []
        #: (provider, breaker) answering ``structured``'s re-asks; None: this one.
        self.repair: "tuple[Provider, Breaker | None] | None" = None
        #: ``loop.time()`` when the step's timeout fires (set by the driver), passed to a
        #: provider that takes ``timeout`` as the seconds left.
        self.deadline: float | None = None
        self._loop = loop
        #: True while an ``inline`` sync action runs on the loop (``complete_sync`` refuses).
        self.on_loop = False
        #: OpenTelemetry tracer and parent context (set by the driver when tracing is on).
        self.tracer: Any = None
        self.trace_parent: Any = None
        #: The state's reply cache (``runtime.reply_cache``), or None.
        self.cache: Any = None
        #: A fork's original's recorded replies (``fsm fork --reuse-llm``), or None.
        self.recorded: Any = None
        #: The instance's input, visible to providers as ``llm.base.CALLER_INPUT``.
        self.caller_input: dict[str, Any] | None = None
        #: ``provider -> RateLimiter | None`` (``Models.limiter``), or None: no rate limits.
        self.rates: "Callable[[Any], RateLimiter | None] | None" = None
        #: Set when a call found its rate limit full: the step then waits durably, whatever
        #: the action did with the ``RateLimitWait`` it raised.
        self.rate_wait: RateLimitWait | None = None

    def _limits(self) -> list[tuple[str, int, int]]:
        """(scope, tokens left before this step, budget) of each budget that applies."""
        out = []
        if self.tokens_left is not None:
            out.append(("instance", self.tokens_left, self.budget or 0))
        if self.state_left is not None:
            out.append(("state", self.state_left, self.state_budget or 0))
        return out

    def _room(self, limits: list[tuple[str, int, int]], prompt: int) -> int | None:
        """Completion tokens the budgets leave after a ``prompt``-token prompt (None: no
        budget); raises ``BudgetExhausted`` when a budget is spent or the prompt won't fit."""
        room = None
        for scope, left, budget in limits:
            free = left - self.used - prompt
            if self.used >= left or free < 1:
                raise BudgetExhausted(budget - left + self.used, budget, scope=scope,
                                      needed=prompt if self.used < left else 0)
            room = free if room is None else min(room, free)
        return room

    async def count_tokens(self, messages: list[dict[str, str]],
                           provider: "Provider | None" = None) -> int:
        """The prompt's tokens by the provider's ``count_tokens`` (sync or async; default:
        this step's provider), else (or when that fails) the conservative estimate."""
        count = getattr(provider or self.provider, "count_tokens", None)
        if count is not None:
            try:
                n = count(messages)
                n = await n if inspect.isawaitable(n) else n
                if isinstance(n, int) and n >= 0:
                    return n
            except Exception as exc:  # noqa: BLE001 - a tokenizer failure must not fail the call
                log.debug("count_tokens failed (%s); using the estimate", exc)
        return estimate_prompt_tokens(messages)

    async def _fit(self, limits: list[tuple[str, int, int]], counted: bool,
                   provider: "Provider", messages: list[dict[str, str]],
                   kwargs: dict[str, Any]) -> int:
        """The prompt's tokens (0 when neither a budget nor a rate limit needs them), with
        ``max_tokens`` cut to what the budgets leave; ``BudgetExhausted`` when none."""
        if not limits and not counted:
            return 0
        self._room(limits, 0)  # spent already: refuse before counting
        prompt = await self.count_tokens(messages, provider)
        room = self._room(limits, prompt)
        if room is not None:
            kwargs["max_tokens"] = max(1, min(int(kwargs.get("max_tokens", 256)), room))
        return prompt

    async def complete(self, messages: list[dict[str, str]], **kwargs: Any) -> "Completion":
        """Call the model (see ``Provider.complete``); raises ``BudgetExhausted``,
        ``CircuitOpen`` or the provider's ``ProviderError``."""
        return await self._complete(self.provider, self.breaker, messages, kwargs)

    async def _complete(self, provider: "Provider | None", breaker: "Breaker | None",
                        messages: list[dict[str, str]], kwargs: dict[str, Any]) -> "Completion":
        if provider is None:
            raise FsmError("this engine has no LLM provider configured")
        from .reply_cache import reply_key
        key = reply_key(provider, messages, kwargs)  # recorded with the reply: a fork finds it
        for source, mark in ((self.recorded, "replayed"), (self.cache, "cached")):
            hit = None if source is None else await _store_io(source.store, source.get, key)
            if hit is not None:  # answered from the store: no tokens, no breaker, no call
                call = self._bill(0, hit.finish_reason, None, provider, hit.model)
                call.update({mark: True, "key": key, "reply": hit.text})
                return hit
        limits = self._limits()
        limiter = self.rates(provider) if self.rates is not None else None
        prompt = await self._fit(limits, limiter is not None, provider, messages, kwargs)
        if self.deadline is not None and "timeout" not in kwargs and accepts_timeout(provider):
            kwargs["timeout"] = max(0.001, self.deadline - asyncio.get_running_loop().time())
        if breaker is not None:
            await breaker.before_call()
        ticket = None
        if limiter is not None:
            try:
                ticket = await _store_io(limiter.store, limiter.acquire,
                                         prompt + int(kwargs.get("max_tokens", 256)))
            except RateLimitWait as exc:
                self.rate_wait = exc
                raise
        try:
            from ..llm.base import CALLER_INPUT
            token = CALLER_INPUT.set(self.caller_input)
            try:
                if self.tracer is None:
                    out = await provider.complete(messages, **kwargs)
                else:
                    from ..telemetry import traced_call
                    out = await traced_call(self.tracer, self.trace_parent, provider.complete,
                                            provider, messages, kwargs)
            finally:
                CALLER_INPUT.reset(token)
        except ProviderError as exc:
            self._bill(exc.prompt_tokens + exc.completion_tokens, None, repr(exc), provider)
            if limiter is not None:
                await _store_io(limiter.store, limiter.settle, ticket,
                                exc.prompt_tokens + exc.completion_tokens)
            if breaker is not None and exc.retryable:
                await breaker.record(False)
            raise
        if limiter is not None:
            await _store_io(limiter.store, limiter.settle, ticket,
                            out.prompt_tokens + out.completion_tokens)
        call = self._bill(out.prompt_tokens + out.completion_tokens, out.finish_reason, None,
                          provider, out.model)
        call["key"], call["reply"] = key, out.text
        call["prompt_tokens"], call["completion_tokens"] = out.prompt_tokens, out.completion_tokens
        if out.usage_missing:
            call["usage_missing"] = True
        over = max((self.used - left for _, left, _ in limits), default=0)
        if over > 0:  # billed past what was left (calls start only within every budget)
            call.update(budget_overrun=True, overrun_tokens=over, prompt_estimate=prompt)
        if breaker is not None:
            await breaker.record(True)
        if self.cache is not None:
            await _store_io(self.cache.store, self.cache.put, key, provider, out)
        return out

    def complete_sync(self, messages: list[dict[str, str]], **kwargs: Any) -> "Completion":
        """``complete`` for sync actions (which run in a worker thread)."""
        if self._loop is None:
            raise FsmError("complete_sync is only available inside a running step")
        if self.on_loop:
            raise FsmError("complete_sync cannot run in an inline action (it would wait on "
                           "the event loop it blocks): drop inline=True, or use an async "
                           "def action with await step.llm.complete(...)")
        fut = asyncio.run_coroutine_threadsafe(self.complete(messages, **kwargs), self._loop)
        return fut.result()

    async def structured(self, messages: list[dict[str, str]], target: Any, *,
                         max_reasks: int = 1, **kwargs: Any) -> Any:
        """Call the model and parse its text into ``target`` (a pydantic model or JSON Schema).

        Output that fails parsing or validation is re-asked with the error up
        to ``max_reasks`` times (output cut at ``max_tokens`` is never repaired:
        it is re-asked with twice the ``max_tokens``); each re-ask counts against the token budget
        and the loop cap (``reasks`` is added to the instance's ``loop_count``).
        Returns ``fsm_engine.structured.Parsed``; raises ``StructuredOutputError``
        when the last answer is still invalid, or ``BudgetExhausted``.
        """
        from ..structured import parse_structured, reask_message
        history = list(messages)
        while True:
            provider, breaker = (self.repair if self.reasks and self.repair is not None
                                 else (self.provider, self.breaker))
            out = await self._complete(provider, breaker, history, dict(kwargs))
            try:
                parsed = parse_structured(out.text, target, finish_reason=out.finish_reason)
            except StructuredOutputError as exc:
                self.outputs.append({"raw": out.text[:4000], "errors": exc.errors,
                                     "repairs": exc.repairs, "truncated": exc.truncated})
                if self.reasks >= max_reasks or self.reasks + 1 >= self.loops_left:
                    raise
                self.reasks += 1
                if exc.truncated:  # cut at max_tokens: never repaired, re-asked with more room
                    kwargs["max_tokens"] = 2 * int(kwargs.get("max_tokens", 256))
                history += [{"role": "assistant", "content": out.text},
                            {"role": "user", "content": reask_message(exc, target)}]
                continue
            self.outputs.append({"raw": out.text[:4000], "repairs": list(parsed.repairs)})
            return parsed

    def _bill(self, tokens: int, finish: str | None, error: str | None, provider: Any,
              answered_by: str | None = None) -> dict[str, Any]:
        """Count a call's tokens; the history's ``llm_calls`` entry names the model."""
        self.used += tokens
        model = answered_by or getattr(provider, "model", None)
        call: dict[str, Any] = {"tokens": tokens, "finish_reason": finish, "error": error,
                                "model": f"{getattr(provider, 'name', 'llm')}:{model}"}
        self.calls.append(call)
        return call


@dataclass(slots=True)
class Step:
    """Passed to actions as their second argument.

    Attributes:
        instance_id: the instance being stepped.
        state: the current state's name.
        attempt: 1-based attempt number of this state's action in this visit.
        visit: how many times the instance has entered this state (1-based).
        idempotency_key: ``"{instance_id}:{state}:{visit}"``: stable across
            retries and crash recoveries of the same visit; send it with any
            external side effect.
        triggers: the declared triggers this state may fire (for model-driven routing).
        outbox_attempt: for side-effect states, how many times this key's
            delivery has been started (> 1 means a retry or a crash recovery).
        llm: the metered model handle (``await step.llm.complete(...)``).
        loop_count / max_transitions: transitions made so far / the cap.
        tokens_used / token_budget: before this step (tokens).
        state_tokens_used / state_token_budget: tokens spent in this visit of the state
            before this attempt (failed attempts included) / the state's per-visit
            budget (``None``: none).
        notes: plain JSON values (dict, list, str, int, finite float, bool, None) the
            action wants in the history row's ``detail``; anything else fails the step
            with reason ``invalid_update``.
    """

    instance_id: str
    state: str
    attempt: int
    visit: int
    idempotency_key: str
    llm: MeteredLLM
    loop_count: int
    max_transitions: int
    tokens_used: int
    token_budget: int | None
    triggers: tuple[str, ...] = ()
    outbox_attempt: int = 0
    notes: dict[str, Any] = field(default_factory=dict)
    state_tokens_used: int = 0
    state_token_budget: int | None = None

    @property
    def tokens_remaining(self) -> int | None:
        """Tokens left in the budget including this step's calls so far (``None``: no budget)."""
        if self.token_budget is None:
            return None
        return max(0, self.token_budget - self.tokens_used - self.llm.used)

    @property
    def state_tokens_remaining(self) -> int | None:
        """Tokens left in this visit's state budget including this step's calls so far
        (``None``: the state has no budget)."""
        if self.state_token_budget is None:
            return None
        return max(0, self.state_token_budget - self.state_tokens_used - self.llm.used)


def run_info(rec: InstanceRecord, state: State, spent: int = 0,
             in_visit: int = 0) -> RunInfo:
    """What ``state``'s guards read besides the context, for a step of ``rec``: the one
    builder the driver and replay share.

    ``rec`` holds the counters before the step (``loop_count``, ``tokens_used``: failed
    attempts included); ``spent``: tokens this attempt's model calls were billed;
    ``in_visit``: tokens this visit's earlier (failed) attempts were billed.
    """
    return RunInfo(instance_id=rec.id, state=state.name, loop_count=rec.loop_count,
                   max_transitions=rec.max_transitions, tokens_used=rec.tokens_used + spent,
                   token_budget=rec.token_budget, state_tokens_used=in_visit + spent,
                   state_token_budget=state.token_budget)


async def _store_io(store: Any, fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)``: in a thread when ``store`` waits on a network (``Store.remote``), so
    a model call's rate-limit and reply-cache round trips never stall the event loop;
    inline for a local file, where the thread hand-off would cost more than the call."""
    if getattr(store, "remote", False):
        return await asyncio.to_thread(fn, *args)
    return fn(*args)
