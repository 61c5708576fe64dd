"""The store's JSON (``store.codec.dumps``) and how the SQLite backend binds NULL: values as
before, at less cost (issue 20's hot path)."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys

import pytest

from fsm_engine.store.codec import dumps


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf"),
                                   {"a": [1, {"b": float("nan")}]}, [0.5, float("inf")]])
def test_dumps_refuses_a_non_finite_float_at_any_depth(value: object) -> None:
    with pytest.raises(ValueError):
        dumps(value)


@pytest.mark.parametrize("value", [{"x": "NaN"}, ["Infinity", "-Infinity"], {"NaN": 1.5},
                                   {"t": "caf\u00e9 NaN \U0001f600"}, {"s": "\ud800"}])
def test_dumps_keeps_text_that_only_spells_nan_or_infinity(value: object) -> None:
    text = dumps(value)
    assert isinstance(text, str) and json.loads(text) == value


def test_the_sqlite_backend_binds_none_through_an_identity_adapter(tmp_path) -> None:
    from fsm_engine.store.sqlite import SqliteStore  # (registers it on import)
    adapt = sqlite3.adapters[(type(None), sqlite3.PrepareProtocol)]
    assert adapt(None) is None
    conn = sqlite3.connect(tmp_path / "x.db")
    conn.execute("CREATE TABLE t(a, b)")
    conn.execute("INSERT INTO t VALUES (?, ?)", (None, 1))
    assert conn.execute("SELECT a IS NULL, typeof(a), b FROM t").fetchone() == (1, "null", 1)
    conn.close()
    store = SqliteStore(str(tmp_path / "s.db"))
    assert store.list() == []
    store.close()


def test_an_adapter_for_none_registered_before_the_store_is_kept() -> None:
    code = ("import sqlite3\n"
            "mine = lambda v: 'mine'\n"
            "sqlite3.register_adapter(type(None), mine)\n"
            "import fsm_engine.store.sqlite\n"
            "print(sqlite3.adapters[(type(None), sqlite3.PrepareProtocol)] is mine)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "True"
