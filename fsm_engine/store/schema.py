"""SQLite schema and migrations (through sqlite-utils).

``fsm_meta`` holds ``schema_version``; ``migrate`` applies each missing step
in order inside one transaction.  A database with tables but no
``fsm_meta`` is someone else's: it is refused, never modified.  Reading the
version needs only ``sqlite3``: sqlite-utils is imported when a migration
runs, so opening a current database (``fsm list``) stays light.
"""

from __future__ import annotations

import sqlite3
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import sqlite_utils

from ..errors import NotAnFsmDatabase, StoreError
from .codec import JSON_COLUMNS  # noqa: F401 - re-exported
from .records import FORMAT_VERSION


def _v1(db: sqlite_utils.Database) -> None:
    db.table("instances").create({
        "id": str, "machine": str, "module": str, "fingerprint": str, "state": str,
        "status": str, "context": str, "input": str, "max_transitions": int,
        "token_budget": int, "created_at": float, "updated_at": float, "reason": str,
        "last_error": str, "seq": int, "loop_count": int, "tokens_used": int,
        "attempt": int, "next_attempt_at": float, "deadline": float, "owner": str,
        "recoveries": int, "recovered_seq": int, "visits": str, "version": int,
    }, pk="id", not_null={"machine", "state", "status", "context"})
    db.table("instances").create_index(["status"])
    db.table("history").create({
        "instance_id": str, "seq": int, "source": str, "dest": str, "trigger": str,
        "at": float, "kind": str, "guards": str, "duration_ms": float, "tokens": int,
        "error": str, "reason": str, "delta": str, "detail": str,
    }, pk=("instance_id", "seq"))
    db.table("attempts").create({
        "instance_id": str, "state": str, "visit": int, "attempt": int,
        "error_class": str, "error": str, "tokens": int, "next_at": float, "at": float,
    })
    db.table("attempts").create_index(["instance_id"])
    db.table("outbox").create({
        "key": str, "instance_id": str, "state": str, "visit": int, "status": str,
        "attempts": int, "created_at": float, "updated_at": float, "result": str,
        "last_error": str,
    }, pk="key")
    db.table("workers").create({"id": str, "host": str, "pid": int, "pid_start": str,
                          "started_at": float, "heartbeat_at": float}, pk="id")
    db.table("blobs").create({"hash": str, "data": str}, pk="hash")
    db.table("breakers").create({"name": str, "state": str, "events": str, "opened_at": float,
                           "probe_at": float, "version": int}, pk="name")


_INSTANCE_COLUMNS = (
    "id TEXT NOT NULL UNIQUE", "machine TEXT NOT NULL", "module TEXT", "fingerprint TEXT",
    "state TEXT NOT NULL", "status TEXT NOT NULL", "context TEXT NOT NULL", "input TEXT",
    "max_transitions INTEGER", "token_budget INTEGER", "created_at REAL", "updated_at REAL",
    "reason TEXT", "last_error TEXT", "seq INTEGER", "loop_count INTEGER", "tokens_used INTEGER",
    "attempt INTEGER", "next_attempt_at REAL", "deadline REAL", "owner TEXT",
    "recoveries INTEGER", "recovered_seq INTEGER", "visits TEXT", "version INTEGER")
_HISTORY_COLUMNS = (
    "seq INTEGER NOT NULL", "source TEXT", "dest TEXT", "trigger TEXT", "at REAL", "kind TEXT",
    "guards TEXT", "duration_ms REAL", "tokens INTEGER", "error TEXT", "reason TEXT",
    "delta TEXT", "detail TEXT")


def _names(columns: tuple[str, ...]) -> str:
    return ", ".join(c.split()[0] for c in columns)


def _v2(db: sqlite_utils.Database) -> None:
    """Key instances by an integer (``key``, in creation order) and history by (that key, seq).

    ``history`` becomes one B-tree (WITHOUT ROWID) clustered by instance in
    creation order: the steps of instances started together land on
    neighbouring pages, so a group commit of 500 steps dirties tens of pages
    instead of hundreds (random ``id`` text keys scattered them).  ``id``
    stays the public identifier (unique).  Rows keep their creation order
    (``key`` = the old rowid).
    """
    cols = _names(_INSTANCE_COLUMNS)
    db.execute(f"CREATE TABLE instances_v2 (key INTEGER PRIMARY KEY, "
               f"{', '.join(_INSTANCE_COLUMNS)})")
    db.execute(f"INSERT INTO instances_v2(key, {cols}) SELECT rowid, {cols} FROM instances "
               "ORDER BY rowid")
    db.execute("DROP TABLE instances")
    db.execute("ALTER TABLE instances_v2 RENAME TO instances")
    db.execute('CREATE INDEX "idx_instances_status" ON "instances" ("status")')
    hcols = _names(_HISTORY_COLUMNS)
    db.execute(f"CREATE TABLE history_v2 (instance INTEGER NOT NULL, "
               f"{', '.join(_HISTORY_COLUMNS)}, PRIMARY KEY (instance, seq)) WITHOUT ROWID")
    db.execute(f"INSERT INTO history_v2(instance, {hcols}) SELECT i.key, "
               f"{', '.join('h.' + c for c in hcols.split(', '))} FROM history h "
               "JOIN instances i ON i.id = h.instance_id")
    db.execute("DROP TABLE history")
    db.execute("ALTER TABLE history_v2 RENAME TO history")


