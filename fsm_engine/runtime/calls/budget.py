"""Token budgets as a layer: refuse a call that cannot fit, cut ``max_tokens`` to what is left."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from ...errors import BudgetExhausted
from ...llm.base import Completion, Message, Provider
from .layer import Layer
from .meter import Meter, count_prompt, current_call

__all__ = ["Limit", "BudgetLayer", "room"]


class Limit(NamedTuple):
    """One token budget that applies to a step: ``scope`` (``"instance"`` or ``"state"``),
    ``left`` (tokens left before the step; may be < 0 after an overshoot) of ``budget``."""

    scope: str
    left: int
    budget: int


def room(limits: tuple[Limit, ...], used: int, prompt: int) -> int | None:
    """Completion tokens the budgets leave after a ``prompt``-token prompt when the step has
    been billed ``used`` (None: no budget); raises ``BudgetExhausted`` when a budget is
    spent or the prompt won't fit."""
    free_min = None
    for lim in limits:
        free = lim.left - used - prompt
        if used >= lim.left or free < 1:
            raise BudgetExhausted(lim.budget - lim.left + used, lim.budget, scope=lim.scope,
                                  needed=prompt if used < lim.left else 0)
        free_min = free if free_min is None else min(free_min, free)
    return free_min


class BudgetLayer(Layer):
    """Check the step's token budgets (``limits``) before ``inner`` is called.

    A spent budget is refused before the prompt is counted; then the prompt is counted
    (``count_prompt``, left on ``current_call().prompt``) and a prompt that does not fit
    is refused (``BudgetExhausted``, 0 tokens billed); a call that starts has its
    ``max_tokens`` cut to what is left.  The prompt is also counted, with no budget,
    when the model has a rate limit (``rates(provider)`` is not None), which needs it.
    A reply billed past what was left is kept, its ``llm_calls`` entry marked
    ``budget_overrun`` with ``overrun_tokens`` and ``prompt_estimate``.
    """

    def __init__(self, inner: Provider, limits: tuple[Limit, ...], meter: Meter, provider: Any,
                 rates: Callable[[Any], object] | None = None) -> None:
        super().__init__(inner)
        self.limits, self.meter, self.provider = limits, meter, provider
        self.rates = rates

    def _counts(self) -> bool:
        return bool(self.limits) or (self.rates is not None and self.rates(self.provider) is not None)

    async def complete(self, messages: list[Message], **kwargs: Any) -> Completion:
        """``inner.complete`` (its signature) within the budgets."""
        if not self._counts():
            return await self.inner.complete(messages, **kwargs)
        call = current_call()
        room(self.limits, self.meter.used, 0)  # spent already: refuse before counting
        prompt = call.prompt = await count_prompt(self.provider, messages)
        free = room(self.limits, self.meter.used, prompt)
        if free is not None:
            kwargs["max_tokens"] = max(1, min(int(kwargs.get("max_tokens", 256)), free))
        out = await self.inner.complete(messages, **kwargs)
        over = max((self.meter.used - lim.left for lim in self.limits), default=0)
        if over > 0 and call.entry is not None:  # billed past what was left
            call.entry.update(budget_overrun=True, overrun_tokens=over, prompt_estimate=prompt)
        return out
