"""Rows the store keeps, as plain dataclasses (JSON-serialisable fields only).

Times are UNIX epoch seconds (float); token counts are integers; ``context``,
``delta`` and ``detail`` are JSON objects.  No pickle anywhere.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, Literal, NamedTuple

if TYPE_CHECKING:
    from .streams import StreamOp

#: An instance's status. ``pending``: created, never stepped; ``running``: owned by a
#: worker or between steps; ``waiting``: needs an external trigger (or a review, a
#: rate limit, its children); ``paused``: stopped by an operator (``Engine.pause``) or by an
#: ``on_exhausted="pause"`` policy, claimed by no worker or resume until ``Engine.unpause``
#: (its timers stopped: the time left is in its ``pause`` history row);
#: ``scheduled``: to start at its ``next_attempt_at`` (a delayed or debounced start);
#: ``completed``/``failed``/``cancelled``: final.
Status = Literal["pending", "running", "waiting", "paused", "scheduled", "completed", "failed",
                 "cancelled"]
PENDING: Final = "pending"
SCHEDULED: Final = "scheduled"
RUNNING: Final = "running"
WAITING: Final = "waiting"
COMPLETED: Final = "completed"
FAILED: Final = "failed"
CANCELLED: Final = "cancelled"
PAUSED: Final = "paused"
FINAL_STATUSES: frozenset[Status] = frozenset({COMPLETED, FAILED, CANCELLED})
STATUSES: tuple[Status, ...] = (PENDING, RUNNING, WAITING, PAUSED, SCHEDULED, COMPLETED, FAILED,
                                CANCELLED)

#: History kind of a takeover: another worker adopted the instance from an owner that died,
#: lost its lease or went away (``runtime.fleet.adoption.takeover_row``).  Not a transition: it counts
#: neither against ``max_transitions`` nor as a step in statistics, diagrams or replay.
RECOVERY = "recovery"
#: History kind of a migration: the instance was upcast to its machine's current version
#: (``runtime.kinds.migration``); like a takeover, a record of the runtime, not a move.
MIGRATION = "migration"
#: History kind of an agent state's journal (``runtime.kinds.agent``): one model turn, one tool
#: call or one approval of a tool call; the instance stays in its state (source = dest).
TOOL = "tool"
#: In-place kinds (source = dest): a pause and its end (``outcome.paused`` / ``unpaused``; ``detail``:
#: ``operator``, the status, reason and timers left), a visit's timers armed (``detail.timers``); and
#: a move, a timer edge's fire (``kinds.timers.fire``; ``detail.timer``: ``due``, ``lateness_s``).
PAUSE, UNPAUSE, ARMED, TIMER = "pause", "unpause", "armed", "timer"
#: History kinds that are not moves: statistics, diagrams and the viewer skip them.
NOT_MOVES = frozenset({RECOVERY, MIGRATION, TOOL, PAUSE, UNPAUSE, ARMED})

#: Version of the stored record format; bumped with a migration.
FORMAT_VERSION = 17

#: Seconds of age one step of priority is worth, and the priorities a start may give (format
#: 14): claims take the lowest ``rank = created_at - priority * AGING_S`` first (the
#: starvation bound: ``runtime.start_options``).
AGING_S, PRIORITY_MIN, PRIORITY_MAX = 60.0, -1000, 1000

#: The queue of a state that names none (``State.queue``).
DEFAULT_QUEUE = "default"
#: ``reason`` of an instance waiting for a provider's rate limit (``next_attempt_at``: when
#: it is claimable again; no retry attempt is spent).
RATE_LIMITED = "rate_limited"


@dataclass(slots=True)
class InstanceRecord:
    """One instance: where it is, what it holds and what it has spent.

    ``seq`` is the number of history rows; ``version`` increments on every
    write and fences concurrent writers (compare-and-set).
    """

    id: str
    machine: str
    module: str
    fingerprint: str
    state: str
    status: Status
    context: dict[str, Any]
    input: dict[str, Any]
    max_transitions: int
    token_budget: int | None
    created_at: float
    updated_at: float
    reason: str | None = None
    last_error: str | None = None
    seq: int = 0
    loop_count: int = 0
    tokens_used: int = 0
    attempt: int = 1
    next_attempt_at: float | None = None
    deadline: float | None = None
    owner: str | None = None
    recoveries: int = 0
    recovered_seq: int = -1
    visits: dict[str, int] = field(default_factory=dict)
    version: int = 0
    #: The store's integer key (creation order), set by ``Store.create``; ``None`` before.
    key: int | None = None
    #: Lineage of a fork: the instance it was forked from and how many of that one's
    #: history rows it copied (``None``: not a fork).
    forked_from: str | None = None
    forked_at_seq: int | None = None
    #: The instance whose fan-out state created this one (``None``: a top-level instance).
    parent_id: str | None = None
    #: This child's branch in its parent's fan-out (a ``Parallel`` branch name, or a ``Map``
    #: item's index as text); ``None`` for a top-level instance.
    branch: str | None = None
    #: The ``Machine.version`` the instance was last written under (with ``fingerprint``);
    #: an older one is upcast when the instance next steps (``runtime.kinds.migration``).
    machine_version: int = 1
    #: How a fork runs (set at creation, ``{}`` for any other instance): ``reuse_llm``
    #: (answer model calls from the original's recorded replies where the prompt is
    #: byte-identical), ``redeliver`` (deliver side effects the original delivered again);
    #: and ``by``, the operator who made it (a name; absent when none was given).
    fork_options: dict[str, Any] = field(default_factory=dict)
    #: The queue of the current state (``State.queue``), set in the commit that moves it:
    #: workers claim by queue, and per-queue limits count the leases of each.
    queue: str = DEFAULT_QUEUE
    #: The partition key given at start (e.g. a tenant id; children inherit it): workers
    #: limit how many instances of one key they hold at once (``None``: no partition).
    partition_key: str | None = None
    #: Context fields stored beside the row (format 9): field name → SHA-256 of the
    #: value's JSON in the store's ``blobs`` (values whose JSON exceeds the store's
    #: ``context_threshold``). ``context`` holds every value in memory; the stored
    #: ``context`` column holds the others, so a step that leaves a large value alone
    #: never rewrites it (keys ``"$input.FIELD"``: large ``input`` values). Maintained
    #: by the store; ``{}`` for small contexts.
    context_refs: dict[str, str] = field(default_factory=dict)
    #: An operator's pause request not applied yet (format 13), as JSON text
    #: (``runtime.kinds.pausing.PauseRequest``): set by the request's own write (its
    #: *touch*, which bumps ``version`` so the holder's running step goes stale), dropped
    #: by the commit that pauses or ends the instance; ``None``: no request.
    pause_request: str | None = None
    #: How it was started (format 14, fixed at creation; ``runtime.start_options``): its
    #: idempotency key (unique per machine), priority, claim ``rank`` (set by the store when
    #: ``None``), debounce key and the latest its start may be pushed back to (epoch s).
    start_key: str | None = None
    priority: int = 0
    rank: float | None = None
    debounce_key: str | None = None
    debounce_until: float | None = None

    @property
    def final(self) -> bool:
        """True when the status is completed, failed or cancelled."""
        return self.status in FINAL_STATUSES

    @property
    def tokens_remaining(self) -> int | None:
        """Tokens left (``None``: no budget)."""
        return None if self.token_budget is None else max(0, self.token_budget - self.tokens_used)


class ChildState(NamedTuple):
    """What a fan-out's join counts of one child (and who runs it), read without its JSON columns
    (``Store.child_states``): cheap enough to read on every wake of a large family."""

    id: str
    version: int
    status: str
    reason: str | None
    branch: str | None
    tokens_used: int
    owner: str | None

    @property
    def final(self) -> bool:
        """True when the status is completed, failed or cancelled."""
        return self.status in FINAL_STATUSES


#: The columns of ``ChildState``, in order (both backends select them).
CHILD_STATE_COLUMNS = ", ".join(ChildState._fields)


class ChildOutput(NamedTuple):
    """What a join merges of one finished child (``Store.child_outputs``): its id and its
    context and input, decoded (large values read back), nothing else."""

    id: str
    context: dict[str, Any]
    input: dict[str, Any]


#: The columns ``Store.child_outputs`` reads (``context_refs`` to resolve large values).
CHILD_OUTPUT_COLUMNS = "id, context, input, context_refs"


@dataclass(slots=True)
class HistoryRow:
    """One transition of one instance; ``seq`` runs 1, 2, 3 … with no gaps.

    ``kind`` is ``transition`` (a declared transition), ``fallback``,
    ``skip``, or a runtime-forced move: ``fail``, ``cancel``, ``loop_limit``,
    ``migration`` (an upcast to a newer machine version: ``detail`` holds
    ``from_version``, ``to_version``, ``renamed`` and ``removed``);
    ``recovery`` (``RECOVERY``) records a takeover by another worker (source = dest);
    ``tool`` (``TOOL``) one model turn, tool call or approval of an agent state
    (source = dest; ``detail.agent`` says which, ``runtime.kinds.agent_journal``).
    ``machine_version`` is the machine version the row was written under.
    ``guards`` lists ``[name, result]`` for each guard evaluated, in order;
    ``delta`` holds the context fields the step changed (the context after
    step *n* is the input with deltas 1..n applied).
    """

    instance_id: str
    seq: int
    source: str
    dest: str
    trigger: str
    at: float
    kind: str = "transition"
    guards: list[list[Any]] = field(default_factory=list)
    duration_ms: float = 0.0
    tokens: int = 0
    error: str | None = None
    reason: str | None = None
    delta: dict[str, Any] = field(default_factory=dict)
    detail: dict[str, Any] = field(default_factory=dict)
    machine_version: int = 1


@dataclass(slots=True)
class AttemptRow:
    """A failed attempt of a state's action, and when the next one is due."""

    instance_id: str
    state: str
    visit: int
    attempt: int
    error_class: str
    error: str
    tokens: int
    next_at: float | None
    at: float


