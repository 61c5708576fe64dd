"""Contract cases for machine definitions kept in the store (format 11; mixed into
``StoreContract``): what the viewer draws instead of importing a row's module; and for
the named values beside them in ``fsm_meta`` (``MetaContract``)."""

from __future__ import annotations

from typing import Any

import pytest

from ..errors import InvalidInput, StoreError
from ..store import DefinitionRow, Store
from .contract_fixtures import concurrently

EXPORT = {"name": "m", "initial": "start", "states": [{"name": "start"}, {"name": "审核"}],
          "transitions": [{"source": "start", "dest": "审核", "trigger": "go"}]}


class DefinitionContract:
    """``put_definitions`` keeps the first export under its key; ``get_definition`` reads
    exactly that key back, and refuses a stored value that is not a machine export."""

    def test_definitions_round_trip_by_name_version_and_fingerprint(self, store: Store) -> None:
        assert store.get_definition("m", 1, "f1") is None
        first = DefinitionRow("m", 1, "f1", EXPORT, 1000.0)
        other = DefinitionRow("m", 2, "f2", {**EXPORT, "initial": "审核"}, 1001.0)
        store.put_definitions([first, other, DefinitionRow("m", 1, "f1", {"states": []}, 5.0)])
        assert store.get_definition("m", 1, "f1") == first  # the first under a key wins
        assert store.get_definition("m", 2, "f2") == other
        assert store.get_definition("m", 1, "f2") is None
        assert store.get_definition("x", 1, "f1") is None
        store.put_definitions([DefinitionRow("m", 1, "f1", {"states": [], "late": 1}, 9.0)])
        assert store.get_definition("m", 1, "f1") == first  # a later write keeps it
        store.put_definitions([])

    def test_a_stored_value_that_is_no_export_is_refused(self, store: Store) -> None:
        store.put_definitions([DefinitionRow("m", 1, "f1", {"states": "not a list"}, 1.0)])
        with pytest.raises(StoreError, match="not a machine export"):
            store.get_definition("m", 1, "f1")


class MetaContract:
    """``get_meta`` / ``put_meta`` / ``add_meta`` / ``meta_prefixed`` on every backend."""

    def test_meta_values_round_trip_replace_and_delete(self, store: Store) -> None:
        assert store.get_meta("pause:a") is None
        store.put_meta("pause:a", '{"by": "ann"}')
        store.put_meta("pause:a", '{"by": "bob"}')
        store.put_meta("pause:b", "x")
        store.put_meta("pausex", "not under the prefix")
        assert store.get_meta("pause:a") == '{"by": "bob"}'
        assert store.meta_prefixed("pause:") == {"pause:a": '{"by": "bob"}', "pause:b": "x"}
        store.put_meta("pause:a", None)
        assert store.get_meta("pause:a") is None
        assert store.meta_prefixed("pause:") == {"pause:b": "x"}

    def test_the_stores_own_keys_are_refused(self, store: Store) -> None:
        for key in ("schema_version", "limits", ""):
            with pytest.raises(InvalidInput):
                store.put_meta(key, "1")
        assert store.get_meta("schema_version") is not None  # untouched

    def test_add_meta_inserts_once_among_concurrent_callers(self, store: Store,
                                                            reopen: Any) -> None:
        won: list[int] = []

        def add(n: int, s: Store) -> None:
            if s.add_meta("used:sig", f"caller {n}"):
                won.append(n)
        concurrently(add, store, [reopen() for _ in range(3)])
        assert len(won) == 1
        assert store.get_meta("used:sig") == f"caller {won[0]}"
        assert store.add_meta("used:sig", "again") is False
