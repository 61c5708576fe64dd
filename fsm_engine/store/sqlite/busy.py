"""Waiting for a SQLite lock held by another connection, without SQLite's busy handler.

``sqlite3.connect(timeout=30)`` installs SQLite's default busy handler
(``sqliteDefaultBusyCallback`` in sqlite3.c): a connection that finds the file locked
sleeps 1, 2, 5, 10, 15, 20, 25, 25, 25, 50, 50 ms, then 100 ms at a time, and whole
seconds in a build without ``usleep`` (``HAVE_USLEEP`` unset: a native build's default we
do not trust).  Two ``fsm worker`` processes on one file hand the write lock back and
forth every ~20 ms (a claim, then a group commit), so a waiter overslept each release by
up to 190 ms: two workers fired 10,000 due timers *later* than one (p99 1.18–1.98 s
against 0.96 s), each asleep 0.7–0.9 s of the burst in ``BEGIN IMMEDIATE``
(bench/timers.py, bench/RESULTS.md).

So a store's connection runs with ``busy_timeout = 0`` once it is open, and the store
waits itself (``retry``): the first try costs nothing more than before; a busy one is
tried again after 0.1 ms, doubling to at most ``CAP_S`` (2 ms, so a release is seen
within 2 ms), each wait jittered down by up to half (``RetryPolicy.delay``: tenacity's
``wait_exponential`` maths) so that waiters do not retry in step, until ``WAIT_S`` (30 s,
the connection's timeout before) have passed.  Then ``sqlite3.OperationalError``
("database is locked") is raised as before, which the store turns into a ``StoreError``.
"""

from __future__ import annotations

import random
import sqlite3
import time
from collections.abc import Callable
from typing import TypeVar

from ...policies import RetryPolicy

T = TypeVar("T")

#: Longest single wait between tries, seconds.
CAP_S = 0.002
#: How long a store waits for a lock in all (seconds): the connection's timeout before.
WAIT_S = 30.0
_POLICY = RetryPolicy(max_attempts=1_000_000, initial_interval=0.0001, backoff_rate=2.0,
                      max_interval=CAP_S, jitter=0.5)


def busy(exc: sqlite3.Error) -> bool:
    """True when ``exc`` says another connection holds a lock (``SQLITE_BUSY``, any of its
    extended codes), which a later try can get past."""
    code = getattr(exc, "sqlite_errorcode", None)
    return isinstance(exc, sqlite3.OperationalError) and code is not None \
        and code & 0xFF == sqlite3.SQLITE_BUSY


def retry(call: Callable[[], T], *, wait_s: float | None = None,
          sleep: Callable[[float], None] = time.sleep,
          clock: Callable[[], float] = time.monotonic) -> T:
    """``call()``, tried again while it raises ``SQLITE_BUSY`` (``busy``) for up to
    ``wait_s`` seconds in all (``None``: ``WAIT_S``); then its last error is raised.  Any other error is raised
    at once.  ``call`` must be safe to try again after a busy failure (a ``BEGIN``, a whole
    read: SQLite changed nothing)."""
    try:
        return call()
    except sqlite3.OperationalError as exc:
        if not busy(exc):
            raise
    end = clock() + (WAIT_S if wait_s is None else wait_s)
    rng = random.Random()
    attempt = 1
    while True:
        sleep(_POLICY.delay(attempt, rng=rng))
        attempt += 1
        try:
            return call()
        except sqlite3.OperationalError as exc:
            if not busy(exc) or clock() >= end:
                raise
