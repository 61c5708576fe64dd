"""A step's cost does not grow with the parts of the context it leaves alone (issue 9,
item 2): only the updated fields are serialised (unless the model has validators or
serializers that could change other fields), and a large unchanged value is neither
re-encoded nor rewritten in the instance row (it lives in ``blobs`` by SHA-256)."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, computed_field, field_validator, model_validator

from fsm_engine import Engine, Machine, State, Transition
from fsm_engine.runtime.values import partial_dump

DOC = "a long document, \"quoted\", ☃\n" * 4000  # ~120 kB of JSON


class Doc(BaseModel):
    n: int = 0
    doc: str = ""
    notes: list[dict[str, Any]] = []


class Derived(BaseModel):
    a: int = 0
    b: int = 0
    total: int = 0

    @model_validator(mode="after")
    def add(self) -> Derived:
        self.total = self.a + self.b
        return self


class CrossField(BaseModel):
    unit: str = "m"
    length: float = 0.0

    @field_validator("length")
    @classmethod
    def in_metres(cls, v: float, info: Any) -> float:
        return v / 100 if info.data.get("unit") == "cm" else v


class OwnField(BaseModel):
    name: str = ""

    @field_validator("name")
    @classmethod
    def strip(cls, v: str) -> str:
        return v.strip()


class Computed(BaseModel):
    a: int = 0

    @computed_field  # type: ignore[prop-decorator]
    @property
    def twice(self) -> int:
        return 2 * self.a


def test_models_that_may_change_other_fields_dump_whole() -> None:
    assert partial_dump(Doc) and partial_dump(OwnField)
    assert not partial_dump(Derived)      # a model validator may set any field
    assert not partial_dump(CrossField)   # info.data: reads other fields
    assert not partial_dump(Computed)     # a computed field follows the others


def _chain(name: str, context: type[BaseModel], actions: list[Any]) -> Machine:
    states = [State(f"s{i}", action=fn) for i, fn in enumerate(actions)]
    states.append(State("end", final=True))
    moves = [Transition(f"t{i}", f"s{i}", f"s{i + 1}" if i + 1 < len(actions) else "end")
             for i in range(len(actions))]
    return Machine(name=name, states=states, transitions=moves, initial="s0", context=context)


def _run(path: Path, machine: Machine, start: dict[str, Any]) -> Any:
    async def main() -> Any:
        engine = Engine(str(path))
        engine.register(machine)
        try:
            return await engine.run(engine.start(machine, start))
        finally:
            await engine.aclose()
    return asyncio.run(main())


def _sql(path: Path, query: str) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(path)
    try:
        return conn.execute(query).fetchall()
    finally:
        conn.close()


def test_a_large_unchanged_document_stays_beside_the_row(tmp_path: Path) -> None:
    def bump(ctx: Doc) -> dict[str, Any]:
        return {"n": ctx.n + 1}

    def note(ctx: Doc) -> dict[str, Any]:
        return {"notes": [*ctx.notes, {"at": ctx.n}]}

    path = tmp_path / "fsm.db"
    rec = _run(path, _chain("docs", Doc, [bump, note, bump, bump]), {"doc": DOC})
    assert rec.status == "completed"
    assert rec.context == {"n": 3, "doc": DOC, "notes": [{"at": 1}]}
    [(ctx, refs, raw_input)] = _sql(path, "SELECT context, context_refs, input FROM instances")
    assert json.loads(ctx) == {"n": 3, "notes": [{"at": 1}]}  # the row holds the small rest
    assert set(json.loads(refs)) == {"doc", "$input.doc"} and "doc" not in json.loads(raw_input)
    # one stored copy of the document (input and context share it), none in the history
    assert _sql(path, "SELECT count(*) FROM blobs") == [(1,)]
    deltas = [json.loads(d) for (d,) in _sql(path, "SELECT delta FROM history ORDER BY seq")]
    assert deltas == [{"n": 1}, {"notes": [{"at": 1}]}, {"n": 2}, {"n": 3}]


def test_a_model_validator_still_updates_the_field_it_derives(tmp_path: Path) -> None:
    def set_a(ctx: Derived) -> dict[str, Any]:
        return {"a": 5}

    def set_b(ctx: Derived) -> dict[str, Any]:
        return {"b": 2}

    path = tmp_path / "fsm.db"
    rec = _run(path, _chain("derived", Derived, [set_a, set_b]), {})
    assert rec.context == {"a": 5, "b": 2, "total": 7}
    [(ctx,)] = _sql(path, "SELECT context FROM instances")
    assert json.loads(ctx) == {"a": 5, "b": 2, "total": 7}


def test_a_cross_field_validator_sees_the_changed_field(tmp_path: Path) -> None:
    def centimetres(ctx: CrossField) -> dict[str, Any]:
        return {"unit": "cm", "length": 250.0}

    rec = _run(tmp_path / "fsm.db", _chain("cross", CrossField, [centimetres]), {})
    assert rec.context == {"unit": "cm", "length": 2.5}


@pytest.mark.parametrize("model", [Doc, Derived])
def test_a_store_round_trip_gives_the_context_back_whole(tmp_path: Path, model: Any) -> None:
    def noop(ctx: Any) -> None:
        return None

    rec = _run(tmp_path / "fsm.db", _chain(f"noop_{model.__name__}", model, [noop, noop]), {})
    assert rec.context == model().model_dump(mode="json")
