"""fsm_engine: durable finite state machines for multi-step LLM workflows.

Declare a :class:`Machine` of :class:`State` s and :class:`Transition` s in a
Python module, run instances with an :class:`Engine` (SQLite by default),
draw it with ``fsm diagram``, audit every transition with ``fsm history``.
"""

from .definition.review import Review
from .definition import BUDGET_EXHAUSTED, FALLBACK, Fire, Machine, RunInfo, State, Transition, fire
from .errors import (
    ActionError, BudgetExhausted, CircuitOpen, ClientError, DefinitionError, FingerprintMismatch,
    FsmError, InstanceFinished, InstanceNotFound, InvalidInput, MachineLoadError,
    NeedsMigration, NotAnFsmDatabase, VersionTooNew, ProviderError, ProviderTimeout, ProviderUnavailable, RateLimited,
    ReviewRefused, ServerError, StaleWrite, StepRejected, StepTimeout, StoreError,
    StructuredOutputError,
)
from .definition.dag import Node, dag
from .definition.fanout import Branch, Map, Parallel, merge_outputs
from .policies import BreakerPolicy, CachePolicy, Completion, RetryPolicy
from .runtime import Engine, Step, load_machine
from .store import HistoryRow, InstanceRecord, SqliteStore, Store, open_store

__version__ = "0.1.0"

__all__ = [
    # definition
    "Machine", "State", "Transition", "fire", "Fire", "RunInfo", "FALLBACK", "BUDGET_EXHAUSTED",
    "RetryPolicy", "BreakerPolicy", "load_machine", "Review", "CachePolicy",
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
    "ClientError", "ReviewRefused", "VersionTooNew", "NeedsMigration",
]
