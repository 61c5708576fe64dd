"""The store interface: the narrow contract every backend passes (``fsm_engine.testing``),
the union of the facets in ``store.facets``."""

from __future__ import annotations

from typing import Protocol

from .facets import (
    DefinitionStore,
    HistoryStore,
    InstanceStore,
    LeaseStore,
    LimitStore,
    MetaStore,
    OutboxStore,
    ReadStore,
    ReplyStore,
    ReviewStore,
    ScheduleStore,
    StoreConnection,
    StreamStore,
)


class Store(StoreConnection, InstanceStore, HistoryStore, OutboxStore, ReplyStore, ReviewStore,
            LeaseStore, LimitStore, DefinitionStore, StreamStore, MetaStore, ScheduleStore,
            ReadStore,
            Protocol):
    """Durable storage for instances, their history, attempts, outbox, replies, reviews,
    workers, breakers, rate windows, limits, definitions, streams and schedules: every facet of
    ``store.facets`` (a caller needing one concern may ask for that facet alone).

    Every method is synchronous and owns its own transaction.  ``commit`` is
    the hot path: it applies a batch of steps in one transaction (group
    commit), each step all-or-nothing, and reports which applied.
    Errors: ``InstanceNotFound`` for unknown ids, ``StoreError`` (or
    ``NotAnFsmDatabase``) when the database is unusable.
    """


__all__ = ["Store"]
