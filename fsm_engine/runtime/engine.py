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
import logging
import os
import random
import time
from typing import Any, Callable, Iterable

from pydantic import BaseModel, ValidationError

from ..definition import Machine
from ..errors import (
    FingerprintMismatch, FsmError, InstanceFinished, InvalidInput, StaleWrite,
)
from ..policies import BreakerPolicy
from ..store import PENDING, RUNNING, SqliteStore, Store
from ..store.records import InstanceRecord, StepCommit, WorkerRow
from . import outcome
from .commit import GroupCommitter
from .compiled import CompiledMachine, compile_machine
from .driver import Driver
from .loader import load_machine
from .models import Models
from .threads import ActionThreads
from .workers import live_ids, new_worker

log = logging.getLogger("fsm_engine")

#: Records this engine just created or adopted, kept so ``run`` needn't read them back
#: (a stale one is harmless: every write is compare-and-set on its version).
_KNOWN_MAX = 100_000

OnStep = Callable[[InstanceRecord], None]


def _validate_input(model: type[BaseModel], data: BaseModel | dict[str, Any] | None) -> dict[str, Any]:
    """The input as the context's JSON dict; ``InvalidInput`` when it does not fit."""
    raw = data.model_dump() if isinstance(data, BaseModel) else dict(data or {})
    try:
        return model.model_validate(raw).model_dump(mode="json")
    except ValidationError as exc:
        first = exc.errors()[0]
        raise InvalidInput(f"input does not fit {model.__name__}: {first['msg']} at "
                           f"{'.'.join(map(str, first['loc'])) or '(root)'}") from None


def _lost_claim(instance_id: str) -> StaleWrite:
    return StaleWrite(f"instance {instance_id} was claimed by another worker first",
                      instance_id=instance_id)


async def _done(value: Any) -> Any:
    return value


def _module_ref(machine: Machine) -> str:
    ns = machine.namespace or {}
    path = ns.get("__file__")
    return os.path.abspath(path) if path else str(ns.get("__name__", ""))


