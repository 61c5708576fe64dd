"""Model calls as layers: each policy a small wrapper with the provider's own signature.

A step's ``step.llm`` (``runtime.step.MeteredLLM``) sends every call down a stack that
``compose`` builds per step from its ``CallSettings``, outermost first::

    ReplayLayer     a fork's recorded reply (--reuse-llm): 0 tokens, nothing sent
    CacheLayer      the state's reply cache: 0 tokens on a hit; a miss is stored
    BudgetLayer     token budgets: refuse before sending, cut max_tokens, mark overruns
    DeadlineLayer   the step's timeout passed as the provider's ``timeout``
    BreakerLayer    circuit breaker: CircuitOpen before sending; outcomes recorded
    RateLimitLayer  shared rate limit: RateLimitWait before sending; settled at the bill
    TraceLayer      an OpenTelemetry span per call
    BillLayer       CALLER_INPUT in context; tokens billed, the llm_calls entry written
    provider        openai_compat, local, scripted, faults, ... (``llm.base.Provider``)

(The issue sketched rate limit above the breaker; the engine has always checked the
breaker first, so an open circuit costs no rate-limit room, and that order is kept.)
Each layer takes ``inner: Provider`` and its own settings, and its ``complete`` awaits
``inner.complete`` directly.  A layer absent from a step costs nothing.  What one call
carries besides the provider's arguments (its reply key, counted prompt, ``llm_calls``
entry) is ``meter.current_call()``; what the step's calls add up to is its ``Meter``.

A streamed call (``step.llm.stream``) is the same ``complete`` down the same layers, with
a ``sink`` on its ``Call``: ``BillLayer`` then reads the provider's ``stream`` and hands
each text piece to the sink, so budgets, breaker, rate limit, cache, replay and tracing
apply to it exactly as to a plain call (a reply answered from the cache or a fork's record
never reaches the provider: ``MeteredLLM.stream`` then replays it as one piece).

Adding a policy is a field, a check and a layer:

1. a field on ``CallSettings`` (a frozen value; the driver fills it from the state);
2. a layer module here: a class ``XLayer(inner, settings...)`` whose
   ``async def complete(self, messages, **kwargs)`` checks before and/or after
   ``await self.inner.complete(messages, **kwargs)`` (raise an ``FsmError`` subclass to
   refuse before sending; bill nothing itself: ``BillLayer`` bills what was sent);
3. one line in ``compose`` (at its place in ``ORDER``) adding the layer when the field is set,
   and a test of the layer alone over ``llm.scripted.Scripted``.

Layers import ``llm/``, ``policies`` and the fleet parts they wrap (breaker, rates,
reply cache); never the engine, the driver or the CLI.
"""

from .bill import BillLayer
from .breaker import BreakerLayer
from .budget import BudgetLayer, Limit
from .compose import ORDER, CallSettings, compose
from .deadline import DeadlineLayer
from .meter import Call, Meter, count_prompt, current_call, store_io
from .rate import RateLimitLayer
from .stored import CacheLayer, ReplayLayer
from .trace import TraceLayer

__all__ = ["BillLayer", "BreakerLayer", "BudgetLayer", "CacheLayer", "Call", "CallSettings",
           "DeadlineLayer", "Limit", "Meter", "ORDER", "RateLimitLayer", "ReplayLayer",
           "TraceLayer", "compose", "count_prompt", "current_call", "store_io"]
