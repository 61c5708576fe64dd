"""The one bounded JSON parser of every door (issue 36, item 11): a document deeper than
the cap is refused before ``json.loads`` recurses, brackets inside strings do not count,
and every fault is one ``InvalidInput``."""

from __future__ import annotations

import pytest

from fsm_engine.errors import InvalidInput
from fsm_engine.json_input import MAX_DEPTH, parse, parse_object


def test_depth_is_checked_before_parsing_and_strings_do_not_count() -> None:
    deep = "[" * 5000 + "]" * 5000
    with pytest.raises(InvalidInput, match="nests deeper than 100 levels"):
        parse(deep, "update")
    at_cap = "[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1)
    assert parse(at_cap, "update") is not None
    brackets = '{"a": "' + "[{" * 5000 + '\\"[", "b": [1]}'
    assert parse(brackets, "update")["b"] == [1]


def test_every_fault_is_one_invalid_input() -> None:
    for text, what in (("{", "not valid JSON"), (b"\xff", "not UTF-8"), ("[1]", "object")):
        with pytest.raises(InvalidInput, match=what):
            parse_object(text, "the edit")
