"""One step's model-call settings (``CallSettings``) and the stack ``compose`` builds from them."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

from ...llm.base import Provider, accepts_timeout
from .bill import BillLayer
from .breaker import BreakerLayer
from .budget import BudgetLayer, Limit
from .deadline import DeadlineLayer
from .meter import Meter
from .rate import RateLimitLayer
from .stored import CacheLayer, ReplayLayer
from .trace import TraceLayer

if TYPE_CHECKING:
    from ..fleet.breaker import Breaker
    from ..fleet.rates import RateLimiter
    from ..reply_cache import RecordedReplies, ReplyCache
    from ..streams import StreamTarget

__all__ = ["CallSettings", "compose", "ORDER"]

#: The layers from the outside in (``compose`` leaves out the ones a step does not use).
ORDER = ("ReplayLayer", "CacheLayer", "BudgetLayer", "DeadlineLayer", "BreakerLayer",
         "RateLimitLayer", "TraceLayer", "BillLayer")


class CallSettings(NamedTuple):
    """What governs one step's model calls (immutable; built by the driver per step, so a
    ``NamedTuple``: a frozen dataclass costs several times more to construct).

    ``limits``: the token budgets that apply (instance, state); ``breaker``: the model's
    circuit breaker (None: none); ``repair``: the provider and breaker answering
    ``structured``'s re-asks (None: the step's own); ``loops_left``: transitions left
    before the loop cap (re-asks count); ``caller_input``: the instance's input, seen by
    providers as ``llm.base.CALLER_INPUT``; ``rates``: ``provider -> RateLimiter | None``
    (None: no rate limits); ``cache``: the state's reply cache; ``recorded``: a fork's
    original's replies (``--reuse-llm``); ``tracer``/``trace_parent``: OpenTelemetry
    tracer and parent context (None: no tracing); ``stream_to``: where ``step.llm.stream``
    writes its pieces (``runtime.streams.StreamTarget``; None: nowhere, only the action
    sees them).
    """

    limits: tuple[Limit, ...] = ()
    breaker: Breaker | None = None
    repair: tuple[Provider, Breaker | None] | None = None
    loops_left: int = 1 << 30
    caller_input: dict[str, Any] | None = None
    rates: Callable[[Any], RateLimiter | None] | None = None
    cache: ReplyCache | None = None
    recorded: RecordedReplies | None = None
    tracer: Any = None
    trace_parent: Any = None
    stream_to: StreamTarget | None = None


def compose(provider: Provider, breaker: Breaker | None, settings: CallSettings,
            meter: Meter) -> Provider:
    """The call stack over ``provider`` (behind ``breaker``), outermost first as ``ORDER``
    says; a layer whose setting is off is left out (no coroutine spent on it).  Composed at
    a step's first call, when its deadline (``meter.deadline``) is known."""
    top: Provider = BillLayer(provider, meter, settings.caller_input)
    if settings.tracer is not None:
        top = TraceLayer(top, settings.tracer, settings.trace_parent, provider)
    if settings.rates is not None:
        top = RateLimitLayer(top, settings.rates, provider, meter)
    if breaker is not None:
        top = BreakerLayer(top, breaker)
    if meter.deadline is not None and accepts_timeout(provider):  # (signature read: once)
        top = DeadlineLayer(top, meter)
    if settings.limits or settings.rates is not None:
        top = BudgetLayer(top, settings.limits, meter, provider, settings.rates)
    if settings.cache is not None:
        top = CacheLayer(top, settings.cache, meter, provider)
    if settings.recorded is not None:
        top = ReplayLayer(top, settings.recorded, meter, provider)
    return top
