"""Schema migrations: a database written by an older fsm_engine opens with its data intact."""

from __future__ import annotations

import hashlib
import json
import sqlite3
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from format13 import UNDO_14, UNDO_16_SQLITE, undo_14

from fsm_engine import SqliteStore, StoreError
from fsm_engine.runtime.fleet.adoption import claim_request
from fsm_engine.store import HistoryRow, StepCommit
from fsm_engine.store.records import FORMAT_VERSION

#: The schema as fsm_engine wrote it at format version 1 (``sqlite_master.sql``, verbatim).
V1_DDL = [
    'CREATE TABLE "fsm_meta" (\n   "key" TEXT PRIMARY KEY,\n   "value" TEXT\n)',
    ('CREATE TABLE "instances" (\n   "id" TEXT PRIMARY KEY,\n   "machine" TEXT NOT NULL,\n'
     '   "module" TEXT,\n   "fingerprint" TEXT,\n   "state" TEXT NOT NULL,\n'
     '   "status" TEXT NOT NULL,\n   "context" TEXT NOT NULL,\n   "input" TEXT,\n'
     '   "max_transitions" INTEGER,\n   "token_budget" INTEGER,\n   "created_at" REAL,\n'
     '   "updated_at" REAL,\n   "reason" TEXT,\n   "last_error" TEXT,\n   "seq" INTEGER,\n'
     '   "loop_count" INTEGER,\n   "tokens_used" INTEGER,\n   "attempt" INTEGER,\n'
     '   "next_attempt_at" REAL,\n   "deadline" REAL,\n   "owner" TEXT,\n'
     '   "recoveries" INTEGER,\n   "recovered_seq" INTEGER,\n   "visits" TEXT,\n'
     '   "version" INTEGER\n)'),
    'CREATE INDEX "idx_instances_status"\n    ON "instances" ("status")',
    ('CREATE TABLE "history" (\n   "instance_id" TEXT,\n   "seq" INTEGER,\n   "source" TEXT,\n'
     '   "dest" TEXT,\n   "trigger" TEXT,\n   "at" REAL,\n   "kind" TEXT,\n   "guards" TEXT,\n'
     '   "duration_ms" REAL,\n   "tokens" INTEGER,\n   "error" TEXT,\n   "reason" TEXT,\n'
     '   "delta" TEXT,\n   "detail" TEXT,\n   PRIMARY KEY ("instance_id", "seq")\n)'),
    ('CREATE TABLE "attempts" (\n   "instance_id" TEXT,\n   "state" TEXT,\n   "visit" INTEGER,\n'
     '   "attempt" INTEGER,\n   "error_class" TEXT,\n   "error" TEXT,\n   "tokens" INTEGER,\n'
     '   "next_at" REAL,\n   "at" REAL\n)'),
    'CREATE INDEX "idx_attempts_instance_id"\n    ON "attempts" ("instance_id")',
    ('CREATE TABLE "outbox" (\n   "key" TEXT PRIMARY KEY,\n   "instance_id" TEXT,\n'
     '   "state" TEXT,\n   "visit" INTEGER,\n   "status" TEXT,\n   "attempts" INTEGER,\n'
     '   "created_at" REAL,\n   "updated_at" REAL,\n   "result" TEXT,\n   "last_error" TEXT\n)'),
    ('CREATE TABLE "workers" (\n   "id" TEXT PRIMARY KEY,\n   "host" TEXT,\n   "pid" INTEGER,\n'
     '   "pid_start" TEXT,\n   "started_at" REAL,\n   "heartbeat_at" REAL\n)'),
    'CREATE TABLE "blobs" (\n   "hash" TEXT PRIMARY KEY,\n   "data" TEXT\n)',
    ('CREATE TABLE "breakers" (\n   "name" TEXT PRIMARY KEY,\n   "state" TEXT,\n'
     '   "events" TEXT,\n   "opened_at" REAL,\n   "probe_at" REAL,\n   "version" INTEGER\n)'),
]

BIG = "y" * 100_000
BIG_HASH = hashlib.sha256(json.dumps(BIG).encode()).hexdigest()

