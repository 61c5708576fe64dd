"""Starts racing from many processes (issue 38): ``race(url, mode, n)`` runs ``n``
processes of this file, each opening an engine on ``url`` and waiting on its stdin until
every one is ready, then starting the start machine once with ``mode``'s option (``key``:
``key="order-42"``; ``debounce``: ``debounce_key="doc"``, a 60 s window) and printing
the id it got.  Returns the ids, one per process."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def race(url: str, mode: str, n: int = 8, timeout: float = 120.0) -> list[str]:
    procs = [subprocess.Popen([sys.executable, __file__, url, mode, str(i)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for i in range(n)]
    try:
        for p in procs:  # every one opened its engine: they start at once
            assert p.stdout is not None
            line = p.stdout.readline()
            assert line.strip() == "ready", p.stderr.read() if p.stderr else line
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        ids = []
        for p in procs:
            out, err = p.communicate(timeout=timeout)
            assert p.returncode == 0, err
            ids.append(out.strip())
        return ids
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def _child(url: str, mode: str, index: int) -> None:
    sys.path.insert(0, str(HERE))
    from start_machine import MACHINE

    from fsm_engine import Engine
    engine = Engine(url)
    engine.register(MACHINE)
    print("ready", flush=True)
    sys.stdin.readline()
    if mode == "key":
        iid = engine.start(MACHINE, {"n": 1}, key="order-42")
    else:
        iid = engine.start(MACHINE, {"n": index}, debounce_key="doc", debounce=60.0)
    engine.close()
    print(iid, flush=True)


if __name__ == "__main__":
    _child(sys.argv[1], sys.argv[2], int(sys.argv[3]))
