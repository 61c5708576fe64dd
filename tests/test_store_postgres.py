"""PostgreSQL-specific read side: what ``check`` can see without ``integrity_check``
(invalid indexes, ``amcheck`` when installed) and read-only opening; batched ``steps``
on both backends."""

from __future__ import annotations

import uuid

import psycopg
import pytest

from fsm_engine import StoreError
from fsm_engine.store import InstanceFilter, open_store
from fsm_engine.testing.contract import fleet


def test_check_runs_amcheck_and_reports_an_invalid_index(pg_cluster) -> None:  # noqa: ANN001
    name = "amck_" + uuid.uuid4().hex[:8]
    pg_cluster.sql(f"CREATE DATABASE {name}")
    pg_cluster.sql("CREATE EXTENSION amcheck", dbname=name)
    store = open_store(pg_cluster.url(name))
    try:
        fleet(store)
        assert store.check() == []  # bt_index_check over every index: clean
        with pytest.raises(psycopg.Error):  # four m1 rows: the build fails, the index stays
            pg_cluster.sql("CREATE UNIQUE INDEX CONCURRENTLY idx_broken ON instances (machine)",
                           dbname=name)
        assert store.check() == ["index idx_broken is invalid (rebuild it with REINDEX)"]
    finally:
        store.close()


def test_read_only_open_refuses_an_older_schema_and_changes_nothing(pg_cluster) -> None:  # noqa: ANN001
    url = pg_cluster.database()
    with pytest.raises(StoreError, match="no fsm database"):
        open_store(url, readonly=True)
    open_store(url).close()
    schema = url.rsplit("%3D", 1)[1]
    pg_cluster.sql(f"UPDATE {schema}.fsm_meta SET value = '3' WHERE key = 'schema_version'")
    with pytest.raises(StoreError, match="schema version 3.*read-only"):
        open_store(url, readonly=True)
    assert pg_cluster.sql(f"SELECT value FROM {schema}.fsm_meta") == [("3",)]


@pytest.mark.parametrize("batch", [1, 2, 3])
def test_steps_in_small_batches_are_the_same_rows(store_url: str, batch: int) -> None:
    store = open_store(store_url)
    try:
        fleet(store)
        every = list(store.steps(InstanceFilter()))
        assert len(every) == 7
        assert list(store.steps(InstanceFilter(), batch=batch)) == every  # type: ignore[call-arg]
    finally:
        store.close()
