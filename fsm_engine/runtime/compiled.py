"""Compile a checked definition into an immutable, shareable machine.

This is the only module that imports ``transitions``.  One
``transitions.Machine`` is built per definition (not per instance) with no
model attached.  Choosing a transition walks, in declaration order, the
``transitions.Transition`` objects of the current state and evaluates each
one's ``transitions.Condition`` list (``conditions`` must be true, ``unless``
false) with one shared ``EventData``: the library's guard semantics without
its per-trigger callback machinery, so many instances share one compiled
machine and a choice costs a few microseconds.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

import transitions

from ..definition import Machine, RunInfo, check, fingerprint
from ..definition.fanout import completion_of
from ..definition.kind import kinds_of
from ..definition.refs import as_refs, ref_name
from ..definition.spec import RESERVED_TRIGGERS, State
from ..definition.timers import by_state as timers_by_state
from ..errors import ActionError
from .values import partial_dump

if TYPE_CHECKING:
    from .kinds.base import Kinds


class Choice(NamedTuple):
    """The transition picked for a step, with every guard evaluated (``[name, result]``)."""

    trigger: str
    dest: str
    guards: list[list[Any]]


def _arity(fn: Callable[..., Any]) -> int:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return 2
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return 2
    pos = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return 2 if len(pos) >= 2 else 1


class GuardResultError(ActionError):
    """A guard returned something other than a bool (the driver fails the instance)."""


def _recording(name: str, fn: Callable[..., Any]) -> Callable[..., bool]:
    """Wrap a guard so each evaluation is appended to the step's guard log.

    A guard must return a ``bool`` (``numpy.bool_`` counts): anything else is
    logged as ``[name, "<type>: <repr>"]`` and raises ``GuardResultError``, so
    the instance fails naming the guard instead of taking a transition on the
    truthiness of ``None``, a list or a coroutine.
    """
    two = _arity(fn) == 2

    def guard(ctx: Any, run: RunInfo, log: list[list[Any]]) -> bool:
        result = fn(ctx, run) if two else fn(ctx)
        if result is not True and result is not False:
            if type(result).__name__ != "bool_":  # numpy.bool_
                shown = f"{type(result).__name__}: {result!r}"[:200]
                log.append([name, shown])
                raise GuardResultError(f"guard {name!r} returned {shown}, not a bool")
            result = bool(result)
        log.append([name, result])
        return result
    return guard


class FanOutPlan(NamedTuple):
    """A compiled fan-out state: its spec, policy and branch machines (compiled)."""

    state: str
    spec: Any                      # definition.fanout.Parallel | Map
    completion: Any                # policies.Completion
    branches: tuple[Any, ...]      # definition.fanout.BranchPlan, one per branch
    machines: tuple[CompiledMachine, ...]

    @property
    def is_map(self) -> bool:
        """True for a ``Map`` (one branch machine, run once per item)."""
        return hasattr(self.spec, "items")


def _fan_outs(machine: Machine) -> dict[str, FanOutPlan]:
    out = {}
    for s in machine.states:
        if s.fan_out is not None:
            branches = tuple(machine.branch_plans(s))
            out[s.name] = FanOutPlan(s.name, s.fan_out, completion_of(s.fan_out), branches,
                                     tuple(compile_machine(b.machine) for b in branches))
    return out


class CompiledMachine:
    """A definition ready to step: immutable, shared by every instance of the machine."""

    def __init__(self, machine: Machine) -> None:
        checked = check(machine)
        self.spec = machine
        self.name = machine.name
        self.fingerprint = fingerprint(machine)
        self.states: dict[str, State] = {s.name: s for s in machine.states}
        self.actions = {name: (fn, _arity(fn), inspect.iscoroutinefunction(fn))
                        for name, fn in checked.actions.items()}
        self.failure_state = machine.failure_state
        self._tm = transitions.Machine(
            model=None, states=list(self.states), initial=machine.initial,
            auto_transitions=False, send_event=False, ignore_invalid_triggers=True)
        self.triggers: dict[str, list[str]] = {s: [] for s in self.states}
        names = list(self.states)
        for t in machine.all_transitions():
            conds: list[Any] = [_recording(ref_name(g) or "?", checked.guards[g])
                                for g in as_refs(t.conditions)]
            unless: list[Any] = [_recording(f"!{ref_name(g)}", checked.guards[g]) for g in as_refs(t.unless)]
            for src in t.sources(names, machine.finals):
                self._tm.add_transition(t.trigger, src, t.dest, conditions=conds, unless=unless)
                if t.trigger not in self.triggers[src]:
                    self.triggers[src].append(t.trigger)
        #: Each waiting state's timers, ``[(trigger, after), ...]`` (``definition.timers``).
        self.timers = timers_by_state(machine)
        timed = {(s, trig) for s, ts in self.timers.items() for trig, _ in ts}
        self._choosable = {s: tuple(t for t in trigs if t not in RESERVED_TRIGGERS
                                    and (s, t) not in timed)
                           for s, trigs in self.triggers.items()}
        self.fields = frozenset(machine.context.model_fields)
        #: A step may dump only the fields it updated (``values.partial_dump``).
        self.partial = partial_dump(machine.context)
        #: The states entered waiting, their kind ``parks`` (wait, review: ``outcome``).
        self.parks = frozenset(name for name, s in self.states.items()
                               if any(k.parks(s) for k in kinds_of(s)))
        #: Fan-out states by name (see ``fsm_engine.runtime.kinds.fanout``).
        self.fan_outs = _fan_outs(machine)
        #: Each state's kind of step (``kinds.base.table``: resolved at the first step,
        #: once the kinds are registered; derived from the definition like the rest).
        self.kinds: Kinds | None = None
        self._plans = {s: {trig: [(t.dest, t.conditions) for t in
                               self._tm.events[trig].transitions.get(s, [])]
                           for trig in self.triggers[s]} for s in self.states}

    def family(self) -> list[CompiledMachine]:
        """This machine and every branch machine of its fan-outs, nested ones too."""
        out = [self]
        for plan in self.fan_outs.values():
            for cm in plan.machines:
                out += cm.family()
        return out

    def model_use(self) -> str:
        """Whether its states may call a model, as far as the definition tells (this machine
        and its fan-outs' branch machines): ``"declared"`` when a state says so (it names
        its model, ``llm`` or ``repair_llm``, caches its calls or its kind
        ``calls_model``: an agent, ``definition.kind``),
        ``"maybe"`` when an action takes ``step`` (it may call ``step.llm``), else
        ``"none"`` (every action takes ``ctx`` alone: no state can call one)."""
        use = "none"
        for cm in self.family():
            if any(s.llm or s.repair_llm or s.cache is not None
                   or any(k.calls_model(s) for k in kinds_of(s)) for s in cm.states.values()):
                return "declared"
            if any(arity == 2 for _, arity, _ in cm.actions.values()):
                use = "maybe"
        return use

    def has_trigger(self, state: str, trigger: str) -> bool:
        """True when ``trigger`` is declared from ``state``."""
        return trigger in self.triggers.get(state, ())

    def choosable(self, state: str) -> tuple[str, ...]:
        """Declared triggers from ``state`` that normal selection considers (not reserved,
        not a timer's)."""
        return self._choosable.get(state, ())

    def choose(self, state: str, ctx: Any, run: Callable[[], RunInfo],
               trigger: str | None = None, log: list[list[Any]] | None = None) -> Choice | None:
        """Pick the transition to take from ``state``.

        With ``trigger`` only that trigger's transitions are candidates;
        without, every non-reserved trigger from ``state`` in declaration
        order.  ``run()`` builds what two-argument guards read (``step.run_info``; called
        only when a guard is evaluated).  Returns ``None`` when no guard set passes.  Guard exceptions propagate
        (``log``, when given, collects the guards evaluated up to then, for the history).
        """
        plan = self._plans.get(state, {})
        log = [] if log is None else log
        data = None
        for trig in (trigger,) if trigger else self.choosable(state):
            for dest, conditions in plan.get(trig, ()):
                if conditions:
                    if data is None:
                        data = transitions.core.EventData(None, None, self._tm, None,
                                                          (ctx, run(), log), {})
                    if not all(cond.check(data) for cond in conditions):
                        continue
                return Choice(trig, dest, log)  # type: ignore[arg-type]  # a plan's dest is set
        return None

    def export(self) -> dict[str, Any]:
        """The definition's plain-dict export (see ``fsm_engine.definition.export``)."""
        return self.spec.export()


_CACHE: dict[int, CompiledMachine] = {}


def compile_machine(machine: Machine) -> CompiledMachine:
    """Check and compile ``machine`` once; later calls return the same object.

    Raises ``DefinitionError`` listing every problem.
    """
    key = id(machine)
    compiled = _CACHE.get(key)
    if compiled is None or compiled.spec is not machine:
        compiled = _CACHE[key] = CompiledMachine(machine)
    return compiled
