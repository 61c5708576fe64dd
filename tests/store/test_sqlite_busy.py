"""A SQLite store waits for another connection's lock itself (``store.sqlite.busy``), not
through SQLite's busy handler, whose sleeps of up to 100 ms (whole seconds in a build
without ``usleep``) made two workers on one file slower than one (bench/timers.py)."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import pytest

from fsm_engine.errors import StoreError
from fsm_engine.store.sqlite import SqliteStore, busy


def _locked() -> sqlite3.OperationalError:
    """The error SQLite gives a ``BEGIN IMMEDIATE`` while another connection writes."""
    exc = sqlite3.OperationalError("database is locked")
    exc.sqlite_errorcode = sqlite3.SQLITE_BUSY  # type: ignore[attr-defined]
    return exc


def test_a_busy_call_is_tried_again_after_short_growing_waits_until_it_succeeds() -> None:
    tries, waits = [], []

    def call() -> str:
        tries.append(1)
        if len(tries) < 8:
            raise _locked()
        return "done"
    assert busy.retry(call, sleep=waits.append) == "done"
    assert len(tries) == 8 and len(waits) == 7
    assert all(0 < w <= busy.CAP_S for w in waits), waits
    assert waits[0] < busy.CAP_S / 4  # the first retry comes soon: a lock is held for ms


def test_a_lock_never_given_up_raises_its_error_after_the_wait_and_other_errors_at_once(
        ) -> None:
    now = [0.0]

    def sleep(s: float) -> None:
        now[0] += s

    def locked() -> None:
        raise _locked()
    with pytest.raises(sqlite3.OperationalError, match="locked"):
        busy.retry(locked, wait_s=1.0, sleep=sleep, clock=lambda: now[0])
    assert 1.0 <= now[0] <= 1.0 + busy.CAP_S

    def broken() -> None:
        raise sqlite3.OperationalError("no such table: x")
    with pytest.raises(sqlite3.OperationalError, match="no such table"):
        busy.retry(broken, sleep=lambda s: pytest.fail("slept on an error that is not busy"))


def test_a_store_write_waits_for_another_connections_lock_and_then_lands(tmp_path: Path) -> None:
    """The store's connection runs without SQLite's handler (``busy_timeout`` 0) and its
    write waits for a lock another process' connection holds, then commits."""
    path = str(tmp_path / "fsm.db")
    store = SqliteStore(path)
    holder = sqlite3.connect(path, isolation_level=None)
    try:
        assert store._conn.execute("PRAGMA busy_timeout").fetchone()[0] == 0  # noqa: SLF001
        holder.execute("BEGIN IMMEDIATE")
        tried = threading.Event()
        real_begin = store.begin

        def begin() -> None:
            tried.set()
            real_begin()
        store.begin = begin  # type: ignore[method-assign]
        done: list[object] = []
        writer = threading.Thread(target=lambda: done.append(store.put_meta("k", "v") or 1))
        writer.start()
        assert tried.wait(30)
        holder.execute("COMMIT")  # given up: the waiting write goes on
        writer.join(30)
        assert not writer.is_alive() and done
        assert store.get_meta("k") == "v"
    finally:
        holder.close()
        store.close()


def test_a_lock_held_past_the_wait_ends_in_a_one_line_store_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = str(tmp_path / "fsm.db")
    store = SqliteStore(path)
    holder = sqlite3.connect(path, isolation_level=None)
    try:
        holder.execute("BEGIN IMMEDIATE")
        monkeypatch.setattr(busy, "WAIT_S", 0.05)
        with pytest.raises(StoreError, match=r"database .*fsm\.db: database is locked$"):
            store.put_meta("k", "v")
        holder.execute("ROLLBACK")
        store.put_meta("k", "v")  # nothing half-written: the store goes on
        assert store.get_meta("k") == "v"
    finally:
        holder.close()
        store.close()
