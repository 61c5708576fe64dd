"""The declarative parts of a machine: ``State``, ``Transition`` and ``Machine``.

These are plain frozen values.  Nothing runs here; ``fsm_engine.definition.check``
validates a ``Machine`` and ``fsm_engine.runtime.compiled`` turns it into
something that can be stepped.

An *action* is ``fn(ctx)`` or ``fn(ctx, step)`` (sync or ``async``), where
``ctx`` is the instance context (an instance of the machine's pydantic model)
and ``step`` a :class:`fsm_engine.runtime.step.Step`.  It returns ``None``,
a ``dict`` of context updates (top-level field → new value), or
:func:`fire` ``(trigger, **updates)`` to choose a trigger.

A *guard* is ``fn(ctx)`` or ``fn(ctx, run)`` returning ``bool``, where ``run``
is a :class:`RunInfo`.  Guards must be pure and cheap: they are evaluated once
per step, their results are recorded in the history.  An ``async def`` guard is
a definition error (its coroutine would always be truthy); a guard returning
anything but a ``bool`` (``numpy.bool_`` counts) fails the instance, its result
recorded as ``"<type>: <repr>"`` among the history row's guards.

Actions and guards may be given as callables or as names; names are resolved
in the module that defines the machine, when the machine is checked.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from ..policies import CachePolicy, RetryPolicy
from .export import export_machine
from .fanout import BranchPlan, Parallel
from .refs import Ref
from .refs import as_refs as as_refs  # re-exported: their home was here
from .refs import ref_name as ref_name
from .review import Review

if TYPE_CHECKING:
    from .agent import Agent
    from .fanout import Branch, FanOut
    from .kind import KindSpec

#: Triggers the runtime fires itself; actions may fire them too.
FALLBACK = "fallback"
BUDGET_EXHAUSTED = "budget_exhausted"
RESERVED_TRIGGERS = frozenset({FALLBACK, BUDGET_EXHAUSTED})


@dataclass(frozen=True, slots=True)
class Fire:
    """An action's result naming the trigger to fire, with context updates."""

    trigger: str | None
    update: Mapping[str, Any] = field(default_factory=dict)


def fire(trigger: str, **update: Any) -> Fire:
    """Return from an action to fire ``trigger`` after applying ``update`` to the context."""
    return Fire(trigger, update)


@dataclass(frozen=True, slots=True)
class RunInfo:
    """What a guard may read besides the context (all counts in transitions / tokens)."""

    instance_id: str
    state: str
    loop_count: int
    max_transitions: int
    tokens_used: int
    token_budget: int | None
    #: Tokens spent in this visit of the state (failed attempts and re-asks included).
    state_tokens_used: int = 0
    #: The state's per-visit budget (``State.token_budget``), ``None`` when it has none.
    state_token_budget: int | None = None

    @property
    def tokens_remaining(self) -> int | None:
        """Tokens left in the budget, ``None`` when the instance has no budget."""
        if self.token_budget is None:
            return None
        return max(0, self.token_budget - self.tokens_used)

    @property
    def state_tokens_remaining(self) -> int | None:
        """Tokens left in this visit's state budget, ``None`` when the state has none."""
        if self.state_token_budget is None:
            return None
        return max(0, self.state_token_budget - self.state_tokens_used)


