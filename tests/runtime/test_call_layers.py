"""Model calls as layers (``fsm_engine.runtime.calls``): the provider contract every provider
meets, each layer alone over a scripted provider (real stores on both backends where a layer
keeps state in one), and the order ``compose`` stacks them in."""

from __future__ import annotations

import asyncio
import importlib.util
import inspect
from collections.abc import Callable
from typing import Any

import pytest
from pydantic import BaseModel

from fsm_engine import BreakerPolicy, Engine, Machine, State, Step, Transition
from fsm_engine.errors import BudgetExhausted, CircuitOpen, RateLimitWait, ServerError
from fsm_engine.llm.base import CALLER_INPUT, Completion, Provider, accepts_timeout
from fsm_engine.llm.faults import FaultInjector
from fsm_engine.llm.openai_compat import OpenAICompatible
from fsm_engine.llm.scripted import Scripted
from fsm_engine.policies import RateLimit
from fsm_engine.runtime.calls import (
    ORDER,
    BillLayer,
    BreakerLayer,
    BudgetLayer,
    CacheLayer,
    CallSettings,
    DeadlineLayer,
    Limit,
    Meter,
    RateLimitLayer,
    ReplayLayer,
    TraceLayer,
    compose,
)
from fsm_engine.runtime.fleet.breaker import Breaker
from fsm_engine.runtime.fleet.rates import RateLimiter
from fsm_engine.runtime.reply_cache import RecordedReplies, ReplyCache, reply_key
from fsm_engine.runtime.step import MeteredLLM
from fsm_engine.store import open_store

MSG = [{"role": "user", "content": "hello there"}]


def script(*texts: str, tokens: tuple[int, int] = (7, 5), **extra: Any) -> Scripted:
    return Scripted.from_replies([{"text": t, "prompt_tokens": tokens[0],
                                   "completion_tokens": tokens[1], **extra} for t in texts])


class Timed(Scripted):
    """A scripted provider whose ``complete`` takes ``timeout`` and keeps what it was given."""

    seen: list[dict[str, Any]]

    async def complete(self, messages: list[dict[str, str]], *, max_tokens: int = 256,
                       temperature: float = 0.0, json_schema: Any = None,
                       stop: list[str] | None = None, timeout: float | None = None) -> Completion:
        self.seen = [*getattr(self, "seen", []), {"max_tokens": max_tokens, "timeout": timeout,
                                                  "input": CALLER_INPUT.get()}]
        return await super().complete(messages, max_tokens=max_tokens)


def timed(*texts: str) -> Timed:
    out = Timed.__new__(Timed)
    out._init(script(*texts).replies, "timed", "test")
    return out


async def send(layer: Provider, meter: Meter, provider: Provider, **kwargs: Any) -> Completion:
    """One call down ``layer`` as ``MeteredLLM`` makes it (the call's reply key in context)."""
    from fsm_engine.runtime.calls.meter import end_call
    token = meter.calling(reply_key(provider, MSG, kwargs))
    try:
        return await layer.complete(MSG, **kwargs)
    finally:
        end_call(token)


# -- the provider contract ------------------------------------------------------------

NO_LLAMA_CPP = pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None,
                                  reason="llama_cpp is not installed (pip install -e '.[local]')")


def _local_llama() -> Provider:
    from fsm_engine.llm.local import LocalLlama
    return LocalLlama(model_path="/nonexistent/m.gguf")


#: Each provider by name, built when a test asks (``LocalLlama`` needs the [local] extra).
PROVIDERS: dict[str, Callable[[], Provider]] = {
    "Scripted": lambda: script("x"),
    "FaultInjector": lambda: FaultInjector(script("x"), {}),
    "LocalLlama": _local_llama,
    "OpenAICompatible": lambda: OpenAICompatible(base_url="http://127.0.0.1:9/v1", model="m",
                                                 api_key="k"),
    "BillLayer": lambda: BillLayer(script("x"), Meter(), None),
}


@pytest.mark.parametrize("name", [pytest.param(n, id=n, marks=NO_LLAMA_CPP if n == "LocalLlama" else ())
                                  for n in PROVIDERS])
def test_every_provider_satisfies_the_provider_protocol(name: str) -> None:
    provider = PROVIDERS[name]()
    assert isinstance(provider, Provider)
    assert isinstance(provider.name, str) and isinstance(provider.model, str)
    params = inspect.signature(provider.complete)
    params.bind(MSG, max_tokens=1, temperature=0.0, json_schema=None, stop=None)
    assert inspect.iscoroutinefunction(provider.complete)
    assert inspect.iscoroutinefunction(provider.aclose)
    assert callable(provider.count_tokens)


@NO_LLAMA_CPP
def test_which_providers_take_a_timeout() -> None:
    took = {name: accepts_timeout(make()) for name, make in PROVIDERS.items()}
    assert took == {"Scripted": False, "FaultInjector": True, "LocalLlama": True,
                    "OpenAICompatible": True, "BillLayer": True}


