"""The fleet's limits in the store (``runtime.fleet.limits``): shared SQL of every backend.

One JSON object in ``fsm_meta`` under the key ``limits`` (no format change: an older
fsm_engine ignores the row).  ``Store.put_limits`` replaces it in one transaction
(``DROP`` then ``PUT``), ``Store.get_limits`` reads it back (``decode``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from . import stored_json

#: Statements (``?`` placeholders) both backends run.
GET = "SELECT value FROM fsm_meta WHERE key = 'limits'"
DROP = "DELETE FROM fsm_meta WHERE key = 'limits'"
PUT = "INSERT INTO fsm_meta(key, value) VALUES ('limits', ?)"


def encode(limits: dict[str, Any]) -> str:
    """``PUT``'s argument: the limits as strict JSON (no NaN or infinity)."""
    return json.dumps(limits, sort_keys=True, allow_nan=False)


def decode(rows: Sequence[Any]) -> dict[str, Any] | None:
    """The stored limits object from ``GET``'s rows (``None``: none stored);
    ``StoreError`` when the value is not a JSON object (its shape is the runtime's:
    ``runtime.fleet.limits.StoredLimits``)."""
    if not rows:
        return None
    return stored_json.read(stored_json.OBJECT, rows[0][0], "stored fleet limits are")
