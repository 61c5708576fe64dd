"""The store interface in facets: one small ``Protocol`` per concern, grouped as the contract
suite groups its tests (``fsm_engine.testing.contract*``); ``store.base.Store`` is their union.

Every method is synchronous and owns its own transaction.  Each method's docstring ends
with a ``Status:`` line: the change it makes to an instance's ``status``
(``records.Status``), one of

- ``pending``   created, never stepped;
- ``running``   owned by a worker, or between steps;
- ``waiting``   needs an external trigger, a review, a rate limit's window or its children;
- ``completed`` / ``failed`` / ``cancelled``: final, never left again.

Errors: ``InstanceNotFound`` for unknown ids, ``StoreError`` (or ``NotAnFsmDatabase``)
when the database is unusable, ``InvalidInput`` for a bad argument where noted.
"""

from __future__ import annotations

import builtins
from collections.abc import Iterator, Sequence
from typing import Any, Protocol

from .claims import ClaimRequest
from .rates import RateRequest
from .records import (
    AttemptRow,
    BreakerRow,
    ChildOutput,
    ChildState,
    DefinitionRow,
    HistoryRow,
    InstanceFilter,
    InstanceRecord,
    OutboxBegin,
    OutboxRow,
    ReplyRow,
    ReviewItem,
    StepCommit,
    StepRow,
    WorkerRow,
)
from .schedules import ScheduleStore  # (its facet lives beside its SQL)
from .streams import StreamOp, StreamRow


class StoreConnection(Protocol):
    """Where the data lives and the connection to it."""

    #: Where the data lives, as a URL (``sqlite:///abs/path``, ``postgresql://host/db``;
    #: no password).
    url: str
    #: True when calls wait on a network (PostgreSQL): the runtime then makes its hot-path
    #: calls (group commits, outbox, breakers) from threads so the event loop goes on;
    #: False (SQLite: a local file) keeps them on the loop, where they are cheaper.
    remote: bool

    def close(self) -> None:
        """Release the connection.

        Status: none changes."""


class InstanceStore(Protocol):
    """Instances and the one write path of a step: ``commit`` (the hot path, a group commit)."""

    def create(self, *records: InstanceRecord, history: Sequence[HistoryRow] = ()) -> None:
        """Insert new instances in one transaction (all or none; a duplicate id fails all);
        each record's ``key`` is set to its new integer key (increasing in creation order);
        ``StartKeyTaken`` (nothing written) when another instance of a record's machine
        holds its ``start_key``.
        ``history`` rows (of these new instances, by ``instance_id``) are inserted in the
        same transaction (a fork's copied history).

        Status: none → each record's own (``pending``; a fork's copy keeps its source's)."""

    def debounce(self, rec: InstanceRecord) -> str:
        """Start ``rec`` (new, ``scheduled``, with a ``debounce_key``; due at its
        ``next_attempt_at``) or fold it into the ``scheduled`` instance of its machine with
        that key: that one's context and input become ``rec``'s, its ``next_attempt_at``
        ``min(rec.next_attempt_at, its debounce_until)``, ``updated_at`` ``rec.created_at``
        (``version`` + 1).  Atomic across processes: at most one scheduled instance per
        machine and key.  Returns the id of the instance holding the burst (``rec.id``
        when inserted: ``rec.key`` is then set).

        Status: none → ``scheduled``, or none changes."""

    def by_start_key(self, machine: str, key: str) -> InstanceRecord | None:
        """The instance of ``machine`` started with ``key`` (``start_key``), or ``None``.

        Status: none changes."""

    def by_debounce_key(self, machine: str, key: str) -> InstanceRecord | None:
        """The ``scheduled`` instance of ``machine`` holding debounce key ``key`` (at most
        one: a partial unique index), or ``None``; one indexed read.

        Status: none changes."""

    def get(self, instance_id: str) -> InstanceRecord:
        """The instance; ``InstanceNotFound`` when absent.

        Status: none changes."""

    def list(self, *, statuses: Sequence[str] | None = None,
             machine: str | None = None, owner: str | None = None) -> builtins.list[InstanceRecord]:
        """Instances, oldest first, optionally filtered by status, machine name, owner.

        Status: none changes."""

    def commit(self, steps: Sequence[StepCommit]) -> builtins.list[bool]:
        """Apply each step whose ``expected_version`` matches; True where applied.

        A step's ``review_open`` item is inserted with it (kept as it is when an item
        with that id exists); a step with ``review_close`` applies only when that item
        is still open and, for a claimer, unclaimed or claimed by it (item and step
        both written, or neither).
        A step's ``wake`` is written in its transaction when the step applies.
        A compound step (``StepCommit.compound``) applies with everything it carries —
        ``create``, ``fence``, ``also``, ``wake`` — or not at all (a duplicate id, a
        fenced instance that moved on, an ``also`` step that is stale: False).

        Status: the stored one → the step's record's (any move but out of a final
        status); a ``wake`` moves a parent ``waiting`` for its children → ``running``
        (claimable); a step that does not apply changes nothing."""

    def children(self, parent_id: str) -> builtins.list[InstanceRecord]:
        """The instances ``parent_id``'s fan-outs created, in creation order (``[]`` for
        none, also for an unknown id).

        Status: none changes."""

    def child_states(self, parent_id: str) -> builtins.list[ChildState]:
        """``children(parent_id)`` without their JSON columns (id, version, status, reason,
        branch, tokens used, owner), in creation order: what a join counts on every wake.

        Status: none changes."""

    def child_outputs(self, parent_id: str) -> builtins.list[ChildOutput]:
        """The id, context and input (large values read back) of each of ``parent_id``'s
        children that is final (completed, failed or cancelled), in creation order, and
        nothing else: what a join merges, without decoding whole records.

        Status: none changes."""


