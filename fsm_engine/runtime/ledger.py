"""The one writer: the only code that calls ``Store.commit``, ``create``, ``debounce``,
``claim``, ``release`` or ``delete``.

Two front doors: ``create`` for new instances (a start, a batch, a fork, a debounced start
folding into its burst) and ``apply`` / ``apply_one`` for changes to instances that exist.
Three verbs beside them are the fleet's and the operator's, each with its one rule applied
here: ``claim`` and ``release`` (a worker's batch of leases, at the engine's clock) and
``delete`` (a prune, each at the version read).  They are not ``StepCommit``s because they
are not steps: a claim chooses its rows inside its transaction, a release and a delete may
touch rows no caller has read.

Every change to an instance — a step (through the group committer), a review
decision, a cancel, a send, an in-place rerun, a claim, a migration, a parked
instance — is a ``StepCommit`` handed to a ``Ledger``, which adds what the change
implies for others and writes it:

- **family effects** (``settle``): a child that ends wakes its parent
  (``StepCommit.wake``); a parent that ends while its children run cancels them
  in the same transaction, adding their tokens (``fanout.propagate``);
- **stale-write fencing**: each step applies only when its instance is still at
  ``expected_version`` (and every fenced instance at its version); ``write``
  returns one ``bool`` per step (``apply_one``: for one), and the caller raises its
  own refusal (``StaleWrite``, ``ReviewRefused``) on False;
- **pause requests** (``runtime.kinds.pausing``): a step gone stale only because an operator
  asked to pause its instance mid-step is written anyway, the pause after it; a step that
  ends its instance drops a request it carries (``settle``);
- **deletes** (``delete``: ``fsm prune``): ended instances only, each at the version read;
- **claims and releases** (``claim``, ``release``: the fleet's ``Ownership``, the runner,
  the worker): stamped with the engine's clock, as every other write is (``Store.release``
  stamped the wall clock, so a ``VirtualClock`` run mixed two times: issue 37);
- **the outbox**: a step carrying ``outbox_done`` marks its idempotency key done in
  its own transaction (the store writes it with the step, or neither).

Why one place: a decision that ended a fan-out child used to be written straight to
the store, skipping the wake an ordinary step makes, and its parent waited forever
(issue 20).  ``tests/runtime/test_ledger.py`` asserts that no other module of the package
calls a store's ``commit``, ``create``, ``claim``, ``release`` or ``delete``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import replace

from ..errors import InstanceNotFound
from ..store.base import Store
from ..store.claims import ClaimRequest
from ..store.records import HistoryRow, InstanceRecord, ReviewItem, StepCommit
from .fleet import adoption
from .kinds import fanout, pausing

#: ``observe(steps, applied)`` called after each commit with what applied (the test kit's
#: ``pytest --fsm-coverage`` collects history rows so); empty: one check per batch.
OBSERVERS: list[Callable[[Sequence[StepCommit], Sequence[bool]], None]] = []


class Ledger:
    """Writes ``StepCommit``s to ``store`` with their family effects (``settle``).

    ``clock``: epoch seconds (the engine's), the time of the cancellations ``settle``
    adds, of claims and of releases.
    """

    def __init__(self, store: Store, clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.clock = clock
        #: Called with each review item a committed step opened (``runtime.kinds.review_hook``:
        #: ``FSM_REVIEW_WEBHOOK``); None: nobody is told.
        self.on_review: Callable[[ReviewItem], None] | None = None

    def settle(self, step: StepCommit) -> StepCommit:
        """``step`` with what it implies for its family: a child that ends wakes its
        parent; a parent that ends while its children run cancels them (with their
        tokens); a pause request it carries is dropped.  Idempotent; a step that does not
        end its instance is returned as is."""
        rec = step.record
        if rec.final:
            rec.pause_request = None
            fanout.propagate(self.store, step, self.clock())
        return step

    def write(self, steps: Sequence[StepCommit]) -> list[bool]:
        """Commit ``steps`` (already settled: the group commit settles each as it is
        queued) in one transaction; per step, True when it applied, False when stale.
        Raises what ``Store.commit`` raises (``StepRejected`` for one step's values)."""
        done = self.store.commit(steps)
        if False in done:  # (not ``all()``: no call on the hot path)
            done = [ok or self._paused_meanwhile(s) for s, ok in zip(steps, done, strict=True)]
        if self.on_review is not None:
            for step, ok in zip(steps, done, strict=True):
                if ok and step.review_open is not None:
                    self.on_review(step.review_open)
        if OBSERVERS:
            for observe in OBSERVERS:
                observe(steps, done)
        return done

    def _paused_meanwhile(self, step: StepCommit) -> bool:
        """Write a stale ``step`` over a pause request's touch, paused after it unless the
        request was withdrawn (True), or leave it stale (False).  Read only when a step is
        stale: no cost on the hot path."""
        try:
            stored = self.store.get(step.record.id)
        except InstanceNotFound:  # deleted meanwhile (pruned): nothing to write over
            return False
        if not pausing.applies(stored, step):
            return False
        return self.store.commit([pausing.rebase(step, stored, self.clock())])[0]

    def create(self, records: Sequence[InstanceRecord], history: Sequence[HistoryRow] = (),
               *, fold: bool = False) -> list[str]:
        """The front door for new instances: insert ``records`` (started, forked) with
        ``history`` (a fork's copied rows) in one transaction, all or none
        (``Store.create``: a duplicate id fails all, a start key held refuses with
        ``StartKeyTaken``; each record's ``key`` is set).  ``fold``: the one debounced
        record (``scheduled``, due when its window ends) starts, or folds into the scheduled
        instance of its burst, in one atomic write (``Store.debounce``).  Returns the ids
        of the instances that hold the records (folded: the burst's)."""
        if fold:
            (record,) = records
            return [self.store.debounce(record)]
        self.store.create(*records, history=history)
        return [r.id for r in records]

    def delete(self, records: Sequence[InstanceRecord]) -> int:
        """Delete the ended instances ``records`` (a prune) with all their rows, in one
        transaction, each only while still at the version read (compare-and-set): one that
        moved on since (restarted, rerun in place) is left whole.  Returns how many were
        deleted."""
        return self.store.delete([r.id for r in records], versions=[r.version for r in records])

    def claim(self, request: ClaimRequest) -> list[InstanceRecord]:
        """``Store.claim`` at this ledger's clock with the runtime's rule for what a claim
        writes (``fleet.adoption.take``: owner, recovery count, takeover row): ``request.now``
        is replaced by ``clock()``, the time the claimed records' ``updated_at``, the leases
        judged and a takeover's recovery row carry.  Returns the instances claimed, as
        stored."""
        return self.store.claim(replace(request, now=self.clock(), adopt=adoption.take))

    def release(self, owner: str, ids: Sequence[str] | None = None) -> int:
        """Give up ``owner``'s claim on ``ids`` (``None``: all it holds; ``[]``: none),
        ``updated_at`` stamped with ``clock()`` (``Store.release``); returns how many were
        released.  Raises what the store raises (``StoreError``)."""
        return self.store.release(owner, None if ids is None else list(ids), now=self.clock())

    def apply(self, steps: Sequence[StepCommit]) -> list[bool]:
        """``settle`` each step, then ``write`` them together."""
        return self.write([self.settle(s) for s in steps])

    def apply_one(self, step: StepCommit) -> bool:
        """``apply`` for one step: True when it applied, False when its instance (or an
        item or instance it fences) changed meanwhile and nothing was written."""
        return self.write([self.settle(step)])[0]
