"""Machine definitions in the store (format 11): shared SQL of every backend.

One row per (machine, version, fingerprint) holding the definition's plain export
as strict JSON.  ``Store.put_definitions`` writes rows an engine registers (a row
already there is kept: the key fixes its content); ``Store.get_definition`` reads
one back for the viewer, which draws diagrams from it instead of importing the
module an instance names.  The stored export is data like any other row: it is
checked to be a JSON object with a list of states, never executed.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

from pydantic import ConfigDict, TypeAdapter, with_config
from typing_extensions import TypedDict  # (pydantic reads typing.TypedDict from 3.12 on)

from . import stored_json
from .records import DefinitionRow

#: The table (``{real}``: the backend's floating-point type).
TABLE = ("CREATE TABLE definitions (machine TEXT NOT NULL, version INTEGER NOT NULL, "
         "fingerprint TEXT NOT NULL, export TEXT NOT NULL, created_at {real}, "
         "PRIMARY KEY (machine, version, fingerprint))")
#: Statements (``?`` placeholders) both backends run.
PUT = ("INSERT INTO definitions (machine, version, fingerprint, export, created_at) "
       "VALUES (?, ?, ?, ?, ?) ON CONFLICT (machine, version, fingerprint) DO NOTHING")
GET = ("SELECT machine, version, fingerprint, export, created_at FROM definitions "
       "WHERE machine = ? AND version = ? AND fingerprint = ?")


@with_config(ConfigDict(extra="allow"))
class StoredExport(TypedDict):
    """What a stored export must be to be drawn: a JSON object with a list of ``states``
    (written by ``rows``: ``Machine.export()``); the rest of it is kept as it is, for the
    viewer to read (``diagram.model``)."""

    states: list[Any]


_EXPORT: TypeAdapter[StoredExport] = TypeAdapter(StoredExport)


def rows(machines: Iterable[Any], now: float) -> list[DefinitionRow]:
    """The rows to keep for compiled machines (``CompiledMachine.family()``): each one's
    export under (name, version, fingerprint), written at ``now`` (epoch seconds)."""
    return [DefinitionRow(m.name, m.spec.version, m.fingerprint, m.spec.export(), now)
            for m in machines]


def encode(row: DefinitionRow) -> tuple[Any, ...]:
    """``PUT``'s arguments for ``row`` (the export as strict JSON: no NaN or infinity)."""
    return (row.machine, row.version, row.fingerprint,
            json.dumps(row.export, sort_keys=True, allow_nan=False), row.created_at)


def encode_all(rows: Sequence[DefinitionRow]) -> list[tuple[Any, ...]]:
    """``encode`` of each row, one per key (the first wins, as in the table)."""
    seen: dict[tuple[str, int, str], tuple[Any, ...]] = {}
    for row in rows:
        seen.setdefault((row.machine, row.version, row.fingerprint), encode(row))
    return list(seen.values())


def decode(rows: Sequence[Any]) -> DefinitionRow | None:
    """The row ``GET`` found (None: none stored); ``StoreError`` when its export is not a
    JSON object holding a list of states."""
    if not rows:
        return None
    machine, version, fingerprint, text, at = rows[0]
    export = stored_json.read(_EXPORT, text, f"the stored definition of {machine} v{version} is",
                              "a machine export")
    return DefinitionRow(str(machine), int(version), str(fingerprint), dict(export),
                         float(at or 0))