class HistoryStore(Protocol):
    """What happened to an instance: its transitions and its failed attempts (both written
    by ``InstanceStore.commit``)."""

    def history(self, instance_id: str) -> builtins.list[HistoryRow]:
        """The instance's history ordered by ``seq``.

        Status: none changes."""

    def attempts(self, instance_id: str) -> builtins.list[AttemptRow]:
        """Failed attempts, oldest first.

        Status: none changes."""


class OutboxStore(Protocol):
    """Side effects under idempotency keys (marked done by ``InstanceStore.commit``)."""

    def outbox_begin(self, key: str, instance_id: str, state: str, visit: int,
                     now: float) -> OutboxRow:
        """Record that a side effect under ``key`` is about to run (attempts += 1).

        Status: none changes (the outbox row's attempts grow)."""

    def outbox_begins(self, begins: Sequence[OutboxBegin]) -> builtins.list[OutboxRow]:
        """``outbox_begin`` for each item, in order, in one transaction; the rows as they
        stand after each (the runtime's batch of side effects starting together).

        Status: none changes."""

    def outbox(self, instance_id: str | None = None) -> builtins.list[OutboxRow]:
        """Outbox rows, oldest first.

        Status: none changes."""


class ReplyStore(Protocol):
    """Model replies kept by key, so a step that runs again reuses the reply it paid for."""

    def get_reply(self, key: str, not_before: float) -> ReplyRow | None:
        """The stored reply under ``key`` written at or after ``not_before`` (epoch s).

        Status: none changes."""

    def put_reply(self, row: ReplyRow) -> None:
        """Store (or replace) the reply under ``row.key``.

        Status: none changes."""


class ReviewStore(Protocol):
    """Human review items (opened and decided by ``InstanceStore.commit``)."""

    def reviews(self, *, statuses: Sequence[str] | None = None, machine: str | None = None,
                instance_id: str | None = None,
                id_prefix: str | None = None) -> builtins.list[ReviewItem]:
        """Review items, oldest first, filtered by status, machine, instance, id prefix.

        Status: none changes."""

    def claim_review(self, item_id: str, by: str, now: float) -> bool:
        """Compare-and-set: ``by`` claims the open item unless someone else holds it;
        False (nothing written) when it is decided, missing or claimed by another.

        Status: none changes (the instance stays ``waiting``; the item is claimed)."""


