"""pytest fixtures running a suite on every store backend (``pytest_plugins = [...]``).

- ``backend``: ``"sqlite"`` or ``"postgres"`` (a parametrised fixture: each test
  using it, directly or through ``store_url``, runs once per backend);
- ``store_url``: a fresh, empty store of that backend, as a URL (a SQLite file in
  ``tmp_path``, or a new schema on the session's PostgreSQL cluster);
- ``engine_factory``: ``make(**engine_kwargs)`` -> an ``Engine`` on ``store_url``,
  closed at the end of the test;
- ``pg_cluster``: the session's throwaway ``PostgresCluster``;
- ``--fsm-coverage MODULE`` (``coverage_plugin``): the session's coverage of a machine.

Without PostgreSQL server binaries the PostgreSQL cases are skipped with the
reason, except under CI (``CI=true``), where they fail: a CI run that skipped
them proved nothing about PostgreSQL.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from .coverage_plugin import (  # noqa: F401 - hooks of this plugin
    pytest_addoption,
    pytest_configure,
    pytest_sessionfinish,
    pytest_terminal_summary,
    pytest_unconfigure,
)
from .postgres import PostgresCluster, bin_dir

BACKENDS = ("sqlite", "postgres")


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[PostgresCluster]:
    """One PostgreSQL server for the whole session (stopped and deleted at its end; one
    per xdist worker), ``fsync`` off: no test crashes the server itself, and a restart
    test's ``pg_ctl restart -m fast`` is a clean shutdown."""
    if bin_dir() is None:
        why = ("PostgreSQL server binaries not found (/usr/lib/postgresql/*/bin): "
               "apt-get install postgresql")
        if _in_ci():
            pytest.fail(why + " — required in CI")
        pytest.skip(why)
    try:
        import psycopg  # noqa: F401
    except ImportError:
        why = "psycopg is not installed: pip install 'fsm_engine[postgres]'"
        if _in_ci():
            pytest.fail(why + " — required in CI")
        pytest.skip(why)
    cluster = PostgresCluster(durable=False).start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    """Each store backend in turn."""
    return str(request.param)


@pytest.fixture
def store_url(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    """A fresh, empty store of ``backend`` as a URL."""
    if backend == "postgres":
        cluster: PostgresCluster = request.getfixturevalue("pg_cluster")
        return cluster.database()
    return str(tmp_path / "fsm.db")


@pytest.fixture
def engine_factory(store_url: str) -> Iterator[Callable[..., Any]]:
    """``make(**kwargs)``: an ``Engine`` on ``store_url`` (closed after the test)."""
    from ..runtime import Engine
    made: list[Any] = []

    def make(**kwargs: Any) -> Any:
        engine = Engine(store_url, **kwargs)
        made.append(engine)
        return engine
    yield make
    for engine in made:
        try:
            engine.close()
        except Exception:  # noqa: BLE001 - already closed by the test
            pass