def _v3(db: sqlite_utils.Database) -> None:
    """Leases with an expiry the owner sets (``workers.lease_until``), the queues a worker
    serves, and an index to find a worker's instances (claims, heartbeats, release)."""
    db.execute("ALTER TABLE workers ADD COLUMN lease_until REAL")
    db.execute("ALTER TABLE workers ADD COLUMN queues TEXT")
    db.execute('CREATE INDEX "idx_instances_owner" ON "instances" ("owner")')


def _v4(db: sqlite_utils.Database) -> None:
    """Indexes for the read side (viewer, ``fsm stats``/``list``/``prune``): instances by
    (machine, status) — both change rarely, so a step's UPDATE seldom touches it — and
    outbox rows by instance."""
    db.execute('CREATE INDEX "idx_instances_machine_status" ON "instances" ("machine", "status")')
    db.execute('CREATE INDEX "idx_outbox_instance_id" ON "outbox" ("instance_id")')


#: The review queue (format 5), the same table in every backend.
REVIEW_TABLE = """CREATE TABLE review_items (
    id TEXT PRIMARY KEY, instance_id TEXT NOT NULL, machine TEXT, state TEXT, visit INTEGER,
    prompt TEXT, show TEXT, choices TEXT, editable TEXT, created_at {real},
    status TEXT NOT NULL, due_at {real}, on_timeout TEXT, claimed_by TEXT,
    claimed_at {real}, decided_by TEXT, decided_at {real}, choice TEXT, note TEXT,
    edit TEXT)"""
REPLIES = ("CREATE TABLE replies (key TEXT PRIMARY KEY, provider TEXT, model TEXT, text TEXT, "
           "finish_reason TEXT, created_at {real})")
LINEAGE = ("ALTER TABLE instances ADD COLUMN forked_from TEXT",
           "ALTER TABLE instances ADD COLUMN forked_at_seq INTEGER",
           "CREATE INDEX idx_instances_forked_from ON instances (forked_from)")
REVIEW_INDEXES = (
    "CREATE INDEX idx_review_items_status ON review_items (status, machine, created_at)",
    "CREATE INDEX idx_review_items_instance_id ON review_items (instance_id)")


def _v5(db: sqlite_utils.Database) -> None:
    """The review queue (one item per (instance, review state, visit)) and the lineage of
    forked instances, and the reply cache."""
    for sql in LINEAGE:
        db.execute(sql)
    db.execute(REPLIES.format(real="REAL"))
    db.execute(REVIEW_TABLE.format(real="REAL"))
    for sql in REVIEW_INDEXES:
        db.execute(sql)


def _v6(db: sqlite_utils.Database) -> None:
    """Families: an instance created by a fan-out state records its parent and branch, and
    its parent finds its children by index."""
    db.execute("ALTER TABLE instances ADD COLUMN parent_id TEXT")
    db.execute("ALTER TABLE instances ADD COLUMN branch TEXT")
    db.execute('CREATE INDEX "idx_instances_parent_id" ON "instances" ("parent_id")')


#: Format 7: the machine version an instance and each history row were written under, and
#: how a fork runs (``reuse_llm``, ``redeliver``: a JSON object).
MACHINE_VERSION = ("ALTER TABLE instances ADD COLUMN machine_version INTEGER NOT NULL DEFAULT 1",
                   "ALTER TABLE history ADD COLUMN machine_version INTEGER NOT NULL DEFAULT 1",
                   "ALTER TABLE instances ADD COLUMN fork_options TEXT NOT NULL DEFAULT '{}'")


def _v7(db: sqlite_utils.Database) -> None:
    """Machine versions (rows written before format 7 were all written under version 1) and
    fork options."""
    for sql in MACHINE_VERSION:
        db.execute(sql)


