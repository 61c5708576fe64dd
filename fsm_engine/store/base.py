"""The store interface: the narrow contract every backend passes (``fsm_engine.testing``)."""

from __future__ import annotations

import builtins

from typing import Any, Iterator, Protocol, Sequence

from .claims import ClaimRequest
from .rates import RateRequest
from .records import (
    AttemptRow, BreakerRow, ChildOutput, ChildState, DefinitionRow, HistoryRow, InstanceFilter, InstanceRecord, OutboxBegin,
    OutboxRow, ReplyRow,
    ReviewItem,
    StepCommit, StepRow, WorkerRow,
)


class Store(Protocol):
    """Durable storage for instances, their history, attempts, outbox, workers and breakers.

    Every method is synchronous and owns its own transaction.  ``commit`` is
    the hot path: it applies a batch of steps in one transaction (group
    commit), each step all-or-nothing, and reports which applied.
    Errors: ``InstanceNotFound`` for unknown ids, ``StoreError`` (or
    ``NotAnFsmDatabase``) when the database is unusable.

    Ownership is leased: an instance's ``owner`` is a worker id, and the
    worker's row (``put_worker``, renewed by ``renew_worker`` while the lease
    holds) says until when its lease holds.  ``claim`` hands runnable instances
    to one worker at a time (concurrent claimers never get the same instance;
    taking one over ends its owner's lease for good, ``store.leases``), ``held``
    is what a heartbeat checks, and ``release`` gives instances back.
    """

    #: Where the data lives, as a URL (``sqlite:///abs/path``, ``postgresql://host/db``;
    #: no password).
    url: str
    #: True when calls wait on a network (PostgreSQL): the runtime then makes its hot-path
    #: calls (group commits, outbox, breakers) from threads so the event loop goes on;
    #: False (SQLite: a local file) keeps them on the loop, where they are cheaper.
    remote: bool

    def create(self, *records: InstanceRecord, history: Sequence[HistoryRow] = ()) -> None:
        """Insert new instances in one transaction (all or none; a duplicate id fails all);
        each record's ``key`` is set to its new integer key (increasing in creation order).
        ``history`` rows (of these new instances, by ``instance_id``) are inserted in the
        same transaction (a fork's copied history)."""

    def get(self, instance_id: str) -> InstanceRecord:
        """The instance; ``InstanceNotFound`` when absent."""

    def list(self, *, statuses: Sequence[str] | None = None,
             machine: str | None = None, owner: str | None = None) -> builtins.list[InstanceRecord]:
        """Instances, oldest first, optionally filtered by status, machine name, owner."""

    def commit(self, steps: Sequence[StepCommit]) -> builtins.list[bool]:
        """Apply each step whose ``expected_version`` matches; True where applied.

        A step's ``review_open`` item is inserted with it (kept as it is when an item
        with that id exists); a step with ``review_close`` applies only when that item
        is still open and, for a claimer, unclaimed or claimed by it (item and step
        both written, or neither).
        A step's ``wake`` is written in its transaction when the step applies.
        A compound step (``StepCommit.compound``) applies with everything it carries —
        ``create``, ``fence``, ``also``, ``wake`` — or not at all (a duplicate id, a
        fenced instance that moved on, an ``also`` step that is stale: False)."""

    def children(self, parent_id: str) -> builtins.list[InstanceRecord]:
        """The instances ``parent_id``'s fan-outs created, in creation order (``[]`` for
        none, also for an unknown id)."""

    def child_states(self, parent_id: str) -> builtins.list[ChildState]:
        """``children(parent_id)`` without their JSON columns (id, version, status, reason,
        branch, tokens used, owner), in creation order: what a join counts on every wake."""

    def child_outputs(self, parent_id: str) -> builtins.list[ChildOutput]:
        """The id, context and input (large values read back) of each of ``parent_id``'s
        children that is final (completed, failed or cancelled), in creation order, and
        nothing else: what a join merges, without decoding whole records."""

    def history(self, instance_id: str) -> builtins.list[HistoryRow]:
        """The instance's history ordered by ``seq``."""

    def attempts(self, instance_id: str) -> builtins.list[AttemptRow]:
        """Failed attempts, oldest first."""

    def outbox_begin(self, key: str, instance_id: str, state: str, visit: int,
                     now: float) -> OutboxRow:
        """Record that a side effect under ``key`` is about to run (attempts += 1)."""

    def outbox_begins(self, begins: Sequence[OutboxBegin]) -> builtins.list[OutboxRow]:
        """``outbox_begin`` for each item, in order, in one transaction; the rows as they
        stand after each (the runtime's batch of side effects starting together)."""

    def outbox(self, instance_id: str | None = None) -> builtins.list[OutboxRow]:
        """Outbox rows, oldest first."""

    def get_reply(self, key: str, not_before: float) -> ReplyRow | None:
        """The stored reply under ``key`` written at or after ``not_before`` (epoch s)."""

    def put_reply(self, row: ReplyRow) -> None:
        """Store (or replace) the reply under ``row.key``."""

    def reviews(self, *, statuses: Sequence[str] | None = None, machine: str | None = None,
                instance_id: str | None = None,
                id_prefix: str | None = None) -> builtins.list[ReviewItem]:
        """Review items, oldest first, filtered by status, machine, instance, id prefix."""

    def claim_review(self, item_id: str, by: str, now: float) -> bool:
        """Compare-and-set: ``by`` claims the open item unless someone else holds it;
        False (nothing written) when it is decided, missing or claimed by another."""

    def claim(self, request: ClaimRequest) -> builtins.list[InstanceRecord]:
        """Make ``request.owner`` the owner of up to ``request.limit`` claimable instances
        (see ``store.claims``), oldest first, in one transaction; return them as stored
        (version bumped).  Instances another claimer is taking at the same moment are
        skipped, not waited for."""

    def held(self, owner: str) -> dict[str, str]:
        """Id -> status of every instance ``owner`` holds (a heartbeat compares it with
        what it runs: an instance missing here was taken over or finished)."""

    def release(self, owner: str, ids: Sequence[str] | None = None) -> int:
        """Give up ``owner``'s instances (only ``ids``, or all): owner cleared, version
        bumped, workers waiting for work woken; returns how many were released."""

    def wait_for_work(self, timeout: float) -> None:
        """Block up to ``timeout`` seconds, returning early when instances may have become
        claimable (created or released); a backend without notifications polls."""

    def put_worker(self, worker: WorkerRow) -> None:
        """Insert (or replace) a worker's row: how a worker registers under a new id.  Its
        heartbeats go through ``renew_worker``."""

    def renew_worker(self, worker: WorkerRow, now: float) -> bool:
        """Renew ``worker.id``'s lease to ``worker.heartbeat_at``/``lease_until`` (and its
        ``queues``) while it holds; True when renewed.  False, nothing written, when the
        stored lease ran out before ``now`` (the renewer's ``time.time()``, the clock a
        claim judges expiry by: ``ClaimRequest.now``), when a takeover ended it, or when
        the row is gone: the worker has lost every instance it held (see
        ``store.leases``; a claim ending the lease and this renewal never both succeed)."""

    def end_lease(self, worker_id: str, now: float, lease_seconds: float) -> bool:
        """End ``worker_id``'s lease for good when it ran out before ``now`` (so no renewal
        succeeds afterwards), before taking one of its instances over outside ``claim``;
        True when the lease is over (also when there is no such row), False while it
        holds (``lease_seconds``: the lease of a row from before format 3)."""

    def workers(self) -> builtins.list[WorkerRow]:
        """Every registered worker."""

    def delete_worker(self, worker_id: str) -> None:
        """Remove a worker that stopped cleanly."""

    def get_breaker(self, name: str) -> BreakerRow:
        """The breaker row (a closed, empty one when absent)."""

    def put_breaker(self, row: BreakerRow, expected_version: int) -> bool:
        """Compare-and-set the breaker row; False when another process changed it first."""

    def rate_acquire(self, request: RateRequest) -> tuple[float, str]:
        """Admit one call under the sliding-window limit ``request.name`` (see
        ``store.rates``) in one transaction serialised per name: ``(0.0, "")`` when
        admitted (its row written), else ``(seconds until it would fit, "requests" or
        "tokens")`` with nothing written."""

    def rate_settle(self, name: str, key: str, tokens: int, until: float) -> None:
        """Record what the admitted call ``key`` really took (tokens) and until when it
        counts (epoch seconds); a call no longer there (expired) is ignored."""

    def get_limits(self) -> dict[str, Any] | None:
        """The fleet's limits as stored (``runtime.fleet.FleetLimits.to_json()``; ``None``:
        none set); ``StoreError`` when the stored value is not a JSON object."""

    def put_limits(self, limits: dict[str, Any] | None) -> None:
        """Replace the fleet's limits with ``limits`` (a JSON object; ``None`` or ``{}``
        removes them), in one transaction."""

    def put_definitions(self, rows: Sequence[DefinitionRow]) -> None:
        """Keep each machine definition's export under its (machine, version, fingerprint),
        in one transaction; a row already stored under that key is kept as it is."""

    def get_definition(self, machine: str, version: int,
                       fingerprint: str) -> DefinitionRow | None:
        """The export stored under that key (None: none, e.g. written before format 11);
        ``StoreError`` when the stored value is not a machine export."""

    # -- read side: the viewer, ``fsm stats`` and ``fsm list`` (filtered and paged by the
    # backend, so 100,000 instances stay fast) and maintenance (``fsm prune``/``fsm check``)
    def query(self, where: InstanceFilter, *, order: str = "created", descending: bool = True,
              limit: int | None = 50, offset: int = 0) -> builtins.list[InstanceRecord]:
        """One page of the instances matching ``where``, sorted by ``order`` (one of
        ``records.ORDERS``; ties in creation order, in the same direction); ``limit``
        None: all.  ``InvalidInput`` for an unknown order."""

    def count(self, where: InstanceFilter, by: str | None = None) -> dict[str | None, int]:
        """How many instances match ``where``: ``{None: n}``, or per value of ``by`` (one
        of ``records.GROUPS``, or ``context.FIELD`` for a top-level context field whose
        values are strings; other values are counted under their JSON text, a missing
        field under None).  ``InvalidInput`` for an unknown ``by``."""

    def steps(self, where: InstanceFilter) -> Iterator[StepRow]:
        """The history rows of the instances matching ``where``, without their JSON
        payloads, ordered by instance (creation order) then ``seq``; read in batches."""

    def delete(self, instance_ids: Sequence[str]) -> int:
        """Delete these instances with their history, attempts and outbox rows in one
        transaction; return how many instances were deleted (unknown ids are skipped)."""

    def check(self) -> builtins.list[str]:
        """Problems found by the backend's own integrity check and by the invariants
        (each instance's history ``seq`` runs 1..``seq`` without gaps, its state equals
        its last history row's ``dest``, no row belongs to a missing instance); one
        line each, ``[]`` when healthy."""

    def close(self) -> None:
        """Release the connection."""
