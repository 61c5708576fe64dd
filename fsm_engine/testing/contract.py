"""The ``Store`` contract as a reusable test suite (pytest).

Every backend passes the same tests: ``tests/store/test_store_contract.py`` runs
them against SQLite and PostgreSQL, and a third-party backend runs them by
subclassing :class:`StoreContract` with a ``store`` fixture::

    import pytest
    from fsm_engine.testing import StoreContract

    class TestMyStore(StoreContract):
        @pytest.fixture
        def store(self, tmp_path):
            s = MyStore(...)
            yield s
            s.close()

One mixin per facet of the contract, each in its own module (``contract_<facet>.py``):
instances, commit, history, outbox, workers, breakers, claims, leases, families, reads,
reviews (with forks and replies), queues, large values, batches, definitions (with meta
values), streams and schedules; the records and rows they build are ``contract_fixtures``'s,
re-exported here for backends' own tests.
"""

from __future__ import annotations

from .contract_batch import BatchContract
from .contract_breakers import BreakerContract
from .contract_claims import ClaimContract
from .contract_commit import CommitContract
from .contract_context import LargeValueContract
from .contract_definitions import DefinitionContract, MetaContract
from .contract_families import FamilyContract
from .contract_fixtures import UNICODE, attempt, concurrently, fleet, hist, live, moved, record
from .contract_history import HistoryContract
from .contract_instances import InstanceContract
from .contract_leases import LeaseContract
from .contract_outbox import OutboxContract
from .contract_queues import QueueContract
from .contract_reads import ReadSideContract
from .contract_reviews import ForkContract, ReplyContract, ReviewContract
from .contract_schedules import ScheduleContract
from .contract_starts import StartContract
from .contract_streams import StreamContract
from .contract_workers import WorkerContract

__all__ = [
    "StoreContract",
    # the facets, each a mixin of StoreContract
    "InstanceContract", "CommitContract", "HistoryContract", "OutboxContract", "WorkerContract",
    "BreakerContract", "ClaimContract", "LeaseContract", "FamilyContract", "ReadSideContract",
    "ReviewContract", "ForkContract", "ReplyContract", "QueueContract", "LargeValueContract",
    "BatchContract", "DefinitionContract", "MetaContract", "StreamContract", "StartContract",
    "ScheduleContract",
    # the fixtures (contract_fixtures)
    "UNICODE", "record", "moved", "hist", "live", "attempt", "concurrently", "fleet",
]


class StoreContract(InstanceContract, CommitContract, HistoryContract, OutboxContract,
                    WorkerContract, BreakerContract, ClaimContract, FamilyContract,
                    ReadSideContract, ReviewContract, ForkContract, ReplyContract,
                    QueueContract, LargeValueContract, LeaseContract, BatchContract,
                    DefinitionContract, StreamContract, MetaContract, StartContract,
                    ScheduleContract):
    """Behaviour every ``Store`` backend must have: the union of the facet mixins above
    (:class:`ReadSideContract` among them).

    Subclass it in a test module (name the subclass ``Test…``) and provide a
    ``store`` fixture yielding a fresh, empty store of the backend under test (and a
    ``reopen`` fixture returning another connection to the same store, for the
    concurrency cases); every test then runs against it.
    """
