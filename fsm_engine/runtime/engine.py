"""The public runtime: start, step, run, resume, cancel and send instances.

``Engine`` is the public face over three parts: the compiled-definition registry
(``runtime.registry``), the client — writes that run nothing (``runtime.client``) —
and the runner, which claims instances and steps them here (``runtime.runner``).  It
owns one store connection, one group committer and one worker identity.  Many instances
run concurrently as asyncio tasks; sync actions run in worker threads
(``ActionThreads``).  Every method that changes an instance goes through a
compare-and-set on the instance's ``version``, so a second process (another ``fsm run``,
``fsm cancel``, a ``resume``) can never interleave half a step.
"""

from __future__ import annotations

import random
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from ..definition import Machine
from ..errors import FsmError, InvalidInput
from ..policies import BreakerPolicy, RateLimit
from ..store import Store, open_store
from ..store.records import (
    REVIEW_OPEN,
    InstanceFilter,
    InstanceRecord,
    ReviewItem,
    StepCommit,
    WorkerRow,
)
from . import bulk, start_options
from .client import Client
from .commit import GroupCommitter
from .compiled import CompiledMachine
from .driver import Driver
from .fleet import limits as fleet
from .fleet.ownership import Ownership
from .kinds import review_hook
from .ledger import Ledger
from .loader import Trust
from .model_registry import Models
from .registry import Registry
from .runner import OnStep, Runner
from .threads import ActionThreads

if TYPE_CHECKING:
    from .schedules import Schedules
    from .stream_read import StreamEvent

_BREAKER = BreakerPolicy()  # the default breaker thresholds
_NO_OPTIONS = (None,) * 6  # ``start``'s options left out: key, delay, at and the debounce's