# -- each layer alone ----------------------------------------------------------------

def test_bill_layer_bills_replies_and_errors_with_the_callers_input() -> None:
    async def go() -> None:
        meter, provider = Meter(), timed("one")
        layer = BillLayer(provider, meter, {"who": "me"})
        out = await send(layer, meter, provider, max_tokens=9)
        assert (out.text, meter.used, provider.seen[0]["input"]) == ("one", 12, {"who": "me"})
        assert meter.calls == [{"tokens": 12, "finish_reason": "stop", "error": None,
                                "model": "scripted:timed", "key": meter.calls[0]["key"],
                                "reply": "one", "prompt_tokens": 7, "completion_tokens": 5}]
        assert meter.calls[0]["key"] == reply_key(provider, MSG, {"max_tokens": 9})
        assert CALLER_INPUT.get() is None  # reset after the call
        bad = script("", error="http500", tokens=(3, 4))
        with pytest.raises(ServerError):
            await send(BillLayer(bad, meter, None), meter, bad)
        assert meter.used == 19 and meter.calls[1]["error"].startswith("ServerError")
    asyncio.run(go())


def test_budget_layer_refuses_before_sending_and_cuts_max_tokens() -> None:
    async def go() -> None:
        meter, provider = Meter(), timed("a", "b")
        layer = BudgetLayer(BillLayer(provider, meter, None), (Limit("state", 40, 40),),
                            meter, provider)
        await send(layer, meter, provider, max_tokens=500)
        prompt = provider.count_tokens(MSG)
        assert provider.seen[0]["max_tokens"] == 40 - prompt  # cut to what is left
        meter.used = 39  # 1 token left: the prompt cannot fit
        with pytest.raises(BudgetExhausted) as err:
            await send(layer, meter, provider)
        assert (provider.calls, err.value.scope, err.value.needed) == (1, "state", prompt)
    asyncio.run(go())


def test_budget_layer_marks_a_reply_billed_past_what_was_left() -> None:
    async def go() -> None:
        meter, provider = Meter(), script("big", tokens=(30, 30))
        layer = BudgetLayer(BillLayer(provider, meter, None), (Limit("instance", 50, 100),),
                            meter, provider)
        await send(layer, meter, provider)
        assert meter.calls[0]["budget_overrun"] is True and meter.calls[0]["overrun_tokens"] == 10
        with pytest.raises(BudgetExhausted):  # spent: refused before counting
            await send(layer, meter, provider)
    asyncio.run(go())


def test_deadline_layer_passes_the_seconds_left() -> None:
    async def go() -> None:
        meter, provider = Meter(), timed("a", "b")
        layer = DeadlineLayer(provider, meter)
        await layer.complete(MSG)
        meter.deadline = asyncio.get_running_loop().time() + 5.0
        await layer.complete(MSG)
        await layer.complete(MSG, timeout=1.5)  # the caller's own wins
        got = [s["timeout"] for s in provider.seen]
        assert got[0] is None and 4.0 < got[1] <= 5.0 and got[2] == 1.5
    asyncio.run(go())


def test_breaker_layer_opens_and_refuses_before_sending(store_url: str) -> None:
    async def go() -> None:
        store = open_store(store_url)
        breaker = Breaker(store, "scripted:m", BreakerPolicy(min_calls=2, failure_rate=0.5,
                                                             cooldown=60.0))
        provider = script("", error="http500")
        layer = BreakerLayer(provider, breaker)
        for _ in range(2):
            with pytest.raises(ServerError):
                await layer.complete(MSG)
        with pytest.raises(CircuitOpen):
            await layer.complete(MSG)
        assert provider.calls == 2  # the third was never sent
        store.close()
    asyncio.run(go())


def test_rate_limit_layer_waits_before_sending_and_settles(store_url: str) -> None:
    async def go() -> None:
        store = open_store(store_url)
        limiter = RateLimiter(store, "scripted:m", RateLimit(rpm=1))
        meter, provider = Meter(), script("a", "b")
        layer = RateLimitLayer(BillLayer(provider, meter, None), lambda p: limiter, provider, meter)
        await send(layer, meter, provider)
        with pytest.raises(RateLimitWait) as err:
            await send(layer, meter, provider)
        assert provider.calls == 1 and meter.rate_wait is err.value and err.value.retry_in > 0
        store.close()
    asyncio.run(go())


def test_cache_layer_answers_a_repeated_call_from_the_store(store_url: str) -> None:
    async def go() -> None:
        store = open_store(store_url)
        meter, provider = Meter(), script("first", "second")
        layer = CacheLayer(BillLayer(provider, meter, None), ReplyCache(store, 60, lambda: 1000.0),
                           meter, provider)
        one = await send(layer, meter, provider)
        two = await send(layer, meter, provider)
        assert (one.text, two.text, provider.calls, meter.used) == ("first", "first", 1, 12)
        assert meter.calls[1]["cached"] is True and meter.calls[1]["tokens"] == 0
        store.close()
    asyncio.run(go())


