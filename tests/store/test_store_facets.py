"""The store interface as small facets (#20 step 5): ``Store`` is their union, each facet
documents the status change each method makes, and ``open_store`` picks a backend from a
scheme registry (a third backend is one registration)."""

from __future__ import annotations

import inspect
import typing

import pytest

from fsm_engine.errors import StoreError
from fsm_engine.store import Store, open_store
from fsm_engine.store.sqlite import SqliteStore


def _methods(cls: type) -> set[str]:
    return {n for n, v in vars(cls).items() if callable(v) and not n.startswith("_")}


def test_store_is_the_union_of_its_facets() -> None:
    from fsm_engine.store.facets import FACETS
    assert len(FACETS) >= 8
    seen: set[str] = set()
    for facet in FACETS:
        assert getattr(facet, "_is_protocol", False), facet
        own = _methods(facet)
        assert own and not own & seen, (facet, own & seen)
        seen |= own
        assert facet in Store.__mro__
    every = {n for n in dir(Store) if not n.startswith("_") and callable(getattr(Store, n))}
    assert seen == every
    assert typing.get_type_hints(Store).keys() >= {"url", "remote"}


def test_each_facet_method_says_which_status_change_it_makes() -> None:
    from fsm_engine.store.facets import FACETS
    for facet in FACETS:
        assert inspect.getdoc(facet), facet
        for name in _methods(facet):
            doc = inspect.getdoc(getattr(facet, name)) or ""
            assert "Status:" in doc, f"{facet.__name__}.{name}"


def test_both_backends_implement_every_facet() -> None:
    from fsm_engine.store.facets import FACETS
    from fsm_engine.store.postgres import PostgresStore
    for facet in FACETS:
        for name in _methods(facet):
            assert callable(getattr(SqliteStore, name)), name
            assert callable(getattr(PostgresStore, name)), name


def test_a_third_backend_is_one_registration(tmp_path) -> None:
    from fsm_engine.store import backends
    opened: list[tuple[str, bool, bool]] = []

    def opener(url: str, *, create: bool, synchronous: str, readonly: bool) -> Store:
        opened.append((url, create, readonly))
        return SqliteStore(str(tmp_path / "third.db"))

    backends.register("third", opener)
    try:
        store = open_store("third://somewhere/db", readonly=False)
        store.close()
        assert opened == [("third://somewhere/db", True, False)]
    finally:
        backends.unregister("third")
    with pytest.raises(StoreError, match=r"^cannot open database third://somewhere/db"):
        open_store("third://somewhere/db")  # unregistered: a plain path again, as before


@pytest.mark.parametrize("url, message", [
    ("sqlite:rel.db", "bad SQLite URL 'sqlite:rel.db': write sqlite:///relative.db or "
                      "sqlite:////absolute.db"),
    ("sqlite://host/x.db", "bad SQLite URL 'sqlite://host/x.db': write sqlite:///relative.db or "
                           "sqlite:////absolute.db"),
])
def test_bad_urls_keep_their_one_line_errors(url: str, message: str) -> None:
    with pytest.raises(StoreError) as caught:
        open_store(url)
    assert str(caught.value) == message


def test_a_missing_file_is_refused_without_create(tmp_path) -> None:
    path = tmp_path / "none.db"
    with pytest.raises(StoreError) as caught:
        open_store(str(path), create=False)
    assert str(caught.value) == f"no database at {path} (run `fsm run` first, or pass --db)"
    assert not path.exists()


def test_schemes_registered_are_sqlite_and_postgres() -> None:
    from fsm_engine.store import backends
    assert {"sqlite", "postgresql", "postgres"} <= set(backends.schemes())
