"""A worker's two prunes of its retired ids at once (the heartbeat thread's ``_housekeep``
and ``close``, which stops the heartbeat without waiting for its thread): the second to
remove an id no longer fails the worker's shutdown (``ValueError: list.remove(x): x not in
list``; the matrix's stream-long-stop-commit-before-src=work-1-postgres cell, FULL, once)."""

from __future__ import annotations

from typing import Any

from fsm_engine.runtime.fleet.ownership import Ownership
from fsm_engine.runtime.ledger import Ledger


class Racing:
    """A store whose first ``delete_worker`` runs another prune (the other thread's) inside."""

    def __init__(self) -> None:
        self.owner: Ownership | None = None
        self.deleted: list[str] = []

    def held(self, worker_id: str) -> list[str]:
        return []

    def delete_worker(self, worker_id: str) -> None:
        self.deleted.append(worker_id)
        if len(self.deleted) == 1 and self.owner is not None:
            self.owner.prune()


def test_two_prunes_at_once_each_finish_and_forget_the_id() -> None:
    store: Any = Racing()
    owner = Ownership(store, writes=Ledger(store), lease_seconds=1.0, max_recoveries=3)
    store.owner = owner
    owner.retired = ["vm:1:old"]
    owner.prune()
    assert owner.retired == [] and store.deleted == ["vm:1:old", "vm:1:old"]
