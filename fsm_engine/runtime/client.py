"""The client: writes that run nothing (start, cancel, pause, fork, rerun, reviews, decide).

Like a DBOS ``DBOSClient`` or a Temporal client, it manages instances without stepping
them: every change is one ledger commit (``runtime.ledger``) or one ``Ledger.create``; a
runner (``runtime.runner``) or a worker then takes the instance up.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterable
from typing import Any

from pydantic import BaseModel, ValidationError

from ..definition import Machine
from ..errors import InstanceFinished, InvalidInput, StaleWrite
from ..store import PENDING, Store
from ..store.records import (
    PAUSE,
    PAUSED,
    REVIEW_OPEN,
    SCHEDULED,
    HistoryRow,
    InstanceRecord,
    ReviewItem,
    StepCommit,
)
from . import outcome, start_options, values
from .compiled import CompiledMachine
from .driver import Driver
from .fleet.ownership import Ownership
from .kinds import pausing, timers
from .kinds import reviews as review_queue
from .ledger import Ledger
from .registry import Registry

#: Records this engine just created or adopted, kept so ``run`` needn't read them back
#: (a stale one is harmless: every write is compare-and-set on its version).
KNOWN_MAX = 100_000


def validate_input(model: type[BaseModel], data: BaseModel | dict[str, Any] | None
                   ) -> dict[str, Any]:
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
        where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in first["loc"])
        raise InvalidInput(f"input does not fit {model.__name__}: "  # the field first
                           f"{where.lstrip('.') or '(root)'}: {first['msg']}") from None
    except InvalidInput as exc:
        raise InvalidInput(f"input does not fit {model.__name__}: {exc}") from None
    return ctx


def _check_partition(partition: str | None) -> None:
    if partition is not None and not (isinstance(partition, str) and 0 < len(partition) <= 200):
        raise InvalidInput(f"a partition key is 1 to 200 characters, not {partition!r}")


class Client:
    """Writes that run nothing, over the store, the ledger and the registry.

    Args:
        known: records the runner may take up without reading them back (shared with it).
        stop_local: called with an instance id whose cancellation committed (stops a run
            of it in this process, if any).
    """

    def __init__(self, store: Store, ledger: Ledger, registry: Registry, driver: Driver,
                 ownership: Ownership, clock: Callable[[], float],
                 known: dict[str, InstanceRecord],
                 stop_local: Callable[[str], None]) -> None:
        self.store, self.ledger, self.registry, self.driver = store, ledger, registry, driver
        self.ownership, self.clock, self.known = ownership, clock, known
        self.stop_local = stop_local

    # -- creating ---------------------------------------------------------------
    def start_many(self, machine: Machine | str,
                   inputs: Iterable[BaseModel | dict[str, Any] | None], *,
                   token_budget: int | None = None, deadline_s: float | None = None,
                   ids: list[str] | None = None, enqueue: bool = False,
                   partition: str | None = None,
                   options: start_options.StartOptions | None = None,
                   keys: list[str] | None = None) -> list[str]:
        """See ``Engine.start_many``: all created in one transaction, or none
        (``InvalidInput`` with ``index``).  ``options`` (``runtime.start_options``: a key, a
        delay, a debounce, a priority) apply to one input only; ``keys``: one start key per
        input (``StartKeyTaken`` when one is held: nothing created)."""
        _check_partition(partition)
        reg = self.registry
        cm = reg.load(machine) if isinstance(machine, str) else reg.register(machine)
        enqueue = enqueue or (options is not None and (options.due is not None
                                                       or options.debounce_s is not None))
        if not enqueue:
            self.ownership.register()
        owner = None if enqueue else self.ownership.worker.id
        records = [self._record(cm, i, data, token_budget, deadline_s, ids, owner, partition)
                   for i, data in enumerate(inputs)]
        if keys is not None:
            start_options.keyed(records, keys)
        if options is not None and not options.plain:
            held = start_options.create_all(self.ledger, records, options)
            if held != [r.id for r in records] or enqueue:
                return held
        else:
            self.ledger.create(records)
        if not enqueue and len(self.known) + len(records) <= KNOWN_MAX:
            self.known.update((r.id, r) for r in records)  # run() needn't read them back
        return [r.id for r in records]

    def _record(self, cm: CompiledMachine, i: int, data: BaseModel | dict[str, Any] | None,
                token_budget: int | None, deadline_s: float | None, ids: list[str] | None,
                owner: str | None, partition: str | None) -> InstanceRecord:
        spec, now = cm.spec, self.clock()
        try:
            ctx = validate_input(spec.context, data)
        except InvalidInput as exc:
            exc.index = i  # which input (all or none start)
            raise
        return InstanceRecord(
            id=ids[i] if ids else os.urandom(6).hex(), machine=spec.name,
            module=self.registry.modules[spec.name], fingerprint=cm.fingerprint,
            state=spec.initial, status=PENDING, context=ctx, input=dict(ctx),
            max_transitions=spec.max_transitions,
            token_budget=spec.token_budget if token_budget is None else token_budget,
            created_at=now, updated_at=now, visits={spec.initial: 1},
            deadline=None if deadline_s is None else now + deadline_s,
            owner=owner, machine_version=spec.version,
            queue=cm.states[spec.initial].queue, partition_key=partition)

    # -- from outside ------------------------------------------------------------
    def cancel(self, instance_id: str, reason: str = "cancelled",
               operator: str | None = None) -> InstanceRecord:
        """See ``Engine.cancel``."""
        self.known.pop(instance_id, None)
        while True:
            rec = self.store.get(instance_id)
            if rec.final:
                raise InstanceFinished(f"instance {rec.id} is already {rec.status}",
                                       instance_id=rec.id)
            step = self.cancel_step(rec, self.clock(), reason, operator)
            if self.ledger.apply_one(step):  # its running children are cancelled with it
                self.stop_local(instance_id)
                return step.record

    def cancel_step(self, rec: InstanceRecord, now: float, reason: str,
                    operator: str | None) -> StepCommit:
        """The commit cancelling ``rec`` (not final) at ``now`` (``outcome.cancelled``); a
        paused delayed start keeps the due time its pause row kept (one history read)."""
        due = outcome.scheduled_due(self.pause_row(rec.id)) if rec.status == PAUSED else None
        return outcome.cancelled(rec, now, reason, operator, paused_due=due)

    def pause_row(self, instance_id: str) -> HistoryRow | None:
        """The last ``kind: pause`` row of ``instance_id`` (None: never paused)."""
        return next((h for h in reversed(self.store.history(instance_id)) if h.kind == PAUSE),
                    None)

    def held_live(self, rec: InstanceRecord) -> bool:
        """True when ``rec``'s owner may be in the middle of a step (this process, or a
        worker whose lease holds and whose process is not known gone)."""
        if rec.owner is None:
            return False
        if rec.owner == self.ownership.id:
            return True
        now = self.clock()
        _, live = self.ownership.view(now)
        return rec.owner in live and rec.owner not in self.ownership.dead(now)

    def pause(self, instance_id: str, *, by: str | None, reason: str = "paused"
              ) -> InstanceRecord:
        """See ``Engine.pause``: ``instance_id``, then each of its children still running
        (and theirs), with the reason ``pausing.with_parent``."""
        rec = self._pause_one(instance_id, by, reason[:pausing.MAX_TEXT])
        self.pause_children(instance_id, by)
        return rec

    def pause_children(self, parent_id: str, by: str | None) -> None:
        """Pause each child of ``parent_id`` still running (and theirs), with the reason
        ``pausing.with_parent`` (``pause``; a bulk pause after each parent it paused)."""
        for child in self.store.children(parent_id):
            if not child.final and child.status != PAUSED:
                with contextlib.suppress(InstanceFinished):  # (it ended meanwhile)
                    self.pause(child.id, by=by, reason=pausing.with_parent(parent_id))

    def _pause_one(self, instance_id: str, by: str | None, reason: str) -> InstanceRecord:
        """Pause ``instance_id`` alone (a request when a live worker holds it)."""
        while True:
            rec = self.store.get(instance_id)
            if rec.final:
                raise InstanceFinished(f"instance {rec.id} is already {rec.status}",
                                       instance_id=rec.id)
            if rec.status == PAUSED:
                return rec  # already: nothing written
            step = self.pause_step(rec, by, reason)
            if step is None:
                return rec  # asked before: its holder's step applies it
            if self.ledger.apply_one(step):
                if step.record.status == PAUSED:
                    self.known.pop(rec.id, None)
                return step.record

    def pause_step(self, rec: InstanceRecord, by: str | None, reason: str
                   ) -> StepCommit | None:
        """The commit pausing ``rec`` (neither final nor paused) now, or, a live worker
        holding it, asking its holder to (``pausing.touch``: the request written with the
        touch); None when a request not withdrawn is there already."""
        if not self.held_live(rec):
            return outcome.paused(rec, self.clock(), by=by, reason=reason)
        req = pausing.decode(rec.pause_request)
        if req is not None and not req.withdrawn:
            return None
        return pausing.touch(rec, req, self.clock(), by=by, reason=reason)

    def unpause(self, instance_id: str, *, by: str | None) -> InstanceRecord:
        """See ``Engine.unpause``: ``instance_id``, then each of its children its pause
        paused (``pause``; not one paused on its own), and theirs."""
        rec = self._unpause_one(instance_id, by)
        self.unpause_children(instance_id, by)
        return rec

    def unpause_children(self, parent_id: str, by: str | None) -> None:
        """End the pause of each child of ``parent_id`` that its pause paused (or asked to),
        and theirs (``unpause``; a bulk unpause after each parent)."""
        cascade = pausing.with_parent(parent_id)
        for child in self.store.children(parent_id):
            req = pausing.decode(child.pause_request)
            if child.reason == cascade and child.status == PAUSED or (
                    req is not None and not req.withdrawn and req.reason == cascade):
                with contextlib.suppress(InvalidInput):  # (its pause ended meanwhile)
                    self.unpause(child.id, by=by)

    def _unpause_one(self, instance_id: str, by: str | None) -> InstanceRecord:
        """End ``instance_id``'s pause alone (withdraw a request not applied yet)."""
        while True:
            rec = self.store.get(instance_id)
            step = self.unpause_step(rec, by)
            if step is None:
                return rec  # a request withdrawn already
            if self.ledger.apply_one(step):
                return step.record

    def unpause_step(self, rec: InstanceRecord, by: str | None) -> StepCommit | None:
        """The commit ending ``rec``'s pause, or withdrawing a request not applied yet
        (a touch while a live worker holds it: its running step lands, unpaused; else the
        request dropped); None when it is withdrawn already.  ``InvalidInput`` when
        ``rec`` is neither paused nor asked to pause; ``DebounceKeyTaken`` for a debounced
        start coming back ``scheduled`` while a newer burst of its key is
        (``start_options.reschedulable``)."""
        if rec.status != PAUSED:
            req = pausing.decode(rec.pause_request)
            if req is None:
                raise InvalidInput(f"instance {rec.id} is {rec.status}, not paused")
            if req.withdrawn:
                return None
            if self.held_live(rec):
                return pausing.touch(rec, req, self.clock(), by=req.by, reason=req.reason,
                                     withdrawn=True)
            return pausing.dropped(rec)
        pause = self.pause_row(rec.id)
        if pause is None:
            raise InvalidInput(f"instance {rec.id} is paused but has no pause row")
        step = outcome.unpaused(rec, pause, self.clock(), by=by)
        if step.record.status == SCHEDULED:
            start_options.reschedulable(self.store, rec)
        return step

    def fork(self, instance_id: str, *, from_seq: int | None = None,
             from_state: str | None = None, from_failure: bool = False,
             reuse_llm: bool = False, redeliver: bool = False, by: str | None = None) -> str:
        """See ``Engine.fork``."""
        rec, rows = self.fork_record(self.store.get(instance_id), from_seq=from_seq,
                                     from_state=from_state, from_failure=from_failure,
                                     reuse_llm=reuse_llm, redeliver=redeliver, by=by)
        self.ledger.create([rec], history=rows)
        return rec.id

    def fork_record(self, orig: InstanceRecord, *, from_seq: int | None = None,
                    from_state: str | None = None, from_failure: bool = False,
                    reuse_llm: bool = False, redeliver: bool = False,
                    stable_id: bool = False, by: str | None = None
                    ) -> tuple[InstanceRecord, list[HistoryRow]]:
        """The fork ``fork`` would create, and its copied rows, not yet stored; with
        ``stable_id`` its id is SHA-256 of (original, fork point) (a bulk fork made twice
        makes it once).  ``InvalidInput`` when there is no such fork point."""
        from .kinds.fork import fork_point, forked
        cm = self.registry.runnable(orig)
        history = self.store.history(orig.id)
        n = fork_point(history, seq=from_seq, state=from_state, failure=from_failure)
        new_id = None
        if stable_id:
            import hashlib
            new_id = hashlib.sha256(f"{orig.id}>{n}".encode()).hexdigest()[:12]
        return forked(cm, orig, history, self.store.attempts(orig.id), n, self.clock(),
                      new_id, reuse_llm=reuse_llm, redeliver=redeliver, by=by)

    def rerun(self, instance_id: str, state: str, *, in_place: bool = False,
              by: str | None = None) -> str:
        """See ``Engine.rerun``."""
        if not in_place:
            return self.fork(instance_id, from_state=state, by=by)
        from .kinds.fork import fork_point
        rec = self.store.get(instance_id)
        if rec.status not in ("completed", "failed"):
            raise InvalidInput(f"instance {rec.id} is {rec.status}: an in-place rerun needs a "
                               "completed or failed instance (or rerun it as a fork)")
        cm = self.registry.runnable(rec)
        history = self.store.history(rec.id)
        n = fork_point(history, state=state)
        context = dict(rec.input)
        for row in history[:n]:
            context.update(row.delta)
        rec = self.registry.upcast(cm, rec)
        reset = timers.enter(cm, outcome.reset(cm, rec, state, context, n, self.clock()))
        if by is not None:
            reset.history[0].detail["operator"] = by
        if not self.ledger.apply_one(self.driver.attach(reset)):
            raise StaleWrite(f"instance {rec.id} changed meanwhile; nothing was written",
                             instance_id=rec.id)
        self.known.pop(rec.id, None)
        return rec.id

    def restarted(self, rec: InstanceRecord, *, by: str | None) -> StepCommit | None:
        """The commit resuming a cancelled or failed ``rec`` where it stopped (None: it is
        neither): a cancelled one in its state with its context (a delayed start cancelled
        before its time: ``scheduled`` for it again while it is ahead,
        ``start_options.rescheduled``), a failed one just before its last failure; one
        ``rerun`` row (``detail.operator``, ``detail.restarted``) appended, nothing
        rewritten (``outcome.reset``)."""
        from .kinds.fork import fork_point
        if rec.status not in ("cancelled", "failed"):
            return None
        cm = self.registry.runnable(rec)
        history = self.store.history(rec.id)
        if rec.status == "cancelled":
            n, state, context = rec.seq, rec.state, dict(rec.context)
        else:
            n = fork_point(history, failure=True)
            context = dict(rec.input)
            for row in history[:n]:
                context.update(row.delta)
            state = history[n - 1].dest if n else cm.spec.initial
        rec = self.registry.upcast(cm, rec)
        now = self.clock()
        step = timers.enter(cm, outcome.reset(cm, rec, state, context, n, now))
        step.history[0].detail.update(operator=by, restarted=rec.status)
        if rec.status == "cancelled" and history:  # a delayed start: when it was due
            step = start_options.rescheduled(self.store, step, history[-1], now)
        return self.driver.attach(step)

    def restart(self, instance_id: str, *, by: str | None) -> InstanceRecord:
        """See ``Engine.restart``."""
        rec = self.store.get(instance_id)
        step = self.restarted(rec, by=by)
        if step is None:
            raise InvalidInput(f"instance {rec.id} is {rec.status}: only a cancelled or failed "
                               "instance is restarted")
        if not self.ledger.apply_one(step):
            raise StaleWrite(f"instance {rec.id} changed meanwhile; nothing was written",
                             instance_id=rec.id)
        self.known.pop(rec.id, None)
        return step.record

    def forks(self, instance_id: str) -> list[InstanceRecord]:
        """The instances forked from ``instance_id``, oldest first."""
        return [r for r in self.store.list(machine=self.store.get(instance_id).machine)
                if r.forked_from == instance_id]

    # -- the review queue (see ``reviews.py``) -------------------------------------------
    def reviews(self, *, status: str | None = REVIEW_OPEN, machine: str | None = None,
                instance_id: str | None = None) -> list[ReviewItem]:
        """See ``Engine.reviews``."""
        return self.store.reviews(statuses=None if status is None else [status],
                                  machine=machine, instance_id=instance_id)

    def review(self, item: ReviewItem | str) -> ReviewItem:
        """The item as stored now (by id or unambiguous id prefix); ``ReviewRefused``."""
        return review_queue.find(self.store, item.id if isinstance(item, ReviewItem) else item)

    def claim_review(self, item: ReviewItem | str, by: str) -> ReviewItem:
        """See ``Engine.claim_review``."""
        found = self.review(item)
        if found.status != REVIEW_OPEN:
            raise review_queue.ReviewRefused(
                f"review {found.id}: {review_queue.not_open(found)}",
                item_id=found.id)
        why = review_queue.stale(found, self.store.get(found.instance_id))
        if why or not self.store.claim_review(found.id, by, self.clock()):
            raise review_queue.ReviewRefused(
                f"review {found.id}: {why or f'claimed by {self.review(found).claimed_by}'}",
                item_id=found.id)
        return self.review(found)

    def decide(self, item: ReviewItem | str, choice: str, *, by: str,
               update: dict[str, Any] | None = None, note: str | None = None,
               link: dict[str, Any] | None = None) -> InstanceRecord:
        """See ``Engine.decide``."""
        found = self.review(item)
        rec = self.store.get(found.instance_id)
        cm = self.registry.runnable(rec)
        rec = self.registry.upcast(cm, rec)
        commit = review_queue.decision(cm, rec, found, choice, by=by, now=self.clock(),
                                       advance=self.driver.advance, update=update, note=note,
                                       claimer=by)
        for row in commit.history[:1]:
            row.detail["operator"] = by  # who did it, as every operator action names
            if link is not None:  # the signed link it came by (its id, not its secret)
                row.detail.setdefault("review", {})["link"] = dict(link)
        if not self.ledger.apply_one(self.driver.attach(commit)):  # ends a child: wakes its parent
            raise review_queue.ReviewRefused(
                f"review {found.id}: the item or its instance changed meanwhile (decided, "
                "claimed or moved on); nothing was written", item_id=found.id)
        self.known.pop(rec.id, None)
        return commit.record

    async def send(self, instance_id: str, trigger: str, update: dict[str, Any] | None = None,
                   *, operator: str | None = None) -> InstanceRecord:
        """Fire ``trigger`` on a ``waiting`` instance with context ``update`` (one commit);
        return the record after it (``operator``: who sent it, ``detail.operator``).
        ``InvalidInput`` when it is not waiting, the trigger is not declared from its
        state or the update does not fit the context model."""
        rec = self.store.get(instance_id)
        if rec.status != "waiting":
            raise InvalidInput(f"instance {rec.id} is {rec.status}, not waiting")
        cm = self.registry.runnable(rec)
        rec = self.registry.upcast(cm, rec)
        commit = self.driver.advance(cm, rec, cm.states[rec.state], None, trigger,
                                     update or {}, 0.0)
        if commit.history:  # an operator's move, not the machine's (an exported test sends it)
            commit.history[0].detail["sent"] = True
        if operator is not None and commit.history:
            commit.history[0].detail["operator"] = operator
        # the trigger moves it on without a decision: an open review item can never apply
        commit.close_reviews = (operator or "fsm", f"instance sent {trigger!r}")
        return await self.driver.commit(rec, commit)

