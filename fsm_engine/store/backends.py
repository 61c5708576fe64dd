"""Which backend opens which URL: a registry of URL schemes (``open_store`` looks here).

A backend is an *opener*, ``opener(url, *, create, synchronous, readonly) -> Store``,
registered under each scheme it serves (the text before ``://``).  A URL whose scheme is
not registered — or that has none, like a plain path — opens as a SQLite file, as it
always did.  Adding a backend is one subpackage (its store and its opener) and one line
here::

    register("mysql", open_mysql)

An opener imports its backend when it runs, so a backend's driver is needed only by those
who use it; a missing driver is a one-line ``StoreError`` naming the extra to install.
"""

from __future__ import annotations

import os
import re
from typing import Protocol

from ..errors import StoreError
from .base import Store


class Opener(Protocol):
    """Open the store at ``url``; errors are one-line ``StoreError`` s."""

    def __call__(self, url: str, *, create: bool, synchronous: str, readonly: bool) -> Store: ...


#: scheme -> the opener serving it
_REGISTRY: dict[str, Opener] = {}
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


def register(scheme: str, opener: Opener) -> None:
    """Serve URLs ``scheme://...`` with ``opener`` (replacing any opener it had)."""
    _REGISTRY[scheme] = opener


def unregister(scheme: str) -> None:
    """Forget ``scheme`` (its URLs open as SQLite paths again); unknown schemes are ignored."""
    _REGISTRY.pop(scheme, None)


def schemes() -> list[str]:
    """The registered schemes, sorted."""
    return sorted(_REGISTRY)


def scheme_of(url: str) -> str:
    """The registered scheme ``url`` names, or ``"sqlite"`` (a plain path, an unknown scheme)."""
    found = _SCHEME.match(url)
    return found.group(1) if found and found.group(1) in _REGISTRY else "sqlite"


def opener_for(url: str) -> Opener:
    """The opener serving ``url`` (see ``scheme_of``)."""
    return _REGISTRY[scheme_of(url)]


def sqlite_path(url: str) -> str:
    """The file of a SQLite URL: ``sqlite:///rel.db``, ``sqlite:////abs.db``,
    ``sqlite://`` (in memory) or a plain path."""
    if not url.startswith("sqlite:"):
        return url
    rest = url[len("sqlite:"):]
    if rest in ("", "//", "///:memory:", "//:memory:"):
        return ":memory:"
    if not rest.startswith("///"):
        raise StoreError(f"bad SQLite URL {url!r}: write sqlite:///relative.db or "
                         "sqlite:////absolute.db")
    return rest[3:]


def open_sqlite(url: str, *, create: bool, synchronous: str, readonly: bool) -> Store:
    """A SQLite file (``sqlite_path``); ``create`` False refuses a missing or empty file."""
    from .sqlite import SqliteStore
    path = sqlite_path(url)
    if readonly:
        return SqliteStore(path, readonly=True)
    if not create and path != ":memory:" and (
            not os.path.exists(path) or (os.path.isfile(path) and not os.path.getsize(path))):
        raise StoreError(f"no database at {path} (run `fsm run` first, or pass --db)")
    return SqliteStore(path, synchronous=synchronous)


def open_postgres(url: str, *, create: bool, synchronous: str, readonly: bool) -> Store:
    """A PostgreSQL database (needs the ``[postgres]`` extra; ``synchronous`` is SQLite's)."""
    try:
        from .postgres import PostgresStore
    except ImportError:
        raise StoreError("a postgresql:// store needs psycopg: "
                         "pip install 'fsm_engine[postgres]'") from None
    return PostgresStore(url, create=create and not readonly, readonly=readonly)


register("sqlite", open_sqlite)
register("postgresql", open_postgres)
register("postgres", open_postgres)

__all__ = ["Opener", "register", "unregister", "schemes", "scheme_of", "opener_for",
           "sqlite_path", "open_sqlite", "open_postgres"]
