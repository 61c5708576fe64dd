"""The public runtime: start, step, run, resume, cancel and send instances.

``Engine`` owns one store connection, one group committer and one worker
identity.  Many instances run concurrently as asyncio tasks; sync actions
run in worker threads (``ActionThreads``).  Every method that changes an
instance goes through a compare-and-set on the instance's ``version``, so a
second process (another ``fsm run``, ``fsm cancel``, a ``resume``) can never
interleave half a step.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import random
import time
from typing import Any, Callable, Coroutine, Iterable, Mapping

from pydantic import BaseModel, ValidationError

from ..definition import Machine
from ..errors import (
    DefinitionError, FingerprintMismatch, FsmError, InstanceFinished, InstanceNotFound,
    InvalidInput, NeedsMigration, StaleWrite,
)
from ..policies import BreakerPolicy, RateLimit
from ..store import PENDING, Store, definitions, open_store
from ..store.claims import FINGERPRINT_MISMATCH, MACHINE_UNAVAILABLE
from ..store.records import (
    RATE_LIMITED, REVIEW_OPEN, WAITING, ChildState, InstanceRecord, ReviewItem, StepCommit,
    WorkerRow,
)
from . import migration, outcome, reviews as review_queue, values
from . import fanout, fleet
from ..definition.fanout import CHILDREN
from .commit import GroupCommitter
from .compiled import CompiledMachine, compile_machine
from .driver import Driver
from .ledger import Ledger
from .loader import Trust, load_machine, reference
from .models import Models
from .ownership import Ownership
from .threads import ActionThreads

log = logging.getLogger("fsm_engine")

#: Records this engine just created or adopted, kept so ``run`` needn't read them back
#: (a stale one is harmless: every write is compare-and-set on its version).
_KNOWN_MAX = 100_000

OnStep = Callable[[InstanceRecord], None]


def _validate_input(model: type[BaseModel], data: BaseModel | dict[str, Any] | None) -> dict[str, Any]:
    """The input as the context's JSON dict; ``InvalidInput`` when it does not fit or holds
    a value that would not come back from JSON as it went in (see ``runtime.values``)."""
    raw = dict(data.__dict__) if isinstance(data, BaseModel) else dict(data or {})
    try:
        values.check_values(model, raw)
        obj = model.model_validate(raw)
        ctx = values.dump(obj, raw)
        values.check_json(ctx)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise InvalidInput(f"input does not fit {model.__name__}: {first['msg']} at "
                           f"{'.'.join(map(str, first['loc'])) or '(root)'}") from None
    except InvalidInput as exc:
        raise InvalidInput(f"input does not fit {model.__name__}: {exc}") from None
    return ctx


def _for_instance(exc: FsmError, instance_id: str) -> FsmError:
    """``exc`` naming ``instance_id``: a copy when it names another instance (one store
    failure reaches every step of its batch as the same exception object)."""
    if exc.instance_id in (None, instance_id):
        exc.instance_id = instance_id
        return exc
    copy = type(exc).__new__(type(exc))
    copy.args, copy.__dict__ = exc.args, dict(exc.__dict__, instance_id=instance_id)
    copy.__cause__ = exc.__cause__
    return copy


def _lost_claim(instance_id: str) -> StaleWrite:
    return StaleWrite(f"instance {instance_id} was claimed by another worker first",
                      instance_id=instance_id)


def _no_branch(rec: InstanceRecord) -> CompiledMachine:
    raise DefinitionError(rec.machine, [f"module {rec.module} defines no branch machine "
                                        f"{rec.machine!r} (instance {rec.id})"])


async def _done(value: Any) -> Any:
    return value


def _runnable(kid: ChildState, parked: set[str]) -> bool:
    """True when a run of ``kid`` (not final, free) can move it: it is not waiting, or it
    waits on something its run here waits out (its own family, a rate limit) and did not
    come back waiting from a run here already (``parked``).  A child waiting for a
    review's decision or a trigger moves only from outside."""
    if kid.status != WAITING:
        return True
    return kid.reason in (CHILDREN, RATE_LIMITED) and kid.id not in parked


def _module_ref(machine: Machine) -> str:
    """Where ``machine`` can be loaded again on any host (``loader.reference``)."""
    ns = machine.namespace or {}
    path = ns.get("__file__")
    return reference(path) if path else str(ns.get("__name__", ""))