@dataclass(slots=True)
class OutboxRow:
    """A side effect under an idempotency key: ``pending`` until marked ``done``."""

    key: str
    instance_id: str
    state: str
    visit: int
    status: str
    attempts: int
    created_at: float
    updated_at: float
    result: dict[str, Any] | None = None
    last_error: str | None = None


class OutboxBegin(NamedTuple):
    """One ``Store.outbox_begins`` item: a side effect under ``key`` about to run at ``now``."""

    key: str
    instance_id: str
    state: str
    visit: int
    now: float


@dataclass(slots=True)
class WorkerRow:
    """A live or dead runtime process; it holds its instances' leases until ``lease_until``.

    The worker renews ``heartbeat_at`` and ``lease_until`` (both epoch seconds)
    by heartbeat; once ``lease_until`` has passed, any worker may claim the
    instances it owns (``None``: a row from before format 3, whose lease is the
    claimer's ``lease_seconds`` after ``heartbeat_at``).  ``queues`` are the
    queues it takes work from (empty: every queue).
    """

    id: str
    host: str
    pid: int
    pid_start: str
    started_at: float
    heartbeat_at: float
    lease_until: float | None = None
    queues: list[str] = field(default_factory=list)


@dataclass(slots=True)
class BreakerRow:
    """Circuit breaker state for one provider + model, shared by every process.

    ``events`` is a list of ``[time, ok]`` pairs inside the window.
    """

    name: str
    state: str = "closed"
    events: list[list[Any]] = field(default_factory=list)
    opened_at: float | None = None
    probe_at: float | None = None
    version: int = 0


