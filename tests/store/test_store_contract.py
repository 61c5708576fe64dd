"""The Store contract on every backend (``fsm_engine.testing.StoreContract``), plus
SQLite-specific file handling.

``backend`` (conftest) parametrises the suite over SQLite and PostgreSQL; a
PostgreSQL run uses the session's throwaway cluster.
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from fsm_engine import NotAnFsmDatabase, SqliteStore, Store, StoreError
from fsm_engine.store import BreakerRow, StepCommit, open_store
from fsm_engine.store.records import FORMAT_VERSION
from fsm_engine.testing import StoreContract
from fsm_engine.testing.contract import hist, moved, record


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
