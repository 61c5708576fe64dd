"""Test support shipped with the package: the store contract suite and a throwaway
PostgreSQL cluster (``fsm_engine.testing.postgres``; needs the server binaries), and a virtual clock
(``VirtualClock``) for machines whose waits are long."""

from .clock import VirtualClock
from .contract import StoreContract

__all__ = ["StoreContract", "VirtualClock"]
