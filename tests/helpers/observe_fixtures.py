"""A small fleet of real instances for the statistics, viewer and browser tests.

``build_fleet(db)`` runs, on one SQLite file, through the real engine and a
scripted model:

* 6 moderation instances on license texts, whose replies cycle through a valid
  verdict, prose with no JSON (re-ask, then fallback), an HTTP 500 (retry) and a
  reply holding ``<script>`` (the XSS probe: it lands in the context and history);
* 2 router instances whose model always says "revise" (failed, ``loop_limit``);
* 1 instance of a machine whose state names hold quotes and markup.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from conftest import MACHINES, license_files

from fsm_engine import Engine, Machine, load_machine
from fsm_engine.llm import Scripted

XSS = "<script>window.__xss = 1; alert(1)</script>"
QUOTED_STATE = 'say "hi" <b>&amp;</b>'
QUOTED_MODULE = f'''
from pydantic import BaseModel
from fsm_engine import Machine, State, Transition

class C(BaseModel):
    note: str = ""

def speak(ctx: C) -> dict:
    return {{"note": {XSS!r}}}

machine = Machine(name="quoted", context=C, initial="start", max_transitions=5,
                  states=[State("start"), State({QUOTED_STATE!r}, action=speak),
                          State("done", final=True)],
                  transitions=[Transition("go", "start", {QUOTED_STATE!r}),
                               Transition("said", {QUOTED_STATE!r}, "done")])
'''

VERDICT = json.dumps({"decision": "approve", "categories": [], "summary": "fine"})
MODERATION_REPLIES = [
    {"text": VERDICT, "prompt_tokens": 50, "completion_tokens": 20},
    {"text": "I think it is fine, no JSON here.", "prompt_tokens": 40, "completion_tokens": 30},
    {"text": "", "error": "http500", "prompt_tokens": 3, "completion_tokens": 0},
    {"text": XSS, "prompt_tokens": 30, "completion_tokens": 12},
]


@dataclass
class Fleet:
    """What ``build_fleet`` made: the database and the ids per machine."""

    db: str
    ids: dict[str, list[str]] = field(default_factory=dict)
    quoted_module: str = ""


async def _run(engine: Engine, ids: list[str]) -> None:
    try:
        await engine.run_many(ids)
    finally:
        await engine.aclose()


def _machine(engine: Engine, path: Path) -> Machine:
    machine, ref = load_machine(str(path))
    engine.register(machine, ref)
    return machine


def build_fleet(db: str, tmp: Path) -> Fleet:
    """Create and run the fleet on ``db`` (see the module docstring); notifications go to
    ``tmp/notifications.jsonl`` (the caller sets ``FSM_NOTIFY_FILE``)."""
    fleet = Fleet(db)
    engine = Engine(db, llm=Scripted.from_replies(MODERATION_REPLIES), seed=3)
    engine.concurrency = 1  # replies are served in a fixed order
    inputs = [{"path": p} for p in license_files(6)]
    fleet.ids["moderation"] = engine.start_many(_machine(engine, MACHINES / "moderation.py"),
                                                inputs)
    asyncio.run(_run(engine, fleet.ids["moderation"]))
    engine = Engine(db, llm=Scripted.from_replies([{"text": "to_review", "prompt_tokens": 5,
                                                    "completion_tokens": 1},
                                                   {"text": "revise", "prompt_tokens": 5,
                                                    "completion_tokens": 1}]), seed=3)
    fleet.ids["router"] = engine.start_many(_machine(engine, MACHINES / "router.py"),
                                            [{}, {"topic": "a limerick"}])
    asyncio.run(_run(engine, fleet.ids["router"]))
    module = tmp / "quoted.py"
    module.write_text(QUOTED_MODULE)
    fleet.quoted_module = str(module)
    engine = Engine(db, seed=3)
    fleet.ids["quoted"] = engine.start_many(_machine(engine, module), [{}])
    asyncio.run(_run(engine, fleet.ids["quoted"]))
    return fleet


_HOLD_AND_DIE = """
import json, os, signal, sys
from fsm_engine import Engine
engine = Engine(sys.argv[1])
print(json.dumps([engine.start(sys.argv[2], json.loads(sys.argv[3])), engine.worker.id]),
      flush=True)
os.kill(os.getpid(), signal.SIGKILL)  # gone holding it, its worker row left behind
"""


def hold_and_die(db: str, module: str, data: dict | None = None) -> tuple[str, str]:
    """Start an instance of ``module`` on ``db`` in a child process that is then SIGKILLed
    holding it (never run); return ``(instance id, the dead worker's id)``.  The next
    claim takes it over with cause ``process_gone``."""
    proc = subprocess.run([sys.executable, "-c", _HOLD_AND_DIE, db, module,
                           json.dumps(data or {})], capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    iid, worker = json.loads(proc.stdout)
    return iid, worker


@dataclass
class Family:
    """What ``build_family`` made: a fan-out parent, its fork, and an adopted instance."""

    db: str
    parent: str = ""
    children: list[str] = field(default_factory=list)
    fork: str = ""
    adopted: str = ""


def build_family(db: str) -> Family:
    """On ``db``: a ``Map`` parent over 3 words (two children call the scripted model, one
    fails: the parent fails ``branch_failed``), a fork of it after its first row (run: it
    gets children of its own), and an instance started by a process SIGKILLed before it
    ran it, then run by another (one ``recovery`` row, cause ``process_gone``)."""
    from parallel_machines import __file__ as module
    fam = Family(db)
    reply = [{"text": "hi", "prompt_tokens": 3, "completion_tokens": 2}]
    engine = Engine(db, llm=Scripted.from_replies(reply), seed=3)
    fam.parent = engine.start(module, {"words": ["llm-a", "fail", "llm-c"]})
    asyncio.run(engine.run(fam.parent))
    fam.children = [c.id for c in engine.store.children(fam.parent)]
    fam.fork = engine.fork(fam.parent, from_seq=1)
    asyncio.run(engine.run(fam.fork))
    engine.close()
    fam.adopted, _ = hold_and_die(db, module, {"words": ["x"]})
    second = Engine(db, seed=3)
    asyncio.run(_run(second, [fam.adopted]))
    return fam