#: (instance_id, seq, source, dest, trigger, at, kind, guards, duration_ms, tokens, error,
#:  reason, delta, detail) as version 1 stored them; a's second delta references a blob.
V1_HISTORY = [
    ("a", 1, "start", "draft", "go", 1001.0, "transition", '[["ready",true]]', 1.5, 10, None,
     None, '{"n":1}', '{}'),
    ("a", 2, "draft", "review", "next", 1002.0, "transition", "[]", 2.5, 0, None, None,
     json.dumps({"text": {"$blob": BIG_HASH}}), '{"note":"審"}'),
    ("b", 1, "start", "failed", "fail", 1003.0, "fail", "[]", 0.0, 0, "ServerError: 502",
     "retries", "{}", "{}"),
]


def _instance(iid: str, state: str, status: str, seq: int, context: str) -> tuple[object, ...]:
    return (iid, "m", "/x/m.py", "0123456789abcdef", state, status, context, '{"n":0}', 10,
            500, 1000.0, 1000.0 + seq, None, None, seq, seq, 10 * seq, 1, None, None, None, 0,
            -1, json.dumps({state: 1}), seq)


def write_v1(path: Path) -> None:
    """A format-1 database with two instances, their history and one blob."""
    conn = sqlite3.connect(path)
    for ddl in V1_DDL:
        conn.execute(ddl)
    conn.execute("INSERT INTO fsm_meta VALUES ('schema_version', '1')")
    conn.executemany(f"INSERT INTO instances VALUES ({','.join('?' * 25)})",
                     [_instance("a", "review", "running", 2, '{"n":1}'),
                      _instance("b", "failed", "failed", 1, '{"n":0}')])
    conn.executemany(f"INSERT INTO history VALUES ({','.join('?' * 14)})", V1_HISTORY)
    conn.execute("INSERT INTO blobs VALUES (?, ?)", (BIG_HASH, json.dumps(BIG)))
    conn.commit()
    conn.close()


def _sql(path: Path, query: str, args: Sequence[object] = ()) -> list[tuple[object, ...]]:
    conn = sqlite3.connect(path)
    try:
        return conn.execute(query, args).fetchall()
    finally:
        conn.close()


def test_v1_database_is_migrated_with_its_data_intact(tmp_path: Path) -> None:
    path = tmp_path / "v1.db"
    write_v1(path)
    store = SqliteStore(str(path))
    a, b = store.get("a"), store.get("b")
    assert (a.state, a.status, a.seq, a.context, a.visits, a.version) == \
        ("review", "running", 2, {"n": 1}, {"review": 1}, 2)
    assert (b.state, b.status, b.tokens_used) == ("failed", "failed", 10)
    rows = store.history("a") + store.history("b")
    assert [(h.instance_id, h.seq, h.source, h.dest, h.kind, h.error) for h in rows] == \
        [(r[0], r[1], r[2], r[3], r[6], r[10]) for r in V1_HISTORY]
    assert rows[0].guards == [["ready", True]] and rows[0].delta == {"n": 1}
    assert rows[1].delta == {"text": BIG} and rows[1].detail == {"note": "審"}
    assert [i.id for i in store.list(statuses=["running"])] == ["a"]
    store.close()
    [(ddl,)] = _sql(path, "SELECT sql FROM sqlite_master WHERE name='history'")
    assert "WITHOUT ROWID" in ddl and "PRIMARY KEY (instance, seq)" in ddl
    # instances keep their creation order as integer keys; history rows point at those keys
    assert _sql(path, "SELECT key, id FROM instances ORDER BY key") == [(1, "a"), (2, "b")]
    assert _sql(path, "SELECT instance, seq FROM history ORDER BY instance, seq") == \
        [(1, 1), (1, 2), (2, 1)]
    assert _sql(path, "SELECT value FROM fsm_meta WHERE key='schema_version'") == \
        [(str(FORMAT_VERSION),)] == [("17",)]
    names = {r[0] for r in _sql(path, "SELECT name FROM sqlite_master")}
    assert "history_v2" not in names and "sqlite_autoindex_history_1" not in names
    assert {"idx_instances_status", "idx_attempts_instance_id", "idx_instances_owner",
            "idx_instances_machine_status", "idx_outbox_instance_id",
            "idx_instances_parent_id", "idx_instances_queue", "idx_instances_partition_key",
            "rate_calls", "definitions", "stream_rows"} <= names
    # format 8: an old instance is in the default queue, in no partition
    assert (a.queue, a.partition_key) == ("default", None)
    # format 5: families (an old instance is top-level: no parent, no branch)
    assert (a.parent_id, a.branch) == (None, None)
    # format 7: everything stored before machine versions was written under version 1
    assert a.machine_version == 1 and {h.machine_version for h in rows} == {1}
    assert a.fork_options == {}
    # format 9: no value of an old row lives beside it
    assert a.context_refs == {} and b.context_refs == {}
    # format 3: workers carry their lease's expiry and their queues
    assert [r[1] for r in _sql(path, "PRAGMA table_info(workers)")][-2:] == ["lease_until", "queues"]


