"""Stored JSON objects the store hands back as they are (issue 37): fleet limits, a
schedule's input, a definition's export.  Each is hostile: text that is not JSON, or not
the object expected, is one ``StoreError`` line naming the row, never a traceback."""

from __future__ import annotations

import json
from typing import Any

import pytest

from fsm_engine.errors import StoreError
from fsm_engine.store import definitions, limits, schedules

NOT_JSON = [None, "", "{", "[1, 2", "nope", b"\xff"]
NOT_OBJECTS = ["[]", "3", '"x"', "null", "true", "[{}]"]


def test_limits_read_back_as_stored() -> None:
    assert limits.decode([]) is None
    value = {"queue_limits": {"llm": 8}, "junk": [1, {"a": None}]}
    assert limits.decode([(limits.encode(value),)]) == value


@pytest.mark.parametrize("text", NOT_JSON)
def test_limits_that_are_not_json_are_refused(text: Any) -> None:
    with pytest.raises(StoreError, match="^stored fleet limits are not JSON: [^\n]*$"):
        limits.decode([(text,)])


@pytest.mark.parametrize("text", NOT_OBJECTS)
def test_limits_that_are_not_an_object_are_refused(text: str) -> None:
    with pytest.raises(StoreError, match="^stored fleet limits are not a JSON object$"):
        limits.decode([(text,)])


def _schedule(text: Any) -> list[Any]:
    return ["tick", "mod", "m", None, 60, "UTC", text, "skip", "none", 0, 0.0, 60.0, None,
            None, 0, 0, 1.0, 1]


def test_a_schedules_input_reads_back_as_stored() -> None:
    row = schedules.decode(_schedule('{"a": [1, {"b": null}], "n": 1e300}'))
    assert row.input == {"a": [1, {"b": None}], "n": 1e300} and row.name == "tick"


@pytest.mark.parametrize("text", NOT_JSON)
def test_a_schedules_input_that_is_not_json_is_refused(text: Any) -> None:
    with pytest.raises(StoreError,
                       match="^the stored input of schedule 'tick' is not JSON: [^\n]*$"):
        schedules.decode(_schedule(text))


@pytest.mark.parametrize("text", NOT_OBJECTS)
def test_a_schedules_input_that_is_not_an_object_is_refused(text: str) -> None:
    with pytest.raises(StoreError,
                       match="^the stored input of schedule 'tick' is not a JSON object$"):
        schedules.decode(_schedule(text))


def test_a_definition_reads_back_as_stored() -> None:
    export = {"states": [{"name": "a"}, 3], "name": "m", "other": {"x": [1]}}
    row = definitions.decode([("m", 2, "f", json.dumps(export), None)])
    assert row is not None and row.export == export and row.created_at == 0.0
    assert definitions.decode([]) is None


@pytest.mark.parametrize("text", NOT_JSON)
def test_a_definition_that_is_not_json_is_refused(text: Any) -> None:
    with pytest.raises(StoreError, match="^the stored definition of m v2 is not JSON: [^\n]*$"):
        definitions.decode([("m", 2, "f", text, 1.0)])


@pytest.mark.parametrize("text", [*NOT_OBJECTS, "{}", '{"states": {}}', '{"states": null}',
                                  '{"states": "abc"}', '{"name": "m"}'])
def test_a_definition_that_is_not_an_export_is_refused(text: str) -> None:
    with pytest.raises(StoreError, match="^the stored definition of m v2 is not a machine "
                                         "export$"):
        definitions.decode([("m", 2, "f", text, 1.0)])
