"""One grammar for durations (fsm_engine.durations): what every flag taking one reads."""

import pytest

from fsm_engine.cli.observe import parse_age
from fsm_engine.durations import parse_duration
from fsm_engine.errors import InvalidInput
from fsm_engine.runtime.schedule_spec import parse_every


@pytest.mark.parametrize(("text", "seconds"), [
    ("45s", 45.0), ("500ms", 0.5), ("1.5h", 5400.0), ("1h30m", 5400.0), ("2w", 1209600.0),
    ("30d", 2592000.0), (" 1H 30M ", 5400.0), ("0s", 0.0)])
def test_a_duration_reads_as_its_seconds(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "soon", "-5s", "5", "5x", "s5", "1h30", "1e3s", "nan s"])
def test_what_is_not_a_duration_reads_as_none(text: str) -> None:
    assert parse_duration(text) is None


def test_an_age_and_an_interval_read_the_same_grammar() -> None:
    for text in ("90m", "1h30m", "2w", "500ms"):
        assert parse_age(text) == pytest.approx(parse_every(text))
    with pytest.raises(InvalidInput, match="cannot read duration 'soon'"):
        parse_age("soon")
    with pytest.raises(InvalidInput, match="--every 'soon': expected a duration"):
        parse_every("soon")