def test_a_migrated_instance_moves_a_large_value_beside_its_row(tmp_path: Path) -> None:
    path = tmp_path / "v1.db"
    write_v1(path)
    store = SqliteStore(str(path))
    rec = store.get("a")
    new = HistoryRow(instance_id="a", seq=3, source="review", dest="review", trigger="ok",
                     at=1004.0)
    after = replace(rec, seq=3, context={**rec.context, "text": BIG * 2})
    assert store.commit([StepCommit(after, rec.version, [new], before=rec)]) == [True]
    assert store.get("a").context == {"n": 1, "text": BIG * 2}
    store.close()
    [(text, refs)] = _sql(path, "SELECT context, context_refs FROM instances WHERE id='a'")
    assert json.loads(text) == {"n": 1} and list(json.loads(refs)) == ["text"]


def test_v2_worker_rows_read_back_with_no_lease_and_no_queues(tmp_path: Path) -> None:
    path = tmp_path / "v1.db"
    write_v1(path)
    conn = sqlite3.connect(path)
    conn.execute("INSERT INTO workers VALUES ('w', 'h', 1, '9', 1.0, 2.0)")
    conn.commit()
    conn.close()
    store = SqliteStore(str(path))
    [w] = store.workers()
    assert (w.id, w.heartbeat_at, w.lease_until, w.queues) == ("w", 2.0, None, [])
    store.close()


def test_migrated_history_takes_new_steps_and_keeps_its_key(tmp_path: Path) -> None:
    path = tmp_path / "v1.db"
    write_v1(path)
    store = SqliteStore(str(path))
    rec = store.get("a")
    new = HistoryRow(instance_id="a", seq=3, source="review", dest="done", trigger="ok",
                     at=1004.0)
    assert store.commit([StepCommit(rec, rec.version, [new])]) == [True]
    assert [h.seq for h in store.history("a")] == [1, 2, 3]
    rec = store.get("a")
    with pytest.raises(StoreError):  # (instance, seq) is the primary key
        store.commit([StepCommit(rec, rec.version, [new])])
    store.close()


def test_fresh_database_has_the_current_shape(tmp_path: Path) -> None:
    path = tmp_path / "new.db"
    SqliteStore(str(path)).close()
    [(ddl,)] = _sql(path, "SELECT sql FROM sqlite_master WHERE name='history'")
    assert "WITHOUT ROWID" in ddl and "PRIMARY KEY (instance, seq)" in ddl
    [(ddl,)] = _sql(path, "SELECT sql FROM sqlite_master WHERE name='instances'")
    assert "key INTEGER PRIMARY KEY" in ddl and "id TEXT NOT NULL UNIQUE" in ddl


def test_format_6_postgres_rows_read_back_under_machine_version_1(pg_cluster) -> None:  # noqa: ANN001
    from fsm_engine import open_store
    from fsm_engine.testing.contract import hist, moved, record
    url = pg_cluster.database()
    store = open_store(url)
    store.create(record("a"))
    store.commit([StepCommit(moved(store.get("a"), "b"), 0, history=[hist("a", 1, "start", "b")])])
    store.close()
    schema = url.rsplit("%3D", 1)[1]  # back to format 6: what formats 7, 8 and 9 added dropped
    pg_cluster.sql(f"{_DROP_V9.format(schema=schema)}; {_DROP_V8.format(schema=schema)}; "
                   f"ALTER TABLE {schema}.instances DROP COLUMN machine_version; "
                   f"ALTER TABLE {schema}.history DROP COLUMN machine_version; "
                   f"ALTER TABLE {schema}.instances DROP COLUMN fork_options; "
                   f"UPDATE {schema}.fsm_meta SET value = '6'")
    store = open_store(url)
    try:
        rec = store.get("a")
        assert (rec.state, rec.seq, rec.machine_version, rec.fork_options) == ("b", 1, 1, {})
        assert [h.machine_version for h in store.history("a")] == [1]
    finally:
        store.close()
    assert pg_cluster.sql(f"SELECT value FROM {schema}.fsm_meta") == [(str(FORMAT_VERSION),)]