class LeaseStore(Protocol):
    """Leased ownership: who runs which instance, and the workers' leases.

    An instance's ``owner`` is a worker id, and the worker's row (``put_worker``, renewed
    by ``renew_worker`` while the lease holds) says until when its lease holds.  ``claim``
    hands runnable instances to one worker at a time (concurrent claimers never get the
    same instance; taking one over ends its owner's lease for good, ``store.leases``),
    ``held`` is what a heartbeat checks, and ``release`` gives instances back.
    """

    def claim(self, request: ClaimRequest) -> builtins.list[InstanceRecord]:
        """Make ``request.owner`` the owner of up to ``request.limit`` claimable instances
        (see ``store.claims``), oldest first, in one transaction; return them as stored
        (version bumped).  Instances another claimer is taking at the same moment are
        skipped, not waited for.

        Status: ``pending`` → ``running``; ``running`` stays; ``waiting`` stays (a
        due timer or a wake: the runner decides), except a rate-limited wait whose
        window came → ``running``."""

    def held(self, owner: str) -> dict[str, str]:
        """Id -> status of every instance ``owner`` holds (a heartbeat compares it with
        what it runs: an instance missing here was taken over or finished).

        Status: none changes."""

    def release(self, owner: str, ids: Sequence[str] | None = None, *, now: float) -> int:
        """Give up ``owner``'s instances (only ``ids``, or all): owner cleared, version
        bumped, ``updated_at`` set to ``now`` (epoch seconds, the releaser's clock: the
        engine's, ``runtime.ledger``), workers waiting for work woken; returns how many
        were released.

        Status: none changes (only the owner)."""

    def next_due(self, now: float, machines: Sequence[str] | None = None) -> float | None:
        """The earliest ``next_attempt_at`` after ``now`` (epoch seconds) of an instance a
        claim skips only because it is not due yet — a timer, review SLA or rate wait of a
        ``waiting`` one, a delayed or debounced start (``scheduled``) — of ``machines``
        (``None``: all); ``None``: none.  An idle worker
        sleeps until then instead of a whole poll (issue 38: timers fire when due, not at
        the next poll).  One read; the waiting term searches ``idx_instances_timers``.

        Status: none changes."""

    def wait_for_work(self, timeout: float) -> None:
        """Block up to ``timeout`` seconds, returning early when instances may have become
        claimable (created or released); a backend without notifications polls.

        Status: none changes."""

    def put_worker(self, worker: WorkerRow) -> None:
        """Insert (or replace) a worker's row: how a worker registers under a new id.  Its
        heartbeats go through ``renew_worker``.

        Status: none changes."""

    def fence(self, now: float, lease_seconds: float) -> int:
        """End the database sessions that workers whose lease ran out before ``now``
        (epoch seconds; ``lease_seconds``: the lease of a row without ``lease_until``)
        left inside a transaction, so the rows they locked can be taken over; how many
        were ended.  Called by every live worker's heartbeat.  PostgreSQL:
        ``store.pg_fence`` (matrix finding M6); SQLite: 0, nothing to end (a writer
        stopped inside a transaction holds the file's write lock until it goes on or
        dies, and other processes meet ``database is locked``).

        Status: none changes."""

    def renew_worker(self, worker: WorkerRow, now: float) -> bool:
        """Renew ``worker.id``'s lease to ``worker.heartbeat_at``/``lease_until`` (and its
        ``queues``) while it holds; True when renewed.  False, nothing written, when the
        stored lease ran out before ``now`` (the renewer's ``time.time()``, the clock a
        claim judges expiry by: ``ClaimRequest.now``), when a takeover ended it, or when
        the row is gone: the worker has lost every instance it held (see
        ``store.leases``; a claim ending the lease and this renewal never both succeed).

        Status: none changes."""

    def end_lease(self, worker_id: str, now: float, lease_seconds: float) -> bool:
        """End ``worker_id``'s lease for good when it ran out before ``now`` (so no renewal
        succeeds afterwards), before taking one of its instances over outside ``claim``;
        True when the lease is over (also when there is no such row), False while it
        holds (``lease_seconds``: the lease of a row from before format 3).

        Status: none changes."""

    def workers(self) -> builtins.list[WorkerRow]:
        """Every registered worker.

        Status: none changes."""

    def delete_worker(self, worker_id: str) -> None:
        """Remove a worker that stopped cleanly.

        Status: none changes (its instances keep their owner until claimed)."""


