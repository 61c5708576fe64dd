"""fsm_engine: durable finite state machines for multi-step LLM workflows.

Declare a :class:`Machine` of :class:`State` s and :class:`Transition` s in a
Python module, run instances with an :class:`Engine` (SQLite by default),
draw it with ``fsm diagram``, audit every transition with ``fsm history``.

Names are imported when first used (PEP 562 ``__getattr__``), so ``fsm --help`` and
other commands that need little start without loading the runtime.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .definition import BUDGET_EXHAUSTED, FALLBACK, Fire, Machine, RunInfo, State, Transition, fire
    from .definition.agent import Agent, Tool, ToolCall, tool
    from .definition.dag import Node, dag
    from .definition.fanout import Branch, Map, Parallel, merge_outputs
    from .definition.review import Review
    from .errors import (
        ActionError,
        BudgetExhausted,
        CircuitOpen,
        ClientError,
        DefinitionError,
        FingerprintMismatch,
        FsmError,
        InstanceFinished,
        InstanceNotFound,
        InvalidInput,
        MachineLoadError,
        NeedsMigration,
        NotAnFsmDatabase,
        ProviderError,
        ProviderTimeout,
        ProviderUnavailable,
        RateLimited,
        ReviewRefused,
        ServerError,
        StaleWrite,
        StartConflict,
        StepRejected,
        StepTimeout,
        StoreError,
        StructuredOutputError,
        VersionTooNew,
    )
    from .policies import BreakerPolicy, CachePolicy, Completion, RetryPolicy
    from .runtime import Engine, Step, load_machine
    from .store import HistoryRow, InstanceRecord, SqliteStore, Store, open_store

__version__ = "0.1.0"

#: Where each public name lives (its module, relative to this package).
_HOMES = {
    **dict.fromkeys(["BUDGET_EXHAUSTED", "FALLBACK", "Fire", "Machine", "RunInfo", "State",
                     "Transition", "fire"], ".definition"),
    "Node": ".definition.dag", "dag": ".definition.dag",
    **dict.fromkeys(["Branch", "Map", "Parallel", "merge_outputs"], ".definition.fanout"),
    "Review": ".definition.review",
    **dict.fromkeys(["Agent", "Tool", "ToolCall", "tool"], ".definition.agent"),
    **dict.fromkeys(["BreakerPolicy", "CachePolicy", "Completion", "RetryPolicy"], ".policies"),
    **dict.fromkeys(["Engine", "Step", "load_machine"], ".runtime"),
    **dict.fromkeys(["HistoryRow", "InstanceRecord", "SqliteStore", "Store", "open_store"], ".store"),
}


def __getattr__(name: str) -> Any:
    """Import a public name on first use (errors from ``.errors``, the rest per ``_HOMES``)."""
    home = _HOMES.get(name, ".errors" if name in __all__ else None)
    if home is None:
        raise AttributeError(f"module 'fsm_engine' has no attribute {name!r}")
    value = getattr(importlib.import_module(home, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])


__all__ = [
    # definition
    "Machine", "State", "Transition", "fire", "Fire", "RunInfo", "FALLBACK", "BUDGET_EXHAUSTED",
    "RetryPolicy", "BreakerPolicy", "load_machine", "Review", "CachePolicy",
    # agent states
    "Agent", "Tool", "ToolCall", "tool",
    # fan-out and DAGs
    "Parallel", "Map", "Branch", "Completion", "merge_outputs", "Node", "dag",
    # runtime
    "Engine", "Step",
    # store
    "Store", "SqliteStore", "open_store", "InstanceRecord", "HistoryRow",
    # errors
    "FsmError", "DefinitionError", "MachineLoadError", "StoreError", "NotAnFsmDatabase",
    "InstanceNotFound", "StaleWrite", "StepRejected", "FingerprintMismatch", "InvalidInput",
    "InstanceFinished",
    "ActionError", "StepTimeout", "BudgetExhausted", "CircuitOpen", "StructuredOutputError",
    "ProviderError", "ProviderUnavailable", "ProviderTimeout", "RateLimited", "ServerError",
    "ClientError", "ReviewRefused", "VersionTooNew", "NeedsMigration", "StartConflict",
]