@dataclass(frozen=True, slots=True)
class State:
    """A state of a machine.

    Args:
        name: any non-empty string (spaces, quotes, colons, CJK are fine).
        action: what runs when the instance is stepped in this state (see module doc).
        final: the instance ends here.  ``failure=True`` makes it a failure end
            (status ``failed``); the runtime moves unhandled failures to the
            machine's failure state when there is one.
        wait: the instance stops in status ``waiting`` until ``Engine.send`` fires a trigger.
        timeout: seconds one attempt of the action may take (``None``: no limit).
        retry: retry policy for retryable errors (``None``: one attempt).
        fallback: state to go to when retries are exhausted, the timeout fires,
            the circuit breaker is open or the budget is exhausted; adds a
            ``fallback`` transition.
        side_effect: the action has an external effect: it runs at most once to
            completion per visit, under an idempotency key recorded in the outbox.
        skippable: when the action fails for good, apply ``default_output`` and
            continue as if it had returned it (recorded as skipped).
        llm: the name of the model this state's action calls (``step.llm``); names map
            to providers at run time (``Engine(llm={"primary": …, "fallback": …})``,
            ``fsm run --llm primary=openai:gpt-4o-mini``), an unmapped name uses the
            default provider.  ``None``: the default provider.
        repair_llm: the model that answers ``step.llm.structured``'s re-asks (a cheap
            format-fixing model); ``None``: the state's own model.
        token_budget: tokens the state's model calls may spend per visit, failed
            attempts and re-asks included (``None``: only the instance's budget
            applies); checked before each call like the instance's budget, and an
            exhausted one takes the state's ``budget_exhausted`` transition (else
            its fallback).  Guards read what is left as ``run.state_tokens_remaining``.
        review: a person decides here (``fsm_engine.definition.review.Review``): entering
            records a review item and the instance waits, holding no worker, for
            ``Engine.decide`` / ``fsm review decide`` (or the SLA timer).
        cache: answer this state's model calls from stored replies
            (``fsm_engine.policies.CachePolicy``); never on a side-effect state.
        fan_out: a ``Parallel`` or ``Map`` (``fsm_engine.definition.fanout``): entering
            the state starts one child instance per branch; the state then takes
            ``joined`` or ``branch_failed`` under the completion policy (no action).
        queue: the queue the instance is in while in this state (default ``"default"``):
            ``fsm worker --queue NAME`` serves only some queues, and concurrency limits
            are per queue (``--concurrency llm=4,io=32``, ``--queue-limit llm=8``), so
            slow model calls (``"llm"``) never take the slots of light steps (``"io"``).
        inline: run a plain ``def`` action on the event loop, like an ``async def`` one,
            instead of in a worker thread (saves the thread hand-off, ~0.1–0.3 ms a
            step).  Only for quick actions that never block: no I/O, no sleeping, no
            ``step.llm.complete_sync`` (it raises ``FsmError`` there); while it runs no
            other instance moves.  It cannot be cut short, so it takes no ``timeout``
            (the instance's deadline is checked before it starts).  No effect on an
            ``async def`` action.
        agent: a tool-calling loop (``fsm_engine.definition.agent.Agent``) run instead of
            an action: every model turn and tool call is journaled as a history row of
            kind ``tool``; it leaves by ``done`` (the validated output) or the outcomes
            ``turns_exhausted``, ``budget_exhausted`` and ``rejected``.
        on_exhausted: ``"pause"``: when this state's retries or a token budget run out
            and no fallback or skip applies, the instance pauses (status ``paused``,
            the reason kept) instead of failing, for an operator to fix the cause and
            ``fsm unpause`` it; ``"fail"``: fail even when the machine says pause;
            ``None``: the machine's ``on_retries_exhausted``.
        kind: a kind of step added as a plug-in (``fsm_engine.definition.kind.KindSpec``,
            stepped by the ``StepKind`` its module registers, ``runtime.kinds.base``).
    """

    name: str
    action: Ref | None = None
    final: bool = False
    failure: bool = False
    wait: bool = False
    timeout: float | None = None
    retry: RetryPolicy | None = None
    fallback: str | None = None
    side_effect: bool = False
    skippable: bool = False
    default_output: Mapping[str, Any] | None = None
    description: str = ""
    llm: str | None = None
    repair_llm: str | None = None
    token_budget: int | None = None
    review: Review | None = None
    cache: CachePolicy | None = None
    fan_out: FanOut | None = None
    queue: str = "default"
    inline: bool = False
    agent: Agent | None = None
    on_exhausted: str | None = None
    kind: KindSpec | None = None


@dataclass(frozen=True, slots=True)
class Transition:
    """A transition: on ``trigger``, from ``source`` (a name, a list, or ``"*"``) to ``dest``.

    ``conditions`` must all be true and ``unless`` all false for it to be taken
    (the ``transitions`` library's semantics).  Among candidates the first
    declared wins.

    ``after`` makes it a *timer* edge (``fsm_engine.definition.timers``): it fires by
    itself once its source has been current for ``after`` — seconds (``int``/``float``
    > 0), a ``timedelta``, or a callable of the context returning seconds or an aware
    ``datetime`` (evaluated once, when the source is entered, and recorded in that
    step's history row as ``detail.timers``; for the initial state, or the state a
    fork starts in, in an ``armed`` row by the visit's first step) — and nothing else
    left it.  Only out of
    a state that waits: ``wait=True``, a review, a fan-out.  Its fire is an ordinary
    committed step (history ``kind: timer``, ``detail.timer``: ``due``, ``lateness_s``).
    """

    trigger: str
    source: str | Sequence[str]
    dest: str
    conditions: Ref | Sequence[Ref] = ()
    unless: Ref | Sequence[Ref] = ()
    after: float | timedelta | Callable[[Any], float | datetime] | None = None

    def sources(self, all_states: Sequence[str], finals: frozenset[str] = frozenset()) -> list[str]:
        """The source state names, ``"*"`` expanded to every state not in ``finals``."""
        if self.source == "*":
            return [s for s in all_states if s not in finals]
        return [self.source] if isinstance(self.source, str) else list(self.source)


