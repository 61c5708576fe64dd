"""A stored stream row's ``info`` is hostile (issue 37): ``streams.decode`` reads the rows
before a malformed one and names the first one in one ``StoreError`` line."""

from __future__ import annotations

import json
from typing import Any

import pytest

from fsm_engine.errors import StoreError
from fsm_engine.store import streams


def _row(pos: int, info: Any, kind: str = "superseded") -> tuple[Any, ...]:
    return ("i", pos, 1, 1, kind, 0, "", info, 2.5)


def test_an_info_reads_back_whole() -> None:
    info = {"by": [3, 2], "finish": "stop", "junk": {"a": [1, None]}}
    [row, opened] = streams.decode([_row(0, json.dumps(info)), _row(1, "{}", "open")])
    assert row.info == info and isinstance(row.info["by"], list) and opened.info == {}


@pytest.mark.parametrize(("info", "why"), [
    (None, "info is not a JSON object"), ("", "info is not a JSON object"),
    ("{", "info is not a JSON object"), ("[1, 2]", "info is not a JSON object"),
    ('"x"', "info is not a JSON object"), (b"{}", "info is not a JSON object"),
    ('{"by": [[1], 2]}', 'by [[1], 2] is not [seq, attempt]'),
    ('{"by": [1]}', "by [1] is not [seq, attempt]"),
    ('{"by": [1, 2, 3]}', "by [1, 2, 3] is not [seq, attempt]"),
    ('{"by": [1, -2]}', "by [1, -2] is not [seq, attempt]"),
    ('{"by": [1, true]}', "by [1, true] is not [seq, attempt]"),
    ('{"by": [1.0, 2]}', "by [1.0, 2] is not [seq, attempt]"),
    ('{"by": "1,2"}', 'by "1,2" is not [seq, attempt]'),
    ('{"by": {"seq": 1}}', 'by {"seq": 1} is not [seq, attempt]'),
])
def test_a_malformed_info_is_named_after_the_rows_before_it(info: Any, why: str) -> None:
    good = _row(0, '{"by": null}')
    assert [r.pos for r in streams.decode([good, _row(1, info)])] == [0]
    with pytest.raises(StoreError) as err:
        streams.decode([_row(7, info), good])
    assert str(err.value) == f"instance i: stream row 7 is malformed: {why}"
