"""A JSON repair fixes syntax only: hostile replies whose repair would change a value's
type or meaning are refused (and go down the fallback chain with the reason recorded);
every syntax repair keeps working (finding 5 of issue 19)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import pytest
from conftest import MACHINES, license_files, scripted

from fsm_engine import Engine
from fsm_engine.errors import StructuredOutputError
from fsm_engine.structured import FENCE, PROSE, parse_structured

DEEP = 10_000


@dataclass(frozen=True)
class Kept:
    """Repaired to exactly ``value``."""

    value: Any


@dataclass(frozen=True)
class Refused:
    """Refused; ``why`` is in the recorded errors; ``truncated`` as given."""

    why: str
    truncated: bool = False


CASES: list[tuple[str, str, Kept | Refused]] = [
    # --- values a repair would change: refused --------------------------------------
    ("python set", "{\"tags\": {'a', 'b'}}", Refused("$.tags: an object became a list")),
    ("set of numbers", '{"ids": {1, 2}}', Refused("$.ids: an object became a list")),
    ("one-member set", '{"a": {"b"}}', Refused("$.a: an object became a list")),
    ("hex", '{"a": 0x1F}', Refused("'0x1F' (not a JSON number) became the str")),
    ("octal 0o", '{"a": 0o17}', Refused("'0o17' (not a JSON number)")),
    ("legacy octal", '{"a": 017}', Refused("'017' (not a JSON number) became the int 17")),
    ("underscored", '{"a": 1_000}', Refused("'1_000' (not a JSON number)")),
    ("expression", '{"a": 1 + 2}', Refused("'1 + 2' (not a JSON number) became the int 1")),
    ("duplicate key", '{"a": 1, "a": 2,}', Refused("$.a: the int 1 became the int 2")),
    ("quote inside a single-quoted string", "{'text': 'don't'}",
     Refused('$.text: the str "don" became')),
    ("python escape", '{"a": "\\x41",}', Refused("(undecodable) became the str \"A\"")),
    ("mixed-case literal", '{"a": tRue}', Refused('the str "tRue" became the bool true')),
    ("NaN", "{'a': NaN}", Refused("NaN")),
    ("Infinity", '{"a": -Infinity,}', Refused("NaN/Infinity")),
    ("truncated", '{"a": [1, 2', Refused("incomplete", truncated=True)),
    ("deep nesting", "[" * DEEP + "1," + "]" * DEEP, Refused("nests deeper")),
    # --- syntax only: repaired ------------------------------------------------------
    ("python literals", "{'ok': True, 'no': False, 'missing': None}",
     Kept({"ok": True, "no": False, "missing": None})),
    ("comments", '{"a": 1, // one\n "b": /* two */ 2}', Kept({"a": 1, "b": 2})),
    ("trailing commas", '{"a": [1, 2,], "b": {"c": 3,},}', Kept({"a": [1, 2], "b": {"c": 3}})),
    ("fence and prose", "Here:\n```json\n{a: 'x', 'b': [1.5, 2e3,],}\n```\nDone.",
     Kept({"a": "x", "b": [1.5, 2000.0]})),
    ("escaped quote in single quotes", "{'a': 'it\\'s', 'b': 'say \"hi\"'}",
     Kept({"a": "it's", "b": 'say "hi"'})),
    ("apostrophe in a double-quoted string", "{'a': \"it's\",}", Kept({"a": "it's"})),
    ("unquoted keys and values", "{a: yes, b: hello world}",
     Kept({"a": "yes", "b": "hello world"})),
    ("missing comma", '{"a": "x" "b": 1}', Kept({"a": "x", "b": 1})),
    ("mismatched brackets", '{"a": [1, 2}', Kept({"a": [1, 2]})),
    ("truncation marker", '{"a": [1, 2, ...],}', Kept({"a": [1, 2]})),
    ("deep past the 100-level cap", "[" * 200 + "1," + "]" * 200, Refused("nests deeper")),
]


def _nest(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize("text, expect", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_hostile_reply(text: str, expect: Kept | Refused) -> None:
    if isinstance(expect, Kept):
        parsed = parse_structured(text)
        want = _nest(200) if expect.value == "200 deep" else expect.value
        assert parsed.data == want
        assert parsed.repairs and all(r in (FENCE, PROSE) or r.startswith("json_repair")
                                      for r in parsed.repairs)
        return
    with pytest.raises(StructuredOutputError) as caught:
        parse_structured(text)
    err = caught.value
    assert any(expect.why in line for line in err.errors), err.errors
    assert err.truncated is expect.truncated and err.raw == text


def test_a_refused_repair_goes_down_the_fallback_chain_with_its_reason(db_path,
                                                                       notify_file) -> None:
    """The moderation machine: the model answers with a set twice (the answer and the
    re-ask), constrained decoding gets it too; the keyword rule decides, and the history
    says why the repair was refused each time."""
    answer = {"text": "{\"decision\": \"reject\", \"categories\": {'spam'}, "
                      "\"summary\": \"ads\"}", "prompt_tokens": 40, "completion_tokens": 20}
    engine = Engine(db_path, llm=scripted(answer), seed=3)
    iid = engine.start(str(MACHINES / "moderation.py"), {"path": license_files(1)[0]})
    rec = asyncio.run(engine.run(iid))
    history = engine.store.history(iid)
    engine.close()
    assert rec.status == "completed" and rec.context["verdict_source"] == "rules"
    assert [h.trigger for h in history].count("reask") == 1
    refused = "repair refused: $.categories: an object became a list"
    validations = [h.delta["validation_errors"] for h in history if h.source == "validate"]
    assert len(validations) == 2 and all(refused in errs for errs in validations)
    assert any("would change a value" in h.detail.get("constrained_error", "")
               for h in history)
