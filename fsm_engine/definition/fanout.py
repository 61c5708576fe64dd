"""Fan-out states: ``Parallel`` (named branches) and ``Map`` (one branch per list item).

A state declared with ``fan_out=Parallel(...)`` or ``fan_out=Map(...)`` has no
action of its own.  Entering it creates one *child instance* per branch, in
the same transaction as the move (each child an ordinary instance of its
branch machine: own row, history, retries, timeouts, fallback, loop cap); the
parent waits (status ``waiting``, reason ``children``) holding no worker slot.
When the ``completion`` policy is decided the parent takes ``joined`` or
``branch_failed`` (both declared as ordinary transitions from the state) with
the branches' outputs merged into its context by the ``reducer``.

A branch is a :class:`~fsm_engine.definition.spec.Machine`, or a single action
(``fn(ctx)`` / ``fn(ctx, step)`` on the *parent's* context) wrapped as a
one-state machine, optionally as a :class:`Branch` with its own retry,
timeout, fallback action and skip default.  A branch's *output* is its final
context (a machine) or the context fields the action changed (an action).

Outputs reach the reducer as a dict keyed by branch name (``Parallel``) or a
list in item order (``Map``), ``None`` for a branch that failed or was
cancelled; a skippable branch that failed contributes its ``default_output``.
With ``into="field"`` the reducer's value (default: the outputs themselves) is
stored in that context field; without, the reducer returns a dict of context
updates (``merge_outputs`` merges action outputs, as a DAG layer does).

This module holds the declarations only (no import of ``spec`` at run time): the
branch machines are built by ``Machine.branch_plans`` and a fan-out state is checked
by ``fsm_engine.definition.check_fanout``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..policies import Completion, RetryPolicy

if TYPE_CHECKING:
    from .refs import Ref
    from .spec import Machine

#: Transitions a fan-out state takes when its completion policy is decided.
JOINED, BRANCH_FAILED = "joined", "branch_failed"
#: The reason a parent waits with, while its children run.
CHILDREN = "children"

Reducer = Callable[[Any], Any]


@dataclass(frozen=True)
class Branch:
    """One branch: a machine, or an action wrapped as a one-state machine.

    Args:
        run: the branch machine, or an action (callable or name) on the parent's context.
        skippable: when the branch fails, count it as skipped and use ``default_output``.
        default_output: the output of a skipped branch (required with ``skippable``).
        retry: the wrapped action's retry policy.
        timeout: the wrapped action's timeout (seconds).
        fallback: an action run when the wrapped action fails for good (retries
            exhausted, timeout, open breaker, budget).
        llm: the model name the wrapped action calls (``State.llm``).
        input: ``fn(parent_ctx) -> dict``, the child's input (default: the parent
            context's fields the branch context declares; an action gets the whole
            parent context).
    """

    run: Machine | Ref
    skippable: bool = False
    default_output: Mapping[str, Any] | None = None
    retry: RetryPolicy | None = None
    timeout: float | None = None
    fallback: Ref | None = None
    llm: str | None = None
    input: Callable[[Any], Mapping[str, Any]] | None = None


@dataclass(frozen=True)
class Parallel:
    """Named branches, all started at once (``max_concurrency``: at most that many running).

    ``branches`` maps branch names to a machine, an action, or a :class:`Branch`.
    See the module docstring for ``into``, ``reducer`` and ``completion``.
    """

    branches: Mapping[str, Machine | Ref | Branch]
    into: str | None = None
    reducer: Reducer | None = None
    completion: Completion | str = "all_successful"
    max_concurrency: int | None = None

    def normalised(self) -> dict[str, Branch]:
        """Every branch as a ``Branch``, in declaration order."""
        return {name: b if isinstance(b, Branch) else Branch(b)
                for name, b in self.branches.items()}


@dataclass(frozen=True)
class Map:
    """One branch per item of the context's list field ``items``, each running ``machine``.

    Args:
        items: the parent context field holding the list.
        machine: the branch machine (or an action, or a ``Branch``) run for every item.
        item_field: the child input is ``{item_field: item}`` (default: the item
            itself, which must then be an object fitting the branch context).
        input: ``fn(parent_ctx, item) -> dict``, the child input (overrides ``item_field``).
        max_concurrency: most children running at once (``None``: all); the rest are
            created as running ones finish.
        into: the parent context field the merged outputs go to (see the module docstring).
        reducer: merges the outputs (default: a list in item order).
        completion: the join's completion policy (default ``all_successful``).
    """

    items: str
    machine: Machine | Ref | Branch
    item_field: str | None = None
    input: Callable[[Any, Any], Mapping[str, Any]] | None = None
    into: str | None = None
    reducer: Reducer | None = None
    completion: Completion | str = "all_successful"
    max_concurrency: int | None = None

    def branch(self) -> Branch:
        """The branch every item runs, as a ``Branch``."""
        return self.machine if isinstance(self.machine, Branch) else Branch(self.machine)


FanOut = Parallel | Map


def completion_of(fan_out: FanOut) -> Completion:
    """The fan-out's completion policy as a ``Completion`` value."""
    c = fan_out.completion
    return c if isinstance(c, Completion) else Completion(c)


def merge_outputs(outputs: Mapping[str, Any] | list[Any]) -> dict[str, Any]:
    """A reducer merging dict outputs (branch order; later branches win a clash) into one
    dict of context updates; ``None`` outputs (failed branches) are left out."""
    values = outputs.values() if isinstance(outputs, Mapping) else outputs
    merged: dict[str, Any] = {}
    for out in values:
        if out:
            merged.update(out)
    return merged


@dataclass(frozen=True)
class BranchPlan:
    """How one branch runs (``Machine.branch_plans``): its name (``""`` for a ``Map``'s),
    its machine, whether that machine wraps an action, and the declared ``Branch``."""

    name: str
    machine: Machine
    wrapped: bool
    spec: Branch = field(repr=False)