#: Format 8, the same in every backend: the queue of an instance's current state and its
#: partition key (both indexed), and the calls each rate limit admitted (``rate_calls``:
#: a sliding window per limit ``name``; ``until`` is when a call stops counting).
QUEUES = (
    "ALTER TABLE instances ADD COLUMN queue TEXT NOT NULL DEFAULT 'default'",
    "ALTER TABLE instances ADD COLUMN partition_key TEXT",
    "CREATE INDEX idx_instances_queue ON instances (queue, status)",
    "CREATE INDEX idx_instances_partition_key ON instances (partition_key)",
    "CREATE TABLE rate_calls (name TEXT NOT NULL, key TEXT NOT NULL, at {real}, "
    "until {real}, tokens BIGINT, PRIMARY KEY (name, key))",
    "CREATE INDEX idx_rate_calls_until ON rate_calls (name, until)")


def _v8(db: sqlite_utils.Database) -> None:
    """Queues, partitions and rate limits (``QUEUES``)."""
    for sql in QUEUES:
        db.execute(sql.format(real="REAL"))


#: Format 9: large context values beside the instance row (``InstanceRecord.context_refs``).
CONTEXT_REFS = "ALTER TABLE instances ADD COLUMN context_refs TEXT NOT NULL DEFAULT '{}'"


def _v9(db: sqlite_utils.Database) -> None:
    """Large context values live in ``blobs`` (by SHA-256), named in ``context_refs``: a
    step that leaves them alone rewrites only the small rest of the row."""
    db.execute(CONTEXT_REFS)


def _v10(db: sqlite_utils.Database) -> None:
    """Nothing for SQLite: format 10 leaves room in PostgreSQL's instance pages
    (``pg_schema._v10``); SQLite rewrites a row in place."""


def _v11(db: sqlite_utils.Database) -> None:
    """Format 11: machine definitions' exports (``store.definitions``), drawn by the viewer
    instead of importing the module a row names."""
    from .definitions import TABLE
    db.execute(TABLE.format(real="REAL"))


def _v12(db: sqlite_utils.Database) -> None:
    """Format 12: streamed model replies, an append-only log per instance
    (``store.streams``)."""
    from .streams import TABLE
    db.execute(TABLE.format(real="REAL"))


#: Format 13: an operator's pause request is a column of its instance (it was an
#: ``fsm_meta`` row ``pause:ID``, written apart from its touch: issue 37).
PAUSE_REQUEST = "ALTER TABLE instances ADD COLUMN pause_request TEXT"


def _v13(db: sqlite_utils.Database) -> None:
    """Format 13: pause requests move from ``fsm_meta`` into ``instances.pause_request``
    (``store.pause_rows``)."""
    from .pause_rows import move_requests
    db.execute(PAUSE_REQUEST)
    move_requests(db.conn, "?")


#: Format 14, the same in every backend (``runtime.start_options``): how an instance was
#: started.  ``start_key`` is unique per machine (the index refuses a second start with a
#: key, not a read before the write); at most one ``scheduled`` instance per machine and
#: ``debounce_key`` (a partial unique index); ``rank`` orders every claim (priority, then
#: age: ``records.AGING_S``), rows written before get their ``created_at``.  Both unique
#: indexes are partial, so a plain start and a step pay for neither.  SQLite reads a
#: claim's rows through the status and timer indexes (``claims.where``) and sorts them by
#: rank (an index on rank cost W1 ~14 % CPU per transition: every start and every end of an
#: instance wrote it); PostgreSQL's claim begins with ``LIVE`` and walks its partial
#: ``PG_RANK`` index in claim order (its steps stay HOT: status is indexed already).
LIVE = "status IN ('pending', 'running', 'waiting', 'scheduled')"
START_OPTIONS = (
    "ALTER TABLE instances ADD COLUMN start_key TEXT",
    "ALTER TABLE instances ADD COLUMN priority INTEGER NOT NULL DEFAULT 0",
    "ALTER TABLE instances ADD COLUMN rank {real}",
    "ALTER TABLE instances ADD COLUMN debounce_key TEXT",
    "ALTER TABLE instances ADD COLUMN debounce_until {real}",
    "UPDATE instances SET rank = COALESCE(created_at, 0)",
    "CREATE UNIQUE INDEX idx_instances_start_key ON instances (machine, start_key) "
    "WHERE start_key IS NOT NULL",
    "CREATE UNIQUE INDEX idx_instances_debounce ON instances (machine, debounce_key) "
    "WHERE status = 'scheduled' AND debounce_key IS NOT NULL")
#: PostgreSQL's claim-order index (format 14).
PG_RANK = f"CREATE INDEX idx_instances_rank ON instances (rank) WHERE {LIVE}"