class LimitStore(Protocol):
    """What the fleet shares: circuit breakers, rate windows and the fleet's limits."""

    def get_breaker(self, name: str) -> BreakerRow:
        """The breaker row (a closed, empty one when absent).

        Status: none changes."""

    def put_breaker(self, row: BreakerRow, expected_version: int) -> bool:
        """Compare-and-set the breaker row; False when another process changed it first.

        Status: none changes."""

    def rate_acquire(self, request: RateRequest) -> tuple[float, str]:
        """Admit one call under the sliding-window limit ``request.name`` (see
        ``store.rates``) in one transaction serialised per name: ``(0.0, "")`` when
        admitted (its row written), else ``(seconds until it would fit, "requests" or
        "tokens")`` with nothing written.

        Status: none changes (a refused call's instance is parked ``waiting`` by its
        own ``commit``)."""

    def rate_settle(self, name: str, key: str, tokens: int, until: float) -> None:
        """Record what the admitted call ``key`` really took (tokens) and until when it
        counts (epoch seconds); a call no longer there (expired) is ignored.

        Status: none changes."""

    def get_limits(self) -> dict[str, Any] | None:
        """The fleet's limits as stored (``runtime.fleet.limits.FleetLimits.to_json()``; ``None``:
        none set); ``StoreError`` when the stored value is not a JSON object.

        Status: none changes."""

    def put_limits(self, limits: dict[str, Any] | None) -> None:
        """Replace the fleet's limits with ``limits`` (a JSON object; ``None`` or ``{}``
        removes them), in one transaction.

        Status: none changes."""


class DefinitionStore(Protocol):
    """The machine definitions instances were started from, kept by key."""

    def put_definitions(self, rows: Sequence[DefinitionRow]) -> None:
        """Keep each machine definition's export under its (machine, version, fingerprint),
        in one transaction; a row already stored under that key is kept as it is.

        Status: none changes."""

    def get_definition(self, machine: str, version: int,
                       fingerprint: str) -> DefinitionRow | None:
        """The export stored under that key (None: none, e.g. written before format 11);
        ``StoreError`` when the stored value is not a machine export.

        Status: none changes."""


class StreamStore(Protocol):
    """Streamed model replies: an append-only log per instance (``store.streams``, format
    12), written by a step while its model call streams, read from any position by any
    process.  These writes are not steps and never touch an instance: ``runtime/ledger.py``
    remains the only writer of steps (the history row keeps the whole reply)."""

    def stream_write(self, ops: Sequence[StreamOp]) -> builtins.list[int]:
        """Apply ``ops`` in one transaction, in order (``streams.StreamOp``): an op that
        opens begins a new attempt of its step — ``superseded`` rows (``by`` it) for every
        attempt of a step in ``[since, seq]`` not superseded yet, its ``open`` row, then its
        rows, stamped with its number (1 + the highest of that step) — and any op appends
        its rows at consecutive positions of its instance's log.  Returns, per op, the
        attempt it opened, else the position of its first row.  The instances need not
        exist (nothing is checked) — except for an op naming an ``owner``: it applies only
        while its instance exists held by that owner, else it writes nothing and gives
        ``streams.FENCED``.  PostgreSQL notifies ``streams.CHANNEL`` with each instance
        id.

        Status: none changes."""

    def stream_read(self, instance_id: str, from_pos: int = 0,
                    limit: int = 500) -> builtins.list[StreamRow]:
        """At most ``limit`` rows of the instance's log from position ``from_pos`` on, in
        order (``[]``: none yet, or an unknown instance), up to a malformed row;
        ``StoreError`` when the first is one (``streams.decode``).

        Status: none changes."""

    def stream_wait(self, instance_id: str, timeout: float) -> None:
        """Return when the instance's log may have grown (PostgreSQL: a NOTIFY; SQLite:
        another connection committed), or after ``timeout`` seconds.

        Status: none changes."""

    def stream_prune(self, before: float) -> int:
        """Delete rows written before ``before`` (epoch seconds) whose step has committed
        (``seq`` <= the instance's) or whose instance is gone; returns how many.

        Status: none changes."""