#: Undo format 9 on PostgreSQL (large context values beside the row): a format 8 database
#: (and format 11's definitions, 12's stream rows and 14's start options, which a format 10
#: database has not).
_DROP_V9 = ("; ".join(undo_14("{schema}.")) + "; "
            "DROP TABLE {schema}.definitions; DROP TABLE {schema}.stream_rows; "
            "ALTER TABLE {schema}.instances DROP COLUMN context_refs; "
            "ALTER TABLE {schema}.instances DROP COLUMN pause_request")
#: Undo format 8 on PostgreSQL (queues, partitions, rate limits): a format 7 database.
_DROP_V8 = ("ALTER TABLE {schema}.instances DROP COLUMN queue; "
            "ALTER TABLE {schema}.instances DROP COLUMN partition_key; "
            "DROP TABLE {schema}.rate_calls")


def test_format_7_postgres_rows_read_back_in_the_default_queue(pg_cluster) -> None:  # noqa: ANN001
    from fsm_engine import open_store
    from fsm_engine.testing.contract import record
    url = pg_cluster.database()
    store = open_store(url)
    store.create(record("a"))
    store.close()
    schema = url.rsplit("%3D", 1)[1]
    pg_cluster.sql(f"{_DROP_V9.format(schema=schema)}; {_DROP_V8.format(schema=schema)}; "
                   f"UPDATE {schema}.fsm_meta SET value = '7'")
    store = open_store(url)
    try:
        rec = store.get("a")
        assert (rec.queue, rec.partition_key) == ("default", None)
        got = store.claim(claim_request("w", 1.0, queues=["default"], queue_limit=5,
                                       partition_limit=1))
        assert [r.id for r in got] == ["a"]
    finally:
        store.close()
    assert pg_cluster.sql(f"SELECT value FROM {schema}.fsm_meta") == [(str(FORMAT_VERSION),)]


def test_postgres_format_8_is_migrated_with_its_rows_intact(pg_cluster) -> None:  # noqa: ANN001
    from fsm_engine.store import open_store
    from fsm_engine.testing.contract import record
    url = pg_cluster.database()
    store = open_store(url)
    store.create(record("a"))
    store.close()
    schema = url.rsplit("%3D", 1)[1]  # back to format 8's shape, as an 8 would have left it
    pg_cluster.sql(_DROP_V9.format(schema=schema))
    pg_cluster.sql(f"UPDATE {schema}.fsm_meta SET value = '8' WHERE key = 'schema_version'")
    store = open_store(url)
    try:
        rec = store.get("a")
        assert (rec.context, rec.context_refs) == ({"n": 0, "s": "x"}, {})
        after = replace(rec, seq=1, context={**rec.context, "s": BIG})
        assert store.commit([StepCommit(after, rec.version, before=rec)]) == [True]
        assert store.get("a").context["s"] == BIG and list(after.context_refs) == ["s"]
    finally:
        store.close()
    assert pg_cluster.sql(f"SELECT value FROM {schema}.fsm_meta "
                          "WHERE key = 'schema_version'") == [(str(FORMAT_VERSION),)]


