"""Micro-benchmarks for scale: ``python -m bench.workloads.micro REPS``.

- one ``transitions`` trigger on the 7-state chain (no callbacks, no I/O);
- a pydantic round trip (``model_validate`` of a dict, then
  ``model_dump(mode="json")``) of the benchmark context (one int) and of the
  reference machine's context holding a 2,400-character text.

Prints one JSON object: name → list of µs per operation, one per repetition.
"""

from __future__ import annotations

import json
import sys
import timeit
from collections.abc import Callable
from pathlib import Path
from typing import Any

from transitions import Machine

from ..common import STATES, TRANSITIONS


def _per_op_us(fn: Callable[[], Any], number: int) -> float:
    return timeit.timeit(fn, number=number) / number * 1e6


def transitions_trigger(number: int) -> float:
    """µs per trigger of ``next`` on the linear chain (``reset`` every 6, not timed apart)."""
    class Model:
        pass
    model = Model()
    table = [["next", STATES[k], STATES[k + 1]] for k in range(TRANSITIONS)]
    table.append(["next", STATES[-1], STATES[0]])
    Machine(model=model, states=list(STATES), transitions=table, initial=STATES[0],
            auto_transitions=False)
    return _per_op_us(model.next, number)  # type: ignore[attr-defined]


def pydantic_round_trip(number: int) -> dict[str, float]:
    """µs per validate + dump of a small and a moderation-sized context."""
    from ..peers.fsm import Counter
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    try:
        from machines.moderation import Moderation
    except ImportError:
        Moderation = None
    small = {"n": 3}
    out = {"pydantic round trip, 1-field context":
           _per_op_us(lambda: Counter.model_validate(small).model_dump(mode="json"), number)}
    if Moderation is not None:
        big = Moderation(path="/tmp/x", text="lorem ipsum " * 200, raw='{"decision":"approve"}',
                         validation_errors=["e1"], repairs=["r1"]).model_dump(mode="json")
        out["pydantic round trip, moderation context (2.4 kB text)"] = _per_op_us(
            lambda: Moderation.model_validate(big).model_dump(mode="json"), number)
    return out


def main(reps: int) -> dict[str, list[float]]:
    results: dict[str, list[float]] = {}
    for _ in range(reps):
        results.setdefault("transitions trigger (no I/O)", []).append(transitions_trigger(20000))
        for name, us in pydantic_round_trip(20000).items():
            results.setdefault(name, []).append(us)
    return results


if __name__ == "__main__":
    print(json.dumps(main(int(sys.argv[1]) if len(sys.argv) > 1 else 3)))