class Ctx(BaseModel):
    answer: str = ""


async def ask(ctx: Ctx, step: Step) -> dict[str, Any]:
    return {"answer": (await step.llm.complete(MSG)).text}


ASK = Machine(name="ask", context=Ctx, initial="ask", states=[
    State("ask", action=ask), State("done", final=True)],
    transitions=[Transition("ok", "ask", "done")])


def test_replay_layer_answers_with_the_originals_recorded_reply(engine_factory: Any) -> None:
    original = script("recorded")
    engine: Engine = engine_factory(llm=original)
    iid = engine.start(ASK, {})
    asyncio.run(engine.run(iid))

    async def go() -> None:
        meter, provider = Meter(), script("fresh")  # same name and model: same key
        layer = ReplayLayer(BillLayer(provider, meter, None),
                            RecordedReplies(engine.store, iid), meter, provider)
        out = await send(layer, meter, provider)
        assert (out.text, provider.calls, meter.used) == ("recorded", 0, 0)
        assert meter.calls[0]["replayed"] is True
    asyncio.run(go())


def test_trace_layer_makes_a_span_per_call() -> None:
    pytest.importorskip("opentelemetry.sdk")
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    exporter, tp = InMemorySpanExporter(), TracerProvider()
    tp.add_span_processor(SimpleSpanProcessor(exporter))
    provider = script("a")
    asyncio.run(TraceLayer(provider, tp.get_tracer("t"), None, provider).complete(MSG))
    (span,) = exporter.get_finished_spans()
    assert span.name == "chat scripted" and span.attributes["gen_ai.usage.input_tokens"] == 7
    tp.shutdown()


# -- the composed stack --------------------------------------------------------------

def stack_names(top: Provider) -> list[str]:
    names = []
    while hasattr(top, "inner"):
        names.append(type(top).__name__)
        top = top.inner
    return names


def test_compose_stacks_the_layers_in_the_documented_order(tmp_path: Any) -> None:
    store = open_store(str(tmp_path / "s.db"))
    provider = timed("a")
    settings = CallSettings(limits=(Limit("instance", 100, 100),), rates=lambda p: None,
                            cache=ReplyCache(store, 60, lambda: 0.0),
                            recorded=RecordedReplies(store, "none"), tracer=object())
    top = compose(provider, Breaker(store, "timed"), settings, Meter(deadline=1e9))
    assert stack_names(top) == list(ORDER)
    assert isinstance(top, Provider) and (top.name, top.model) == ("scripted", "timed")
    bare = compose(script("a"), None, CallSettings(), Meter())
    assert stack_names(bare) == ["BillLayer"]  # a policy that is off costs no layer
    no_deadline = compose(provider, None, CallSettings(), Meter())
    assert stack_names(no_deadline) == ["BillLayer"]  # no step timeout: no DeadlineLayer
    store.close()


def test_metered_llm_sends_through_its_stack_budget_above_breaker(tmp_path: Any) -> None:
    """A spent budget is refused before the breaker is asked (budget is the outer layer);
    a cached reply is served with the budget spent (the cache is above it)."""
    store = open_store(str(tmp_path / "s.db"))
    breaker = Breaker(store, "scripted:scripted", BreakerPolicy(min_calls=1, cooldown=60.0))
    cache = ReplyCache(store, 60, lambda: 0.0)
    settings = CallSettings(limits=(Limit("instance", 40, 40),), breaker=breaker, cache=cache)

    async def go() -> None:
        llm = MeteredLLM(script("a", tokens=(20, 20)), settings, loop=asyncio.get_running_loop())
        assert (await llm.complete(MSG)).text == "a" and llm.used == 40
        assert (await llm.complete(MSG)).text == "a"  # cached: no budget needed
        await breaker.record(False)  # the breaker opens...
        with pytest.raises(BudgetExhausted):  # ...but the budget refuses first
            await llm.complete([{"role": "user", "content": "other"}])
        assert [c.get("cached", False) for c in llm.calls] == [False, True]
    asyncio.run(go())
    store.close()


TIMED = Machine(name="timed", context=Ctx, initial="ask", states=[
    State("ask", action=ask, timeout=5.0), State("done", final=True)],
    transitions=[Transition("ok", "ask", "done")])


def test_a_steps_timeout_reaches_a_provider_that_takes_one(engine_factory: Any) -> None:
    """End to end: the driver sets the step's deadline before the action's first call, so the
    lazily composed stack has its DeadlineLayer; the input reaches the provider too."""
    provider = timed("a", "b")
    engine: Engine = engine_factory(llm=provider)
    for machine, want in ((TIMED, True), (ASK, False)):
        iid = engine.start(machine, {})
        assert asyncio.run(engine.run(iid)).status == "completed"
        got = provider.seen[-1]["timeout"]
        assert (got is not None and 0 < got <= 5.0) if want else got is None
