"""The runner: claims instances and steps them here (run, step, run_many, resume, the
fan-out families), with the task tables that keep one instance stepped once per process.

``Engine`` is the public face over it; ``Worker`` drives it through its public methods
only (``ensure_worker``, ``runnable``, ``take``, ``parking``, ``hand_off``, ``run``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass
from typing import Any

from ..errors import (
    DefinitionError,
    FingerprintMismatch,
    FsmError,
    InstanceFinished,
    InstanceNotFound,
    InvalidInput,
    NeedsMigration,
    StaleWrite,
)
from ..store import Store
from ..store.claims import FINGERPRINT_MISMATCH, MACHINE_UNAVAILABLE
from ..store.records import (
    PAUSED,
    PENDING,
    RATE_LIMITED,
    RUNNING,
    SCHEDULED,
    InstanceRecord,
    StepCommit,
    WorkerRow,
)
from . import outcome, run_errors
from .compiled import CompiledMachine
from .driver import Driver
from .fleet import limits as fleet
from .fleet.ownership import Ownership
from .kinds import base as kinds
from .kinds import migration, pausing
from .kinds.families import Families
from .ledger import Ledger
from .model_registry import Models
from .registry import Registry

log = logging.getLogger("fsm_engine")

OnStep = Callable[[InstanceRecord], None]
Outcome = InstanceRecord | FsmError
#: Statuses ``_run`` steps at once (every other one goes through ``_turn``).
_STEPPED = frozenset({PENDING, RUNNING})


@dataclass
class _Run:
    """One ``run`` of one instance here: what its steps share."""

    iid: str
    on_step: OnStep | None
    family: bool
    task: asyncio.Task[Any] | None
    fan: bool = False  # this run continues a fan-out family


class Runner:
    """Claims instances and steps them in this process (see ``Engine`` for the knobs).

    Args:
        concurrency: max instances stepping at once in ``run_many`` (None: all).
        tracer: an OpenTelemetry tracer for ``fsm.run`` spans, or None.
    """

    def __init__(self, store: Store, registry: Registry, driver: Driver, ledger: Ledger,
                 ownership: Ownership, models: Models, clock: Callable[[], float], *,
                 lease_seconds: float, concurrency: int | None, tracer: Any) -> None:
        self.store, self.registry, self.driver, self.ledger = store, registry, driver, ledger
        self.ownership, self.models, self.clock = ownership, models, clock
        self.lease_seconds, self.concurrency, self.tracer = lease_seconds, concurrency, tracer
        self.tasks: dict[str, asyncio.Task[Any]] = {}
        #: Records taken up here that ``run`` needn't read back (see ``take``).
        self.known: dict[str, InstanceRecord] = {}
        #: False until the fleet's stored rate limits are read (at the first run); a
        #: worker that reads them itself, off the loop, sets it True.
        self.limits_read = False
        #: Instances whose run here was cancelled mid-step (still held): ``close`` keeps
        #: them, so whoever takes them next records the takeover.
        self.interrupted: set[str] = set()
        #: The fan-out families a run here continues (``runtime.kinds.families``).
        self.families = Families(store, ownership, lease_seconds,
                                 lambda iid: iid in self.tasks or iid in self.known)
        #: instances handed to ``run_many``/``resume`` and not yet done: they count as
        #: running for group commit from the start (see ``solo``)
        self._scheduled = 0
        driver.host = lambda rec: self.worker.id if rec.id in self.families.hosts else None
        driver.born = self.families.adopt_born
        driver.lease_current = self.ownership.lease_current

    # -- for the group committer and the worker ------------------------------------
    def solo(self) -> bool:
        """True when at most one instance runs here (group commit: commit at once)."""
        return max(len(self.tasks), self._scheduled) <= 1

    def scheduled(self, n: int) -> None:
        """Count ``n`` more (or, negative, fewer) instances about to run here for group
        commit (``solo``): a worker's claimed batch counts from its claim, so the first
        of them to commit (a step that never awaits: a timer's fire) does not commit alone
        while the others wait to start."""
        self._scheduled += n

    @property
    def worker(self) -> WorkerRow:
        """This runner's worker row (its id is the ``owner`` of what it holds)."""
        return self.ownership.worker

    @property
    def hand_off(self) -> Callable[[InstanceRecord, InstanceRecord], bool] | None:
        """``hand_off(before, after)``: True when a step into another queue gives the
        instance back (``Driver.hand_off``; a worker sets it)."""
        return self.driver.hand_off

    @hand_off.setter
    def hand_off(self, decide: Callable[[InstanceRecord, InstanceRecord], bool] | None) -> None:
        self.driver.hand_off = decide

    def runnable(self, rec: InstanceRecord) -> CompiledMachine:
        """``rec``'s machine when it can run here (``Registry.runnable``), else the error."""
        return self.registry.runnable(rec)

    def take(self, rec: InstanceRecord) -> None:
        """Remember ``rec`` (just claimed) so its ``run`` needn't read it back."""
        self.known[rec.id] = rec

    def busy(self) -> set[str]:
        """Instances a task here is running now."""
        return {iid for iid, task in self.tasks.items() if not task.done()}

    def stop_local(self, instance_id: str) -> None:
        """Stop the task running ``instance_id`` here, if any (its cancel committed)."""
        task = self.tasks.get(instance_id)
        if task is not None and not task.done():
            task.cancel()

    def ensure_worker(self) -> None:
        """Read the fleet's limits once and keep this worker's heartbeat going."""
        if not self.limits_read:
            self.limits_read = True
            self.use_limits(fleet.read(self.store))
        self.ownership.start_heartbeat(self._lost, lambda: list(self.tasks))

    def use_limits(self, limits: fleet.FleetLimits | None) -> None:
        """Obey the fleet's stored rate limits (``None``: keep the current ones)."""
        if limits is not None:
            self.models.use_stored_rates(limits.rate_limits)

    def _lost(self, instance_id: str, status: str | None) -> None:
        """The heartbeat found ``instance_id`` cancelled or taken over: stop its task."""
        self.stop_local(instance_id)
        self.known.pop(instance_id, None)

    def parking(self, rec: InstanceRecord, exc: FsmError) -> StepCommit | None:
        """The commit leaving ``rec`` alone when its machine cannot be had here (None:
        ``exc`` is not about its machine)."""
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

    # -- claiming -------------------------------------------------------------------
    async def _claim(self, instance_id: str) -> tuple[CompiledMachine, InstanceRecord]:
        rec = self.known.pop(instance_id, None) or self.families.born.pop(instance_id, None) \
            or self.store.get(instance_id)
        if rec.status == SCHEDULED:
            rec = await self._due(rec)
        if rec.final:
            raise InstanceFinished(f"instance {rec.id} is already {rec.status}",
                                   instance_id=rec.id, state=rec.state)
        if rec.status == PAUSED:
            raise InvalidInput(f"instance {rec.id} is paused ({rec.reason}): "
                               "`fsm unpause` it first", instance_id=rec.id, state=rec.state)
        cm = self.registry.runnable(rec)
        self.ensure_worker()
        if rec.owner == self.worker.id:  # started (or already claimed) here
            return cm, self.registry.upcast(cm, await self._checked(cm, rec))
        step = self.ownership.adoption(rec)
        if not await self.driver.committer.submit(step):
            raise run_errors.lost_claim(rec.id)
        return cm, self.registry.upcast(cm, await self._checked(cm, step.record))

    async def _due(self, rec: InstanceRecord) -> InstanceRecord:
        """``rec`` (``scheduled``: a delayed or debounced start) once due: asleep on the
        engine's clock until its ``next_attempt_at`` (a ``VirtualClock`` jumps there), read
        again after each sleep (a later start of its burst may have pushed it back, a
        cancel ended it, a worker started it)."""
        while rec.status == SCHEDULED and rec.next_attempt_at is not None:
            wait = rec.next_attempt_at - self.clock()
            if wait <= 0:
                break
            await asyncio.sleep(wait)
            rec = self.store.get(rec.id)
        return rec

    async def _checked(self, cm: CompiledMachine, rec: InstanceRecord) -> InstanceRecord:
        """``rec`` once held here: failed when crash-looping, its parked reason cleared."""
        if self.ownership.crash_looping(rec):
            now = self.clock()
            return await self.driver.commit(rec, outcome.failed(
                cm, rec, "crash_loop", now, error=f"{rec.recoveries} recoveries without progress"))
        if rec.pause_request is not None:  # asked while another holder had it
            return await self.driver.commit(rec, pausing.on_claim(rec, self.clock()))
        if rec.reason in (MACHINE_UNAVAILABLE, FINGERPRINT_MISMATCH, migration.NEEDS_MIGRATION):
            return await self.driver.commit(rec, outcome.unparked(rec))
        return rec

    # -- running --------------------------------------------------------------------
    async def step(self, instance_id: str) -> InstanceRecord:
        """See ``Engine.step``: one step, then the instance is released."""
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

    def run(self, instance_id: str, on_step: OnStep | None = None, *,
            family: bool = True) -> Coroutine[Any, Any, InstanceRecord]:
        """See ``Engine.run``: step until final or waiting; return the last record.

        A plain function returning the run's coroutine (awaited by the caller), not a
        coroutine awaiting it: every resumption of a step passes through each coroutine
        of the chain, and this one would only forward."""
        if self.tracer is not None:
            from ..telemetry import traced_run
            return traced_run(self.tracer, self._run, instance_id, on_step, family)
        return self._run(instance_id, on_step, family)

    async def _run(self, instance_id: str, on_step: OnStep | None,
                   family: bool = True) -> InstanceRecord:
        run = self._enter(instance_id, on_step, family)
        if not isinstance(run, _Run):  # another task here runs it: that run's record
            return await run
        again = False
        try:  # the steps awaited here, not in coroutines of their own: no frame more on
            cm, rec = await self._begin(run)  # every resumption of every step
            go_on = True
            while go_on and not rec.final:
                if rec.status in _STEPPED:  # the hot path
                    rec = await self.driver.step_once(cm, rec)
                    if run.on_step:
                        run.on_step(rec)
                    # handed off at a queue boundary (a worker's ``hand_off``): this run ends
                    go_on = rec.owner is not None or rec.status != RUNNING
                else:  # paused, rate-limited, waiting: ``_turn`` decides
                    cm, rec, go_on = await self._turn(run, cm, rec)
        except StaleWrite:
            rec = self.store.get(run.iid)
            if not rec.final and rec.owner == self.worker.id:
                raise
        except asyncio.CancelledError as exc:
            rec, again = self._cancelled(run, exc)
        except (InstanceFinished, InstanceNotFound, FingerprintMismatch):
            raise  # nothing was claimed
        except Exception:  # a store failure or an unexpected error: don't keep the claim
            self.ownership.release([run.iid])
            raise
        finally:
            self._end(run)
        return await self._run(instance_id, on_step, family) if again else rec

    def _enter(self, instance_id: str, on_step: OnStep | None, family: bool
               ) -> _Run | asyncio.Future[InstanceRecord]:
        """The ``_Run`` of ``instance_id`` here, its task in the task table (before the
        claim: ``resume()`` must see it as ours and busy); or, when another task of this
        runner is running it, that task shielded (its record is this run's)."""
        task = asyncio.current_task()
        other = self.tasks.get(instance_id)
        if other is not None and other is not task and not other.done():
            return asyncio.shield(other)
        if task is not None:
            self.tasks[instance_id] = task
        self.ownership.started(instance_id)  # the heartbeat sees it in ``tasks`` now
        return _Run(instance_id, on_step, family, task)

    def _cancelled(self, run: _Run, exc: asyncio.CancelledError
                   ) -> tuple[InstanceRecord, bool]:
        rec = self.store.get(run.iid)
        if rec.status != "cancelled" and rec.owner == self.worker.id:
            self.interrupted.add(run.iid)
            raise exc  # cancelled from here, not by a cancel or a takeover
        # this worker lost its lease and nobody took the instance: a run here (not a
        # worker's, which leaves it to the next claim) takes it over again and goes on
        return rec, run.family and not rec.final and rec.owner in self.ownership.retired

    def _end(self, run: _Run) -> None:
        if self.tasks.get(run.iid) is run.task:
            self.tasks.pop(run.iid, None)
        if run.fan:
            self.families.parents.discard(run.iid)
            self.families.hosts.discard(run.iid)

    async def _begin(self, run: _Run) -> tuple[CompiledMachine, InstanceRecord]:
        """The instance claimed for ``run`` (``_claim``); a fan-out parent's run marked as
        continuing its family."""
        cm, rec = await self._claim(run.iid)
        self.interrupted.discard(run.iid)  # run again here: no longer cut short
        run.fan = (cm.kinds or kinds.table(cm)).families and run.iid not in self.families.parents
        if run.fan:  # this run continues the family
            self.families.parents.add(run.iid)
            if run.family:
                self.families.hosts.add(run.iid)
        return cm, rec

    async def _turn(self, run: _Run, cm: CompiledMachine, rec: InstanceRecord
                    ) -> tuple[CompiledMachine, InstanceRecord, bool]:
        """One turn of ``run``'s loop: a step, a wait, or the end (False)."""
        if rec.status == PAUSED:  # paused at the step's commit (``runtime.kinds.pausing``)
            return cm, rec, False
        if rec.status == "waiting" and rec.reason == RATE_LIMITED:  # given back
            if not run.family:
                return cm, rec, False  # claimed again, by any worker, once it is due
            cm, rec = await self._rate_wait(run.iid, rec)  # here: wait, go on
            return cm, rec, True
        if rec.status == "waiting" and not kinds.timer_due(rec, self.clock()):
            return await self._wait_family(run, cm, rec)
        rec = await self.driver.step_once(cm, rec)
        if run.on_step:
            run.on_step(rec)
        # handed off at a queue boundary (a worker's ``hand_off``): this run ends
        return cm, rec, not (rec.owner is None and rec.status == "running")

    async def _wait_family(self, run: _Run, cm: CompiledMachine, rec: InstanceRecord
                           ) -> tuple[CompiledMachine, InstanceRecord, bool]:
        """A waiting ``rec``: its family run here (``family``), then held again."""
        kind = (cm.kinds or kinds.table(cm)).get(rec.state, kinds.PLAIN)
        if not (run.family and kind.families and kind.awaits_family(rec)):
            return cm, rec, False
        if self.tasks.get(run.iid) is run.task:  # held by nobody while it waits
            self.tasks.pop(run.iid, None)
        rec = await self._family(cm, rec, run.on_step)
        if rec.final or rec.status == "waiting" and not kinds.timer_due(rec, self.clock()):
            return cm, rec, False  # (a timer due: its step here fires it)
        if run.task is not None:
            self.tasks[run.iid] = run.task
        cm, rec = await self._claim(run.iid)
        return cm, rec, True

    async def _rate_wait(self, instance_id: str, rec: InstanceRecord
                         ) -> tuple[CompiledMachine, InstanceRecord]:
        """Sleep until a rate-limited ``rec`` may call again, then hold it again."""
        await asyncio.sleep(max(0.0, (rec.next_attempt_at or 0.0) - self.clock()))
        return await self._claim(instance_id)

    # -- families (see ``families.py``) -----------------------------------------------
    async def _family(self, cm: CompiledMachine, parent: InstanceRecord,
                      on_step: OnStep | None) -> InstanceRecord:
        """Run ``parent``'s children here until it has a step to take (``Families.run``)."""
        return await self.families.run(cm, parent, self._one(on_step, gate=False))

    async def _continue_parent(self, rec: Any, on_step: OnStep | None) -> None:
        """``rec`` ended and woke its parent, which no ``run`` here is continuing (e.g. a
        ``resume`` adopted the children but not their waiting parent): continue it here."""
        while isinstance(rec, InstanceRecord) and rec.final and rec.parent_id is not None \
                and rec.parent_id not in self.families.parents:
            parent = self.store.get(rec.parent_id)
            if parent.final or parent.status == "waiting" or parent.id in self.tasks \
                    or not self.ownership.can_take(parent):
                return
            try:
                rec = await self.run(parent.id, on_step)
            except (StaleWrite, InstanceFinished):
                return
            except FsmError as exc:
                log.warning("instance %s stopped: %s", parent.id, exc)
                return

    # -- many at once ---------------------------------------------------------------
    def _one(self, on_step: OnStep | None, gate: bool = True
             ) -> Callable[[str], Coroutine[Any, Any, Outcome]]:
        """A coroutine factory running one instance under the concurrency gate (``gate``
        False: ungated, a family's children); every instance gets an outcome, whatever
        another one raised; a child that ends may continue its parent here."""
        limit = asyncio.Semaphore(self.concurrency) if self.concurrency and gate else None

        def one(iid: str) -> Coroutine[Any, Any, Outcome]:
            self._scheduled += 1  # counted when scheduled, before it first runs (and
            return self._guarded(iid, on_step, limit)  # uncounted when it ends)
        return one

    async def _guarded(self, iid: str, on_step: OnStep | None,
                       limit: asyncio.Semaphore | None) -> Outcome:
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
            return run_errors.for_instance(exc, iid)
        except Exception as exc:  # noqa: BLE001 - one instance's fault stays its own
            return run_errors.unexpected(iid, exc)
        finally:
            self._scheduled -= 1

    async def run_many(self, ids: Iterable[str], on_step: OnStep | None = None
                       ) -> list[Outcome]:
        """See ``Engine.run_many``: one outcome per id, in order."""
        one = self._one(on_step)
        return list(await asyncio.gather(*[asyncio.ensure_future(one(i)) for i in ids]))

    def resumable(self) -> list[InstanceRecord]:
        """Instances not held by a live worker (nor run here) a step would move
        (``Ownership.resumable``)."""
        busy = self.busy()
        return [r for r in self.ownership.resumable() if r.id not in busy]

    async def resume(self, on_step: OnStep | None = None, *, chunk: int = 500
                     ) -> list[Outcome]:
        """See ``Engine.resume``: claim ``chunk`` at a time, each chunk stepping before the
        next is claimed; one outcome per instance claimed."""
        self.ensure_worker()
        mine = self.store.held(self.worker.id)  # e.g. started here, not yet run
        idle = [iid for iid in mine if iid not in self.tasks]  # those running stay ours
        if idle:
            self.ledger.release(self.worker.id, idle)
        one = self._one(on_step)
        tasks: list[asyncio.Future[Outcome]] = []
        parked: list[tuple[InstanceRecord, FsmError]] = []
        while True:
            batch = self.ownership.claim(chunk, due_by=float("inf"))
            if not batch:
                break
            tasks += [self._start(rec, one, parked) for rec in batch]
            await asyncio.sleep(0)  # let this chunk start before claiming the next
        self._park(parked)
        return list(await asyncio.gather(*tasks))

    def _start(self, rec: InstanceRecord, one: Callable[[str], Coroutine[Any, Any, Outcome]],
               parked: list[tuple[InstanceRecord, FsmError]]) -> asyncio.Future[Outcome]:
        """``rec`` (claimed) running here, or its error (``parked``) when it cannot."""
        try:
            self.registry.runnable(rec)
        except FsmError as exc:
            exc.instance_id = exc.instance_id or rec.id
            parked.append((rec, exc))
            return asyncio.ensure_future(run_errors.done(exc))
        self.known[rec.id] = rec
        return asyncio.ensure_future(one(rec.id))

    def _park(self, parked: list[tuple[InstanceRecord, FsmError]]) -> None:
        """Give back instances this runner cannot run, saying why (``fsm list``/``show``)."""
        commits = [c for c in (self.parking(rec, exc) for rec, exc in parked) if c is not None]
        if commits:
            self.ledger.apply(commits)
        others = [rec.id for rec, exc in parked if self.parking(rec, exc) is None]
        if others:
            self.ledger.release(self.worker.id, others)
