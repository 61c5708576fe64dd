"""Values at the boundary (issue 10, item 4): the context holds exactly what round-trips
through JSON.  Each awkward value, in start input and in an action's update, is either
round-tripped exactly (type and value) or refused with its field path; SQLite's JSON1
functions accept every stored context, history delta and detail; ``--json`` output is
strict JSON."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import sqlite3
from typing import Any

import pytest
from pydantic import BaseModel
from typer.testing import CliRunner

from fsm_engine import Engine, InvalidInput, Machine, State, Transition, fire
from fsm_engine.cli import app


class Inner(BaseModel):
    when: dt.datetime
    tags: set[str] = set()


class Ctx(BaseModel):
    loose: Any = None
    meta: dict[str, Any] = {}
    items: list[Any] = []
    text: str = ""
    ratio: float = 0.0
    inner: Inner | None = None
    update: dict[str, Any] = {}  # what the action returns (plain JSON in the input)


UPDATES: dict[str, Any] = {}  # test id -> the update the action returns (not JSON itself)


def act(ctx: Ctx, step) -> Any:
    step.notes["seen"] = True
    return fire("ok", **UPDATES.get(step.instance_id, {}))


MACHINE = Machine(
    name="values", context=Ctx, initial="act",
    states=[State("act", action=act), State("done", final=True),
            State("failed", final=True, failure=True)],
    transitions=[Transition("ok", "act", "done")])

FILE = open(__file__, encoding="utf-8")  # noqa: SIM115 - a real handle, never read

REFUSED = [  # (case, update/input, the field path the error names)
    ("bytes-untyped", {"loose": b"\xff\x00"}, "loose"),
    ("utf8-bytes-in-str", {"text": b"abc"}, "text"),
    ("bytes-nested", {"meta": {"k": [1, b"x"]}}, "meta.k[1]"),
    ("nan", {"ratio": float("nan")}, "ratio"),
    ("inf-untyped", {"items": [1.0, float("inf")]}, "items[1]"),
    ("minus-inf-nested", {"meta": {"a": {"b": float("-inf")}}}, "meta.a.b"),
    ("lambda", {"loose": lambda: 1}, "loose"),
    ("file", {"meta": {"fh": FILE}}, "meta.fh"),
    ("tuple-untyped", {"loose": (1, 2)}, "loose"),
    ("int-key-untyped", {"meta": {"d": {1: "x"}}}, "meta.d"),
    ("datetime-untyped", {"items": [dt.datetime(2024, 1, 1)]}, "items[0]"),
]


def _ids(cases: list[tuple[Any, ...]]) -> list[str]:
    return [c[0] for c in cases]


@pytest.fixture
def eng(db_path: str):
    e = Engine(db_path, seed=1)
    yield e
    e.close()


@pytest.mark.parametrize("case,value,path", REFUSED, ids=_ids(REFUSED))
def test_start_input_refused_with_its_path(eng: Engine, case: str, value: dict, path: str) -> None:
    with pytest.raises(InvalidInput) as err:
        eng.start(MACHINE, value)
    assert f"{path}:" in str(err.value)
    assert eng.store.list() == []  # nothing half-written


@pytest.mark.parametrize("case,value,path", REFUSED, ids=_ids(REFUSED))
def test_update_refused_fails_the_instance_with_its_path(eng: Engine, case: str, value: dict,
                                                         path: str) -> None:
    iid = eng.start(MACHINE, {})
    UPDATES[iid] = value
    rec = asyncio.run(eng.run(iid))
    assert (rec.status, rec.reason, rec.owner) == ("failed", "invalid_update", None)
    assert f"{path}:" in rec.last_error
    assert eng.store.get(iid).context == {**Ctx().model_dump(mode="json")}


def test_accepted_values_round_trip_exactly(eng: Engine) -> None:
    when = dt.datetime(2024, 5, 6, 7, 8, 9, 123456, tzinfo=dt.UTC)
    given = {"loose": {"a": [1, 2.5, None, True, "é\u2603"]}, "items": [{"x": -0.0}, 10**30],
             "inner": Inner(when=when, tags={"b", "a"}), "ratio": 1e308, "text": "\u0000nul"}
    iid = eng.start(MACHINE, given)
    UPDATES[iid] = given | {"text": "after", "meta": {"nested": {"deep": [[], {}]}}}
    rec = asyncio.run(eng.run(iid))
    assert rec.status == "completed"
    ctx = Ctx.model_validate(eng.store.get(iid).context)
    assert ctx.inner == Inner(when=when, tags={"a", "b"}) and ctx.inner.when.tzinfo is not None
    assert ctx.loose == given["loose"] and ctx.items == given["items"]
    assert type(ctx.items[1]) is int and ctx.ratio == 1e308
    assert ctx.meta == {"nested": {"deep": [[], {}]}} and ctx.text == "after"


def test_json1_accepts_every_stored_context_delta_and_detail(eng: Engine, db_path: str) -> None:
    ids = [eng.start(MACHINE, {"ratio": 0.5}) for _ in range(len(REFUSED) + 1)]
    for iid, (_, value, _) in zip(ids, REFUSED, strict=False):
        UPDATES[iid] = value
    UPDATES[ids[-1]] = {"ratio": 2.0, "meta": {"ok": [1.5, "x"]}}
    asyncio.run(eng.run_many(ids))
    conn = sqlite3.connect(db_path)
    bad = conn.execute(
        "SELECT count(*) FROM instances WHERE NOT json_valid(context) OR NOT json_valid(input)"
        " OR NOT json_valid(visits)").fetchone()[0]
    assert bad == 0
    rows = conn.execute("SELECT count(*), sum(json_valid(delta) AND json_valid(detail)"
                        " AND json_valid(guards)) FROM history").fetchone()
    assert rows[0] >= len(ids) and rows[0] == rows[1]
    ratios = conn.execute("SELECT json_extract(context, '$.ratio') FROM instances"
                          " ORDER BY key").fetchall()
    assert [r[0] for r in ratios] == [0.5] * len(REFUSED) + [2.0]
    assert conn.execute("SELECT json_extract(delta, '$.meta.ok[0]') FROM history h"
                        " JOIN instances i ON i.key = h.instance WHERE i.id = ?",
                        (ids[-1],)).fetchone()[0] == 1.5
    conn.close()


def _strict(text: str) -> Any:
    def fail(token: str) -> Any:
        raise AssertionError(f"non-standard JSON token {token}")
    return json.loads(text, parse_constant=fail)


def test_every_json_output_is_strict(eng: Engine, db_path: str) -> None:
    iid = eng.start(MACHINE, {"ratio": 1.5})
    UPDATES[iid] = {"ratio": float("nan")}
    ok = eng.start(MACHINE, {})
    asyncio.run(eng.run_many([iid, ok]))
    runner = CliRunner()
    for args in (["list"], ["show", iid], ["history", iid], ["show", ok], ["history", ok],
                 ["outbox"]):
        result = runner.invoke(app, [*args, "--json", "--db", db_path])
        assert result.exit_code == 0, result.output
        _strict(result.stdout)


def test_fsm_run_names_the_input_file_at_fault(tmp_path, db_path: str, capsys) -> None:
    from cli import run_main
    good, bad, script = tmp_path / "good.json", tmp_path / "bad.json", tmp_path / "s.jsonl"
    good.write_text('{"path": "x"}')
    script.write_text('{"text": "{}"}\n')
    bad.write_text('{"path": "x", "raw": "ok", "repairs": [NaN]}')  # Python's json reads NaN
    code, _, err = run_main(["run", "machines/moderation.py", "--input", str(good), str(bad),
                             "--db", db_path, "--llm", f"scripted:{script}"], capsys)
    assert code == 2 and err.startswith(f"fsm: error: {bad}: input does not fit Moderation: ")
    assert "repairs[0]: nan has no JSON form" in err and len(err.splitlines()) == 1
    assert Engine(db_path).store.list() == []  # neither input started


def test_json_output_stays_strict_on_a_database_written_before_the_checks(
        eng: Engine, db_path: str) -> None:
    iid = eng.start(MACHINE, {"ratio": 1.5})
    conn = sqlite3.connect(db_path)  # what an older fsm_engine stored: bare tokens
    conn.execute("UPDATE instances SET context = ? WHERE id = ?",
                 ('{"ratio": NaN, "items": [Infinity, -Infinity]}', iid))
    conn.commit()
    conn.close()
    result = CliRunner().invoke(app, ["show", iid, "--json", "--db", db_path])
    assert result.exit_code == 0, result.output
    assert _strict(result.stdout)["context"] == {"ratio": "NaN", "items": ["Infinity", "-Infinity"]}


def test_an_input_of_the_wrong_type_names_the_field_first(eng: Engine) -> None:
    class Doc(BaseModel):
        path: str
        sections: list[int] = []

    machine = Machine(name="doc", context=Doc, initial="done", states=[State("done", final=True)],
                      transitions=[])
    with pytest.raises(InvalidInput) as bad:
        eng.start(machine, {"path": 5})
    assert str(bad.value) == "input does not fit Doc: path: Input should be a valid string"
    with pytest.raises(InvalidInput) as nested:
        eng.start(machine, {"path": "x", "sections": [1, "two"]})
    assert str(nested.value).startswith("input does not fit Doc: sections[1]: Input should be")
    with pytest.raises(InvalidInput) as missing:
        eng.start(machine, {})
    assert str(missing.value) == "input does not fit Doc: path: Field required"
