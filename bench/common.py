"""What every workload and peer shares: the benchmark machine's shape, SQLite setup, RSS.

The machine is the same for everyone: a linear chain ``s0 → s1 → … → s6``
(7 states, 6 transitions, ``s6`` final).  The state holds one integer ``n``;
the action of each non-final state adds 1 to it, so a finished instance has
``n == 6``.  In W2/W3 the action of ``s2`` (``INFER``) awaits ``sleep``
seconds first, standing in for a model call.
"""

from __future__ import annotations

import os
import re
import sqlite3
from dataclasses import dataclass, field
from typing import Any

STATES = tuple(f"s{i}" for i in range(7))
FINAL = STATES[-1]
TRANSITIONS = len(STATES) - 1          # durable transitions per instance
INFER = "s2"                           # the state whose action may sleep
#: W1 context sizes (bytes of a ``doc`` string field no action changes), ``0``: no doc.
DOC_SIZES = (300, 10_000, 100_000)


def doc_text(size: int) -> str:
    """A document of ``size`` characters (prose with quotes, so JSON encoders escape)."""
    unit = 'The committee said "approve" — after review. '
    return (unit * (size // len(unit) + 1))[:size]


def fresh_path(directory: str, name: str) -> str:
    """``directory/name`` with any old database, WAL and shared-memory file removed."""
    path = os.path.join(directory, name)
    for suffix in ("", "-wal", "-shm", "-journal"):
        try:
            os.remove(path + suffix)
        except FileNotFoundError:
            pass
    return path


def db_bytes(path: str) -> int:
    """Bytes on disk of a SQLite database: main file plus WAL (after the peer closed it)."""
    return sum(os.path.getsize(path + s) for s in ("", "-wal") if os.path.exists(path + s))


def connect(path: str, synchronous: str, **kwargs: Any) -> sqlite3.Connection:
    """A sqlite3 connection in WAL mode with the given ``synchronous`` level (autocommit)."""
    conn = sqlite3.connect(path, isolation_level=None, **kwargs)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(f"PRAGMA synchronous={synchronous}")
    return conn


# -- hand-written schema shared by the floor and the `transitions` peer --------------------
SCHEMA = """
CREATE TABLE IF NOT EXISTS instances (id TEXT PRIMARY KEY, state TEXT NOT NULL,
    context TEXT NOT NULL, seq INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS history (instance_id TEXT NOT NULL, seq INTEGER NOT NULL,
    source TEXT NOT NULL, dest TEXT NOT NULL, trigger TEXT NOT NULL, at REAL NOT NULL,
    PRIMARY KEY (instance_id, seq));
"""
INSERT_INSTANCE = "INSERT INTO instances(id, state, context, seq) VALUES (?, ?, ?, 0)"
UPDATE_INSTANCE = "UPDATE instances SET state=?, context=?, seq=? WHERE id=?"
INSERT_HISTORY = ("INSERT INTO history(instance_id, seq, source, dest, trigger, at) "
                  "VALUES (?, ?, ?, ?, ?, ?)")


# -- peak RSS per measurement ------------------------------------------------------------
def reset_peak_rss() -> None:
    """Reset the kernel's peak-RSS mark (VmHWM) of this process (Linux ≥ 4.0)."""
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
    except OSError:
        pass


def peak_rss_mib() -> float:
    """Peak resident set size since the last ``reset_peak_rss`` (MiB)."""
    try:
        with open("/proc/self/status") as fh:
            match = re.search(r"VmHWM:\s+(\d+) kB", fh.read())
        if match:
            return int(match.group(1)) / 1024
    except OSError:
        pass
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


@dataclass
class Sample:
    """One repetition of one workload on one framework."""

    seconds: float
    transitions: int
    rss_mib: float
    db_bytes: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"seconds": self.seconds, "transitions": self.transitions,
                "rss_mib": self.rss_mib, "db_bytes": self.db_bytes, **self.extra}
