"""The Store contract on every backend (``fsm_engine.testing.StoreContract``), plus
SQLite-specific file handling.

``backend`` (conftest) parametrises the suite over SQLite and PostgreSQL; a
PostgreSQL run uses the session's throwaway cluster.
"""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path
from typing import Callable, Iterator

import pytest

from dataclasses import replace

from fsm_engine import InstanceNotFound, InvalidInput, NotAnFsmDatabase, SqliteStore, Store, StoreError
from fsm_engine.store import BreakerRow, InstanceFilter, StepCommit, open_store
from fsm_engine.store.records import FORMAT_VERSION
from fsm_engine.testing import StoreContract
from fsm_engine.testing.contract import attempt, hist, moved, record


class TestStoreContract(StoreContract):
    """The whole contract, once per backend."""

    @pytest.fixture
    def store(self, store_url: str) -> Iterator[Store]:
        s = open_store(store_url)
        yield s
        s.close()

    @pytest.fixture
    def reopen(self, store_url: str) -> Callable[[], Store]:
        return lambda: open_store(store_url)


# -- the read side ----------------------------------------------------------------------
def _fleet(store: Store) -> None:
    """Five instances of two machines in several states, with history, attempts and outbox."""
    specs = [("a", "m1", "completed", "done", None, 30, 3, 1000.0, {"src": "model", "n": 1}),
             ("b", "m1", "failed", "failed", "timeout", 10, 2, 1010.0, {"src": "rules", "n": 2}),
             ("c", "m1", "running", "work", None, 50, 1, 1020.0, {"src": "model", "n": 3}),
             ("d", "m2", "completed", "done", None, 0, 1, 1030.0, {"note": "Needle here"}),
             ("e", "m1", "pending", "start", None, 0, 0, 1040.0, {"src": "rules", "n": 5})]
    for iid, machine, status, state, reason, tokens, steps, at, ctx in specs:
        rec = record(iid, machine=machine, at=at)
        rec.context = ctx
        store.create(rec)
        rows, path = [], ["start", "work", "check", state][:steps] + [state]
        for seq in range(1, steps + 1):
            src, dst = path[seq - 1], (path[seq] if seq < steps else state)
            rows.append(hist(iid, seq, src, dst, tokens=tokens // max(steps, 1), duration_ms=2.0 * seq,
                             kind="fallback" if iid == "b" and seq == 2 else "transition",
                             detail={"attempt": 2, "reasks": 1, "llm_calls": [{}, {}]} if seq == 1 else {}))
        new = replace(rec, state=state, status=status, reason=reason, tokens_used=tokens,
                      seq=steps, loop_count=steps, updated_at=at + 100 + steps)
        store.commit([StepCommit(new, 0, rows)])
    store.outbox_begin("a:work:1", "a", "work", 1, 1001.0)
    store.commit([StepCommit(store.get("b"), store.get("b").version, attempt=attempt("b"))])


