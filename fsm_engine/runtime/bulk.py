"""Operator actions over every instance a query matches: cancel, pause, unpause, resume
(a cancelled or failed one where it stopped: ``Client.restarted``), and fork / rerun
(new instances from each match's history).

``plan`` reads the matching ids (creation order) and a sample: a dry run prints them.
``apply`` then works in batches of ``batch``: it reads the batch's records, builds one
compare-and-set commit per instance that the action still applies to, and hands the
batch to the ledger as **one transaction** (``Ledger.apply``).  So a SIGKILL mid-way
leaves each instance wholly done or untouched; a repeat skips those already done (the
action no longer applies: cancelled, already paused, not paused), so none is done
twice; an instance that moved between the read and the commit is read again and
retried alone.  An instance a live worker holds is paused through its request
(``Client.pause``): its running step commits first.  A fork (just before the last
failure, or before the latest visit of ``state``; a rerun is a fork from ``state``) gets
an id derived from its original and fork point, so a batch's forks are created in one
transaction and a repeat finds them there and makes none twice.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace

from ..errors import DebounceKeyTaken, InstanceFinished, InstanceNotFound, InvalidInput
from ..store.base import Store
from ..store.records import (
    FINAL_STATUSES,
    PAUSED,
    HistoryRow,
    InstanceFilter,
    InstanceRecord,
    StepCommit,
)
from .client import Client
from .ledger import Ledger

#: The actions ``apply`` knows.
ACTIONS = ("cancel", "pause", "unpause", "resume", "fork", "rerun")
#: Instances per transaction by default.
BATCH = 500


@dataclass(slots=True)
class Plan:
    """What a bulk action would touch: how many match, a sample, and (for ``apply``) every
    matching id in creation order (empty for a preview)."""

    action: str
    count: int
    sample: list[InstanceRecord]
    ids: list[str] = field(default_factory=list)


@dataclass(slots=True)
class Done:
    """What ``apply`` did: instances changed, skipped (the action no longer applied,
    e.g. already cancelled) and requested (a pause a running step will apply)."""

    changed: int = 0
    skipped: int = 0
    requested: int = 0
    batches: int = 0
    errors: list[str] = field(default_factory=list)


def plan(store: Store, action: str, where: InstanceFilter, sample: int = 10, *,
         preview: bool = False) -> Plan:
    """The matching instances (``InvalidInput`` for an unknown action); ``preview``:
    only their count and a sample (a dry run, a confirmation page: two cheap reads)."""
    if action not in ACTIONS:
        raise InvalidInput(f"unknown bulk action {action!r}; one of: {', '.join(ACTIONS)}")
    if preview:
        first = store.query(where, order="created", descending=False, limit=sample)
        return Plan(action, store.count(where).get(None, 0), first)
    records = store.query(where, order="created", descending=False, limit=None)
    return Plan(action, len(records), records[:sample], [r.id for r in records])


@dataclass(slots=True)
class Pruned:
    """What ``prune`` did: instances matching when it began, deleted, and skipped (they
    moved on between their read and their delete, e.g. restarted), in ``batches``
    transactions."""

    matching: int
    deleted: int = 0
    skipped: int = 0
    batches: int = 0


def ended(where: InstanceFilter) -> InstanceFilter:
    """``where`` limited to ended instances (completed, failed, cancelled: all three when it
    names no status); ``InvalidInput`` when it names another."""
    statuses = where.statuses or tuple(sorted(FINAL_STATUSES))
    live = [s for s in statuses if s not in FINAL_STATUSES]
    if live:
        raise InvalidInput(f"prune deletes ended instances only: a status must be one of "
                           f"{', '.join(sorted(FINAL_STATUSES))}, not {live[0]!r}")
    return replace(where, statuses=statuses)


def prune(ledger: Ledger, where: InstanceFilter, *, batch: int = BATCH,
          dry_run: bool = False) -> Pruned:
    """Delete the ended instances matching ``where`` with all their rows, ``batch`` per
    transaction through ``ledger`` (``Ledger.delete``: each at the version read); with
    ``dry_run`` only count them.  Stops when a batch deletes none (all of it moved on)."""
    store, where = ledger.store, ended(where)
    done = Pruned(store.count(where).get(None, 0))
    if dry_run:
        return done
    seen: set[str] = set()
    while True:  # small transactions: running engines wait for at most one batch
        records = store.query(where, descending=False, limit=max(1, batch))
        if not records:
            break
        seen.update(r.id for r in records)
        gone = ledger.delete(records)
        done.deleted += gone
        done.batches += 1
        if not gone:
            break
    done.skipped = len(seen) - done.deleted  # (one skipped, then deleted, counts once)
    return done


def _chunks(ids: Sequence[str], size: int) -> Iterator[Sequence[str]]:
    for start in range(0, len(ids), size):
        yield ids[start:start + size]


class Bulk:
    """Applies one action to a plan, batch by batch, through ``client``'s ledger.

    ``by``: the operator (``detail.operator`` of every row); ``on_batch(done)``: called
    after each batch's transaction (progress, or a test's SIGKILL point)."""

    def __init__(self, client: Client, clock: Callable[[], float], by: str | None,
                 reason: str | None = None, state: str | None = None, *,
                 reuse_llm: bool = False, redeliver: bool = False) -> None:
        self.client, self.store, self.ledger = client, client.store, client.ledger
        self.clock, self.by, self.reason, self.state = clock, by, reason, state
        self.fork_options = {"reuse_llm": reuse_llm, "redeliver": redeliver}

    def apply(self, p: Plan, *, batch: int = BATCH,
              on_batch: Callable[[Done], None] | None = None) -> Done:
        """Apply ``p.action`` to every id of ``p`` (see the module doc)."""
        done = Done()
        for ids in _chunks(p.ids, max(1, batch)):
            self._batch(p.action, ids, done)
            done.batches += 1
            if on_batch is not None:
                on_batch(done)
        return done

    def _batch(self, action: str, ids: Sequence[str], done: Done) -> None:
        if action in ("fork", "rerun"):
            self._forks(ids, done)
            return
        commits: list[StepCommit] = []
        for iid in ids:
            step = self._commit(action, iid, done)
            if step is not None:
                commits.append(step)
        if not commits:
            return
        results = self.ledger.apply(commits)  # one transaction, compare-and-set each
        for step, ok in zip(commits, results, strict=True):
            if ok:
                done.changed += 1
                self._cascade(action, step.record.id)
            else:
                self._one(action, step.record.id, done)  # it moved: read again, alone

    def _cascade(self, action: str, iid: str) -> None:
        """After ``iid`` was paused or unpaused: its children too, as ``Engine.pause`` and
        ``Engine.unpause`` do (a query of its children; none for most instances)."""
        if action == "pause":
            self.client.pause_children(iid, self.by)
        elif action == "unpause":
            self.client.unpause_children(iid, self.by)

    def _forks(self, ids: Sequence[str], done: Done) -> None:
        """The batch's forks, created in one transaction (those made before skipped)."""
        made: list[tuple[InstanceRecord, list[HistoryRow]]] = []
        for iid in ids:
            try:
                fork = self.client.fork_record(self.store.get(iid), from_state=self.state,
                                               from_failure=self.state is None, stable_id=True,
                                               by=self.by, **self.fork_options)
            except (InvalidInput, InstanceNotFound):
                done.skipped += 1  # no such point (never failed, never in that state)
                continue
            try:
                self.store.get(fork[0].id)
                done.skipped += 1  # made by an earlier run of this action
            except InstanceNotFound:
                made.append(fork)
        if made:
            self.ledger.create([r for r, _ in made], history=[h for _, rows in made
                                                               for h in rows])
            done.changed += len(made)

    def _commit(self, action: str, iid: str, done: Done) -> StepCommit | None:
        """The commit doing ``action`` to ``iid`` now, or None (skipped, requested)."""
        try:
            rec = self.store.get(iid)
        except InstanceNotFound:
            done.skipped += 1
            return None
        if action == "pause" and not rec.final and rec.status != PAUSED \
                and self.client.held_live(rec):
            self._request(rec, done)  # its running step commits first
            return None
        return self._built(action, rec, done)

    def _built(self, action: str, rec: InstanceRecord, done: Done) -> StepCommit | None:
        """``_build``, counting a None in ``done.skipped`` and a refusal (a debounced start
        whose key has a newer burst: ``DebounceKeyTaken``) in ``done.errors``."""
        try:
            step = self._build(action, rec)
        except DebounceKeyTaken as exc:
            done.errors.append(str(exc))
            return None
        if step is None:
            done.skipped += 1
        return step

    def _build(self, action: str, rec: InstanceRecord) -> StepCommit | None:
        """The commit doing ``action`` to ``rec`` (None: it no longer applies)."""
        now = self.clock()
        if action == "resume":
            return self.client.restarted(rec, by=self.by)
        if rec.final:
            return None
        if action == "cancel":
            return self.client.cancel_step(rec, now, self.reason or "cancelled", self.by)
        if action == "pause":  # the same commit as one ``Engine.pause``
            if rec.status == PAUSED:
                return None
            return self.client.pause_step(rec, self.by, reason=self.reason or "paused")
        try:  # the same commit as one ``Engine.unpause`` (a request withdrawn)
            return self.client.unpause_step(rec, self.by)
        except DebounceKeyTaken:  # refused, not skipped
            raise
        except InvalidInput:  # neither paused nor asked to: nothing to end
            return None

    def _request(self, rec: InstanceRecord, done: Done) -> None:
        try:
            now = self.client.pause(rec.id, by=self.by, reason=self.reason or "paused")
        except InstanceFinished:
            done.skipped += 1
            return
        if now.status == PAUSED:
            done.changed += 1
        else:
            done.requested += 1

    def _one(self, action: str, iid: str, done: Done) -> None:
        """Retry one instance that moved under the batch, until it applies or no longer
        needs to (a few rounds at most: each round some other writer made progress)."""
        if action == "pause":  # a worker may hold it now: its step commits first
            self._request(self.store.get(iid), done)
            return
        for _ in range(5):
            rec = self.store.get(iid)
            step = self._built(action, rec, done)
            if step is None:
                return
            if self.ledger.apply_one(step):
                done.changed += 1
                self._cascade(action, iid)
                return
        done.errors.append(f"{iid}: kept moving; run the action again")
