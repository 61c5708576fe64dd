"""A store wrapper whose reads the test changes (the matrix checker's tests)."""

from __future__ import annotations

import builtins
from typing import Any


class Tampered:
    """A store whose reads are the real store's, changed by the test."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.extra: list[Any] = []
        self.rows: dict[str, list[Any]] = {}

    def list(self) -> builtins.list[Any]:
        return [*self.store.list(), *self.extra]

    def history(self, iid: str) -> builtins.list[Any]:
        return self.rows.get(iid) or (self.store.history(iid) if iid in
                                      {r.id for r in self.store.list()} else [])

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)