class Engine:
    """Runs instances of machines durably.

    Args:
        store: a ``Store`` or a URL for ``open_store`` (a plain path: SQLite; default ``fsm.db``).
        llm: the ``Provider`` handed to actions as ``step.llm`` (metered), or a mapping
            of model names to providers (``{"primary": …, "fallback": …, "*": default}``)
            for machines whose states name their model (``State(..., llm="primary")``);
            see :mod:`fsm_engine.runtime.model_registry`.
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
            by default (``"installed"``) one of the tracer provider this process installed,
            else None (off: see ``fsm_engine.telemetry``; ``fsm`` commands install one
            when the ``OTEL_*`` variables ask, ``fsm_engine.telemetry_sdk``).
        rate_limits: shared rate limits (``RateLimit``) by model name (``"*"``: the
            default provider) or ``"provider:model"``; see :mod:`fsm_engine.runtime.fleet.rates`.
        trust: which modules stored instances name may be imported (``loader.Trust``:
            those ``load``-ed here, files under the machines root; else ``MachineRefused``).
        keep_definitions: False: machines registered or loaded are kept in memory only,
            no ``definitions`` row written (the engine of a dry run, which writes nothing).
    """

    def __init__(self, store: Store | str = "fsm.db", *, llm: Any = None,
                 lease_seconds: float = 10.0, max_recoveries: int = 5,
                 concurrency: int | None = None,
                 breaker: BreakerPolicy | None = _BREAKER,
                 seed: int | None = None, threads: int = 32,
                 clock: Callable[[], float] = time.time, tracer: Any = "installed",
                 rate_limits: Mapping[str, RateLimit] | None = None,
                 trust: Trust | None = None, keep_definitions: bool = True) -> None:
        self.store: Store = open_store(store) if isinstance(store, str) else store
        self.trust = trust or Trust()
        self.lease_seconds = lease_seconds
        self.max_recoveries = max_recoveries
        self.breaker_policy = breaker
        self.clock = clock
        #: The one writer (``runtime.ledger``): every commit, claim and release of this
        #: engine goes through it.
        self.ledger = Ledger(self.store, clock)
        self.ownership = Ownership(self.store, writes=self.ledger, lease_seconds=lease_seconds,
                                   max_recoveries=max_recoveries, clock=clock)
        self._threads = ActionThreads(threads)
        self.models = Models(llm, self.store, breaker, clock, rate_limits)
        self.ledger.on_review = review_hook.from_env(self.store)  # FSM_REVIEW_WEBHOOK
        self.committer = GroupCommitter(self.ledger)  # ``solo``: the runner's, below
        self.driver = Driver(self.store, self.committer, models=self.models, clock=clock,
                             rng=random.Random(seed), threads=self._threads)
        if isinstance(tracer, str):  # "installed": the process's tracer provider, if any
            from ..telemetry import installed_tracer
            tracer = installed_tracer()
        self.driver.tracer = tracer
        self.registry = Registry(self.store, self.models, self.trust, clock, self.driver.upcasts,
                                 keep_definitions=keep_definitions)
        self.runner = Runner(self.store, self.registry, self.driver, self.ledger,
                             self.ownership, self.models, clock, lease_seconds=lease_seconds,
                             concurrency=concurrency, tracer=tracer)
        self.committer.solo = self.runner.solo  # bound: one call per commit, no lambda
        self.client = Client(self.store, self.ledger, self.registry, self.driver,
                             self.ownership, clock, self.runner.known, self.runner.stop_local)
        #: The runner's tables, under the names they had here (tests reach for them).
        self._known = self.runner.known
        self._tasks = self.runner.tasks
        self._schedules: Schedules | None = None

    @property
    def llm(self) -> Any:
        """The default provider (states naming no model, or an unmapped one, call it)."""
        return self.models.default

    @llm.setter
    def llm(self, provider: Any) -> None:
        self.models.set_default(provider)

    @property
    def tracer(self) -> Any:
        """The OpenTelemetry tracer for ``fsm.run`` spans, or None (off)."""
        return self.runner.tracer

    @tracer.setter
    def tracer(self, tracer: Any) -> None:
        self.runner.tracer = tracer

    @property
    def concurrency(self) -> int | None:
        """Max instances stepping at once in ``run_many`` / ``resume`` (None: all)."""
        return self.runner.concurrency

    @concurrency.setter
    def concurrency(self, limit: int | None) -> None:
        self.runner.concurrency = limit

    # -- definitions (``runtime.registry``) ---------------------------------------------
    def register(self, machine: Machine, module: str | None = None) -> CompiledMachine:
        """Check and compile ``machine``, remember where it came from, and keep its export
        in the store (``Store.put_definitions``: what the viewer draws).

        Raises ``DefinitionError`` listing every problem.
        """
        return self.registry.register(machine, module)

    def load(self, ref: str) -> CompiledMachine:
        """Load, check and register the machine in module ``ref`` (path or dotted name),
        which this engine then trusts (``trust``) wherever an instance names it."""
        return self.registry.load(ref)

    def check_module(self, rec: InstanceRecord) -> None:
        """Return when ``rec``'s machine is registered or its module may be imported here
        (``trust``); else ``MachineRefused`` naming the instance and the module."""
        self.registry.check_module(rec)

    def definition(self, rec: InstanceRecord) -> CompiledMachine:
        """The compiled machine ``rec`` names (loaded from its module when not registered,
        if ``trust`` allows), whatever version it has; ``DefinitionError`` when it cannot."""
        return self.registry.definition(rec)

    # -- creating (``runtime.client``) ----------------------------------------------------
    def start(self, machine: Machine | str, input: BaseModel | dict[str, Any] | None = None, *,
              token_budget: int | None = None, deadline_s: float | None = None,
              instance_id: str | None = None, partition: str | None = None,
              key: str | None = None, delay: float | None = None, at: datetime | None = None,
              priority: int = 0, debounce_key: str | None = None,
              debounce: float | None = None, max_wait: float | None = None) -> str:
        """Create an instance in the initial state (status ``pending``); return its id.

        ``input`` is validated against the machine's context model
        (``InvalidInput`` when it does not fit); ``token_budget`` (tokens)
        overrides the machine's default; ``deadline_s`` (seconds from now)
        bounds the whole instance; ``partition`` (e.g. a tenant id, 1–200
        characters) is its partition key, inherited by its children: workers
        with a partition limit hold at most that many instances of one key at
        once.  The instance is owned by this engine until it runs or this
        process dies (then any ``resume`` adopts it).

        How it starts (``runtime.start_options``; ``InvalidInput`` for a bad one, nothing
        written): ``key`` (1–200 characters, unique per machine): a second start with it
        returns the first instance's id and starts nothing, with another input it raises
        ``StartConflict`` naming that instance; ``delay`` (seconds) or ``at`` (an aware
        ``datetime``, not past): status ``scheduled``, unowned, until then; ``debounce_key``
        with ``debounce`` (seconds) and ``max_wait`` (seconds): starts with the key while
        one is scheduled fold into it (the latest input, due ``debounce`` after the latest
        start, never past ``max_wait`` after the first; its id is returned);
        ``priority`` (−1000…1000, default 0): claimed before lower priorities started up
        to ``priority × AGING_S`` seconds earlier (``store.records.AGING_S``).
        """
        opts = None  # a plain start (the common case, on W1's path) checks nothing
        if (key, delay, at, debounce_key, debounce, max_wait) != _NO_OPTIONS \
                or type(priority) is not int or priority != 0:
            opts = start_options.check(self.clock(), key=key, delay=delay, at=at,
                                       priority=priority, debounce_key=debounce_key,
                                       debounce=debounce, max_wait=max_wait)
        return self.start_many(machine, [input], token_budget=token_budget,
                               deadline_s=deadline_s, partition=partition,
                               ids=None if instance_id is None else [instance_id],
                               options=opts)[0]

    def start_many(self, machine: Machine | str,
                   inputs: Iterable[BaseModel | dict[str, Any] | None], *,
                   token_budget: int | None = None, deadline_s: float | None = None,
                   ids: list[str] | None = None, enqueue: bool = False,
                   partition: str | None = None,
                   options: start_options.StartOptions | None = None,
                   keys: list[str] | None = None) -> list[str]:
        """``start`` for many inputs in one transaction (all created, or none); an
        ``InvalidInput`` carries ``index``, the position of the input at fault.

        ``enqueue``: create them unowned, for any worker to claim (``fsm start``),
        instead of held by this engine.  ``options``: ``start``'s, checked
        (``start_options.check``; a key or a debounce for one input only).  ``keys``: a
        start key per input (1–200 characters; schedule ticks): when one is held already,
        nothing is created (``StartKeyTaken``; start that input alone with its ``key`` to get
        the holder's id).
        """
        return self.client.start_many(machine, inputs, token_budget=token_budget,
                                      deadline_s=deadline_s, ids=ids, enqueue=enqueue,
                                      partition=partition, options=options, keys=keys)

    @property
    def schedules(self) -> Schedules:
        """The store's schedules: ``add``, ``list``, ``pause``, ``resume``, ``delete``,
        ``backfill``, and ``fire_due`` (what ``fsm worker`` calls): see
        :mod:`fsm_engine.runtime.schedules`."""
        if self._schedules is None:
            from .schedules import Schedules
            self._schedules = Schedules(self)
        return self._schedules

    # -- ownership and running (``runtime.runner``) -----------------------------------------
    @property
    def worker(self) -> WorkerRow:
        """This engine's worker row (its id is the ``owner`` of the instances it holds)."""
        return self.ownership.worker

    def use_limits(self, limits: fleet.FleetLimits | None) -> None:
        """Obey the fleet's stored rate limits (``runtime.fleet.limits``; ``None``: keep the
        current ones).  Read by itself when the engine first runs; ``fsm worker`` reads
        them again every ``fleet.REFRESH_S`` seconds."""
        self.runner.use_limits(limits)

    async def step(self, instance_id: str) -> InstanceRecord:
        """Run exactly one step of the instance and release it; return the new record.

        Raises ``InstanceNotFound``, ``InstanceFinished``, ``FingerprintMismatch``,
        or ``FsmError`` when a live worker owns it.
        """
        return await self.runner.step(instance_id)

    async def run(self, instance_id: str, on_step: OnStep | None = None, *,
                  family: bool = True) -> InstanceRecord:
        """Step the instance until it is final or waiting; return the last record.

        When another task of this engine is already running the instance, waits
        for that run and returns its record (the instance is never stepped twice).
        In a fan-out state (waiting, reason ``children``) ``family`` runs the children here
        too and continues the parent once they have joined; ``family=False`` (a worker)
        returns the waiting parent: its children and its join are claimed like any work.
        """
        return await self.runner.run(instance_id, on_step, family=family)

    async def run_many(self, ids: Iterable[str], on_step: OnStep | None = None
                       ) -> list[InstanceRecord | FsmError]:
        """Run many instances concurrently; per instance, its final record or the
        ``FsmError`` that stopped it (an unexpected exception is wrapped in an
        ``FsmError`` whose ``__cause__`` it is): one entry per id, in order."""
        return await self.runner.run_many(ids, on_step)

    def resumable(self) -> list[InstanceRecord]:
        """Non-final instances not held by a live worker (nor being run by one of this
        engine's own tasks) that a step would move: not waiting, or waiting with a timer
        due (a timer edge, a review's SLA)."""
        return self.runner.resumable()

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
        return await self.runner.resume(on_step, chunk=chunk)

    def _parking(self, rec: InstanceRecord, exc: FsmError) -> StepCommit | None:
        return self.runner.parking(rec, exc)  # kept for callers of the old private name

    # -- from outside (``runtime.client``) -------------------------------------------------
    def cancel(self, instance_id: str, reason: str = "cancelled", *,
               operator: str | None = None) -> InstanceRecord:
        """End the instance in status ``cancelled`` (works across processes).

        Its owner notices within ``lease_seconds / 3`` and stops the running action.
        Raises ``InstanceNotFound``, or ``InstanceFinished`` when already final.
        """
        return self.client.cancel(instance_id, reason, operator)

    async def send(self, instance_id: str, trigger: str, **update: Any) -> InstanceRecord:
        """Fire ``trigger`` on a ``waiting`` instance with context ``update``; then run it."""
        rec = await self.client.send(instance_id, trigger, update)
        return rec if rec.final else await self.run(rec.id)

    async def signal(self, instance_id: str, trigger: str, update: dict[str, Any] | None = None,
                     *, operator: str | None = None) -> InstanceRecord:
        """``send`` without running the instance here (``fsm send``, the console): fire
        ``trigger`` on a ``waiting`` instance with context ``update``, validated by the
        context model, in one commit whose history row names ``operator``; a worker or
        ``resume`` then continues it.  ``InvalidInput`` when it is not waiting, the
        trigger is not declared from its state or the update does not fit."""
        return await self.client.send(instance_id, trigger, update, operator=operator)

    def pause(self, instance_id: str, *, by: str | None = None, reason: str = "paused"
              ) -> InstanceRecord:
        """Pause an instance between steps: status ``paused``, claimed by no worker or
        resume, its timers (retry backoff, review SLA, rate wait, deadline) stopped with
        the time they had left; one ``kind: pause`` history row naming ``by``
        (``detail.operator``).  One a live worker holds finishes its running step first:
        the pause is then a request the ledger applies at that step's commit (the record
        returned is still ``running``).  A fan-out parent's children still running are
        paused with it (and theirs), each with its own row and the reason ``paused with
        its parent ID``.  Idempotent; ``InstanceFinished`` when final."""
        return self.client.pause(instance_id, by=by, reason=reason)

    def unpause(self, instance_id: str, *, by: str | None = None) -> InstanceRecord:
        """End a pause: the status and reason the instance had come back, its timers run
        on with the time they had left (one paused by ``on_retries_exhausted`` gets a fresh
        set of attempts); a request not yet applied is withdrawn.  The children its pause
        paused are unpaused with it (not one paused on its own).  ``InvalidInput`` when it
        is neither paused nor asked to pause."""
        return self.client.unpause(instance_id, by=by)

    def restart(self, instance_id: str, *, by: str | None = None) -> InstanceRecord:
        """Resume a cancelled or failed instance where it stopped (DBOS's resume): a
        cancelled one in its state with its context, a failed one just before its last
        failure; one appended ``rerun`` row names ``by``; it is then runnable (a worker or
        ``resume`` continues it).  A delayed start cancelled before its time is
        ``scheduled`` for that time again while it is still ahead, else runnable at once.
        ``InvalidInput`` for any other status; ``DebounceKeyTaken`` for a debounced start
        scheduled again while a newer burst of its key is."""
        return self.client.restart(instance_id, by=by)

    def bulk_plan(self, action: str, where: InstanceFilter, *, preview: bool = False
                  ) -> bulk.Plan:
        """What ``bulk`` would touch: the ids matching ``where`` (creation order), their
        count and a sample (``preview``: the count and sample only, for a dry run);
        ``InvalidInput`` for an action not in ``bulk.ACTIONS``."""
        return bulk.plan(self.store, action, where, preview=preview)

    def prune(self, where: InstanceFilter, *, batch: int = bulk.BATCH,
              dry_run: bool = False) -> bulk.Pruned:
        """Delete the ended instances (completed, failed, cancelled) matching ``where``
        with their history, attempts, outbox, review and stream rows, ``batch`` per
        transaction, each only while still at the version read: one that moved on since
        (restarted) is skipped and counted (``bulk.prune``).  ``dry_run``: count only.
        ``InvalidInput`` when ``where`` names a status that has not ended."""
        return bulk.prune(self.ledger, where, batch=batch, dry_run=dry_run)

    def bulk(self, plan: bulk.Plan, *, by: str | None = None, reason: str | None = None,
             state: str | None = None, batch: int = bulk.BATCH,
             on_batch: Callable[[bulk.Done], None] | None = None,
             reuse_llm: bool = False, redeliver: bool = False) -> bulk.Done:
        """Apply ``plan`` (cancel, pause, unpause, resume; fork or rerun from ``state``, a fork
        without one from each last failure) in batches of ``batch`` instances, one
        transaction each, compare-and-set per instance (``runtime.bulk``): interruptible,
        and idempotent when repeated; ``reuse_llm`` / ``redeliver``: as for ``fork``."""
        if plan.action == "rerun" and not state:
            raise InvalidInput("a bulk rerun needs the state to run again")
        return bulk.Bulk(self.client, self.clock, by, reason, state, reuse_llm=reuse_llm,
                         redeliver=redeliver).apply(plan, batch=batch, on_batch=on_batch)

    def fork(self, instance_id: str, *, from_seq: int | None = None,
             from_state: str | None = None, from_failure: bool = False,
             reuse_llm: bool = False, redeliver: bool = False, by: str | None = None) -> str:
        """Create a new instance from a prefix of ``instance_id``'s history (one
        transaction: the record and its copied rows); return its id.  It is unowned and
        runnable (``run``, ``resume`` or a worker steps it).  ``by``: the operator who
        asked (kept in its ``fork_options["by"]``).

        ``reuse_llm``: its model calls whose prompt (provider, model, messages and
        parameters) is byte-identical to one the original made are answered with the
        original's recorded reply (0 tokens, ``replayed`` in the history); others call
        the model (the default, ``reuse_llm=False``, calls it for all).  ``redeliver``:
        side effects the original delivered run again (under the fork's own key,
        ``original>fork:state:visit``); by default they are not repeated.  Raises
        ``InvalidInput`` for a fork point that does not exist or ends in a final state,
        ``FingerprintMismatch`` for a changed machine (an older version is upcast
        when the fork runs).  A fork standing in a state with timers waits a fresh ``after``
        from its first step (recorded in its own ``armed`` row), never the original's
        time left (``runtime.kinds.timers``).
        """
        return self.client.fork(instance_id, from_seq=from_seq, from_state=from_state,
                                from_failure=from_failure, reuse_llm=reuse_llm,
                                redeliver=redeliver, by=by)

    def rerun(self, instance_id: str, state: str, *, in_place: bool = False,
              by: str | None = None) -> str:
        """Run ``state`` again from just before its latest visit: as a fork (returns the new
        id), or ``in_place`` on a completed or failed instance by appending a ``rerun`` row
        that resets state and context (returns ``instance_id``; the history is never
        rewritten, ``seq`` stays gap-free).  ``by``: the operator who asked (the fork's
        ``fork_options["by"]``, the ``rerun`` row's ``detail.operator``).  Raises
        ``InvalidInput`` (never visited, not final), ``StaleWrite`` when the instance
        changed meanwhile.
        """
        return self.client.rerun(instance_id, state, in_place=in_place, by=by)

    def stream(self, instance_id: str, from_offset: int | str = 0) -> AsyncIterator[StreamEvent]:
        """Watch an instance: an async iterator of ``StreamEvent``s (model reply chunks as
        they are written, attempts superseded, steps committed with trigger and destination,
        then the final status) from ``from_offset`` (a log offset or an event's ``cursor``)
        until the instance is final; see ``runtime.stream_read``.  Raises
        ``InstanceNotFound`` / ``InvalidInput`` at the first ``__anext__``.  Rows of a
        committed step are kept ``driver.streams.retention_s`` seconds (default 1 h)."""
        from .stream_read import events
        return events(self.store, instance_id, from_offset)

    def forks(self, instance_id: str) -> list[InstanceRecord]:
        """The instances forked from ``instance_id``, oldest first."""
        return self.client.forks(instance_id)

    def reviews(self, *, status: str | None = REVIEW_OPEN, machine: str | None = None,
                instance_id: str | None = None) -> list[ReviewItem]:
        """Review items, oldest first: open ones by default (``status=None``: all), of one
        machine or instance."""
        return self.client.reviews(status=status, machine=machine, instance_id=instance_id)

    def review(self, item: ReviewItem | str) -> ReviewItem:
        """The item as stored now (by id or unambiguous id prefix); ``ReviewRefused``."""
        return self.client.review(item)

    def claim_review(self, item: ReviewItem | str, by: str) -> ReviewItem:
        """Make ``by`` the item's claimer (others' decisions are then refused).

        Raises ``ReviewRefused`` when it is decided, stale or claimed by someone else.
        """
        return self.client.claim_review(item, by)

    def decide(self, item: ReviewItem | str, choice: str, *, by: str,
               update: dict[str, Any] | None = None, note: str | None = None,
               link: dict[str, Any] | None = None) -> InstanceRecord:
        """Record ``by``'s decision ``choice`` on the review item, with the edit ``update``
        (context fields the review's ``editable`` model allows) and ``note``, in one
        transaction; the instance then continues when a worker (``fsm worker``,
        ``resume``, ``run``) steps it.  ``link``: the signed link it came by
        (``review_links.Link.record()``), kept in the row's ``detail.review.link``.
        Returns the instance after the decision.

        Raises ``ReviewRefused`` (nothing written) for a stale, second, unoffered,
        claimed-by-another or invalid answer.
        """
        return self.client.decide(item, choice, by=by, update=update, note=note, link=link)

    async def aclose(self) -> None:
        """Stop the heartbeat, deregister this worker and close the store."""
        self.close()

    def close(self) -> None:
        """Give back the instances this engine holds between steps (started and never run,
        or left between steps) in one ``Store.release``, so the next engine claims them
        without a takeover row; deregister this worker and close the store (also stops the
        heartbeat).  An instance whose step was under way here (its run still going, or
        cancelled mid-step) stays held: taking it over is a recovery."""
        self.ownership.close(keep=self.runner.busy() | self.runner.interrupted)
        self._threads.shutdown()
        self.store.close()