def test_postgres_format_9_is_migrated_to_half_filled_instance_pages(pg_cluster) -> None:  # noqa: ANN001
    from fsm_engine.store import open_store
    from fsm_engine.store.pg_schema import FILLFACTOR
    from fsm_engine.testing.contract import record
    url = pg_cluster.database()
    schema = url.rsplit("%3D", 1)[1]
    options = f"SELECT reloptions FROM pg_class WHERE oid = '{schema}.instances'::regclass"
    store = open_store(url)
    store.create(record("a"))
    store.close()
    assert pg_cluster.sql(options) == [([f"fillfactor={FILLFACTOR}"],)]  # a new database
    pg_cluster.sql(f"ALTER TABLE {schema}.instances RESET (fillfactor)")  # as format 9 left it
    pg_cluster.sql(f"DROP TABLE {schema}.definitions")
    pg_cluster.sql(f"DROP TABLE {schema}.stream_rows")
    pg_cluster.sql(f"ALTER TABLE {schema}.instances DROP COLUMN pause_request")
    pg_cluster.sql("; ".join(undo_14(f"{schema}.")))
    pg_cluster.sql(f"UPDATE {schema}.fsm_meta SET value = '9' WHERE key = 'schema_version'")
    store = open_store(url)
    try:
        rec = store.get("a")
        after = replace(rec, seq=1, state="b")
        assert store.commit([StepCommit(after, rec.version, before=rec)]) == [True]
        assert store.get("a").state == "b"
    finally:
        store.close()
    assert pg_cluster.sql(options) == [([f"fillfactor={FILLFACTOR}"],)]
    assert pg_cluster.sql(f"SELECT value FROM {schema}.fsm_meta "
                          "WHERE key = 'schema_version'") == [(str(FORMAT_VERSION),)]


#: A format 12 database's pause requests (issue 37): ``a`` asked (its reason kept in the
#: request), ``b`` carrying the marker with its row lost, ``c`` paused since (its row
#: spent), and a row of an instance gone.
_V12_PAUSES = (
    *UNDO_14,
    "ALTER TABLE {t}instances DROP COLUMN pause_request",
    "UPDATE {t}instances SET reason = 'pause_requested', version = 3 WHERE id IN ('a', 'b')",
    "UPDATE {t}instances SET status = 'paused', reason = 'hold' WHERE id = 'c'",
    "INSERT INTO {t}fsm_meta VALUES ('pause:a', '{{\"by\": \"ann\", \"reason\": \"hold\", "
    "\"at\": 5.0, \"version\": 3, \"prior_reason\": \"rate_limited\", "
    "\"withdrawn\": false}}')",
    "INSERT INTO {t}fsm_meta VALUES ('pause:c', '{{\"version\": 1}}')",
    "INSERT INTO {t}fsm_meta VALUES ('pause:gone', '[]')",
    "UPDATE {t}fsm_meta SET value = '12' WHERE key = 'schema_version'")


def _v12_pauses_moved(store: Any) -> None:
    from fsm_engine.runtime.kinds import pausing
    a, b, c = (store.get(i) for i in "abc")
    assert (a.reason, b.reason, b.pause_request, c.reason, c.pause_request) == (
        "rate_limited", None, None, "hold", None)
    assert pausing.decode(a.pause_request) == pausing.PauseRequest("ann", "hold", 5.0, 2, 3)
    assert store.meta_prefixed("pause:") == {}


def _v12_store(create: Callable[[], Any]) -> None:
    from fsm_engine.testing.contract import record
    store = create()
    store.create(record("a"), record("b"), record("c"))
    store.close()


def test_sqlite_format_12_pause_requests_move_into_their_instances(tmp_path: Path) -> None:
    path = tmp_path / "v12.db"
    _v12_store(lambda: SqliteStore(str(path)))
    conn = sqlite3.connect(path)
    for sql in (*UNDO_16_SQLITE, *_V12_PAUSES):
        conn.execute(sql.format(t=""))
    conn.commit()
    conn.close()
    store = SqliteStore(str(path))
    try:
        _v12_pauses_moved(store)
    finally:
        store.close()


def test_postgres_format_12_pause_requests_move_into_their_instances(pg_cluster) -> None:  # noqa: ANN001
    from fsm_engine.store import open_store
    url = pg_cluster.database()
    schema = url.rsplit("%3D", 1)[1]
    _v12_store(lambda: open_store(url))
    pg_cluster.sql("; ".join(sql.format(t=f"{schema}.") for sql in _V12_PAUSES))
    store = open_store(url)
    try:
        _v12_pauses_moved(store)
    finally:
        store.close()


def _v13_store(create: Callable[[], Any]) -> None:
    from fsm_engine.testing.contract import record
    store = create()
    old, new = record("old"), record("new")
    old.created_at, new.created_at = 100.0, 200.0
    store.create(old, new)
    store.close()


