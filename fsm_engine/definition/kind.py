"""Kinds of step as the definition sees them (issue 37): ``KindSpec``, the declarative half
of a kind added as a plug-in, and ``StateKind``, the one protocol through which the
definition layer checks, exports and draws every kind, built-in or plug-in.

A plug-in kind's state is ``State("cool", kind=SPEC)``, ``SPEC`` a frozen value of the
kind's own class with the members of ``KindSpec``.  The definition never imports a kind:
it calls these, so a kind is checked at load (``definition.check``, each problem prefixed
with the state), exported (``definition.export``: the state's ``"kind"`` entry, which the
fingerprint, the diagrams (a note per state), the coverage report and ``fsm test`` read)
and then stepped by the ``StepKind`` its module registers (``runtime.kinds.base``).

The built-in kinds are fields of ``State`` (``wait``, ``review``, ``fan_out``, ``agent``);
each is seen through a ``StateKind`` beside its declaration (``WAIT`` here,
``review.REVIEW``, ``check_fanout.FAN_OUT``, ``agent.AGENT``), and a plug-in's spec
through ``PLUGIN``.  ``kinds_of(state)`` lists the ones a state declares (one, in a
valid machine; each reports its own combination problems); ``KINDS`` is the dispatch
order, which is also the order of their problems, export entries and diagram notes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from .agent import AGENT
from .check_fanout import FAN_OUT
from .review import REVIEW

if TYPE_CHECKING:
    from .spec import Machine, State


@runtime_checkable
class KindSpec(Protocol):
    """What a plug-in kind's spec offers the definition layer.

    ``name``: the kind's name (its ``StepKind.name``); ``problems(state, fields,
    triggers)``: what is wrong with it on the state named ``state`` (context ``fields``,
    the state's declared ``triggers``), empty when nothing is; ``export()``: its
    settings as a JSON-able dict (part of the machine's fingerprint: change it and
    stored instances need a migration); ``note()``: the one-line label diagrams show.

    Optional members, read with ``getattr`` (default False): ``parks``: entering the
    state leaves the instance waiting (status ``waiting``, no worker) in the entering
    commit, for an event or a decision to move it (its ``StepKind.plan`` then meets it
    waiting); ``calls_model``: its step calls a model, so a run loads one
    (``CompiledMachine.model_use``).
    """

    name: str

    def problems(self, state: str, fields: Sequence[str],
                 triggers: Sequence[str]) -> list[str]: ...

    def export(self) -> dict[str, Any]: ...

    def note(self) -> str: ...


@dataclass(frozen=True)
class Site:
    """A state of a machine, where a kind is checked or exported.

    ``problems_of(m)``: every problem of a nested machine ``m`` (``[]``: none), given by
    ``check``; ``export_of(m)``: a nested machine's export, given by ``export`` (a
    fan-out's branch machines: so no kind module imports ``check`` or ``export``).
    """

    machine: Machine
    state: State
    problems_of: Callable[[Machine], list[str]] | None = None
    export_of: Callable[[Machine], dict[str, Any]] | None = None

    @property
    def where(self) -> str:
        """``state 'NAME'``, the prefix of the state's problems."""
        return f"state {self.state.name!r}"

    @property
    def fields(self) -> list[str]:
        """The machine's context fields (``[]`` when its context is not a model class)."""
        context = self.machine.context
        return list(context.model_fields) if isinstance(context, type) else []

    @property
    def triggers(self) -> list[str]:
        """The triggers declared from the state (fallback transitions included)."""
        m, name = self.machine, self.state.name
        names = [s.name for s in m.states]
        return [t.trigger for t in m.all_transitions() if name in t.sources(names, m.finals)]


class StateKind(Protocol):
    """One kind of step as the definition layer sees it (a singleton in ``KINDS``).

    ``name``: its ``StepKind.name``; ``waits``: a state of it holds no worker while it
    waits, so a timer edge may leave it (``definition.timers``); ``matches(state)``: the
    state declares it; ``parks(state)``: entering it leaves the instance waiting in the
    entering commit (``runtime.outcome``; a fan-out waits only once its children are
    created, by its ``StepKind.enter``); ``calls_model(state)``: its step calls a model
    by itself (``CompiledMachine.model_use``); ``problems(site)``: what is wrong, each
    naming the state; ``export(site)``: its entries in the state's export (``{}``: none;
    part of the fingerprint); ``notes(exported)``: its diagram notes, read from an
    exported state (the diagrams draw stored exports too).
    """

    name: str
    waits: bool

    def matches(self, state: State) -> bool: ...

    def parks(self, state: State) -> bool: ...

    def calls_model(self, state: State) -> bool: ...

    def problems(self, site: Site) -> list[str]: ...

    def export(self, site: Site) -> dict[str, Any]: ...

    def notes(self, exported: Mapping[str, Any]) -> list[str]: ...


class Wait:
    """``State(wait=True)``: waits for ``Engine.send``.  Its flag is one of every state's
    exported fields (``wait``), so it adds no entry of its own."""

    name, waits = "wait", True

    def matches(self, state: State) -> bool:
        return bool(state.wait)

    def parks(self, state: State) -> bool:
        return True

    def calls_model(self, state: State) -> bool:
        return False

    def problems(self, site: Site) -> list[str]:
        return [f"{site.where}: a wait state has no action"] \
            if site.state.action is not None else []

    def export(self, site: Site) -> dict[str, Any]:
        return {}

    def notes(self, exported: Mapping[str, Any]) -> list[str]:
        return ["waits for event"] if exported.get("wait") and not exported.get("final") \
            else []


class PlugIn:
    """``State(kind=SPEC)``: a plug-in kind, through its ``KindSpec``."""

    name, waits = "kind", False

    def matches(self, state: State) -> bool:
        return state.kind is not None

    def parks(self, state: State) -> bool:
        return bool(getattr(state.kind, "parks", False))

    def calls_model(self, state: State) -> bool:
        return bool(getattr(state.kind, "calls_model", False))

    def problems(self, site: Site) -> list[str]:
        s = site.state
        assert s.kind is not None
        if s.review is not None or s.agent is not None or s.fan_out is not None or s.wait:
            return [f"{site.where}: kind {s.kind.name!r} cannot be combined with review, "
                    "agent, fan_out or wait"]
        return [f"{site.where}: kind {s.kind.name!r}: {p}"
                for p in s.kind.problems(s.name, site.fields, site.triggers)]

    def export(self, site: Site) -> dict[str, Any]:
        spec = site.state.kind
        assert spec is not None
        return {"kind": {"name": spec.name, "note": spec.note(), **spec.export()}}

    def notes(self, exported: Mapping[str, Any]) -> list[str]:
        kind = exported.get("kind")
        return [str(kind.get("note") or kind.get("name"))] if isinstance(kind, Mapping) \
            else []


WAIT, PLUGIN = Wait(), PlugIn()
#: Every kind, in the order of their problems, export entries and diagram notes.
KINDS: tuple[StateKind, ...] = (WAIT, REVIEW, FAN_OUT, AGENT, PLUGIN)


def kinds_of(state: State) -> tuple[StateKind, ...]:
    """The kinds ``state`` declares, in ``KINDS`` order (``()``: a plain action or a
    final state; more than one only in a machine ``check`` refuses)."""
    return tuple(k for k in KINDS if k.matches(state))


def spec_of(state: State) -> StateKind | None:
    """The kind of ``state`` (the first it declares), ``None`` for a plain action."""
    return next((k for k in KINDS if k.matches(state)), None)