class Engine:
    """Runs instances of machines durably.

    Args:
        store: a ``Store`` or a URL for ``open_store`` (a plain path: SQLite; default ``fsm.db``).
        llm: the ``Provider`` handed to actions as ``step.llm`` (metered), or a mapping
            of model names to providers (``{"primary": …, "fallback": …, "*": default}``)
            for machines whose states name their model (``State(..., llm="primary")``);
            see :mod:`fsm_engine.runtime.models`.
        lease_seconds: a worker whose heartbeat is older than this is dead
            and its instances may be adopted (same-host dead pids at once).
        max_recoveries: adoptions of one instance from dead workers without
            progress in between before it fails with reason ``crash_loop``.
        concurrency: max instances stepping at once in ``run_many`` (None: all).
        breaker: circuit breaker thresholds, one breaker per provider + model
            shared through the store (default ``BreakerPolicy()``; ``None`` disables).
        seed: seeds the jitter RNG (reproducible backoff in tests).
        threads: most worker threads for sync actions without a timeout (a sync
            action with a timeout runs in a thread of its own, abandoned if it hangs).
        tracer: an OpenTelemetry tracer for ``fsm.run`` / ``fsm.step`` / model-call spans;
            by default the one the standard ``OTEL_*`` variables configure, else None
            (off: see ``fsm_engine.telemetry``).
        rate_limits: shared rate limits (``RateLimit``) by model name (``"*"``: the
            default provider) or ``"provider:model"``; see :mod:`fsm_engine.runtime.rates`.
        trust: which modules stored instances name may be imported (``loader.Trust``:
            those ``load``-ed here, files under the machines root; else ``MachineRefused``).
    """

    def __init__(self, store: Store | str = "fsm.db", *, llm: Any = None,
                 lease_seconds: float = 10.0, max_recoveries: int = 5,
                 concurrency: int | None = None,
                 breaker: BreakerPolicy | None = BreakerPolicy(),
                 seed: int | None = None, threads: int = 32,
                 clock: Callable[[], float] = time.time, tracer: Any = "env",
                 rate_limits: Mapping[str, RateLimit] | None = None,
                 trust: Trust | None = None) -> None:
        self.store: Store = open_store(store) if isinstance(store, str) else store
        self.trust = trust or Trust()
        self.lease_seconds = lease_seconds
        self.max_recoveries = max_recoveries
        self.concurrency = concurrency
        self.breaker_policy = breaker
        self.clock = clock
        self.ownership = Ownership(self.store, lease_seconds=lease_seconds,
                                   max_recoveries=max_recoveries, clock=clock)
        self._machines: dict[str, CompiledMachine] = {}
        self._modules: dict[str, str] = {}
        self._tasks: dict[str, asyncio.Task[InstanceRecord]] = {}
        self._known: dict[str, InstanceRecord] = {}
        self._limits_read = False  # the fleet's stored rate limits, read at the first run
        #: Instances whose run here was cancelled mid-step (still held): ``close`` keeps
        #: them, so whoever takes them next records the takeover.
        self._interrupted: set[str] = set()
        #: Children this engine runs for parents waiting in ``run`` (id -> task).
        self._kids: dict[str, asyncio.Future[Any]] = {}
        #: Parents a ``run`` here continues (their children's ends must not start another).
        self._parents: set[str] = set()
        #: Parents whose ``run`` here runs their children too: their new children are
        #: created owned by this engine's worker (no claim) and handed over in ``_born``.
        self._hosts: set[str] = set()
        self._born: dict[str, InstanceRecord] = {}
        #: Per parent waiting in ``_family``: set when one of its children run here ends.
        self._ended: dict[str, asyncio.Event] = {}
        self._threads = ActionThreads(threads)
        self.models = Models(llm, self.store, breaker, clock, rate_limits)
        #: instances handed to ``run_many``/``resume`` and not yet done: an action that never
        #: suspends would otherwise run its instance to the end before the next one starts
        #: (each commit "alone"), so these count as running for group commit from the start
        self._scheduled = 0
        #: The one writer (``runtime.ledger``): every commit of this engine goes through it.
        self.ledger = Ledger(self.store, clock)
        self.committer = GroupCommitter(
            self.ledger, solo=lambda: max(len(self._tasks), self._scheduled) <= 1)
        self.driver = Driver(self.store, self.committer, models=self.models, clock=clock,
                             rng=random.Random(seed), threads=self._threads)
        self.driver.host = lambda rec: self.worker.id if rec.id in self._hosts else None
        self.driver.lease_current = self.ownership.lease_current
        self.driver.born = lambda records: self._born.update(
            (r.id, r) for r in records if r.owner is not None)
        if isinstance(tracer, str):  # "env": as the OTEL_* variables say
            from ..telemetry import tracer_from_env
            tracer = tracer_from_env()
        self.tracer = self.driver.tracer = tracer

    @property
    def llm(self) -> Any:
        """The default provider (states naming no model, or an unmapped one, call it)."""
        return self.models.default

    @llm.setter
    def llm(self, provider: Any) -> None:
        self.models.set_default(provider)

    # -- definitions ------------------------------------------------------------
    def register(self, machine: Machine, module: str | None = None) -> CompiledMachine:
        """Check and compile ``machine``, remember where it came from, and keep its export
        in the store (``Store.put_definitions``: what the viewer draws).

        Raises ``DefinitionError`` listing every problem.
        """
        cm = compile_machine(machine)
        if module is None and self._machines.get(machine.name) is cm:
            return cm  # already registered (start_many calls this for every batch)
        ref = module or _module_ref(machine)
        for member in cm.family():  # branch machines load from the parent's module
            self.models.check(member.states)
            self._machines[member.name] = member
            self._modules[member.name] = ref
        self.store.put_definitions(definitions.rows(cm.family(), self.clock()))
        return cm

    def load(self, ref: str) -> CompiledMachine:
        """Load, check and register the machine in module ``ref`` (path or dotted name),
        which this engine then trusts (``trust``) wherever an instance names it."""
        machine, canonical = load_machine(ref)
        self.trust.allow(canonical)
        return self.register(machine, canonical)

    def check_module(self, rec: InstanceRecord) -> None:
        """Return when ``rec``'s machine is registered or its module may be imported here
        (``trust``); else ``MachineRefused`` naming the instance and the module."""
        if rec.machine not in self._machines:
            self.trust.check(rec.module, rec.id)

    def definition(self, rec: InstanceRecord) -> CompiledMachine:
        """The compiled machine ``rec`` names (loaded from its module when not registered,
        if ``trust`` allows), whatever version it has; ``DefinitionError`` when it cannot."""
        cm = self._machines.get(rec.machine)
        if cm is None:
            self.check_module(rec)
            cm = self.load(rec.module)
            if cm.name != rec.machine:  # a branch machine: registered with its parent
                cm = self._machines.get(rec.machine) or _no_branch(rec)
        return cm

    def _compiled(self, rec: InstanceRecord) -> CompiledMachine:
        """``rec``'s machine, when it can run ``rec`` (at once, or after an upcast: see
        ``migration``); else ``VersionTooNew``, ``FingerprintMismatch`` or
        ``NeedsMigration``."""
        cm = self.definition(rec)
        migration.plan(cm, rec, self.clock())
        return cm

    def _upcast(self, cm: CompiledMachine, rec: InstanceRecord) -> InstanceRecord:
        """``rec`` upcast to ``cm``'s version, in memory: the driver writes the upcast with
        the instance's next commit (one transaction).  ``rec`` itself when current."""
        self.driver.upcasts.pop(rec.id, None)
        up = migration.plan(cm, rec, self.clock())
        if up is None:
            return rec
        self.driver.upcasts[rec.id] = up
        return up.record

    # -- creating ---------------------------------------------------------------
    def start(self, machine: Machine | str, input: BaseModel | dict[str, Any] | None = None, *,
              token_budget: int | None = None, deadline_s: float | None = None,
              instance_id: str | None = None, partition: str | None = None) -> str:
        """Create an instance in the initial state (status ``pending``); return its id.

        ``input`` is validated against the machine's context model
        (``InvalidInput`` when it does not fit); ``token_budget`` (tokens)
        overrides the machine's default; ``deadline_s`` (seconds from now)
        bounds the whole instance; ``partition`` (e.g. a tenant id, 1–200
        characters) is its partition key, inherited by its children: workers
        with a partition limit hold at most that many instances of one key at
        once.  The instance is owned by this engine until it runs or this
        process dies (then any ``resume`` adopts it).
        """
        return self.start_many(machine, [input], token_budget=token_budget,
                               deadline_s=deadline_s, partition=partition,
                               ids=None if instance_id is None else [instance_id])[0]

    def start_many(self, machine: Machine | str,
                   inputs: Iterable[BaseModel | dict[str, Any] | None], *,
                   token_budget: int | None = None, deadline_s: float | None = None,
                   ids: list[str] | None = None, enqueue: bool = False,
                   partition: str | None = None) -> list[str]:
        """``start`` for many inputs in one transaction (all created, or none); an
        ``InvalidInput`` carries ``index``, the position of the input at fault.

        ``enqueue``: create them unowned, for any worker to claim (``fsm start``),
        instead of held by this engine.
        """
        if partition is not None and not (isinstance(partition, str) and 0 < len(partition) <= 200):
            raise InvalidInput(f"a partition key is 1 to 200 characters, not {partition!r}")
        cm = self.load(machine) if isinstance(machine, str) else self.register(machine)
        spec, now = cm.spec, self.clock()
        if not enqueue:
            self._register()
        records = []
        for i, data in enumerate(inputs):
            try:
                ctx = _validate_input(spec.context, data)
            except InvalidInput as exc:
                exc.index = i  # type: ignore[attr-defined]  # which input (all or none start)
                raise
            records.append(InstanceRecord(
                id=ids[i] if ids else os.urandom(6).hex(), machine=spec.name,
                module=self._modules[spec.name], fingerprint=cm.fingerprint,
                state=spec.initial, status=PENDING, context=ctx, input=dict(ctx),
                max_transitions=spec.max_transitions,
                token_budget=spec.token_budget if token_budget is None else token_budget,
                created_at=now, updated_at=now, visits={spec.initial: 1},
                deadline=None if deadline_s is None else now + deadline_s,
                owner=None if enqueue else self.worker.id, machine_version=spec.version,
                queue=cm.states[spec.initial].queue, partition_key=partition))
        self.store.create(*records)
        if not enqueue and len(self._known) + len(records) <= _KNOWN_MAX:  # run() needn't read them back
            self._known.update((r.id, r) for r in records)
        return [r.id for r in records]

    # -- ownership (see ``ownership.py``) ---------------------------------------------
    @property
    def worker(self) -> WorkerRow:
        """This engine's worker row (its id is the ``owner`` of the instances it holds)."""
        return self.ownership.worker

    def _register(self) -> None:
        self.ownership.register()

    def _ensure_worker(self) -> None:
        if not self._limits_read:
            self._limits_read = True
            self.use_limits(fleet.read(self.store))
        self.ownership.start_heartbeat(self._lost, lambda: list(self._tasks))

    def use_limits(self, limits: "fleet.FleetLimits | None") -> None:
        """Obey the fleet's stored rate limits (``runtime.fleet``; ``None``: keep the
        current ones).  Read by itself when the engine first runs; ``fsm worker`` reads
        them again every ``fleet.REFRESH_S`` seconds."""
        if limits is not None:
            self.models.use_stored_rates(limits.rate_limits)

    def _lost(self, instance_id: str, status: str | None) -> None:
        """The heartbeat found ``instance_id`` cancelled or taken over: stop its task."""
        task = self._tasks.get(instance_id)
        if task is not None and not task.done():
            task.cancel()
        self._known.pop(instance_id, None)

    def _parking(self, rec: InstanceRecord, exc: FsmError) -> StepCommit | None:
        """The commit leaving ``rec`` alone when its machine cannot be had here."""
        if isinstance(exc, NeedsMigration):
            reason = migration.NEEDS_MIGRATION
        elif isinstance(exc, FingerprintMismatch):
            reason = FINGERPRINT_MISMATCH
        elif isinstance(exc, DefinitionError):
            reason = MACHINE_UNAVAILABLE
        else:
            return None
        now = self.clock()
        return outcome.parked(rec, reason, str(exc), now, now + self.lease_seconds)

    async def _claim(self, instance_id: str) -> tuple[CompiledMachine, InstanceRecord]:
        rec = self._known.pop(instance_id, None) or self._born.pop(instance_id, None) \
            or self.store.get(instance_id)
        if rec.final:
            raise InstanceFinished(f"instance {rec.id} is already {rec.status}",
                                   instance_id=rec.id, state=rec.state)
        cm = self._compiled(rec)
        self._ensure_worker()
        if rec.owner == self.worker.id:  # started (or already claimed) here
            return cm, self._upcast(cm, await self._checked(cm, rec))
        step = self.ownership.adoption(rec)
        if not await self.committer.submit(step):
            raise _lost_claim(rec.id)
        return cm, self._upcast(cm, await self._checked(cm, step.record))

    async def _checked(self, cm: CompiledMachine, rec: InstanceRecord) -> InstanceRecord:
        """``rec`` once held here: failed when crash-looping, its parked reason cleared."""
        if self.ownership.crash_looping(rec):
            now = self.clock()
            return await self.driver.commit(rec, outcome.failed(
                cm, rec, "crash_loop", now, error=f"{rec.recoveries} recoveries without progress"))
        if rec.reason in (MACHINE_UNAVAILABLE, FINGERPRINT_MISMATCH, migration.NEEDS_MIGRATION):
            return await self.driver.commit(rec, outcome.unparked(rec))
        return rec

    # -- running ----------------------------------------------------------------
    async def step(self, instance_id: str) -> InstanceRecord:
        """Run exactly one step of the instance and release it; return the new record.

        Raises ``InstanceNotFound``, ``InstanceFinished``, ``FingerprintMismatch``,
        or ``FsmError`` when a live worker owns it.
        """
        cm, rec = await self._claim(instance_id)
        try:
            rec = await self.driver.step_once(cm, rec)
        except StaleWrite:
            raise
        except Exception:  # a store failure or an unexpected error: don't keep the claim
            self.ownership.release([instance_id])
            raise
        if rec.owner == self.worker.id:
            release = outcome.clone(rec)
            release.owner = None
            rec = await self.driver.commit(rec, StepCommit(release, rec.version, before=rec))
        return rec

    async def run(self, instance_id: str, on_step: OnStep | None = None, *,
                  family: bool = True) -> InstanceRecord:
        """Step the instance until it is final or waiting; return the last record.

        When another task of this engine is already running the instance, waits
        for that run and returns its record (the instance is never stepped twice).
        In a fan-out state (waiting, reason ``children``) ``family`` runs the children here
        too and continues the parent once they have joined; ``family=False`` (a worker)
        returns the waiting parent: its children and its join are claimed like any work.
        """
        if self.tracer is not None:
            from ..telemetry import traced_run
            return await traced_run(self.tracer, self._run, instance_id, on_step, family)
        return await self._run(instance_id, on_step, family)

    async def _run(self, instance_id: str, on_step: OnStep | None,
                   family: bool = True) -> InstanceRecord:
        task = asyncio.current_task()
        other = self._tasks.get(instance_id)
        if other is not None and other is not task and not other.done():
            return await asyncio.shield(other)
        if task is not None:  # before the claim: resume() must see it as ours and busy
            self._tasks[instance_id] = task  # type: ignore[assignment]
        fan = again = False
        try:
            cm, rec = await self._claim(instance_id)
            self._interrupted.discard(instance_id)  # run again here: no longer cut short
            fan = bool(cm.fan_outs) and instance_id not in self._parents
            if fan:  # this run continues the family
                self._parents.add(instance_id)
                if family:
                    self._hosts.add(instance_id)
            while not rec.final:
                if rec.status == "waiting" and rec.reason == RATE_LIMITED:  # given back
                    if not family:
                        break  # claimed again, by any worker, once it is due
                    cm, rec = await self._rate_wait(instance_id, rec)  # here: wait, go on
                    continue
                if rec.status == "waiting" and not review_queue.timer_due(rec, self.clock()):
                    if not (family and rec.reason == CHILDREN):
                        break
                    if self._tasks.get(instance_id) is task:  # held by nobody while it waits
                        self._tasks.pop(instance_id, None)
                    rec = await self._family(cm, rec, on_step)
                    if rec.final or rec.status == "waiting":
                        break
                    if task is not None:
                        self._tasks[instance_id] = task  # type: ignore[assignment]
                    cm, rec = await self._claim(instance_id)
                    continue
                rec = await self.driver.step_once(cm, rec)
                if on_step:
                    on_step(rec)
                if rec.owner is None and rec.status == "running":
                    break  # handed off at a queue boundary (a worker's ``Driver.hand_off``)
        except StaleWrite:
            rec = self.store.get(instance_id)
            if not rec.final and rec.owner == self.worker.id:
                raise
        except asyncio.CancelledError:
            rec = self.store.get(instance_id)
            if rec.status != "cancelled" and rec.owner == self.worker.id:
                self._interrupted.add(instance_id)
                raise  # cancelled from here, not by a cancel or a takeover
            # this worker lost its lease and nobody took the instance: a run here (not a
            # worker's, which leaves it to the next claim) takes it over again and goes on
            again = family and not rec.final and rec.owner in self.ownership.retired
        except (InstanceFinished, InstanceNotFound, FingerprintMismatch):
            raise  # nothing was claimed
        except Exception:  # a store failure or an unexpected error: don't keep the claim
            self.ownership.release([instance_id])
            raise
        finally:
            if self._tasks.get(instance_id) is task:
                self._tasks.pop(instance_id, None)
            if fan:
                self._parents.discard(instance_id)
                self._hosts.discard(instance_id)
        return await self._run(instance_id, on_step, family) if again else rec

    async def _rate_wait(self, instance_id: str, rec: InstanceRecord
                         ) -> tuple[CompiledMachine, InstanceRecord]:
        """Sleep until a rate-limited ``rec`` may call again, then hold it again."""
        await asyncio.sleep(max(0.0, (rec.next_attempt_at or 0.0) - self.clock()))
        return await self._claim(instance_id)

    async def _family(self, cm: CompiledMachine, parent: InstanceRecord,
                      on_step: OnStep | None) -> InstanceRecord:
        """Run ``parent``'s current children here until it has a step to take (its join or
        a top-up: ``fanout.needs_step``; other wakes are skipped), ends, or is left
        waiting; return it.

        Children another live worker holds are left to it (polled every
        ``lease_seconds / 3``); children of children run the same way.  A child waiting
        for a decision, a trigger or its own waiting family is not run again until it
        moves: when every child left waits, the parent is returned still waiting (``run``
        leaves it waiting, as it leaves a lone instance in review).  Once the family
        has joined (or the parent ended), children still running here are stopped (the
        join or the cancellation already ended them in the store).
        """
        poll = max(0.05, self.lease_seconds / 3)
        one = self._runner(on_step, gate=False)
        ended = self._ended.setdefault(parent.id, asyncio.Event())
        parked: set[str] = set()  # children whose run here left them waiting
        kids: list[ChildState] = []
        try:
            while True:
                ended.clear()  # before the read: a child ending after it sets it again
                rec = self.store.get(parent.id)
                if rec.final or rec.status not in ("waiting", "running") \
                        or rec.reason != CHILDREN:
                    break
                states = self.store.child_states(parent.id)
                if rec.status == "running" and fanout.needs_step(cm, rec, states):
                    break  # woken with something to do
                kids = fanout.current(parent.id, states)
                if not self._spawn(rec, kids, one, parked):
                    break  # every child left waits: so does the parent
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(ended.wait(), poll)
        finally:
            self._ended.pop(parent.id, None)
        if rec.final or rec.reason != CHILDREN:
            self._drop_family({k.id for k in kids})
        return rec

    def _drop_family(self, ids: set[str]) -> None:
        """Stop the children ``ids`` still running here and forget the ones born here."""
        for kid_id, fut in list(self._kids.items()):
            if kid_id in ids:
                fut.cancel()
        for kid_id in [k for k in self._born if k in ids]:
            del self._born[kid_id]

    def _spawn(self, parent: InstanceRecord, kids: Iterable[ChildState],
               one: Callable[[str], Any], parked: set[str]) -> bool:
        """Start here each child of ``parent``'s current fan-out (``kids``) not running
        here that no live worker holds and that can move (``_runnable``); a child's end
        (local) sets ``parent``'s event in ``_ended``.  False when nothing is left to
        wait for here: every child not final waits (``parked``: run here and left
        waiting)."""
        busy = False
        for kid in kids:
            if kid.final:
                continue
            if kid.status != WAITING:
                parked.discard(kid.id)  # it moved: run it again when it waits anew
            if kid.id in self._kids or kid.id in self._tasks or kid.id in self._known:
                busy = True
            elif not self.ownership.can_take(kid):
                busy = True  # another live worker runs it: poll
            elif _runnable(kid, parked):
                self._kids[kid.id] = fut = asyncio.ensure_future(one(kid.id))
                fut.add_done_callback(
                    functools.partial(self._kid_done, parent.id, kid.id, parked))
                busy = True
        return busy

    def _kid_done(self, parent_id: str, kid_id: str, parked: set[str],
                  fut: "asyncio.Future[Any]") -> None:
        self._kids.pop(kid_id, None)
        if not fut.cancelled() and fut.exception() is None:
            rec = fut.result()
            if isinstance(rec, InstanceRecord) and rec.status == WAITING:
                parked.add(kid_id)
        ended = self._ended.get(parent_id)
        if ended is not None:
            ended.set()

    async def _continue_parent(self, rec: Any, on_step: OnStep | None) -> None:
        """``rec`` ended and woke its parent, which no ``run`` here is continuing (e.g. a
        ``resume`` adopted the children but not their waiting parent): continue it here."""
        while isinstance(rec, InstanceRecord) and rec.final and rec.parent_id is not None \
                and rec.parent_id not in self._parents:
            parent = self.store.get(rec.parent_id)
            if parent.final or parent.status == "waiting" or parent.id in self._tasks \
                    or not self.ownership.can_take(parent):
                return
            try:
                rec = await self.run(parent.id, on_step)
            except (StaleWrite, InstanceFinished):
                return
            except FsmError as exc:
                log.warning("instance %s stopped: %s", parent.id, exc)
                return

    def _runner(self, on_step: OnStep | None, gate: bool = True) -> Callable[[str], Any]:
        """A coroutine factory running one instance under the concurrency gate (``gate``
        False: ungated, a family's children); every instance gets an outcome, whatever
        another one raised; a child that ends may continue its parent here."""
        limit = asyncio.Semaphore(self.concurrency) if self.concurrency and gate else None

        def one(iid: str) -> Coroutine[Any, Any, InstanceRecord | FsmError]:
            self._scheduled += 1  # counted when scheduled, before it first runs (and
            return guarded(iid)   # uncounted when it ends, whatever it ended with)

        async def guarded(iid: str) -> InstanceRecord | FsmError:
            try:
                # ``_run`` straight away unless tracing: a coroutine less per instance
                run = self.run if self.tracer is not None else self._run
                if limit is None:
                    rec = await run(iid, on_step)
                else:
                    async with limit:
                        rec = await run(iid, on_step)
                await self._continue_parent(rec, on_step)
                return rec
            except InstanceFinished:  # e.g. cancelled while it waited for its turn
                return self.store.get(iid)
            except FsmError as exc:
                log.warning("instance %s stopped: %s", iid, exc)
                return _for_instance(exc, iid)
            except Exception as exc:  # noqa: BLE001 - one instance's fault stays its own
                log.error("instance %s stopped by an unexpected error", iid, exc_info=True)
                err = FsmError(f"instance {iid} stopped: {type(exc).__name__}: {exc}",
                               instance_id=iid)
                err.__cause__ = exc
                return err
            finally:
                self._scheduled -= 1
        return one

    async def run_many(self, ids: Iterable[str], on_step: OnStep | None = None
                       ) -> list[InstanceRecord | FsmError]:
        """Run many instances concurrently; per instance, its final record or the
        ``FsmError`` that stopped it (an unexpected exception is wrapped in an
        ``FsmError`` whose ``__cause__`` it is): one entry per id, in order."""
        one = self._runner(on_step)
        return list(await asyncio.gather(*[asyncio.ensure_future(one(i)) for i in ids]))

    def resumable(self) -> list[InstanceRecord]:
        """Non-final, non-waiting instances not held by a live worker (nor being run by
        one of this engine's own tasks)."""
        busy = {iid for iid, task in self._tasks.items() if not task.done()}
        return [r for r in self.ownership.resumable() if r.id not in busy]

    async def resume(self, on_step: OnStep | None = None, *, chunk: int = 500
                     ) -> list[InstanceRecord | FsmError]:
        """Continue every instance left pending or running by a dead (or no) worker.

        Instances are claimed ``chunk`` at a time (``Store.claim``: one transaction
        per chunk, never one another live worker holds or is claiming) and each chunk
        starts stepping before the next is claimed, so the first steps of a large
        resume are durable within a fraction of a second.  An instance whose machine
        cannot be loaded here, or was started from another definition, is left alone
        with reason ``machine_unavailable`` / ``fingerprint_mismatch``.  Returns, per
        instance claimed, what ``run_many`` returns (or the error that left it alone).
        """
        self._ensure_worker()
        mine = self.store.held(self.worker.id)  # e.g. started by this engine, not yet run
        idle = [iid for iid in mine if iid not in self._tasks]  # those running stay ours
        if idle:
            self.store.release(self.worker.id, idle)
        one, tasks, parked = self._runner(on_step), [], []
        while True:
            batch = self.ownership.claim(chunk, due_by=float("inf"))
            if not batch:
                break
            for rec in batch:
                try:
                    self._compiled(rec)
                except FsmError as exc:
                    exc.instance_id = exc.instance_id or rec.id
                    parked.append((rec, exc))
                    tasks.append(asyncio.ensure_future(_done(exc)))
                    continue
                self._known[rec.id] = rec
                tasks.append(asyncio.ensure_future(one(rec.id)))
            await asyncio.sleep(0)  # let this chunk start before claiming the next
        self._park(parked)
        return list(await asyncio.gather(*tasks))

    def _park(self, parked: list[tuple[InstanceRecord, FsmError]]) -> None:
        """Give back instances this engine cannot run, saying why (``fsm list``/``show``)."""
        commits = [c for c in (self._parking(rec, exc) for rec, exc in parked) if c is not None]
        if commits:
            self.ledger.apply(commits)
        others = [rec.id for rec, exc in parked if self._parking(rec, exc) is None]
        if others:
            self.store.release(self.worker.id, others)

    # -- from outside ------------------------------------------------------------
    def cancel(self, instance_id: str, reason: str = "cancelled") -> InstanceRecord:
        """End the instance in status ``cancelled`` (works across processes).

        Its owner notices within ``lease_seconds / 3`` and stops the running action.
        Raises ``InstanceNotFound``, or ``InstanceFinished`` when already final.
        """
        self._known.pop(instance_id, None)
        while True:
            rec = self.store.get(instance_id)
            if rec.final:
                raise InstanceFinished(f"instance {rec.id} is already {rec.status}",
                                       instance_id=rec.id)
            step = outcome.cancelled(rec, self.clock(), reason)
            if self.ledger.apply_one(step):  # its running children are cancelled with it
                task = self._tasks.get(instance_id)
                if task is not None and not task.done():
                    task.cancel()
                return step.record

    async def send(self, instance_id: str, trigger: str, **update: Any) -> InstanceRecord:
        """Fire ``trigger`` on a ``waiting`` instance with context ``update``; then run it."""
        rec = self.store.get(instance_id)
        if rec.status != "waiting":
            raise InvalidInput(f"instance {rec.id} is {rec.status}, not waiting")
        cm = self._compiled(rec)
        self._ensure_worker()
        rec = self._upcast(cm, rec)
        rec = await self.driver.commit(rec, self.driver.advance(
            cm, rec, cm.states[rec.state], None, trigger, update, 0.0))
        return rec if rec.final else await self.run(rec.id)

    # -- fork (see ``fork.py``) -------------------------------------------------------
    def fork(self, instance_id: str, *, from_seq: int | None = None,
             from_state: str | None = None, from_failure: bool = False,
             reuse_llm: bool = False, redeliver: bool = False) -> str:
        """Create a new instance from a prefix of ``instance_id``'s history (one
        transaction: the record and its copied rows); return its id.  It is unowned and
        runnable (``run``, ``resume`` or a worker steps it).

        ``reuse_llm``: its model calls whose prompt (provider, model, messages and
        parameters) is byte-identical to one the original made are answered with the
        original's recorded reply (0 tokens, ``replayed`` in the history); others call
        the model (the default, ``reuse_llm=False``, calls it for all).  ``redeliver``:
        side effects the original delivered run again (under the fork's own key,
        ``original>fork:state:visit``); by default they are not repeated.  Raises
        ``InvalidInput`` for a fork point that does not exist or ends in a final state,
        ``FingerprintMismatch`` for a changed machine (an older version is upcast
        when the fork runs).
        """
        from .fork import fork_point, forked
        orig = self.store.get(instance_id)
        cm = self._compiled(orig)
        history = self.store.history(orig.id)
        n = fork_point(history, seq=from_seq, state=from_state, failure=from_failure)
        rec, rows = forked(cm, orig, history, self.store.attempts(orig.id), n, self.clock(),
                           reuse_llm=reuse_llm, redeliver=redeliver)
        self.store.create(rec, history=rows)
        return rec.id

    def rerun(self, instance_id: str, state: str, *, in_place: bool = False) -> str:
        """Run ``state`` again from just before its latest visit: as a fork (returns the new
        id), or ``in_place`` on a completed or failed instance by appending a ``rerun`` row
        that resets state and context (returns ``instance_id``; the history is never
        rewritten, ``seq`` stays gap-free).  Raises ``InvalidInput`` (never visited, not
        final), ``StaleWrite`` when the instance changed meanwhile.
        """
        if not in_place:
            return self.fork(instance_id, from_state=state)
        from .fork import fork_point
        rec = self.store.get(instance_id)
        if rec.status not in ("completed", "failed"):
            raise InvalidInput(f"instance {rec.id} is {rec.status}: an in-place rerun needs a "
                               "completed or failed instance (or rerun it as a fork)")
        cm = self._compiled(rec)
        history = self.store.history(rec.id)
        n = fork_point(history, state=state)
        context = dict(rec.input)
        for row in history[:n]:
            context.update(row.delta)
        rec = self._upcast(cm, rec)
        reset = outcome.reset(cm, rec, state, context, n, self.clock())
        if not self.ledger.apply_one(self.driver.attach(reset)):
            raise StaleWrite(f"instance {rec.id} changed meanwhile; nothing was written",
                             instance_id=rec.id)
        self._known.pop(rec.id, None)
        return rec.id

    def forks(self, instance_id: str) -> list[InstanceRecord]:
        """The instances forked from ``instance_id``, oldest first."""
        return [r for r in self.store.list(machine=self.store.get(instance_id).machine)
                if r.forked_from == instance_id]

    # -- the review queue (see ``reviews.py``) -------------------------------------------
    def reviews(self, *, status: str | None = REVIEW_OPEN, machine: str | None = None,
                instance_id: str | None = None) -> list[ReviewItem]:
        """Review items, oldest first: open ones by default (``status=None``: all), of one
        machine or instance."""
        return self.store.reviews(statuses=None if status is None else [status],
                                  machine=machine, instance_id=instance_id)

    def review(self, item: ReviewItem | str) -> ReviewItem:
        """The item as stored now (by id or unambiguous id prefix); ``ReviewRefused``."""
        return review_queue.find(self.store, item.id if isinstance(item, ReviewItem) else item)

    def claim_review(self, item: ReviewItem | str, by: str) -> ReviewItem:
        """Make ``by`` the item's claimer (others' decisions are then refused).

        Raises ``ReviewRefused`` when it is decided, stale or claimed by someone else.
        """
        found = self.review(item)
        if found.status != REVIEW_OPEN:
            raise review_queue.ReviewRefused(
                f"review {found.id}: already decided: {found.choice} by {found.decided_by}",
                item_id=found.id)
        why = review_queue.stale(found, self.store.get(found.instance_id))
        if why or not self.store.claim_review(found.id, by, self.clock()):
            raise review_queue.ReviewRefused(
                f"review {found.id}: {why or f'claimed by {self.review(found).claimed_by}'}",
                item_id=found.id)
        return self.review(found)

    def decide(self, item: ReviewItem | str, choice: str, *, by: str,
               update: dict[str, Any] | None = None, note: str | None = None) -> InstanceRecord:
        """Record ``by``'s decision ``choice`` on the review item, with the edit ``update``
        (context fields the review's ``editable`` model allows) and ``note``, in one
        transaction; the instance then continues when a worker (``fsm worker``,
        ``resume``, ``run``) steps it.  Returns the instance after the decision.

        Raises ``ReviewRefused`` (nothing written) for a stale, second, unoffered,
        claimed-by-another or invalid answer.
        """
        found = self.review(item)
        rec = self.store.get(found.instance_id)
        cm = self._compiled(rec)
        rec = self._upcast(cm, rec)
        commit = review_queue.decision(cm, rec, found, choice, by=by, now=self.clock(),
                                       advance=self.driver.advance, update=update, note=note,
                                       claimer=by)
        if not self.ledger.apply_one(self.driver.attach(commit)):  # ends a child: wakes its parent
            raise review_queue.ReviewRefused(
                f"review {found.id}: the item or its instance changed meanwhile (decided, "
                "claimed or moved on); nothing was written", item_id=found.id)
        self._known.pop(rec.id, None)
        return commit.record

    async def aclose(self) -> None:
        """Stop the heartbeat, deregister this worker and close the store."""
        self.close()

    def close(self) -> None:
        """Give back the instances this engine holds between steps (started and never run,
        or left between steps) in one ``Store.release``, so the next engine claims them
        without a takeover row; deregister this worker and close the store (also stops the
        heartbeat).  An instance whose step was under way here (its run still going, or
        cancelled mid-step) stays held: taking it over is a recovery."""
        busy = {iid for iid, task in self._tasks.items() if not task.done()}
        self.ownership.close(keep=busy | self._interrupted)
        self._threads.shutdown()
        self.store.close()