def _v14_columns_work(store: Any) -> None:
    """A format 13 database migrated: its rows claim in creation order (``rank`` their
    ``created_at``, priority 0), and the start key and debounce indexes hold."""
    from fsm_engine.errors import StartKeyTaken
    from fsm_engine.testing.contract import record
    old = store.get("old")
    assert (old.priority, old.rank, old.start_key, old.debounce_key) == (0, 100.0, None, None)
    urgent = record("urgent", machine="m")
    urgent.created_at, urgent.priority, urgent.start_key = 250.0, 1, "k"
    store.create(urgent)  # rank 250 - 60 = 190: ahead of "new" (200), behind "old" (100)
    twin = record("twin", machine="m")
    twin.start_key = "k"
    with pytest.raises(StartKeyTaken):
        store.create(twin)
    claimed = store.claim(claim_request(owner="w", now=1000.0, limit=3))
    assert [r.id for r in claimed] == ["old", "urgent", "new"]


def test_sqlite_format_13_is_migrated_to_start_options(tmp_path: Path) -> None:
    path = tmp_path / "v13.db"
    _v13_store(lambda: SqliteStore(str(path)))
    conn = sqlite3.connect(path)
    for sql in [*undo_14(), "UPDATE fsm_meta SET value = '13' WHERE key = 'schema_version'"]:
        conn.execute(sql)
    conn.commit()
    conn.close()
    store = SqliteStore(str(path))
    try:
        _v14_columns_work(store)
    finally:
        store.close()


def test_postgres_format_13_is_migrated_to_start_options(pg_cluster) -> None:  # noqa: ANN001
    from fsm_engine.store import open_store
    url = pg_cluster.database()
    schema = url.rsplit("%3D", 1)[1]
    _v13_store(lambda: open_store(url))
    pg_cluster.sql("; ".join([*undo_14(f"{schema}."), f"UPDATE {schema}.fsm_meta SET "
                              "value = '13' WHERE key = 'schema_version'"]))
    store = open_store(url)
    try:
        _v14_columns_work(store)
    finally:
        store.close()
    assert pg_cluster.sql(f"SELECT value FROM {schema}.fsm_meta "
                          "WHERE key = 'schema_version'") == [(str(FORMAT_VERSION),)]


def test_sqlite_format_16_claims_due_timers_through_an_index(tmp_path: Path) -> None:
    """Format 16 (issue 38): the claim's waiting term (``status = 'waiting' AND
    next_attempt_at <= ?``) searches ``idx_instances_timers``, not every waiting row."""
    from fsm_engine.store.claims import select, where
    path = tmp_path / "v15.db"
    SqliteStore(str(path)).close()
    conn = sqlite3.connect(path)
    conn.execute("DROP INDEX idx_instances_timers")
    conn.execute("UPDATE fsm_meta SET value = '15' WHERE key = 'schema_version'")
    conn.commit()
    conn.close()
    SqliteStore(str(path)).close()  # migrated to 16
    cond, args = where(claim_request(owner="w", now=100.0))
    plan = _sql(path, "EXPLAIN QUERY PLAN " + select(("id",)).replace("?", "100.0") +
                cond.replace("?", "100.0") + " ORDER BY i.key LIMIT 10")
    assert any("idx_instances_timers (status=? AND next_attempt_at<?)" in str(row[-1])
               for row in plan), plan
    assert _sql(path, "SELECT value FROM fsm_meta WHERE key='schema_version'") == [("17",)]


def test_sqlite_format_17_ranks_due_timers_from_the_index_alone(tmp_path: Path) -> None:
    """Format 17 (issue 38): a format-16 file's ``idx_instances_timers`` (status, due time)
    is rebuilt covering what a claim's waiting arm reads (``claims.by_arm``), so the arm
    is answered by the index alone; the waiting rows stay claimable across the rebuild."""
    from fsm_engine.store.claims import by_arm, where
    from fsm_engine.store.schema import TIMERS_INDEX_16
    path = tmp_path / "v16.db"
    SqliteStore(str(path)).close()
    conn = sqlite3.connect(path)
    conn.execute("DROP INDEX idx_instances_timers")
    conn.execute(TIMERS_INDEX_16)
    conn.execute("UPDATE fsm_meta SET value = '16' WHERE key = 'schema_version'")
    conn.commit()
    conn.close()
    SqliteStore(str(path)).close()  # migrated to 17
    cond, args = where(claim_request(owner="w", now=100.0, machines=["m"]))
    arms, arm_args = by_arm(cond, args)
    plan = _sql(path, "EXPLAIN QUERY PLAN " + arms, arm_args)
    assert any("COVERING INDEX idx_instances_timers (status=? AND next_attempt_at<?)"
               in str(row[-1]) for row in plan), plan
    assert _sql(path, "SELECT value FROM fsm_meta WHERE key='schema_version'") == [("17",)]