class Engine:
    """Runs instances of machines durably.

    Args:
        store: a ``Store`` or a SQLite path (default ``fsm.db``).
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
    """

    def __init__(self, store: Store | str = "fsm.db", *, llm: Any = None,
                 lease_seconds: float = 10.0, max_recoveries: int = 5,
                 concurrency: int | None = None,
                 breaker: BreakerPolicy | None = BreakerPolicy(),
                 seed: int | None = None, threads: int = 32,
                 clock: Callable[[], float] = time.time, tracer: Any = "env") -> None:
        self.store: Store = SqliteStore(store) if isinstance(store, str) else store
        self.lease_seconds = lease_seconds
        self.max_recoveries = max_recoveries
        self.concurrency = concurrency
        self.breaker_policy = breaker
        self.clock = clock
        self.worker = new_worker(clock())
        self._registered = False
        self._machines: dict[str, CompiledMachine] = {}
        self._modules: dict[str, str] = {}
        self._tasks: dict[str, asyncio.Task[InstanceRecord]] = {}
        self._known: dict[str, InstanceRecord] = {}
        self._view: tuple[float, dict[str, WorkerRow], set[str]] | None = None
        self._heartbeat: asyncio.Task[None] | None = None
        self._threads = ActionThreads(threads)
        self.models = Models(llm, self.store, breaker, clock)
        self.committer = GroupCommitter(self.store, solo=lambda: len(self._tasks) <= 1)
        self.driver = Driver(self.store, self.committer, models=self.models, clock=clock,
                             rng=random.Random(seed), threads=self._threads)
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
        """Check and compile ``machine`` and remember where it came from.

        Raises ``DefinitionError`` listing every problem.
        """
        cm = compile_machine(machine)
        if module is None and self._machines.get(machine.name) is cm:
            return cm  # already registered (start_many calls this for every batch)
        self.models.check(cm.states)
        self._machines[machine.name] = cm
        self._modules[machine.name] = module or _module_ref(machine)
        return cm

    def load(self, ref: str) -> CompiledMachine:
        """Load, check and register the machine in module ``ref`` (path or dotted name)."""
        machine, canonical = load_machine(ref)
        return self.register(machine, canonical)

    def _compiled(self, rec: InstanceRecord) -> CompiledMachine:
        cm = self._machines.get(rec.machine)
        if cm is None:
            cm = self.load(rec.module)
        if cm.fingerprint != rec.fingerprint:
            raise FingerprintMismatch(
                f"instance {rec.id} was started from another version of machine "
                f"{rec.machine!r} (fingerprint {rec.fingerprint}, now {cm.fingerprint})",
                instance_id=rec.id)
        return cm

    # -- creating ---------------------------------------------------------------
    def start(self, machine: Machine | str, input: BaseModel | dict[str, Any] | None = None, *,
              token_budget: int | None = None, deadline_s: float | None = None,
              instance_id: str | None = None) -> str:
        """Create an instance in the initial state (status ``pending``); return its id.

        ``input`` is validated against the machine's context model
        (``InvalidInput`` when it does not fit); ``token_budget`` (tokens)
        overrides the machine's default; ``deadline_s`` (seconds from now)
        bounds the whole instance.  The instance is owned by this engine
        until it runs or this process dies (then any ``resume`` adopts it).
        """
        return self.start_many(machine, [input], token_budget=token_budget,
                               deadline_s=deadline_s,
                               ids=None if instance_id is None else [instance_id])[0]

    def start_many(self, machine: Machine | str,
                   inputs: Iterable[BaseModel | dict[str, Any] | None], *,
                   token_budget: int | None = None, deadline_s: float | None = None,
                   ids: list[str] | None = None) -> list[str]:
        """``start`` for many inputs in one transaction (all created, or none)."""
        cm = self.load(machine) if isinstance(machine, str) else self.register(machine)
        spec, now = cm.spec, self.clock()
        self._register()
        records = []
        for i, data in enumerate(inputs):
            ctx = _validate_input(spec.context, data)
            records.append(InstanceRecord(
                id=ids[i] if ids else os.urandom(6).hex(), machine=spec.name,
                module=self._modules[spec.name], fingerprint=cm.fingerprint,
                state=spec.initial, status=PENDING, context=ctx, input=dict(ctx),
                max_transitions=spec.max_transitions,
                token_budget=spec.token_budget if token_budget is None else token_budget,
                created_at=now, updated_at=now, visits={spec.initial: 1},
                deadline=None if deadline_s is None else now + deadline_s,
                owner=self.worker.id))
        self.store.create(*records)
        if len(self._known) + len(records) <= _KNOWN_MAX:  # run() needn't read them back
            self._known.update((r.id, r) for r in records)
        return [r.id for r in records]

    # -- ownership --------------------------------------------------------------
    def _register(self) -> None:
        if not self._registered:
            self.worker.heartbeat_at = self.clock()
            self.store.put_worker(self.worker)
            self._registered = True

    def _ensure_worker(self) -> None:
        self._register()
        if self._heartbeat is None or self._heartbeat.done():
            self._heartbeat = asyncio.get_running_loop().create_task(self._beat())

    async def _beat(self) -> None:
        while True:
            await asyncio.sleep(self.lease_seconds / 3)
            self.worker.heartbeat_at = self.clock()
            self.store.put_worker(self.worker)
            for rec in self.store.list(statuses=["cancelled"], owner=self.worker.id):
                task = self._tasks.get(rec.id)
                if task is not None and not task.done():
                    task.cancel()
                gone = outcome.clone(rec)
                gone.owner = None  # seen: drop it from the next poll
                self.store.commit([StepCommit(gone, rec.version, before=rec)])

    def _worker_view(self, now: float) -> tuple[dict[str, WorkerRow], set[str]]:
        """Registered workers and the live ones, re-read at most every 0.5 s
        (a resume of thousands of instances reads them once, not once each)."""
        if self._view is None or now - self._view[0] > 0.5:
            workers = {w.id: w for w in self.store.workers()}
            self._view = (now, workers, live_ids(list(workers.values()), now, self.lease_seconds))
        return self._view[1], self._view[2]

    def _adoption(self, cm: CompiledMachine, rec: InstanceRecord) -> StepCommit:
        """The commit that makes this worker the owner of ``rec`` (maybe a crash_loop failure)."""
        now = self.clock()
        step = outcome.claimed(rec, self.worker.id, now)
        if rec.owner is None or rec.owner == self.worker.id:
            return step
        workers, live = self._worker_view(now)
        if rec.owner in live:
            raise FsmError(f"instance {rec.id} is being run by live worker {rec.owner}",
                           instance_id=rec.id)
        dead = workers.get(rec.owner)
        sleeping = (rec.next_attempt_at is not None and dead is not None
                    and rec.next_attempt_at > dead.heartbeat_at)
        new = step.record
        if rec.status == RUNNING and not sleeping:
            same = rec.recovered_seq == rec.seq
            new.recoveries, new.recovered_seq = (rec.recoveries + 1 if same else 1), rec.seq
        if new.recoveries > self.max_recoveries:
            fail = outcome.failed(cm, new, "crash_loop", now,
                                  error=f"{new.recoveries} recoveries without progress")
            fail.expected_version, fail.before = rec.version, rec  # written over the stored row
            return fail
        return step

    async def _claim(self, instance_id: str) -> tuple[CompiledMachine, InstanceRecord]:
        rec = self._known.pop(instance_id, None) or self.store.get(instance_id)
        if rec.final:
            raise InstanceFinished(f"instance {rec.id} is already {rec.status}",
                                   instance_id=rec.id, state=rec.state)
        cm = self._compiled(rec)
        self._ensure_worker()
        if rec.owner == self.worker.id:
            return cm, rec  # started (or already claimed) by this engine
        step = self._adoption(cm, rec)
        if not await self.committer.submit(step):
            raise _lost_claim(rec.id)
        return cm, step.record

    # -- running ----------------------------------------------------------------
    async def step(self, instance_id: str) -> InstanceRecord:
        """Run exactly one step of the instance and release it; return the new record.

        Raises ``InstanceNotFound``, ``InstanceFinished``, ``FingerprintMismatch``,
        or ``FsmError`` when a live worker owns it.
        """
        cm, rec = await self._claim(instance_id)
        rec = await self.driver.step_once(cm, rec)
        if rec.owner == self.worker.id:
            release = outcome.clone(rec)
            release.owner = None
            rec = await self.driver.commit(rec, StepCommit(release, rec.version, before=rec))
        return rec

    async def run(self, instance_id: str, on_step: OnStep | None = None) -> InstanceRecord:
        """Step the instance until it is final or waiting; return the last record."""
        if self.tracer is not None:
            from ..telemetry import traced_run
            return await traced_run(self.tracer, self._run, instance_id, on_step)
        return await self._run(instance_id, on_step)

    async def _run(self, instance_id: str, on_step: OnStep | None) -> InstanceRecord:
        cm, rec = await self._claim(instance_id)
        task = asyncio.current_task()
        if task is not None:
            self._tasks[rec.id] = task  # type: ignore[assignment]
        try:
            while not rec.final and rec.status != "waiting":
                rec = await self.driver.step_once(cm, rec)
                if on_step:
                    on_step(rec)
        except StaleWrite:
            rec = self.store.get(instance_id)
            if not rec.final and rec.owner == self.worker.id:
                raise
        except asyncio.CancelledError:
            rec = self.store.get(instance_id)
            if rec.status != "cancelled":
                raise
        finally:
            self._tasks.pop(instance_id, None)
        return rec

    def _runner(self, on_step: OnStep | None) -> Callable[[str], Any]:
        """A coroutine factory running one instance under the concurrency gate."""
        gate = asyncio.Semaphore(self.concurrency) if self.concurrency else None

        async def one(iid: str) -> InstanceRecord | FsmError:
            try:
                if gate is None:
                    return await self.run(iid, on_step)
                async with gate:
                    return await self.run(iid, on_step)
            except InstanceFinished:  # e.g. cancelled while it waited for its turn
                return self.store.get(iid)
            except FsmError as exc:
                log.warning("instance %s stopped: %s", iid, exc)
                exc.instance_id = exc.instance_id or iid
                return exc
        return one

    async def run_many(self, ids: Iterable[str], on_step: OnStep | None = None
                       ) -> list[InstanceRecord | FsmError]:
        """Run many instances concurrently; per instance, its final record or the
        ``FsmError`` that stopped it (other exceptions propagate)."""
        one = self._runner(on_step)
        return list(await asyncio.gather(*[asyncio.ensure_future(one(i)) for i in ids]))

    def resumable(self) -> list[InstanceRecord]:
        """Non-final, non-waiting instances not held by a live worker."""
        _, live = self._worker_view(self.clock())
        return [r for r in self.store.list(statuses=[PENDING, RUNNING])
                if r.owner is None or r.owner == self.worker.id or r.owner not in live]

    async def resume(self, on_step: OnStep | None = None, *, chunk: int = 500
                     ) -> list[InstanceRecord | FsmError]:
        """Continue every instance left pending or running by a dead (or no) worker.

        Instances are adopted ``chunk`` at a time (one transaction per chunk) and
        each chunk starts stepping before the next is adopted, so the first steps
        of a large resume are durable within a fraction of a second.  Returns what
        ``run_many`` returns, in ``resumable()`` order.
        """
        self._ensure_worker()
        one, tasks = self._runner(on_step), []
        records = self.resumable()
        for i in range(0, len(records), chunk):
            for rec, outcome_ in self._adopt_all(records[i:i + chunk]):
                if isinstance(outcome_, FsmError):
                    tasks.append(asyncio.ensure_future(_done(outcome_)))
                else:
                    self._known[rec.id] = outcome_
                    tasks.append(asyncio.ensure_future(one(rec.id)))
            await asyncio.sleep(0)  # let this chunk start before adopting the next
        return list(await asyncio.gather(*tasks))

    def _adopt_all(self, records: list[InstanceRecord]
                   ) -> list[tuple[InstanceRecord, InstanceRecord | FsmError]]:
        """Adopt ``records`` in one transaction; per record the owned record or why not."""
        planned: list[tuple[InstanceRecord, StepCommit | FsmError]] = []
        for rec in records:
            try:
                planned.append((rec, self._adoption(self._compiled(rec), rec)))
            except FsmError as exc:
                exc.instance_id = exc.instance_id or rec.id
                planned.append((rec, exc))
        commits = [p for _, p in planned if isinstance(p, StepCommit)]
        applied = iter(self.store.commit(commits) if commits else [])
        out: list[tuple[InstanceRecord, InstanceRecord | FsmError]] = []
        for rec, plan in planned:
            if isinstance(plan, FsmError):
                out.append((rec, plan))
            elif next(applied):
                out.append((rec, plan.record))
            else:
                out.append((rec, _lost_claim(rec.id)))
        return out

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
            if self.store.commit([step])[0]:
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
        rec = await self.driver.commit(rec, self.driver.advance(
            cm, rec, cm.states[rec.state], None, trigger, update, 0.0))
        return rec if rec.final else await self.run(rec.id)

    async def aclose(self) -> None:
        """Stop the heartbeat, deregister this worker and close the store."""
        if self._heartbeat is not None:
            self._heartbeat.cancel()
        self.close()

    def close(self) -> None:
        """Deregister this worker and close the store (``aclose`` also stops the heartbeat)."""
        if self._registered:
            self.store.delete_worker(self.worker.id)
            self._registered = False
        self._threads.shutdown()
        self.store.close()
