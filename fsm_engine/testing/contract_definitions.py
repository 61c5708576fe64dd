"""Contract cases for machine definitions kept in the store (format 11; mixed into
``StoreContract``): what the viewer draws instead of importing a row's module."""

from __future__ import annotations

import pytest

from ..errors import StoreError
from ..store import DefinitionRow, Store

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
