"""What an action sees besides its context: the ``Step`` handle and its metered LLM."""

from __future__ import annotations

import asyncio
from contextvars import Token
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..definition.spec import RunInfo
from ..errors import FsmError, RateLimitWait, StructuredOutputError
from .calls import Call, CallSettings, Meter, compose, count_prompt
from .calls.meter import Sink, end_call
from .reply_cache import reply_key
from .stream_reply import ReplyStream

if TYPE_CHECKING:
    from ..definition.spec import State
    from ..llm.base import Completion, Provider
    from ..store.records import InstanceRecord


class MeteredLLM:
    """The model handle of one step (``step.llm``): a thin face over its call layers.

    Calls go down the stack ``runtime.calls.compose`` builds from ``settings`` (replay,
    reply cache, token budgets, deadline, circuit breaker, rate limit, tracing, billing:
    see ``fsm_engine.runtime.calls``).  ``used`` is the tokens (prompt + completion) this
    step has been billed, including calls that failed after the provider billed them;
    ``calls`` the ``detail.llm_calls`` entries.  Before a call its prompt is counted (the
    provider's ``count_tokens``: its tokenizer, else the conservative estimate of
    ``fsm_engine.llm.base``); a call whose prompt alone does not fit what is left of the
    instance's or the state's budget is refused with ``BudgetExhausted`` and costs 0
    tokens, and a call that starts has its ``max_tokens`` cut to what is left after the
    prompt.  A reply billed above what was left is kept and recorded with
    ``budget_overrun``; the next call is refused.  An open breaker raises ``CircuitOpen``
    and a full shared rate limit ``RateLimitWait``, both before any call is made.

    Set while the step runs (by the driver): ``deadline`` (``loop.time()`` when the step's
    timeout fires, passed to a provider that takes ``timeout`` as the seconds left) and
    ``on_loop`` (True while an ``inline`` sync action runs: ``complete_sync`` refuses).
    """

    def __init__(self, provider: Provider | None, settings: CallSettings | None = None, *,
                 loop: asyncio.AbstractEventLoop | None = None) -> None:
        self.provider = provider
        self.settings = settings = settings if settings is not None else CallSettings()
        self.meter = Meter()
        self.reasks = 0
        #: What ``structured`` saw: raw text, repairs, validation errors (for the history).
        self.outputs: list[dict[str, Any]] = []
        self.on_loop = False
        self._loop = loop
        self._stack: Provider | None = None  # composed at the first call
        self._repair: Provider | None = None

    @property
    def used(self) -> int:
        """Tokens this step's calls were billed."""
        return self.meter.used

    @property
    def calls(self) -> list[dict[str, Any]]:
        """The ``detail.llm_calls`` entries of this step's calls."""
        return self.meter.calls

    @property
    def rate_wait(self) -> RateLimitWait | None:
        """Set when a call found its rate limit full: the step then waits durably, whatever
        the action did with the ``RateLimitWait`` it raised."""
        return self.meter.rate_wait

    @property
    def deadline(self) -> float | None:
        """``loop.time()`` when the step's timeout fires (None: no timeout)."""
        return self.meter.deadline

    @deadline.setter
    def deadline(self, value: float | None) -> None:
        self.meter.deadline = value

    async def count_tokens(self, messages: list[dict[str, str]],
                           provider: Provider | None = None) -> int:
        """The prompt's tokens by the provider's ``count_tokens`` (sync or async; default:
        this step's provider), else (or when that fails) the conservative estimate."""
        return await count_prompt(provider or self.provider, messages)

    async def complete(self, messages: list[dict[str, str]], **kwargs: Any) -> Completion:
        """Call the model (see ``Provider.complete``); raises ``BudgetExhausted``,
        ``CircuitOpen``, ``RateLimitWait`` or the provider's ``ProviderError``."""
        stack, token = self._begin(self._stack or self._main(), self.provider, messages, kwargs)
        try:  # awaited here: no extra coroutine per call
            return await stack.complete(messages, **kwargs)
        finally:
            end_call(token)

    def stream(self, messages: list[dict[str, str]], *, json_reply: bool = False,
               **kwargs: Any) -> ReplyStream:
        """Call the model and get its reply as it is generated (``complete``'s arguments)::

            reply = step.llm.stream(messages, max_tokens=200)
            async for piece in reply:   # text pieces, in order
                ...
            reply.completion            # the whole Completion, as complete() returns it
            await step.llm.stream(messages).complete()   # or no loop: that Completion
            await step.llm.stream(messages).text()       # or just its text (str)

        The call goes down the same layers as ``complete`` (budgets, breaker, rate limit,
        reply cache, a fork's recorded replies, billing), and its pieces are appended to the
        store's stream log for ``engine.stream`` / ``fsm stream`` / the viewer, as attempt
        ``(seq, n)`` of this step (``runtime.streams``).  Raises as ``complete``, possibly
        after some pieces.  ``json_reply`` (implied by ``json_schema``): the reply is JSON,
        so subscribers also get the partial object parsed from it so far."""
        return self._streaming(self._stack or self._main(), self.provider, messages, kwargs,
                               json=json_reply or kwargs.get("json_schema") is not None)

    def _streaming(self, stack: Provider | None, provider: Provider | None,
                   messages: list[dict[str, str]], kwargs: dict[str, Any], *,
                   json: bool) -> ReplyStream:
        """A ``ReplyStream`` of one call down ``stack`` (``json``: its reply is JSON)."""
        return ReplyStream(self._begin, (stack, provider), messages, kwargs,
                           self.settings.stream_to, json)

    async def _send(self, stack: Provider | None, provider: Provider | None,
                    messages: list[dict[str, str]], kwargs: dict[str, Any]) -> Completion:
        """``complete`` down ``stack`` (the repair model's, for a re-ask)."""
        top, token = self._begin(stack, provider, messages, kwargs)
        try:
            return await top.complete(messages, **kwargs)
        finally:
            end_call(token)

    def _begin(self, stack: Provider | None, provider: Provider | None,
               messages: list[dict[str, str]], kwargs: dict[str, Any],
               sink: Sink | None = None) -> tuple[Provider, Token[Call | None]]:
        """Start a call down ``stack``: its reply key (of the call as the action made it, before
        any layer changes ``kwargs``) in context; ``FsmError`` when there is no provider."""
        if stack is None or provider is None:
            raise FsmError("this engine has no LLM provider configured")
        return stack, self.meter.calling(reply_key(provider, messages, kwargs), sink)

    def _main(self) -> Provider | None:
        """The stack over this step's provider (None: no provider), composed once."""
        if self._stack is None and self.provider is not None:
            self._stack = compose(self.provider, self.settings.breaker, self.settings, self.meter)
        return self._stack

    def _reasker(self) -> tuple[Provider | None, Provider | None]:
        """(stack, provider) answering a re-ask: the repair model's when there is one."""
        repair = self.settings.repair
        if not self.reasks or repair is None:
            return self._main(), self.provider
        if self._repair is None:
            self._repair = compose(repair[0], repair[1], self.settings, self.meter)
        return self._repair, repair[0]

    def complete_sync(self, messages: list[dict[str, str]], **kwargs: Any) -> Completion:
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
                         max_reasks: int = 1, stream: bool = False, **kwargs: Any) -> Any:
        """Call the model and parse its text into ``target`` (a pydantic model or JSON Schema).

        Output that fails parsing or validation is re-asked with the error up
        to ``max_reasks`` times (output cut at ``max_tokens`` is never repaired:
        it is re-asked with twice the ``max_tokens``); each re-ask counts against the token budget
        and the loop cap (``reasks`` is added to the instance's ``loop_count``).
        With ``stream`` each answer is streamed (``stream``): a subscriber sees the reply,
        and the partial object it parses to, as they are written; a re-ask's answer
        supersedes the invalid one.
        Returns ``fsm_engine.structured.Parsed``; raises ``StructuredOutputError``
        when the last answer is still invalid, or ``BudgetExhausted``.
        """
        from ..structured import parse_structured, reask_message
        history = list(messages)
        while True:
            stack, provider = self._reasker()
            out = (await self._streaming(stack, provider, history, dict(kwargs), json=True).complete()
                   if stream else await self._send(stack, provider, history, dict(kwargs)))
            try:
                parsed = parse_structured(out.text, target, finish_reason=out.finish_reason)
            except StructuredOutputError as exc:
                self.outputs.append({"raw": out.text[:4000], "errors": exc.errors,
                                     "repairs": exc.repairs, "truncated": exc.truncated})
                if self.reasks >= max_reasks or self.reasks + 1 >= self.settings.loops_left:
                    raise
                self.reasks += 1
                if exc.truncated:  # cut at max_tokens: never repaired, re-asked with more room
                    kwargs["max_tokens"] = 2 * int(kwargs.get("max_tokens", 256))
                history += [{"role": "assistant", "content": out.text},
                            {"role": "user", "content": reask_message(exc, target)}]
                continue
            self.outputs.append({"raw": out.text[:4000], "repairs": list(parsed.repairs)})
            return parsed


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
        started_at: when this attempt's action was started (epoch seconds, this worker's
            clock), read just before the worker checked its lease a last time: an action
            of a claimed instance starts only if the lease was current after this instant.
            A process stopped after that check (SIGSTOP, a long pause) runs the action
            on when let go on, later than ``started_at``; its commit is refused.
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
    started_at: float = 0.0

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


def history_detail(rec: InstanceRecord, step: Step | None) -> dict[str, Any]:
    """The history row's ``detail``: attempt, outbox key, model calls, action notes."""
    detail: dict[str, Any] = dict(step.notes) if step is not None else {}
    if rec.attempt > 1:
        detail["attempt"] = rec.attempt
    if step is None:
        return detail
    if step.outbox_attempt:
        detail["idempotency_key"] = step.idempotency_key
        detail["outbox_attempt"] = step.outbox_attempt
    for key, value in (("llm_calls", step.llm.calls), ("reasks", step.llm.reasks),
                       ("structured", step.llm.outputs)):
        if value:
            detail[key] = value
    return detail