def _fresh(code: str) -> str:
    """What ``code`` prints in a fresh interpreter (its stderr on failure)."""
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_databases_created_by_threads_at_once_all_open(tmp_path) -> None:
    """Four threads each create a database at the same moment (each migration imports
    sqlite-utils): every one opens (a half-imported sqlite-utils seen by a second thread
    raised AttributeError in a change that was reverted)."""
    assert _fresh(
        "import os, threading\n"
        "from fsm_engine import SqliteStore\n"
        "errs, gate = [], threading.Barrier(4)\n"
        "def one(n):\n"
        "    gate.wait()\n"
        "    try:\n"
        f"        SqliteStore(os.path.join({str(tmp_path)!r}, f'{{n}}.db')).close()\n"
        "    except BaseException as exc:\n"
        "        errs.append(repr(exc))\n"
        "ts = [threading.Thread(target=one, args=(n,)) for n in range(4)]\n"
        "[t.start() for t in ts]; [t.join() for t in ts]\n"
        "print(errs)\n") == "[]"


def test_sqlite_utils_still_stores_numpy_values_after_a_database_was_created(tmp_path) -> None:
    """The engine's migrations leave sqlite-utils as the application would have it: with
    numpy installed (it comes with llama-cpp-python), a table of its values still gets
    their column types (refused numpy at the migration's import, sqlite-utils raised
    ``KeyError`` for them: a reverted change)."""
    pytest.importorskip("numpy")
    assert _fresh(
        "import os\n"
        "from fsm_engine import SqliteStore\n"
        f"SqliteStore(os.path.join({str(tmp_path)!r}, 'a.db')).close()\n"
        "import numpy, sqlite_utils\n"
        f"db = sqlite_utils.Database(os.path.join({str(tmp_path)!r}, 'user.db'))\n"
        "db['t'].insert({'x': numpy.int64(3), 'y': numpy.float32(1.5)})\n"
        "print(db['t'].columns_dict)\n") == "{'x': <class 'int'>, 'y': <class 'float'>}"


def _v14_schedules_added(store: Any) -> None:
    from fsm_engine.store.schedules import ScheduleRow
    assert store.get("old").state == "start" and store.schedules() == []
    row = ScheduleRow("nightly", "m.py", "m", "0 6 * * *", None, "UTC", {}, "skip", "none",
                      False, 1.0, 2.0)
    assert store.add_schedule(row) and store.get_schedule("nightly") == row


def test_sqlite_format_14_is_migrated_to_store_schedules(tmp_path: Path) -> None:
    path = tmp_path / "v14.db"
    _v13_store(lambda: SqliteStore(str(path)))
    conn = sqlite3.connect(path)
    conn.execute("DROP TABLE schedules")  # as format 14 left it
    conn.execute("UPDATE fsm_meta SET value = '14' WHERE key = 'schema_version'")
    conn.commit()
    conn.close()
    store = SqliteStore(str(path))
    try:
        _v14_schedules_added(store)
    finally:
        store.close()
    assert _sql(path, "SELECT value FROM fsm_meta WHERE key='schema_version'") == \
        [(str(FORMAT_VERSION),)]


def test_postgres_format_14_is_migrated_to_store_schedules(pg_cluster) -> None:  # noqa: ANN001
    from fsm_engine.store import open_store
    url = pg_cluster.database()
    schema = url.rsplit("%3D", 1)[1]
    _v13_store(lambda: open_store(url))
    pg_cluster.sql(f"DROP TABLE {schema}.schedules; UPDATE {schema}.fsm_meta SET value = '14' "
                   "WHERE key = 'schema_version'")
    store = open_store(url)
    try:
        _v14_schedules_added(store)
    finally:
        store.close()
    assert pg_cluster.sql(f"SELECT value FROM {schema}.fsm_meta "
                          "WHERE key = 'schema_version'") == [(str(FORMAT_VERSION),)]
