"""Small named values in ``fsm_meta`` (``Store.get_meta`` / ``put_meta`` / ``add_meta``):
shared SQL of every backend.

The table exists in every store (it holds ``schema_version`` and ``limits``), so these
values need no format change: the review-link signing key (``review_link_key``) and the
links already used (``review_link_used:SIG``).  No instance state lives here (a pause
request is a column of its instance since format 13: it is written with its instance's
version, ``tests/runtime/test_ledger.py``).  The store's own keys are refused here.
"""

from __future__ import annotations

from ..errors import InvalidInput

#: Keys the store keeps for itself: never written through the meta facet.
RESERVED = frozenset({"schema_version", "limits"})
#: Longest key, longest value (characters).
MAX_KEY, MAX_VALUE = 200, 65_536

#: Statements (``?`` placeholders) both backends run.
GET = "SELECT value FROM fsm_meta WHERE key = ?"
PREFIX = "SELECT key, value FROM fsm_meta WHERE key >= ? AND key < ? ORDER BY key"
DROP = "DELETE FROM fsm_meta WHERE key = ?"
ADD = "INSERT INTO fsm_meta(key, value) VALUES (?, ?) ON CONFLICT (key) DO NOTHING"
PUT = ("INSERT INTO fsm_meta(key, value) VALUES (?, ?) "
       "ON CONFLICT (key) DO UPDATE SET value = excluded.value")


def checked(key: str, value: str | None = None) -> str:
    """``key`` when a caller may write it (and ``value`` fits); ``InvalidInput`` else."""
    if not isinstance(key, str) or not 0 < len(key) <= MAX_KEY or key in RESERVED:
        raise InvalidInput(f"meta key {key!r} is reserved or not 1..{MAX_KEY} characters")
    if value is not None and (not isinstance(value, str) or len(value) > MAX_VALUE):
        raise InvalidInput(f"meta value of {key!r} is not a string of at most {MAX_VALUE}")
    return key


def prefix_bounds(prefix: str) -> tuple[str, str]:
    """``PREFIX``'s arguments: every key starting with ``prefix`` sorts in [lo, hi)."""
    return prefix, prefix + "\U0010ffff"
