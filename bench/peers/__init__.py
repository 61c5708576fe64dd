"""One module per framework, each the way its own docs show durable persistence.

Every module defines ``Bench(path, synchronous, sleep)`` with

- ``await open(workload)`` / ``await close()``: set up and tear down for ``"W1"``
  or ``"W2"`` (not timed);
- ``await sequential(n)``: W1, run ``n`` instances one after another, each to its
  final state, every transition durably committed before the next one starts;
- ``await concurrent(n)``: W2, start ``n`` instances and run them all at once;
  the action of ``s2`` awaits ``sleep`` seconds.  May return a dict of extra
  measurements (for example how long starting took).

Each run checks its own result (every instance final with ``n == 6``), so a
peer that silently skips work fails instead of looking fast.  Modules are
imported by name in a child process; one that fails to import is reported
as ``n/a (reason)``.
"""

PEERS = {
    "fsm_engine": "bench.peers.fsm:BenchAsyncActions",
    "fsm_engine (def actions)": "bench.peers.fsm:Bench",
    "fsm_engine (def, inline)": "bench.peers.fsm:BenchInline",
    "floor (raw SQLite)": "bench.peers.floor:Bench",
    "transitions + SQLite": "bench.peers.transitions_sqlite:Bench",
    "langgraph (SqliteSaver)": "bench.peers.langgraph_peer:Bench",
    "burr (SQLitePersister)": "bench.peers.burr_peer:Bench",
    "dbos (SQLite sys db)": "bench.peers.dbos_peer:Bench",
}
#: fsm_engine's two rows: ``async def`` actions run on the event loop, as every peer runs
#: its actions (in the caller's thread); plain ``def`` actions pay one thread hop per step
#: (the engine never runs a sync action on the event loop, where it could block every
#: other instance).
FSM = "fsm_engine"
FSM_DEF = "fsm_engine (def actions)"
FSM_INLINE = "fsm_engine (def, inline)"
FSM_VARIANTS = (FSM, FSM_DEF, FSM_INLINE)
FLOOR = "floor (raw SQLite)"
#: Peers that run W1 at the context sizes of ``common.DOC_SIZES`` (they take ``doc``).
SIZED = (FSM, FSM_DEF, FSM_INLINE, FLOOR, "transitions + SQLite")
