"""Child-process entry point for W1/W2: ``python -m bench.child``.

``python -m bench.child module:Class`` imports the peer and prints ``{}``
(or ``{"error": …}`` when the import fails).  Then the parent sends one JSON
command per line on stdin; the child answers one JSON line per command:

- ``{"op": "open", "task": {…}}`` → ``{}`` (warms the case up the first time);
- ``{"op": "run", "n": N}`` → ``{"seconds": …}``;
- ``{"op": "close"}`` → ``{"sample": {…}}``.

Any failure answers ``{"error": "…"}`` (traceback on stderr).  One process
per peer keeps import side effects (DBOS's global registry, LangGraph's
caches) and memory apart; one event loop serves the child's whole life.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import traceback
from typing import Any

from .common import fresh_path
from .workloads.steps import Session, Task, load_peer, warm_up


def _short(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".splitlines()[0]
    return text[:160]


class Child:
    def __init__(self) -> None:
        self.warmed: set[str] = set()
        self.session: Session | None = None

    async def handle(self, cmd: dict[str, Any]) -> dict[str, Any]:
        op = cmd["op"]
        if op == "open":
            task = Task(**cmd["task"])
            if task.tag not in self.warmed:
                await warm_up(task)
                self.warmed.add(task.tag)
            self.session = Session(task, fresh_path(task.workdir, f"{task.tag}.db"))
            await self.session.open()
            return {}
        assert self.session is not None, "no open session"
        if op == "run":
            return {"seconds": await self.session.run(cmd["n"])}
        sample = await self.session.close()
        self.session = None
        return {"sample": sample.as_dict()}


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.ERROR)
    try:
        if argv:
            load_peer(argv[0])
        print("{}", flush=True)
    except Exception as exc:  # noqa: BLE001 - the peer is not installed or broken
        traceback.print_exc(file=sys.stderr)
        print(json.dumps({"error": _short(exc)}), flush=True)
        return 1
    loop = asyncio.new_event_loop()
    child = Child()
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            out = loop.run_until_complete(child.handle(json.loads(line)))
        except Exception as exc:  # noqa: BLE001 - reported as "n/a (reason)"
            traceback.print_exc(file=sys.stderr)
            child.session = None
            out = {"error": _short(exc)}
        print(json.dumps(out), flush=True)
    loop.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
