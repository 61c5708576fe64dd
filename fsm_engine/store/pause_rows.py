"""Format 13's data step, the same on both backends: pause requests move from ``fsm_meta``
into their instance's ``pause_request`` column.

Before format 13 a request was an ``fsm_meta`` row ``pause:ID`` (JSON ``by``, ``reason``,
``at``, ``version``: the version its touch wrote, ``prior_reason``, ``withdrawn``) and its
instance carried the reason ``pause_requested`` instead of its own.  Each such instance
gets its reason back and the request in the column, in the format
``runtime.kinds.pausing`` reads (``base``: the version before the touch); a row whose
instance no longer carries the marker (paused, ended, gone) was spent and is dropped, and
an instance carrying the marker without a row gets its reason back (none was kept), as its
next claim would have done.  Stored values are hostile: a row that is not such an object
is dropped.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, StrictInt, ValidationError

from .details import Text

#: The reason an instance carried while a request was stored in ``fsm_meta``.
OLD_MARKER = "pause_requested"
_PREFIX = "pause:"


class OldRequest(BaseModel):
    """An ``fsm_meta`` row ``pause:ID`` as format 12 wrote it: an object whose ``version``
    is an int; ``by``, ``reason`` and ``at`` are carried over as they are (the new
    request's reader, ``pausing.decode``, judges them), a ``prior_reason`` that is not text
    is none (``details.Lenient``), ``withdrawn`` is only ``true``; other keys are
    ignored.  (Written by an older fsm_engine: its writer is gone, so the shape lives
    here, with its only reader.)"""

    model_config = ConfigDict(frozen=True, extra="ignore")

    version: StrictInt
    by: Any = None
    reason: Any = None
    at: Any = None
    prior_reason: Text = None
    withdrawn: Any = False


def converted(text: str | None) -> tuple[str, str | None] | None:
    """``(the new request's JSON, the reason the instance had)`` of an old request, or None
    when ``text`` is not one (``OldRequest``)."""
    if not text:
        return None
    try:
        old = OldRequest.model_validate_json(text)
    except ValidationError:
        return None
    new = {"by": old.by, "reason": old.reason, "at": old.at, "base": old.version - 1,
           "version": old.version, "withdrawn": old.withdrawn is True}
    return json.dumps(new), old.prior_reason


def move_requests(cur: Any, mark: str) -> None:
    """Move every ``pause:ID`` row of ``fsm_meta`` into ``instances.pause_request`` (inside
    the migration's transaction; ``cur``: a sqlite3 connection or a psycopg cursor, whose
    ``execute`` returns what ``fetchall`` reads; ``mark``: its placeholder)."""
    rows = cur.execute(f"SELECT key, value FROM fsm_meta WHERE substr(key, 1, {len(_PREFIX)})"
                       f" = '{_PREFIX}'").fetchall()
    for key, value in rows:
        new = converted(value)
        if new is not None:
            cur.execute(f"UPDATE instances SET pause_request = {mark}, reason = {mark} "
                        f"WHERE id = {mark} AND reason = '{OLD_MARKER}' AND status IN "
                        "('pending', 'running', 'waiting')",
                        (new[0], new[1], key[len(_PREFIX):]))
    cur.execute(f"UPDATE instances SET reason = NULL WHERE reason = '{OLD_MARKER}' "
                "AND pause_request IS NULL")
    cur.execute(f"DELETE FROM fsm_meta WHERE substr(key, 1, {len(_PREFIX)}) = '{_PREFIX}'")