class TestStoreReadSide:
    """``query``, ``count``, ``steps``, ``delete`` and ``check`` (the read side of the viewer,
    ``fsm stats``/``list``/``prune``/``check``).  SQLite only until the PostgreSQL store
    implements them (they then join ``StoreContract``)."""

    @pytest.fixture
    def store(self, tmp_path: Path) -> Iterator[Store]:
        s = open_store(str(tmp_path / "read.db"))
        yield s
        s.close()

    def test_query_filters_by_each_field(self, store: Store) -> None:
        _fleet(store)
        ids = lambda **kw: sorted(r.id for r in store.query(InstanceFilter(**kw), limit=None))  # noqa: E731
        assert ids() == ["a", "b", "c", "d", "e"]
        assert ids(machine="m2") == ["d"]
        assert ids(statuses=("completed", "failed")) == ["a", "b", "d"]
        assert ids(statuses=()) == []
        assert ids(machine="m1", states=("done", "work")) == ["a", "c"]
        assert ids(reasons=("timeout",)) == ["b"]
        assert ids(text="needle") == ["d"]  # case-insensitive, inside the context
        assert ids(text="%") == [] and ids(text="_") == []  # LIKE wildcards are literal
        assert ids(created_after=1010.0, created_before=1030.0) == ["b", "c"]
        assert ids(updated_after=1130.0) == ["d", "e"]

    def test_query_sorts_and_pages(self, store: Store) -> None:
        _fleet(store)
        page = lambda **kw: [r.id for r in store.query(InstanceFilter(), **kw)]  # noqa: E731
        assert page() == ["e", "d", "c", "b", "a"]  # newest first by default
        assert page(descending=False, limit=2) == ["a", "b"]
        assert page(descending=False, limit=2, offset=2) == ["c", "d"]
        assert page(order="tokens", limit=3) == ["c", "a", "b"]
        assert page(order="tokens", descending=False) == ["d", "e", "b", "a", "c"]  # ties by age
        assert page(order="transitions", limit=1) == ["a"]
        assert page(order="updated", limit=1) == ["e"]
        with pytest.raises(InvalidInput):
            store.query(InstanceFilter(), order="size")

    def test_count_by_group_and_context_field(self, store: Store) -> None:
        _fleet(store)
        assert store.count(InstanceFilter()) == {None: 5}
        assert store.count(InstanceFilter(machine="nope")) == {}
        assert store.count(InstanceFilter(), "status") == \
            {"completed": 2, "failed": 1, "running": 1, "pending": 1}
        assert store.count(InstanceFilter(machine="m1"), "state") == \
            {"done": 1, "failed": 1, "work": 1, "start": 1}
        assert store.count(InstanceFilter(), "reason") == {None: 4, "timeout": 1}
        assert store.count(InstanceFilter(), "machine") == {"m1": 4, "m2": 1}
        assert store.count(InstanceFilter(), "context.src") == {"model": 2, "rules": 2, None: 1}
        assert store.count(InstanceFilter(machine="m1"), "context.n") == \
            {"1": 1, "2": 1, "3": 1, "5": 1}
        for bad in ("context", "context.a.b", "owner; DROP TABLE instances", "context.x'"):
            with pytest.raises(InvalidInput):
                store.count(InstanceFilter(), bad)

    def test_steps_are_history_rows_in_instance_then_seq_order(self, store: Store) -> None:
        _fleet(store)
        rows = list(store.steps(InstanceFilter(machine="m1")))
        assert [(r.instance_id, r.seq) for r in rows] == \
            [("a", 1), ("a", 2), ("a", 3), ("b", 1), ("b", 2), ("c", 1)]
        first = rows[0]
        assert (first.machine, first.status, first.created_at, first.source, first.dest) == \
            ("m1", "completed", 1000.0, "start", "work")
        assert (first.tokens, first.duration_ms, first.attempt, first.reasks, first.llm_calls) == \
            (10, 2.0, 2, 1, 2)
        assert (rows[1].attempt, rows[1].reasks, rows[1].llm_calls) == (1, 0, 0)
        assert rows[4].kind == "fallback" and rows[4].dest == "failed"
        assert list(store.steps(InstanceFilter(statuses=("pending",)))) == []

    def test_delete_removes_every_row_of_the_instances_only(self, store: Store) -> None:
        _fleet(store)
        assert store.delete(["a", "b", "zz", "a"]) == 2
        assert sorted(r.id for r in store.list()) == ["c", "d", "e"]
        for gone in ("a", "b"):
            with pytest.raises(InstanceNotFound):
                store.history(gone)
            assert store.attempts(gone) == [] and store.outbox(gone) == []
        assert [r.seq for r in store.history("c")] == [1]
        assert store.check() == []
        assert store.delete([]) == 0

    def test_check_is_clean_then_finds_a_gap_and_a_state_mismatch(self, store: Store) -> None:
        _fleet(store)
        assert store.check() == []
        gap = store.get("c")  # history 1, then a row numbered 3
        store.commit([StepCommit(replace(gap, seq=3, state="check"), gap.version,
                                 [hist("c", 3, "work", "check")])])
        odd = store.get("d")  # the row says it went to "done", the record says "elsewhere"
        store.commit([StepCommit(replace(odd, state="elsewhere"), odd.version)])
        problems = store.check()
        assert len(problems) == 2, problems
        assert any("instance c" in p and "gap" in p for p in problems)
        assert any("instance d" in p and "'elsewhere'" in p and "'done'" in p for p in problems)