class MetaStore(Protocol):
    """Small named text values beside the instances (``fsm_meta``): operator requests,
    signing keys, used one-time links.  Keys are 1..200 characters; the store's own
    (``schema_version``, ``limits``) are refused with ``InvalidInput``."""

    def get_meta(self, key: str) -> str | None:
        """The value under ``key`` (``None``: none).  Status: none changes."""

    def meta_prefixed(self, prefix: str) -> dict[str, str]:
        """Every ``key: value`` whose key starts with ``prefix``.  Status: none changes."""

    def put_meta(self, key: str, value: str | None) -> None:
        """Set ``key`` to ``value`` (``None``: delete it), in one transaction.

        Status: none changes."""

    def add_meta(self, key: str, value: str) -> bool:
        """Insert ``key`` unless it exists: True when this call inserted it (exactly one
        of concurrent callers wins).

        Status: none changes."""


class ReadStore(Protocol):
    """The read side — the viewer, ``fsm stats`` and ``fsm list`` (filtered and paged by the
    backend, so 100,000 instances stay fast) — and maintenance (``fsm prune``/``fsm check``)."""

    def query(self, where: InstanceFilter, *, order: str = "created", descending: bool = True,
              limit: int | None = 50, offset: int = 0) -> builtins.list[InstanceRecord]:
        """One page of the instances matching ``where``, sorted by ``order`` (one of
        ``records.ORDERS``; ties in creation order, in the same direction); ``limit``
        None: all.  ``InvalidInput`` for an unknown order.

        Status: none changes."""

    def count(self, where: InstanceFilter, by: str | None = None) -> dict[str | None, int]:
        """How many instances match ``where``: ``{None: n}``, or per value of ``by`` (one
        of ``records.GROUPS``, or ``context.FIELD`` for a top-level context field whose
        values are strings; other values are counted under their JSON text, a missing
        field under None).  ``InvalidInput`` for an unknown ``by``.

        Status: none changes."""

    def steps(self, where: InstanceFilter) -> Iterator[StepRow]:
        """The history rows of the instances matching ``where``, without their JSON
        payloads, ordered by instance (creation order) then ``seq``; read in batches.

        Status: none changes."""

    def delete(self, instance_ids: Sequence[str], *,
               versions: Sequence[int] | None = None) -> int:
        """Delete these instances with their history, attempts, outbox, review and stream
        rows in one transaction; return how many instances were deleted (unknown ids are
        skipped).  ``versions`` (one per id; a prune, ``Ledger.delete``): each only while
        it is still at that version and ended, else skipped (compare-and-set).

        Status: any → none (the instances are gone); with ``versions``: completed, failed
        or cancelled → none."""

    def check(self) -> builtins.list[str]:
        """Problems found by the backend's own integrity check and by the invariants
        (each instance's history ``seq`` runs 1..``seq`` without gaps, its state equals
        its last history row's ``dest``, no row belongs to a missing instance); one
        line each, ``[]`` when healthy.

        Status: none changes."""


#: Every facet, in the order ``Store`` lists them.
FACETS: tuple[type, ...] = (StoreConnection, InstanceStore, HistoryStore, OutboxStore, ReplyStore,
                            ReviewStore, LeaseStore, LimitStore, DefinitionStore, StreamStore,
                            MetaStore, ScheduleStore, ReadStore)

__all__ = ["FACETS", "StoreConnection", "InstanceStore", "HistoryStore", "OutboxStore",
           "ReplyStore", "ReviewStore", "LeaseStore", "LimitStore", "DefinitionStore",
           "StreamStore", "MetaStore", "ScheduleStore", "ReadStore"]
