"""One machine module in two versions, written to the same path in a test's tmp dir.

Version 1: ``start -> check -> done`` (and ``start -> legacy -> done`` for texts
starting with "legacy"), context ``text, words``.  Version 2: ``check`` renamed
``validate``, ``legacy`` removed (not mapped), a required ``lang`` field its
upcaster fills in ("en"; it raises for the text "boom" and gives a value the
model rejects for "bad").  ``FLOW_BLOCK=PATH`` makes ``validate`` touch PATH and
hang (a test kills the process there).
"""

from __future__ import annotations

import sys
from pathlib import Path

V1 = '''
from pydantic import BaseModel
from fsm_engine import Machine, State, Transition


class Ctx(BaseModel):
    text: str
    words: int = 0


def begin(ctx):
    return {"words": len(ctx.text.split())}


def check_it(ctx):
    return {}


def is_legacy(ctx):
    return ctx.text.startswith("legacy")


machine = Machine(
    "flow", context=Ctx, initial="start", version=1,
    states=[State("start", action=begin), State("check", action=check_it),
            State("legacy", action=check_it), State("done", final=True),
            State("failed", final=True, failure=True)],
    transitions=[Transition("next", "start", "legacy", conditions=is_legacy),
                 Transition("next", "start", "check"), Transition("ok", "check", "done"),
                 Transition("ok", "legacy", "done")])
'''

V2 = '''
import os
import time
from pathlib import Path

from pydantic import BaseModel
from fsm_engine import Machine, State, Transition


class Ctx(BaseModel):
    text: str
    words: int = 0
    lang: str
    checked: bool = False


def add_lang(ctx):
    if ctx["text"] == "boom":
        raise ValueError("cannot tell the language of boom")
    ctx["lang"] = None if ctx["text"] == "bad" else "en"
    return ctx


def begin(ctx):
    return {"words": len(ctx.text.split())}


def validate(ctx):
    block = os.environ.get("FLOW_BLOCK")
    if block:
        Path(block).touch()
        time.sleep(600)
    return {"checked": True}


machine = Machine(
    "flow", context=Ctx, initial="start", version=2,
    migrations={2: add_lang}, renamed_states={"check": "validate"},
    states=[State("start", action=begin), State("validate", action=validate),
            State("done", final=True), State("failed", final=True, failure=True)],
    transitions=[Transition("next", "start", "validate"), Transition("ok", "validate", "done")])
'''

#: Version 1's structure with another state order: a fingerprint change, no version bump.
V1_CHANGED = V1.replace('Transition("ok", "legacy", "done")]',
                        'Transition("ok", "legacy", "done"), '
                        'Transition("redo", "check", "start")]')


def write(path: Path, source: str) -> str:
    """Write ``source`` to ``path`` and forget any earlier import of it; return the path."""
    path.write_text(source)
    import hashlib
    import os
    # the loader's module name for a file (``loader._import_path``)
    name = "fsm_machine_" + hashlib.sha1(os.path.abspath(path).encode()).hexdigest()[:12]
    sys.modules.pop(name, None)
    return str(path)