# -- SQLite-specific -----------------------------------------------------------------------
def foreign_sqlite(path: Path) -> bytes:
    """Write a SQLite database with someone else's tables; return its bytes."""
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE customers(id INTEGER PRIMARY KEY, name TEXT)")
    conn.execute("INSERT INTO customers(name) VALUES ('Ada')")
    conn.commit()
    conn.close()
    return path.read_bytes()


class TestSqliteFiles:
    """How ``SqliteStore`` treats the file it is given."""

    def test_text_file_is_not_an_fsm_database_and_is_untouched(self, tmp_path: Path) -> None:
        path = tmp_path / "notes.txt"
        path.write_text("just some notes\n" * 10)
        with pytest.raises(NotAnFsmDatabase) as info:
            SqliteStore(str(path))
        assert str(path) in str(info.value) and "\n" not in str(info.value)
        assert path.read_text() == "just some notes\n" * 10

    def test_sqlite_with_other_tables_is_refused(self, tmp_path: Path) -> None:
        path = tmp_path / "shop.db"
        foreign_sqlite(path)
        with pytest.raises(NotAnFsmDatabase) as info:
            SqliteStore(str(path))
        assert str(path) in str(info.value) and "\n" not in str(info.value)
        conn = sqlite3.connect(path)
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        rows = conn.execute("SELECT name FROM customers").fetchall()
        conn.close()
        assert tables == {"customers"} and rows == [("Ada",)]

    def test_sqlite_with_other_tables_is_not_modified(self, tmp_path: Path) -> None:
        path = tmp_path / "shop.db"
        before = foreign_sqlite(path)
        with pytest.raises(NotAnFsmDatabase):
            SqliteStore(str(path))
        assert path.read_bytes() == before
        assert sorted(os.listdir(tmp_path)) == ["shop.db"]

    def test_corrupt_file_raises_one_line_store_error(self, tmp_path: Path) -> None:
        path = tmp_path / "corrupt.db"
        path.write_bytes(b"SQLite format 3\x00" + bytes(range(256)) * 40)
        with pytest.raises(StoreError) as info:
            SqliteStore(str(path))
        msg = str(info.value)
        assert "\n" not in msg and str(path) in msg

    def test_directory_path_raises_store_error(self, tmp_path: Path) -> None:
        (tmp_path / "adir").mkdir()
        (tmp_path / "adir" / "x").write_text("x")
        with pytest.raises(StoreError) as info:
            SqliteStore(str(tmp_path / "adir"))
        assert "\n" not in str(info.value)

    def test_empty_file_becomes_a_new_database(self, tmp_path: Path) -> None:
        path = tmp_path / "empty.db"
        path.touch()
        s = SqliteStore(str(path))
        s.create(record("a"))
        assert s.get("a").id == "a"
        s.close()

    def test_reopening_keeps_data(self, tmp_path: Path) -> None:
        path = str(tmp_path / "fsm.db")
        s = SqliteStore(path)
        s.create(record("a"))
        s.commit([StepCommit(moved(s.get("a"), "b"), 0, history=[hist("a", 1, "start", "b")])])
        s.put_breaker(BreakerRow("x", state="open"), 0)
        s.close()
        again = SqliteStore(path)
        assert (again.get("a").state, again.get("a").version) == ("b", 1)
        assert [h.dest for h in again.history("a")] == ["b"]
        assert again.get_breaker("x").state == "open"
        again.close()

    def test_wal_mode_is_on(self, tmp_path: Path) -> None:
        path = str(tmp_path / "fsm.db")
        SqliteStore(path).close()
        conn = sqlite3.connect(path)
        mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
        conn.close()
        assert mode == "wal"

    def test_schema_version_is_recorded(self, tmp_path: Path) -> None:
        path = str(tmp_path / "fsm.db")
        SqliteStore(path).close()
        conn = sqlite3.connect(path)
        rows = conn.execute("SELECT key, value FROM fsm_meta").fetchall()
        conn.close()
        assert rows == [("schema_version", str(FORMAT_VERSION))]

    def test_newer_schema_version_is_refused(self, tmp_path: Path) -> None:
        path = str(tmp_path / "fsm.db")
        SqliteStore(path).close()
        conn = sqlite3.connect(path)
        conn.execute("UPDATE fsm_meta SET value=? WHERE key='schema_version'",
                     (str(FORMAT_VERSION + 1),))
        conn.commit()
        conn.close()
        with pytest.raises(StoreError) as info:
            SqliteStore(path)
        assert "upgrade fsm_engine" in str(info.value)