def _v14(db: sqlite_utils.Database) -> None:
    """Format 14: idempotency keys, priorities, the claim order and debounced starts
    (``START_OPTIONS``); status ``scheduled`` needs no column (``next_attempt_at`` is its
    due time)."""
    for sql in START_OPTIONS:
        db.execute(sql.format(real="REAL"))


def _v15(db: sqlite_utils.Database) -> None:
    """Format 15: stored schedules (``store.schedules``), fired by every ``fsm worker``
    (issue 38)."""
    from .schedules import INDEX, TABLE
    db.execute(TABLE.format(real="REAL"))
    db.execute(INDEX)



#: Format 16 (issue 38): waiting instances by due time, for the claim's waiting term
#: (``status = 'waiting' AND next_attempt_at <= ?``: timer edges, review SLAs, rate waits):
#: 10,000 instances waiting on timers cost one index search per poll, not a scan of every
#: waiting row.  Partial: a step of a running instance never touches it.
TIMERS_INDEX_16 = ("CREATE INDEX IF NOT EXISTS idx_instances_timers ON instances "
                   "(status, next_attempt_at) WHERE status = 'waiting'")


def _v16(db: sqlite_utils.Database) -> None:
    """Format 16: the partial index of waiting instances by due time (``TIMERS_INDEX_16``;
    PostgreSQL has had its own since its format 5)."""
    db.execute(TIMERS_INDEX_16)


#: Format 17 (issue 38): the same partial index, covering the columns a claim's waiting arm
#: reads (``claims.by_arm``: rank, machine, owner, queue), so that a burst of due timers is
#: ranked from the index alone: 10,000 due, a claim of 32 went from 3.9 to 1.6 ms (it read
#: each due row from the table to test its owner and machine).  Still partial: a step of a
#: running instance never touches it.
TIMERS_INDEX = ("CREATE INDEX idx_instances_timers ON instances "
                "(status, next_attempt_at, rank, machine, owner, queue) WHERE status = 'waiting'")


def _v17(db: sqlite_utils.Database) -> None:
    """Format 17: ``idx_instances_timers`` covering the claim's waiting arm
    (``TIMERS_INDEX``; nothing for PostgreSQL, which walks its rank index)."""
    db.execute("DROP INDEX IF EXISTS idx_instances_timers")
    db.execute(TIMERS_INDEX)


MIGRATIONS = [_v1, _v2, _v3, _v4, _v5, _v6, _v7, _v8, _v9, _v10, _v11, _v12, _v13, _v14, _v15,
              _v16, _v17]
assert len(MIGRATIONS) == FORMAT_VERSION


def _version(conn: sqlite3.Connection, path: str) -> int:
    names = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    if "fsm_meta" not in names:
        if names:
            raise NotAnFsmDatabase(f"{path} is not an fsm database (it has other tables)")
        return 0
    row = conn.execute("SELECT value FROM fsm_meta WHERE key='schema_version'").fetchone()
    value = str(row[0]) if row else ""
    if not value.isdigit():  # a missing, negative or non-integer version: not ours to touch
        raise NotAnFsmDatabase(f"{path} has an unreadable fsm schema version ({value or 'none'!s})")
    return int(value)


def read_version(conn: sqlite3.Connection, path: str) -> int:
    """The schema version of the database (0: empty); ``NotAnFsmDatabase`` for a foreign one."""
    return _version(conn, path)


def refuse_foreign(conn: sqlite3.Connection, path: str) -> None:
    """Raise ``NotAnFsmDatabase`` for a SQLite file holding someone else's tables."""
    _version(conn, path)


def migrate(conn: sqlite3.Connection, path: str) -> None:
    """Bring the schema to ``FORMAT_VERSION``; refuse foreign or newer databases."""
    version = _version(conn, path)
    if version > FORMAT_VERSION:
        raise StoreError(f"{path} has schema version {version}; this fsm_engine reads "
                         f"up to {FORMAT_VERSION}: upgrade fsm_engine")
    if version == FORMAT_VERSION:
        return
    import sqlite_utils
    db = sqlite_utils.Database(conn)
    conn.execute("BEGIN IMMEDIATE")
    try:
        current = _version(conn, path)  # again, under the write lock
        if current == 0:
            db.table("fsm_meta").create({"key": str, "value": str}, pk="key")
        for step in MIGRATIONS[current:]:
            step(db)
        conn.execute("INSERT OR REPLACE INTO fsm_meta(key, value) VALUES ('schema_version', ?)",
                     (str(FORMAT_VERSION),))
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