@dataclass(frozen=True)
class Machine:
    """A machine definition (data only).

    Args:
        name: identifier stored with every instance.
        states: the states; their order is the display order.
        transitions: the transitions, in priority order.
        initial: name of the initial state.
        context: pydantic model of the instance context; input is validated against it.
        max_transitions: loop cap; an instance that has made this many
            transitions without reaching a final state fails with reason ``loop_limit``.
        token_budget: default token budget per instance (``None``: unlimited).
        namespace: where string references are resolved; defaults to the
            globals of the module that created the machine.
        tally: context fields whose values are counted over the instances of a run
            (``fsm run`` prints the counts at its end, e.g. where verdicts came from).
        outcome: context fields that sum up an instance's result, each a field name or a
            dotted path into a dict or model field (``"verdict.decision"``): ``fsm run``'s
            closing table shows them per instance, each named by its last part
            (``decision=approve``; ``()``: the final state).
        on_loop_limit: a review state the instance goes to when it reaches
            ``max_transitions`` instead of failing (``None``: fail with ``loop_limit``);
            the reviewer's decision grants another ``max_transitions`` transitions.
        on_circuit_open: a review state the instance goes to when its model's circuit
            breaker is open and the state has no fallback (``None``: fail).
        on_retries_exhausted: ``"pause"``: an instance whose retries (or token budget)
            run out pauses with the reason instead of failing (``State.on_exhausted``
            overrides it per state); ``None`` or ``"fail"``: it fails.
        version: the machine's version (an int >= 1), stored with every instance and
            history row.  Bump it whenever the structure (states, transitions, the
            context model) changes: an instance stored under an older version is upcast
            when it next steps (``fsm_engine.runtime.kinds.migration``); one stored under the
            same version with another fingerprint is refused (``FingerprintMismatch``).
        migrations: ``{k: upcaster}`` for every version ``k`` in ``2..version``: a pure
            function of the context as a JSON dict (the version ``k - 1`` shape)
            returning the version ``k`` dict; ``None`` for a version whose context did
            not change (only states renamed or added).  The result is validated by
            ``context``.
        renamed_states: ``{old name: new name}`` for states renamed since an older
            version; a stored instance standing in ``old`` continues in ``new``.
    """

    name: str
    states: Sequence[State]
    transitions: Sequence[Transition]
    initial: str
    context: type[BaseModel]
    max_transitions: int = 100
    token_budget: int | None = None
    description: str = ""
    namespace: Mapping[str, Any] | None = field(default=None, compare=False, repr=False)
    tally: Sequence[str] = ()
    outcome: Sequence[str] = ()
    on_loop_limit: str | None = None
    on_circuit_open: str | None = None
    on_retries_exhausted: str | None = None
    version: int = 1
    migrations: Mapping[int, Callable[[dict[str, Any]], dict[str, Any]] | None] = field(
        default_factory=dict, compare=False, repr=False)
    renamed_states: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.namespace is None:
            frame = inspect.currentframe()
            caller = frame.f_back.f_back if frame and frame.f_back else None
            object.__setattr__(self, "namespace", caller.f_globals if caller else {})
        object.__setattr__(self, "states", tuple(self.states))
        object.__setattr__(self, "transitions", tuple(self.transitions))

    def all_transitions(self) -> list[Transition]:
        """Declared transitions plus one ``fallback`` transition per ``State.fallback``."""
        extra = [Transition(FALLBACK, s.name, s.fallback) for s in self.states if s.fallback]
        return list(self.transitions) + extra

    def state(self, name: str) -> State:
        """The state called ``name``; ``KeyError`` when there is none."""
        for s in self.states:
            if s.name == name:
                return s
        raise KeyError(name)

    @property
    def finals(self) -> frozenset[str]:
        """Names of the final states."""
        return frozenset(s.name for s in self.states if s.final)

    @property
    def failure_state(self) -> str | None:
        """The first final state marked ``failure``, where unhandled failures go."""
        return next((s.name for s in self.states if s.final and s.failure), None)

    def branch_plans(self, state: State) -> list[BranchPlan]:
        """The branches of ``state`` (one of ``states``) when it fans out, in declaration
        order (a ``Map`` has one, run once per item); a branch given as an action is
        wrapped as a one-state machine (what the definition implies, as
        ``all_transitions`` adds the fallback transitions).  ``[]`` without ``fan_out``."""
        fan_out = state.fan_out
        if fan_out is None:
            return []
        named = (fan_out.normalised() if isinstance(fan_out, Parallel)
                 else {"": fan_out.branch()})
        return [BranchPlan(name, b.run, False, b) if isinstance(b.run, Machine)
                else BranchPlan(name, _wrap_action(self, state.name, name, b), True, b)
                for name, b in named.items()]

    def export(self) -> dict[str, Any]:
        """A plain-dict view for diagrams, fingerprints and review (JSON-serialisable)."""
        return export_machine(self)


def _wrap_action(parent: Machine, state: str, name: str, branch: Branch) -> Machine:
    """A single action as a one-state branch machine on the parent's context model
    (its retry, timeout and fallback action from ``branch``)."""
    label = f"{parent.name}.{state}" + (f".{name}" if name else "")
    states = [State("run", action=branch.run, retry=branch.retry,  # type: ignore[arg-type]
                    timeout=branch.timeout, llm=branch.llm,
                    fallback="fallback" if branch.fallback is not None else None)]
    transitions = [Transition("done", "run", "done")]
    if branch.fallback is not None:
        states.append(State("fallback", action=branch.fallback, llm=branch.llm))
        transitions.append(Transition("done", "fallback", "done"))
    states += [State("done", final=True), State("failed", final=True, failure=True)]
    return Machine(name=label, context=parent.context, initial="run", states=states,
                   transitions=transitions, max_transitions=10, namespace=parent.namespace)
