"""Python's cyclic garbage collector, tuned for a long-lived process fsm_engine owns
(issue 39, item 2).

A step allocates dicts, records and pydantic models, most of them freed by reference
counting; the cyclic collector still walks every tracked object of a generation each time
its allocation count passes a threshold (CPython 3.11: 700 allocations for generation 0,
10 generation-0 collections for generation 1, 10 of those for generation 2; see
``gc.set_threshold`` and the CPython developer guide's *Garbage collector design*).  At
10,000 instances in flight the tracked objects are many and long-lived (the records, the
compiled machines, the imported libraries), so the older generations' walks cost ~15-21 %
of W2's CPU (``bench/RESULTS.md``).  Two standard remedies, both from CPython's own
documentation of ``gc.freeze``:

* ``gc.freeze()`` after start-up moves every object alive then (modules, classes, the
  loaded machines, pydantic's validators) to a permanent generation no collection walks;
* a higher generation-0 threshold collects less often; the young objects of one batch of
  steps are mostly freed by reference counting before a collection would find them.

Only the commands that own their process tune it (``fsm run``, ``fsm worker``, through
``tune_if_owned``): the process is theirs when it was started as the ``fsm`` command
(``fsm_engine.cli.entry``, which sets ``owned``); ``fsm_engine.cli.main`` called inside
another program (a test run, a notebook) leaves that program's collector alone, as does a
library user's process unless it calls ``tune`` itself.
``FSM_GC=default`` leaves the collector alone in those commands too (to compare, or for a
process that embeds them).  Measured by ``bench/collector.py`` (CPU and peak RSS, W2).
"""

from __future__ import annotations

import gc
import os

#: Generation thresholds for a long-lived fsm_engine process: generation 0 collected
#: every 10,000 net allocations instead of 700 (chosen by ``bench/collector.py``: the CPU
#: saved levels off above it while the young objects alive between two collections stay
#: a few MiB); generations 1 and 2 as CPython's defaults.
THRESHOLDS = (10_000, 10, 10)

#: True in a process started as the ``fsm`` command (``fsm_engine.cli.entry``).
owned = False


def tune(thresholds: tuple[int, int, int] = THRESHOLDS) -> bool:
    """Freeze what is alive now out of the collector's walks and set ``thresholds``
    (``gc.set_threshold``'s three counts); call once after start-up (machines loaded).
    Returns False, changing nothing, when ``FSM_GC=default`` is set."""
    if os.environ.get("FSM_GC", "").strip().lower() == "default":
        return False
    gc.collect()  # what start-up left as garbage is freed, not frozen
    gc.freeze()
    gc.set_threshold(*thresholds)
    return True


def tune_if_owned() -> bool:
    """``tune()`` when this process is the ``fsm`` command's (``owned``); else False."""
    return tune() if owned else False