#: Review item statuses: ``open`` until a decision (a person's, or the SLA timer's).
REVIEW_OPEN, REVIEW_DECIDED = "open", "decided"
#: A review item closed undecided: its instance moved on without a decision (cancelled,
#: sent a trigger, cancelled with its family); ``note`` says why (``StepCommit.close_reviews``).
REVIEW_CLOSED = "closed"


@dataclass(slots=True)
class ReviewItem:
    """A decision asked of a person: one per (instance, review state, visit).

    ``id`` is derived from that key (``review_id``); ``show`` holds the shown
    context fields' values when the item opened; ``choices`` the triggers offered;
    ``editable`` the context fields an edit may set; ``due_at`` (epoch seconds) when
    ``on_timeout`` is taken (``None``: no SLA).  A decision sets ``decided_*``,
    ``choice``, ``note`` and ``edit`` (the context fields it changed).
    """

    id: str
    instance_id: str
    machine: str
    state: str
    visit: int
    prompt: str
    show: dict[str, Any]
    choices: list[str]
    editable: list[str]
    created_at: float
    status: str = REVIEW_OPEN
    due_at: float | None = None
    on_timeout: str | None = None
    claimed_by: str | None = None
    claimed_at: float | None = None
    decided_by: str | None = None
    decided_at: float | None = None
    choice: str | None = None
    note: str | None = None
    edit: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class ReviewDecision:
    """What a step writes to close a review item (compare-and-set: the item must still be
    open and, when ``claimer`` is set, unclaimed or claimed by ``claimer``)."""

    item_id: str
    by: str
    at: float
    choice: str
    note: str | None = None
    edit: dict[str, Any] | None = None
    claimer: str | None = None


@dataclass(slots=True)
class ReplyRow:
    """A stored model reply (the reply cache), keyed by a hash of the call."""

    key: str
    provider: str
    model: str
    text: str
    finish_reason: str
    created_at: float


@dataclass(slots=True)
class DefinitionRow:
    """A machine definition's plain export (``Machine.export()``) as the store keeps it
    (format 11), keyed by (``machine``, ``version``, ``fingerprint``): written when an
    engine registers the machine, read by the viewer, which draws from it and never
    imports a module."""

    machine: str
    version: int
    fingerprint: str
    export: dict[str, Any]
    created_at: float


