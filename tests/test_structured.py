"""Raw model replies → parse_structured: value, repairs, or the rejection."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any, Literal

import jsonschema
import pytest
from pydantic import BaseModel

from fsm_engine.errors import FsmError, StructuredOutputError
from fsm_engine.structured import Parsed, parse_structured, reask_message


class Verdict(BaseModel):
    decision: Literal["approve", "reject", "review"]
    categories: list[str]
    summary: str


VERDICT_SCHEMA: dict[str, Any] = {
    "title": "Verdict",
    "type": "object",
    "properties": {
        "decision": {"enum": ["approve", "reject", "review"]},
        "categories": {"type": "array", "items": {"type": "string"}},
        "summary": {"type": "string"},
    },
    "required": ["decision", "categories", "summary"],
}

FENCE, PROSE, BOM = "removed markdown fence", "removed prose around JSON", "stripped BOM"
GOOD = '{"decision": "approve", "categories": ["news"], "summary": "fine"}'
GOOD_VALUE = {"decision": "approve", "categories": ["news"], "summary": "fine"}


@dataclass(frozen=True)
class Ok:
    value: Any
    repairs: tuple[str, ...] = ()


@dataclass(frozen=True)
class Rejected:
    truncated: bool = False
    errors: tuple[str, ...] = ()   # each must appear inside some err.errors entry
    repairs: tuple[str, ...] = ()


@dataclass(frozen=True)
class Row:
    id: str
    text: str
    expect: Ok | Rejected
    target: Any = None
    finish_reason: str | None = None


ROWS = [
    # --- clean JSON, fences, prose ------------------------------------------------
    Row("plain object", GOOD, Ok(GOOD_VALUE), Verdict),
    Row("bare fence", f"```\n{GOOD}\n```", Ok(GOOD_VALUE, (FENCE,)), Verdict),
    Row("json fence", f"```json\n{GOOD}\n```", Ok(GOOD_VALUE, (FENCE,)), Verdict),
    Row("one-line json fence", f"```json {GOOD}```", Ok(GOOD_VALUE, (FENCE,)), Verdict),
    Row("fence with prose before and after",
        f"Sure! Here is my verdict:\n\n```json\n{GOOD}\n```\n\nLet me know if you need more.",
        Ok(GOOD_VALUE, (FENCE, PROSE)), Verdict),
    Row("fence inside a string value",
        '```json\n{"decision": "review", "categories": [], '
        '"summary": "run ```py\\nprint(1)\\n``` first"}\n```',
        Ok({"decision": "review", "categories": [],
            "summary": "run ```py\nprint(1)\n``` first"}, (FENCE,)), Verdict),
    Row("code fence before the json fence",
        f"First:\n```python\nprint({{}})\n```\nthen:\n```json\n{GOOD}\n```",
        Ok(GOOD_VALUE, (FENCE, PROSE)), Verdict),
    Row("broken fence before a good fence",
        f"```json\n[1, 2\n```\n```json\n{GOOD}\n```", Ok(GOOD_VALUE, (FENCE, PROSE)), Verdict),
    Row("prose-wrapped object", f"My answer is {GOOD} -- hope that helps!",
        Ok(GOOD_VALUE, (PROSE,)), Verdict),
    Row("bracketed prose before the object", f"I've read it [twice]. {GOOD}",
        Ok(GOOD_VALUE, (PROSE,)), Verdict),
    Row("apostrophe in bracketed prose", f"Note [the author's claim] first: {GOOD}",
        Ok(GOOD_VALUE, (PROSE,)), Verdict),
    Row("brackets inside strings", 'x {"s": "a } and ] and { inside", "n": [1]} y',
        Ok({"s": "a } and ] and { inside", "n": [1]}, (PROSE,))),
    Row("BOM", "\ufeff" + GOOD, Ok(GOOD_VALUE, (BOM,)), Verdict),
    Row("BOM and fence", f"\ufeff```json\n{GOOD}\n```", Ok(GOOD_VALUE, (BOM, FENCE))),
    Row("top-level array", '[{"a": 1}, {"a": 2}]', Ok([{"a": 1}, {"a": 2}])),
    Row("scalar reply", '"just text"', Ok("just text")),
    Row("nested objects", '{"a": {"b": {"c": [1, {"d": null}]}}, "e": false}',
        Ok({"a": {"b": {"c": [1, {"d": None}]}}, "e": False})),
    # --- non-ASCII and escapes ----------------------------------------------------
    Row("chinese",
        '{"decision": "approve", "categories": ["新闻"], "summary": "这是一个测试"}',
        Ok({"decision": "approve", "categories": ["新闻"], "summary": "这是一个测试"}), Verdict),
    Row("emoji", '{"decision": "review", "categories": ["🚀"], "summary": "Looks good 👍🏽"}',
        Ok({"decision": "review", "categories": ["🚀"], "summary": "Looks good 👍🏽"}), Verdict),
    Row("escaped quotes and backslashes", r'{"s": "He said \"no\" \\ then \u00e9"}',
        Ok({"s": 'He said "no" \\ then é'})),
    # --- repaired by json_repair --------------------------------------------------
    Row("trailing commas",
        '{"decision": "reject", "categories": ["spam",], "summary": "ads",}',
        Ok({"decision": "reject", "categories": ["spam"], "summary": "ads"},
           ("json_repair: trailing commas",)), Verdict),
    Row("single quotes", "{'decision': 'review', 'categories': [], 'summary': \"it's ok\"}",
        Ok({"decision": "review", "categories": [], "summary": "it's ok"},
           ("json_repair: single quotes",)), Verdict),
    Row("unquoted keys", '{decision: "approve", categories: [], summary: "ok"}',
        Ok({"decision": "approve", "categories": [], "summary": "ok"},
           ("json_repair: unquoted keys",)), Verdict),
    Row("line comments", '{\n  // my verdict\n  "a": 1, // one\n  "b": 2\n}',
        Ok({"a": 1, "b": 2}, ("json_repair: comments",))),
    Row("block comments", '{"a": /* first */ 1, "b": [2 /* two */]}',
        Ok({"a": 1, "b": [2]}, ("json_repair: comments",))),
    Row("python literals", "{'ok': True, 'missing': None}",
        Ok({"ok": True, "missing": None}, ("json_repair: Python literals, single quotes",))),
    Row("several defects in fenced prose",
        "Here:\n```json\n{a: 'x', 'b': [1, 2,],}\n```",
        Ok({"a": "x", "b": [1, 2]},
           (FENCE, PROSE, "json_repair: single quotes, trailing commas, unquoted keys"))),
    Row("array with trailing comma in prose", "Results: [1, 2, 3,] done",
        Ok([1, 2, 3], (PROSE, "json_repair: trailing commas"))),
    Row("missing comma", '{"a": "x" "b": 1}',
        Ok({"a": "x", "b": 1}, ("json_repair: malformed JSON",))),
    Row("unquoted value with an apostrophe", "{a: don't}",
        Ok({"a": "don't"}, ("json_repair: unquoted keys, unquoted values",))),
    Row("mismatched brackets", '{"a": [1, 2}',
        Ok({"a": [1, 2]}, ("json_repair: mismatched brackets",))),
    # --- NaN / Infinity -----------------------------------------------------------
    Row("NaN", '{"score": NaN}', Rejected(errors=("NaN",))),
    Row("Infinity", '{"score": Infinity}', Rejected(errors=("NaN/Infinity",))),
    Row("-Infinity in array", "[1, -Infinity]", Rejected(errors=("NaN/Infinity",))),
    Row("lowercase nan needing repair", "{'score': nan}", Rejected(errors=("NaN/Infinity",))),
    Row("overflowing number", '{"score": 1e999}', Rejected(errors=("non-finite",))),
    # --- truncation -------------------------------------------------------------
    Row("truncated mid-string", '{"decision": "approve", "summary": "The document is',
        Rejected(truncated=True, errors=("unterminated string",)), Verdict),
    Row("truncated mid-object", '{"decision": "approve", "categories": ["a", "b"',
        Rejected(truncated=True, errors=("2 unclosed brackets",)), Verdict),
    Row("truncated inside a fence", 'Here you go:\n```json\n{"decision": "appr',
        Rejected(truncated=True, repairs=(FENCE, PROSE)), Verdict),
    Row("truncated inside a bare fence", '```\n{"decision": "appr',
        Rejected(truncated=True, repairs=(FENCE,)), Verdict),
    Row("truncated after a complete object", '{"a": 1}\nand the real one: {"a": 2, "b": [',
        Rejected(truncated=True, repairs=(PROSE,))),
    Row("truncated in a block comment", '{"a": 1 /* because', Rejected(truncated=True)),
    Row("finish_reason length with valid JSON", GOOD,
        Rejected(truncated=True, errors=("max_tokens",)), Verdict, "length"),
    Row("BOM then finish_reason length", "\ufeff" + GOOD,
        Rejected(truncated=True, repairs=(BOM,)), None, "length"),
    Row("incomplete JSON in a closed fence", '```json\n{"a": [1, 2\n```\nDone.',
        Rejected(truncated=False, errors=("line",), repairs=(FENCE, PROSE))),
    # --- nothing to parse ---------------------------------------------------------
    Row("empty string", "", Rejected(errors=("empty",))),
    Row("whitespace only", "  \n\t  ", Rejected(errors=("empty",))),
    Row("BOM only", "\ufeff", Rejected(errors=("empty",), repairs=(BOM,))),
    Row("plain prose", "I'm sorry, I cannot classify this document.",
        Rejected(errors=("no JSON object or array",))),
    Row("fence with no JSON", "```\nnothing here\n```", Rejected(errors=("no JSON",))),
    # --- validation against the pydantic model -----------------------------------
    Row("model: wrong enum value", '{"decision": "maybe", "categories": [], "summary": "x"}',
        Rejected(errors=("$.decision: Input should be 'approve', 'reject' or 'review'",)),
        Verdict),
    Row("model: missing required field", '{"decision": "approve", "categories": []}',
        Rejected(errors=("$.summary: Field required",)), Verdict),
    Row("model: wrong type", '{"decision": "approve", "categories": "spam", "summary": "x"}',
        Rejected(errors=("$.categories: Input should be a valid list",)), Verdict),
    Row("model: wrong item type", '{"decision": "approve", "categories": [1], "summary": "x"}',
        Rejected(errors=("$.categories[0]: Input should be a valid string",)), Verdict),
    Row("model: array instead of object", "[1, 2]", Rejected(errors=("$: Input should be",)),
        Verdict),
    Row("model: fenced and invalid", '```json\n{"decision": "approve"}\n```',
        Rejected(errors=("$.categories: Field required", "$.summary: Field required"),
                 repairs=(FENCE,)), Verdict),
    # --- validation against a JSON Schema dict -------------------------------------
    Row("schema: valid", f"```json\n{GOOD}\n```", Ok(GOOD_VALUE, (FENCE,)), VERDICT_SCHEMA),
    Row("schema: wrong enum value", '{"decision": "maybe", "categories": [], "summary": "x"}',
        Rejected(errors=("$.decision: 'maybe' is not one of ['approve', 'reject', 'review']",)),
        VERDICT_SCHEMA),
    Row("schema: missing required field", '{"decision": "approve", "categories": []}',
        Rejected(errors=("$: 'summary' is a required property",)), VERDICT_SCHEMA),
    Row("schema: wrong type", '{"decision": "approve", "categories": "spam", "summary": "x"}',
        Rejected(errors=("$.categories: 'spam' is not of type 'array'",)), VERDICT_SCHEMA),
    Row("schema: wrong item type", '{"decision": "approve", "categories": [1], "summary": "x"}',
        Rejected(errors=("$.categories[0]: 1 is not of type 'string'",)), VERDICT_SCHEMA),
]


def test_the_table_is_large_enough() -> None:
    assert len(ROWS) >= 30
    assert len({row.id for row in ROWS}) == len(ROWS)


@pytest.mark.parametrize("row", ROWS, ids=[row.id for row in ROWS])
def test_raw_model_output(row: Row) -> None:
    if isinstance(row.expect, Ok):
        parsed = parse_structured(row.text, row.target, finish_reason=row.finish_reason)
        _check_ok(parsed, row)
    else:
        with pytest.raises(StructuredOutputError) as caught:
            parse_structured(row.text, row.target, finish_reason=row.finish_reason)
        _check_rejected(caught.value, row)


def _check_ok(parsed: Parsed, row: Row) -> None:
    assert isinstance(row.expect, Ok)
    assert parsed.repairs == row.expect.repairs
    assert parsed.data == row.expect.value
    if isinstance(row.target, type):
        assert isinstance(parsed.value, row.target)
        assert parsed.value.model_dump() == row.expect.value
    else:
        assert parsed.value == row.expect.value


def _check_rejected(err: StructuredOutputError, row: Row) -> None:
    assert isinstance(row.expect, Rejected)
    assert err.raw == row.text
    assert err.truncated is row.expect.truncated
    assert err.repairs == list(row.expect.repairs)
    assert err.errors, "every rejection explains itself"
    for wanted in row.expect.errors:
        assert any(wanted in got for got in err.errors), (wanted, err.errors)
    assert "\n" not in str(err)


# --- the rest of the public contract -----------------------------------------------

def test_error_is_an_fsm_error_with_a_one_line_message() -> None:
    with pytest.raises(FsmError) as caught:
        parse_structured('{"decision": "maybe"}', Verdict)
    assert isinstance(caught.value, StructuredOutputError)
    assert str(caught.value).startswith("model output does not match Verdict: $.decision")
    assert "(and" not in str(caught.value)  # three problems are all shown


def test_validation_errors_list_every_problem() -> None:
    with pytest.raises(StructuredOutputError) as caught:
        parse_structured('{"decision": 3}', Verdict)
    assert caught.value.errors == [
        "$.decision: Input should be 'approve', 'reject' or 'review'",
        "$.categories: Field required",
        "$.summary: Field required",
    ]


def test_parsed_is_frozen() -> None:
    parsed = parse_structured("[1]")
    with pytest.raises(dataclasses.FrozenInstanceError):
        parsed.value = 2  # type: ignore[misc]


def test_value_and_data_differ_for_a_model() -> None:
    parsed = parse_structured(GOOD, Verdict)
    assert parsed.value == Verdict(**GOOD_VALUE)
    assert parsed.data == GOOD_VALUE and isinstance(parsed.data, dict)


def test_a_bad_target_is_a_caller_bug() -> None:
    with pytest.raises(TypeError):
        parse_structured(GOOD, int)  # type: ignore[arg-type]
    with pytest.raises(jsonschema.SchemaError):
        parse_structured(GOOD, {"type": 12})


def test_deep_nesting_is_rejected_not_crashed() -> None:
    text = "[" * 100_000 + "1," + "]" * 100_000  # json and json_repair both recurse
    with pytest.raises(StructuredOutputError) as caught:
        parse_structured(text)
    assert caught.value.raw == text
    assert caught.value.truncated is False
    assert caught.value.errors == ["model output nests deeper than 100 levels of containers"]


def test_nesting_up_to_the_cap_parses_one_more_level_is_refused() -> None:
    assert str(parse_structured("[" * 101 + "]" * 101).data) == "[" * 101 + "]" * 101
    with pytest.raises(StructuredOutputError, match="nests deeper than 100"):
        parse_structured('{"a": ' + "[" * 101 + "]" * 101 + "}")


def test_reask_after_validation_error_lists_problems_and_schema() -> None:
    with pytest.raises(StructuredOutputError) as caught:
        parse_structured('{"decision": "maybe", "categories": []}', Verdict)
    message = reask_message(caught.value, Verdict)
    assert "$.decision: Input should be 'approve', 'reject' or 'review'" in message
    assert "$.summary: Field required" in message
    assert "JSON Schema" in message
    schema_line = message.splitlines()[-1]
    assert json.loads(schema_line) == Verdict.model_json_schema()


def test_reask_after_truncation_asks_for_a_shorter_answer() -> None:
    with pytest.raises(StructuredOutputError) as caught:
        parse_structured(GOOD, VERDICT_SCHEMA, finish_reason="length")
    message = reask_message(caught.value, VERDICT_SCHEMA)
    assert "cut off" in message
    assert json.loads(message.splitlines()[-1]) == VERDICT_SCHEMA


def test_reask_without_target_asks_for_plain_json() -> None:
    with pytest.raises(StructuredOutputError) as caught:
        parse_structured("no idea")
    message = reask_message(caught.value, None)
    assert "the reply contains no JSON object or array" in message
    assert "single valid JSON object or array" in message
    assert "Schema" not in message


def test_reask_lists_at_most_ten_problems() -> None:
    schema = {"type": "object", "required": [f"k{i}" for i in range(15)]}
    with pytest.raises(StructuredOutputError) as caught:
        parse_structured("{}", schema)
    assert len(caught.value.errors) == 15
    assert "(and 12 more)" in str(caught.value)
    message = reask_message(caught.value, schema)
    assert sum(line.startswith("- ") for line in message.splitlines()) == 10