def test_large_history_values_are_stored_once_by_hash(tmp_path):
    """A 200 KiB output written by 3 steps of 2 instances is stored once and read back whole."""
    import sqlite3

    from fsm_engine.store import SqliteStore
    from fsm_engine.store.records import HistoryRow, InstanceRecord, StepCommit

    path = str(tmp_path / "blobs.db")
    store = SqliteStore(path)
    big = "x" * (200 * 1024)
    for iid in ("a", "b"):
        rec = InstanceRecord(id=iid, machine="m", module="m.py", fingerprint="f", state="s",
                             status="running", context={}, input={}, max_transitions=9,
                             token_budget=None, created_at=0.0, updated_at=0.0)
        store.create(rec)
        for seq in (1, 2, 3):
            rec.seq = seq
            row = HistoryRow(instance_id=iid, seq=seq, source="s", dest="s", trigger="t",
                             at=0.0, delta={"raw": big, "n": seq})
            assert store.commit([StepCommit(rec, rec.version, [row])]) == [True]
    rows = store.history("a")
    assert [r.delta for r in rows] == [{"raw": big, "n": n} for n in (1, 2, 3)]
    store.close()
    conn = sqlite3.connect(path)
    assert conn.execute("SELECT COUNT(*) FROM blobs").fetchone()[0] == 1
    stored = conn.execute("SELECT MAX(LENGTH(delta)) FROM history").fetchone()[0]
    assert stored < 200


def test_sqlite_step_with_before_updates_only_the_changed_columns(tmp_path: Path) -> None:
    """The UPDATE a step issues names only the columns that differ (``status`` is indexed)."""
    store = SqliteStore(str(tmp_path / "diff.db"))
    store.create(record("a", status="running"))
    base = store.get("a")
    sql: list[str] = []
    store._conn.set_trace_callback(sql.append)
    store.commit([StepCommit(moved(base, "b", context=dict(base.context)), 0, before=base)])
    store._conn.set_trace_callback(None)
    [update] = [s for s in sql if s.startswith("UPDATE instances")]
    sets = update.split(" SET ")[1].split(" WHERE ")[0]
    assert [part.split("=")[0] for part in sets.split(", ")] == \
        ["state", "updated_at", "seq", "loop_count", "visits", "version"]
    store.close()


def test_sqlite_json_is_compact_utf8_with_escaped_lone_surrogates() -> None:
    """The store's JSON: compact UTF-8; lone surrogates kept as escapes; TypeError for non-JSON."""
    from fsm_engine.store import sqlite as backend

    value = {"é": [1.5, None, True, "\u202e"], "n": {"k": 'say "hi"'}, "e": []}
    assert backend._dumps(value) == '{"é":[1.5,null,true,"\u202e"],"n":{"k":"say \\"hi\\""},"e":[]}'
    assert json.loads(backend._dumps({"f": "bad\udcff.txt"})) == {"f": "bad\udcff.txt"}
    assert backend._dumps({"f": "bad\udcff.txt"}).isascii()
    with pytest.raises(TypeError):
        backend._dumps({"x": object()})
