"""Stored text on the terminal is text (issue 19, finding 10): no markup is parsed, no
control sequence reaches the terminal.  Hostile values in every printed field of
``fsm list``, ``fsm history``, ``fsm show``, ``fsm stats``, ``fsm outbox`` and in error
lines, through the real CLI in a subprocess, on both backends."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from dataclasses import replace

import pytest

from fsm_engine.store import StepCommit, open_store
from fsm_engine.store.records import AttemptRow
from fsm_engine.testing.contract import hist, moved, record
from fsm_engine.testing.contract_reviews import item

ENTRY = [sys.executable, "-m", "fsm_engine.cli"]
#: Markup that crashed rich ([/oops]) or became a link, an OSC 8 hyperlink, a colour, a
#: C1 CSI that clears the screen, DEL and a bell.
HOSTILE = ("[/oops] [link=https://evil.example/]click[/link] [bold]b "
           "\x1b]8;;https://evil.example/\x07L\x1b]8;;\x07 \x1b[31mred\x1b[0m \x9b2J \x7f \x07 "
           ":smile: \u202egnp.exe\u202c \u2066iso\u2069 \u200f\u061c")  # bidi controls too
#: The bidirectional controls that reorder what a terminal shows (U+202E makes
#: ``gnp.exe`` read ``exe.png``).
BIDI = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")
HID = "h[/oops]\x1b[2J"  # an instance id with markup and an escape in it


def _fleet(url: str) -> None:
    store = open_store(url)
    try:
        rec = record(HID, machine="m" + HOSTILE, state="start")
        rec.context = {"note": HOSTILE, HOSTILE: 1}
        rec.input = {"text": HOSTILE}
        store.create(rec)
        rows = [hist(HID, 1, "start", "s" + HOSTILE, error="e" + HOSTILE, reason="r" + HOSTILE,
                     guards=[["g" + HOSTILE, True]], detail={"raw": HOSTILE},
                     delta={"note": HOSTILE})]
        new = replace(rec, state="s" + HOSTILE, status="failed", reason="r" + HOSTILE,
                      last_error="LLM server said: " + HOSTILE, seq=1, loop_count=1,
                      updated_at=1100.0)
        store.commit([StepCommit(new, 0, rows, attempt=AttemptRow(
            HID, "start", 1, 1, "ServerError", "a" + HOSTILE, 3, None, 1001.0))])
        store.outbox_begin("k" + HOSTILE, HID, "s" + HOSTILE, 1, 1001.0)
        store.create(record("rv", machine="m" + HOSTILE))
        waiting = moved(store.get("rv"), "review", status="waiting")
        review = replace(item("rv", "item1"), prompt="p" + HOSTILE, show={"s": HOSTILE, HOSTILE: 1},
                         choices=["approve", "c" + HOSTILE], state="review" + HOSTILE)
        store.commit([StepCommit(waiting, 0, [hist("rv", 1, "start", "review")],
                                 review_open=review)])
        store.create(record("rw"))
        decided = replace(item("rw", "item2"), status="decided", choice="c" + HOSTILE,
                          decided_by="d" + HOSTILE, decided_at=1003.0)
        store.commit([StepCommit(moved(store.get("rw"), "review", status="waiting"), 0,
                                 [hist("rw", 1, "start", "review")], review_open=decided)])
    finally:
        store.close()


def _fsm(*args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([*ENTRY, *args], capture_output=True, timeout=120,
                          env={**os.environ, "COLUMNS": "400"})


def _clean(got: subprocess.CompletedProcess[bytes], code: int = 0) -> str:
    out, err = got.stdout, got.stderr
    assert got.returncode == code, (got.returncode, out[-2000:], err[-2000:])
    for stream in (out, err):
        assert b"\x1b" not in stream and b"\x07" not in stream and b"\x7f" not in stream
        assert b"\xc2\x9b" not in stream  # C1 CSI as UTF-8
        assert b"Traceback" not in stream
    text = (out + err).decode("utf-8")
    assert not BIDI.intersection(text), "a raw bidi control reached the terminal"
    return text


@pytest.fixture
def url(store_url: str) -> str:
    _fleet(store_url)
    return store_url


@pytest.mark.parametrize("command", [["list"], ["list", "--wide"], ["history", "h"],
                                     ["show", "h"], ["stats"], ["outbox"], ["review", "list"],
                                     ["review", "show", "item1"]],
                         ids=lambda c: "-".join(c))
def test_hostile_values_print_as_text(url: str, command: list[str]) -> None:
    text = _clean(_fsm(*command, "--db", url))
    assert "[/oops]" in text  # printed as it is: not parsed (and no crash)
    assert "\\x1b" in text or "\\x9b" in text


@pytest.mark.parametrize("command", [["list", "--json"], ["history", "h", "--json"],
                                     ["show", "h", "--json"], ["stats", "--json"],
                                     ["review", "show", "item1", "--json"]],
                         ids=lambda c: "-".join(c))
def test_json_output_is_valid_and_has_no_raw_controls(url: str, command: list[str]) -> None:
    text = _clean(_fsm(*command, "--db", url))
    data = json.loads(text)
    assert any(HOSTILE in s for s in _strings(data))  # the same values, escaped


def _strings(value: object) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in (*_strings(k), *_strings(v))]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


def test_error_line_naming_stored_text_is_one_clean_line(url: str) -> None:
    """A refused claim names the item's stored decision in its error line."""
    text = _clean(_fsm("review", "claim", "item2", "--as", "ann", "--db", url), code=2)
    assert text.startswith("fsm: error: ") and text.count("\n") == 1, text
    assert "[/oops]" in text and "\\x1b" in text


