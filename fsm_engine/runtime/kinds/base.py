"""Kinds of step as plug-ins (issue 37): the ``StepKind`` protocol and the registry the
driver and the runner dispatch through.

A *kind of step* is what a state does when an instance is stepped in it: a plain action,
a wait for an event, a review, a fan-out/join, an agent's tool-calling loop, or a kind a
plug-in adds.  Its two halves:

* **the definition** (``State`` fields, or ``State(kind=SPEC)`` for a plug-in: any object
  with ``name``, ``problems(state, fields, triggers) -> list[str]`` and
  ``export() -> dict``, see ``fsm_engine.definition.kind``): checked at load
  (``definition.check``), exported (``definition.export``, which the fingerprint, the
  diagrams, the coverage report and ``fsm test`` read);
* **the step** (a ``StepKind`` registered here): what it plans, runs and commits.

A step of an instance in state ``S`` of kind ``K`` (``runtime.driver``):

1. ``K.plan(api, ...)`` before the instance's deadline and loop cap are checked when
   ``K.bounded`` is False (a wait, a review: no action, nothing spent), after them
   otherwise: a ``StepCommit`` (nothing runs) or ``None``;
2. else, after the retry's backoff and a lease check, ``K.run(api, ...)``: the
   ``StepCommit`` recording what ran (the plain kind: ``Driver.run_action``);
3. the commit: the driver's (version compare-and-set through the group committer), or
   ``K.commit(api, ...)`` for a kind whose commit is fenced on other instances (fan-out);
4. a transition *into* a state of kind ``K`` passes through ``K.enter`` (fan-out starts
   its children in that same commit).

Where it sits, and why: ``kinds/`` is a floor below the driver and the runner
(``pyproject.toml``, the ``runtime`` contract), so a kind never imports them; it gets
the driver as ``api``, typed by the ``DriverAPI`` protocol below — the public surface a
kind may use, and nothing else (the agent kind used ``Driver`` privates before).  The
driver imports only this registry (and the built-in kinds, to register them).  Each
compiled machine resolves its states' kinds once (``table``): the hot path of a plain
action is a dict lookup and an identity test, not a walk of the registry.

The definition half has one path too: ``definition.kind.StateKind``, through which
``check``, ``export``, the diagrams' notes, ``definition.timers`` (which states wait)
and the compiled machine see every kind — the built-in fields through adapters beside
their declarations (``WAIT``, ``review.REVIEW``, ``check_fanout.FAN_OUT``,
``agent.AGENT``), a plug-in's ``KindSpec`` through ``PLUGIN``.  Entering a state whose
kind ``parks`` (wait, review; a plug-in's spec may say so) leaves the instance waiting in
``outcome._enter`` by ``CompiledMachine.parks``; ``CompiledMachine.model_use`` asks each
kind's ``calls_model`` (the agent); the runner continues a family where the kind says
its state ``awaits_family`` (fan-out: reason ``children``).

Still outside this seam (issue 37, left), and why: parking stays in ``outcome._enter``
rather than a ``StepKind.enter`` because a state is entered on paths that do not pass
the driver's ``enter`` dispatch (a join's transition, a route to ``on_loop_limit`` /
``on_circuit_open``, ``fsm rerun``'s reset), and ``outcome`` is a floor below
``kinds``; the runner's family machinery (``kinds.families``) is fan-out's own;
coverage (``fsm_engine.coverage``: a review's choices) and replay read the export and
the history rows a kind commits, with no hook of their own (a plug-in's rows count
as moves).

The built-in kinds are in ``kinds.builtin``.  A new kind is one module with its spec
class and its ``StepKind``, registered at import by ``register(MyKind())``; the machine
module that uses the spec imports that module (see docs/explanation/architecture.md,
*Where to add → a kind of step*, and ``tests/runtime/kinds/test_kind_plugin.py``).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Coroutine, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from ...errors import FsmError
from ...store.records import WAITING, InstanceRecord, OutboxBegin, OutboxRow, StepCommit
from .. import outcome

if TYPE_CHECKING:
    from ...definition.spec import State
    from ...store.base import Store
    from ..compiled import CompiledMachine
    from ..step import Step
    from ..threads import ActionThreads


class DriverAPI(Protocol):
    """What a kind may use of the driver stepping it (``runtime.driver.Driver``).

    Attributes: ``store`` (reads only: every write is a returned ``StepCommit``), ``clock()``
    (the engine's clock, seconds), ``rng``, ``threads`` (the action thread pool),
    ``tracer`` (OpenTelemetry, or None), ``lease_current(owner) -> bool``, ``host(rec)``
    (the worker new children are created owned by, or None), ``begins`` (``await
    begins(OutboxBegin)`` -> the outbox row, this attempt counted).
    """

    store: Store
    clock: Callable[[], float]
    rng: random.Random
    threads: ActionThreads
    tracer: Any
    lease_current: Callable[[str | None], bool]
    host: Callable[[InstanceRecord], str | None]

    async def begins(self, item: OutboxBegin) -> OutboxRow:
        """The outbox row of ``item``'s key, this attempt counted (coalesced per loop turn)."""
        ...

    def advance(self, cm: CompiledMachine, rec: InstanceRecord, state: State,
                step: Step | None, trigger: str | None, update: Mapping[str, Any],
                ms: float, *, kind: str = "transition", reason: str | None = None,
                error: str | None = None) -> StepCommit:
        """The commit taking the transition chosen after ``update`` (``Driver.advance``)."""
        ...

    def on_error(self, cm: CompiledMachine, rec: InstanceRecord, state: State,
                 step: Step | None, exc: BaseException, ms: float) -> StepCommit:
        """The commit after a failed attempt: retry later, fallback, skip, pause or fail."""
        ...

    def make_step(self, cm: CompiledMachine, rec: InstanceRecord, state: State,
                  spent: int = 0, *, long_visit: bool = False) -> Step:
        """The ``Step`` an action (or a model turn) of ``rec`` in ``state`` gets; ``spent``:
        this visit's tokens in earlier commits, ``long_visit``: a visit over many commits."""
        ...

    def check_lease(self, rec: InstanceRecord) -> None:
        """Raise ``StaleWrite`` when this worker's lease on ``rec`` ran out."""
        ...

    def kind_state(self, name: str) -> dict[str, Any]:
        """A dict kept by this driver for the kind ``name`` (its caches), created empty."""
        ...

    async def run_action(self, cm: CompiledMachine, rec: InstanceRecord, state: State,
                         now: float) -> StepCommit:
        """Run the state's action under its policies (the plain kind's ``run``)."""
        ...

    async def decide(self, cm: CompiledMachine, rec: InstanceRecord) -> StepCommit:
        """The commit one step of ``rec`` would make (``plan``, else ``run``)."""
        ...

    async def submit(self, step: StepCommit) -> bool:
        """Commit ``step`` as the group committer's fenced submit; False when stale."""
        ...


class StepKind:
    """One kind of step.  Subclass it, override the hooks it needs, ``register`` one instance.

    ``name`` names the kind (unique in the registry).  Which hooks a subclass overrides is
    read once, when the class is made (``plans``, ``runs``, ``owns_commit``, ``enters``):
    a hook left alone costs nothing per step.  Hooks return commits, never write.
    """

    name: ClassVar[str] = ""
    #: False: ``plan`` comes before the instance's deadline and loop cap (a step that
    #: waits spends nothing, so neither limit stops it).
    bounded: ClassVar[bool] = True
    #: True: the runner continues its children's family here (fan-out).
    families: ClassVar[bool] = False
    plans: ClassVar[bool] = False
    runs: ClassVar[bool] = False
    owns_commit: ClassVar[bool] = False
    enters: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.plans = cls.plan is not StepKind.plan
        cls.runs = cls.run is not StepKind.run
        cls.owns_commit = cls.commit is not StepKind.commit
        cls.enters = cls.enter is not StepKind.enter

    def matches(self, state: State) -> bool:
        """True when ``state`` is of this kind (the first registered kind matching wins).
        Default: its plug-in spec (``State.kind``) has this kind's ``name`` — by name, not
        class, so a machine file loaded twice (by path, by module) still matches."""
        spec = state.kind
        return spec is not None and getattr(spec, "name", None) == self.name

    def plan(self, api: DriverAPI, cm: CompiledMachine, rec: InstanceRecord, state: State,
             now: float) -> StepCommit | None:
        """The commit of a step that runs nothing (a wait, a timer, a join), or ``None``:
        ``run``.  ``now``: the engine's clock, seconds."""
        return None

    def run(self, api: DriverAPI, cm: CompiledMachine, rec: InstanceRecord, state: State,
            now: float) -> Coroutine[Any, Any, StepCommit]:
        """The commit recording what ran; an error of the step's own goes through
        ``api.on_error`` (retry, fallback, failure), never out.  Raises ``StaleWrite`` when
        the lease was lost.  Default: the state's action (``api.run_action``)."""
        return api.run_action(cm, rec, state, now)

    async def commit(self, api: DriverAPI, cm: CompiledMachine,
                     rec: InstanceRecord) -> InstanceRecord:
        """A whole step, commit included, for a kind whose commit is fenced on other
        instances (``api.decide`` then ``api.submit``, again while it comes back stale);
        the new record.  Raises ``StaleWrite`` when ``rec`` itself moved."""
        raise NotImplementedError

    def enter(self, api: DriverAPI, cm: CompiledMachine, step: StepCommit,
              rec: InstanceRecord) -> StepCommit:
        """``step`` (a transition of ``rec`` into a state of this kind) with what entering
        does in the same commit (fan-out: the children created)."""
        return step

    def awaits_family(self, rec: InstanceRecord) -> bool:
        """True when ``rec``, waiting in a state of this kind, waits on its family of
        children, which a run that continues families (``families``) then runs here
        before it steps ``rec`` again.  Default: False."""
        return False


class PlainAction(StepKind):
    """A state whose action (or none) runs under its policies: the default kind."""

    name = "action"

    def matches(self, state: State) -> bool:
        return True


PLAIN = PlainAction()
_KINDS: list[StepKind] = []


def register(kind: StepKind) -> StepKind:
    """Add ``kind`` to the registry (before the plain kind, which matches every state);
    returns it.  Raises ``FsmError`` when a kind of that name is registered."""
    if not kind.name or any(k.name == kind.name for k in (*_KINDS, PLAIN)):
        raise FsmError(f"a kind of step named {kind.name!r} is registered already "
                              "(or the name is empty)")
    _KINDS.append(kind)
    return kind


def unregister(name: str) -> None:
    """Remove the kind ``name`` (a test's throwaway kind); machines compiled since keep it."""
    _KINDS[:] = [k for k in _KINDS if k.name != name]


def kind_of(state: State) -> StepKind:
    """The kind of ``state``: the first registered kind that matches it, else ``PLAIN``."""
    for kind in _KINDS:
        if kind.matches(state):
            return kind
    return PLAIN


def registered() -> tuple[str, ...]:
    """The names of the registered kinds, in dispatch order (the plain kind last)."""
    return (*(k.name for k in _KINDS), PLAIN.name)


class Kinds(dict[str, StepKind]):
    """One compiled machine's states' kinds (state name -> kind), resolved once."""

    def __init__(self, cm: CompiledMachine) -> None:
        super().__init__((name, kind_of(s)) for name, s in cm.states.items())
        #: The states a transition into passes through their kind's ``enter``.
        self.entering = {name: k for name, k in self.items() if k.enters}
        #: True when a state's kind runs a family of children (the runner continues it).
        self.families = any(k.families for k in self.values())


def table(cm: CompiledMachine) -> Kinds:
    """``cm``'s kinds (``Kinds``), resolved at its first step and kept on it."""
    kinds = cm.kinds
    if kinds is None:
        kinds = cm.kinds = Kinds(cm)
    return kinds


def timer_due(rec: InstanceRecord, now: float) -> bool:
    """True when ``rec`` waits with a timer that is due (``next_attempt_at`` ≤ ``now``):
    a review's SLA, or a plug-in's timer; the runner steps it instead of leaving it."""
    return rec.status == WAITING and rec.next_attempt_at is not None \
        and rec.next_attempt_at <= now


def waiting(rec: InstanceRecord, now: float, until: float | None = None) -> StepCommit:
    """The commit leaving ``rec`` waiting where it is, holding no worker (no history row);
    ``until``: a timer's due time (epoch seconds, ``next_attempt_at``): the runner, a
    worker or ``fsm resume`` steps it again once due (``timer_due``)."""
    new = outcome.clone(rec)
    new.status, new.owner, new.updated_at = WAITING, None, now
    if until is not None:
        new.next_attempt_at = until
    return StepCommit(new, rec.version, before=rec)