@dataclass(slots=True)
class StepCommit:
    """Everything one step writes, committed all-or-nothing.

    ``record`` is the instance after the step; the write only applies when
    the stored ``version`` still equals ``expected_version``.  ``before`` is
    the record the step started from, when known: a store may then write only
    the columns that differ (``None``: write every mutable column).
    """

    record: InstanceRecord
    expected_version: int
    history: list[HistoryRow] = field(default_factory=list)
    attempt: AttemptRow | None = None
    outbox_done: tuple[str, dict[str, Any]] | None = None
    before: InstanceRecord | None = None
    #: A review item the step opens (inserted unless one with its id exists).
    review_open: ReviewItem | None = None
    #: A review item the step decides; the step applies only if the item's CAS holds.
    review_close: ReviewDecision | None = None
    #: ``(by, note)``: every review item of this instance still open is closed undecided
    #: (``REVIEW_CLOSED``) with this note, when the step applies (a cancel, a send: the
    #: instance leaves its review without a decision).
    close_reviews: tuple[str, str] | None = None
    #: New instances inserted with this step (a fan-out's children; a duplicate id makes
    #: the whole step not apply).
    create: Sequence[InstanceRecord] = ()
    #: ``(instance id, version)`` of other instances this step read: it applies only when
    #: each is still at that version (a join reading its children's final states).
    fence: Sequence[tuple[str, int]] = ()
    #: Steps of other instances applied with this one, all or none (a join cancelling the
    #: children still running).
    also: Sequence[StepCommit] = ()
    #: An instance to wake: if it is ``waiting`` with reason ``children`` it becomes
    #: ``running`` (claimable), version bumped (a child telling its parent it finished).
    wake: str | None = None
    #: Stream-log writes (``store.streams.StreamOp``) applied with the step, when it
    #: applies: the tail of the attempts it streamed (``runtime.streams``), so a short
    #: streamed call costs no transaction of its own.
    stream: Sequence[StreamOp] = ()
    # (``create``, ``fence``, ``also`` and ``stream`` default to ``()``, replaced, never
    # appended to: lists less to allocate and collect per ordinary step)

    @property
    def compound(self) -> bool:
        """True when the step writes other instances' rows that can make it not apply
        (applied in a savepoint); a ``wake`` alone cannot fail, so it rides the plain path."""
        return bool(self.create or self.fence or self.also)


# -- read-side queries (the viewer, ``fsm stats``, ``fsm list``) ------------------------------

#: Sort keys of ``Store.query``: creation order, last update, tokens used, transitions made.
ORDERS = ("created", "updated", "tokens", "transitions", "priority")
#: Columns ``Store.count`` groups by (besides ``context.FIELD``).
GROUPS = ("status", "state", "reason", "machine")


@dataclass(frozen=True, slots=True)
class InstanceFilter:
    """Which instances a read-side query covers; every field that is set must match.

    ``statuses``/``states``/``reasons`` match any of their values (a reason of
    ``None`` is not matched by any value); ``text`` is a case-insensitive
    substring of the instance's id, context JSON or last error; times are
    epoch seconds, ``*_after`` inclusive and ``*_before`` exclusive.
    """

    machine: str | None = None
    statuses: tuple[str, ...] | None = None
    states: tuple[str, ...] | None = None
    reasons: tuple[str, ...] | None = None
    text: str | None = None
    created_after: float | None = None
    created_before: float | None = None
    updated_after: float | None = None
    updated_before: float | None = None
    #: Only forks of this instance id.
    forked_from: str | None = None
    #: Only instances no fan-out created (``parent_id`` is NULL).
    top_level: bool = False
    #: Only this instance and its descendants (children's ids extend their parent's id).
    family: str | None = None


@dataclass(frozen=True, slots=True)
class StepRow:
    """One history row without its JSON payload, for statistics over many instances.

    ``machine``, ``status`` and ``created_at`` are the instance's (its status now; its
    creation is when its first state was entered);
    ``attempt`` is the attempt the row's step ended on (``detail.attempt``,
    else 1); ``reasks`` the structured-output re-asks in it (``detail.reasks``);
    ``llm_calls`` the model calls it made (``len(detail.llm_calls)``); ``tokens`` the
    tokens of the calls made in this step: a join's (or a parent's end's) row carries its
    children's tokens, which ``tokens`` leaves out (``detail.children_tokens``: they are
    counted in the children's own rows).
    """

    instance_id: str
    machine: str
    status: str
    created_at: float
    seq: int
    source: str
    dest: str
    trigger: str
    kind: str
    at: float
    duration_ms: float
    tokens: int
    error: str | None
    reason: str | None
    attempt: int = 1
    reasks: int = 0
    llm_calls: int = 0
