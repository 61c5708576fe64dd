"""Test support shipped with the package: the store contract suite and a throwaway
PostgreSQL cluster (``fsm_engine.testing.postgres``; needs the server binaries)."""

from .contract import StoreContract

__all__ = ["StoreContract"]