def test_helpers_escape_every_control() -> None:
    from fsm_engine.terminal import SafeFormatter, console, json_text, shown
    assert shown("a\nb\tc\x1b[0m\x9b\x7f\x00\udcff") == "a\nb\tc\\x1b[0m\\x9b\\x7f\\x00\\udcff"
    assert json.loads(json_text(json.dumps("\x9b\x7f\u2028", ensure_ascii=False))) == \
        "\x9b\x7f\u2028"
    import io
    buf = io.StringIO()
    out = console(file=buf, force_terminal=False, width=200)
    out.print("[/oops] [link=x]y[/link] :smile: \x1b[31m")
    assert buf.getvalue() == "[/oops] [link=x]y[/link] :smile: \\x1b[31m\n"
    record_ = logging.LogRecord("x", logging.WARNING, __file__, 1, "bad %s", (HOSTILE,), None)
    line = SafeFormatter("%(message)s").format(record_)
    assert "\x1b" not in line and "\x9b" not in line and "[/oops]" in line
    assert not BIDI.intersection(line + shown(HOSTILE) + json_text(json.dumps(HOSTILE, ensure_ascii=False)))
    assert shown("a\u202eb") == "a\\u202eb"
    assert json.loads(json_text(json.dumps("\u202e", ensure_ascii=False))) == "\u202e"


LOGS = '''
import logging

from pydantic import BaseModel

from fsm_engine import Machine, State, Transition, fire


class C(BaseModel):
    note: str = ""


def go(ctx, step):
    logging.getLogger("fsm_engine.x").warning("seen %s api_key=SECRET-9", HOSTILE)
    return fire("next")

machine = Machine(name="logs", initial="go", context=C, states=[State("go", action=go),
                  State("done", final=True)], transitions=[Transition("next", "go", "done")])
'''


def test_log_lines_of_a_run_are_redacted_and_escaped(tmp_path) -> None:  # type: ignore[no-untyped-def]
    module = tmp_path / "logs.py"
    module.write_text(f"HOSTILE = {HOSTILE!r}\n" + LOGS)
    (tmp_path / "in.json").write_text("{}")
    (tmp_path / "r.jsonl").write_text('{"text": "x"}\n')
    got = _fsm("run", str(module), "--input", str(tmp_path / "in.json"), "--db",
               str(tmp_path / "fsm.db"), "--llm", f"scripted:{tmp_path / 'r.jsonl'}", "-q")
    text = _clean(got)
    assert "seen [/oops]" in text and "SECRET-9" not in text
