"""Check that a JSON repair fixed only syntax: every value of the reply kept its type and
meaning (``structured`` refuses a repair this finds fault with).

Both sides are read as a stream of *events*, each with its nesting depth: an object or
an array opening, a key, a scalar.  The reply's text is tokenised the way
``structured._scan`` reads it (strings in double or single quotes, comments skipped,
a run of bare words between structural tokens is one unquoted value); the repaired value
is walked in order.  The streams must be equal, with only these conversions counted as
syntax:

- single-quoted strings and unquoted keys/values are strings (``'x'``, ``x``, ``don't``);
- Python's ``True``/``False``/``None`` are ``true``/``false``/``null``;
- a bare ``...``/``…`` (a truncation marker) stands for nothing;
- commas, colons, comments and whitespace carry no value; a closing bracket of the
  wrong kind closes the nearest opener of its kind (as ``_scan`` reads it).

Everything else is a change of value: a Python set ``{'a', 'b'}`` (an object without keys)
read as a list, ``0x1F``/``017``/``1_000`` (not JSON numbers) read as a string or another
number, a duplicate key whose first value was dropped, a string with an unbalanced quote
read with the quote inside, an expression ``1 + 2`` read as ``1``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

__all__ = ["TOKEN", "repair_changes"]

#: The tokens of a JSON-like text (``structured._scan`` and this check read it alike).
#: A ' opens a string only where a key or value may start (so "it's" is no string).
TOKEN = re.compile(r"""
    (?P<dstr>"[^"\\]*(?:\\.[^"\\]*)*")  | (?P<dopen>")
  | (?P<sstr>(?<=[{\[,:])\s*'[^'\\]*(?:\\.[^'\\]*)*')  | (?P<sopen>(?<=[{\[,:])\s*')
  | (?P<lcomment>//[^\n]*)  | (?P<bcomment>/\*.*?\*/)  | (?P<bopen>/\*)
  | (?P<open>[{\[])  | (?P<close>[}\]])  | (?P<comma>,)  | (?P<colon>:)
  | (?P<num>-?\d[\w.+-]*)  | (?P<word>-?[A-Za-z_$][\w$]*)
  | (?P<ws>\s+)  | (?P<other>.)
""", re.VERBOSE | re.DOTALL)

#: (depth, kind, value, path): kind "{", "[", "key", or the scalar's type name.
Event = tuple[int, str, Any, str]

_NUMBER = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?")
_NUMERIC = re.compile(r"[+-]?\.?\d")
_LITERALS = {"true": True, "false": False, "null": None,
             "True": True, "False": False, "None": None}
_ELLIPSIS = re.compile(r"(?:\.{3,}|…)")
_SINGLE_ESCAPE = re.compile(r"\\(.)|\"", re.DOTALL)
_UNDECODABLE = "undecodable"
_NOT_NUMBER = "not a JSON number"


def repair_changes(source: str, repaired: Any) -> str | None:
    """``None`` when ``repaired`` (json_repair's value for ``source``) holds exactly the
    values ``source`` writes, else one line naming the first change
    (``"$.tags: an object's value 'a' became a list"``)."""
    theirs = list(_repaired_events(repaired))
    mine = list(_source_events(source))
    for ours, got in zip(mine, theirs, strict=False):
        if ours[:3] != got[:3]:
            return f"{got[3]}: {_show(ours)} became {_show(got)}"
    if len(mine) != len(theirs):
        extra = (mine if len(mine) > len(theirs) else theirs)[min(len(mine), len(theirs))]
        lost = len(mine) > len(theirs)
        return f"{extra[3]}: {_show(extra)} was {'dropped' if lost else 'added'}"
    return None


def _show(event: Event) -> str:
    depth, kind, value, _ = event
    if kind in ("{", "["):
        return "an object" if kind == "{" else "a list"
    if kind == "key":
        return f"the key {value!r}"
    if kind in (_UNDECODABLE, _NOT_NUMBER):
        return f"{value!r} ({kind})"
    return f"the {kind} {json.dumps(value)[:60]}"


# --- the repaired value -----------------------------------------------------------

def _repaired_events(data: Any) -> Iterator[Event]:
    """``data``'s events in document order (iterative: any depth)."""
    todo: list[tuple[int, Any, str]] = [(0, data, "$")]
    while todo:
        depth, item, path = todo.pop()
        if isinstance(item, dict):
            yield depth, "{", None, path
            for key, value in reversed(list(item.items())):
                todo.append((depth + 1, value, f"{path}.{key}"))
                todo.append((depth + 1, _Key(key), f"{path}.{key}"))
        elif isinstance(item, list):
            yield depth, "[", None, path
            todo.extend((depth + 1, value, f"{path}[{i}]")
                        for i, value in reversed(list(enumerate(item))))
        elif isinstance(item, _Key):
            yield depth, "key", item.name, path
        else:
            yield depth, _kind(item), item, path


class _Key:
    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__


# --- the reply's text -------------------------------------------------------------

class _Reader:
    """Events of a reply's JSON-like text, read token by token."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.stack: list[str] = []
        self.events: list[Event] = []
        self.bare: tuple[int, int] | None = None  # the unquoted run being read

    def scalar(self, kind: str, value: Any) -> None:
        self.events.append((len(self.stack), kind, value, "$"))

    def flush(self) -> None:
        if self.bare is None:
            return
        raw = self.text[self.bare[0]:self.bare[1]].strip()
        self.bare = None
        if not _ELLIPSIS.fullmatch(raw):
            self.scalar(*_bare(raw))

    def colon(self) -> None:
        self.flush()
        if self.events and self.events[-1][1] not in ("{", "[", "key"):
            depth, kind, value, path = self.events.pop()
            name = value if kind == "str" else self._raw_key(value)
            self.events.append((depth, "key", name, path))

    @staticmethod
    def _raw_key(value: Any) -> str:
        return value if isinstance(value, str) else json.dumps(value)

    def close(self, closer: str) -> None:
        self.flush()
        opener = "{" if closer == "}" else "["
        if opener in self.stack:
            while self.stack.pop() != opener:
                pass


def _source_events(text: str) -> list[Event]:
    reader = _Reader(text)
    for tok in TOKEN.finditer(text):
        kind = tok.lastgroup or "other"
        if kind in ("word", "num", "other"):
            start = tok.start() if reader.bare is None else reader.bare[0]
            reader.bare = (start, tok.end())
        elif kind != "ws":
            _structural(reader, kind, tok.group())
    reader.flush()
    return reader.events


def _structural(reader: _Reader, kind: str, raw: str) -> None:
    if kind == "colon":
        return reader.colon()
    reader.flush()
    if kind == "open":
        reader.events.append((len(reader.stack), raw, None, "$"))
        reader.stack.append(raw)
    elif kind == "close":
        reader.close(raw)
    elif kind in ("dstr", "sstr"):
        reader.scalar(*_string(raw.strip()))


def _string(raw: str) -> tuple[str, Any]:
    """A quoted string's (kind, value): ``'…'`` read as ``"…"`` with ``\\'`` as ``'``."""
    if raw.startswith("'"):
        raw = '"' + _SINGLE_ESCAPE.sub(_requote, raw[1:-1]) + '"'
    try:
        return "str", json.loads(raw, strict=False)
    except ValueError:
        return _UNDECODABLE, raw


def _requote(match: re.Match[str]) -> str:
    escaped = match.group(1)
    if escaped is None:
        return '\\"'
    return "'" if escaped == "'" else match.group(0)


def _bare(raw: str) -> tuple[str, Any]:
    """An unquoted run's (kind, value): a JSON literal or number, or a string."""
    if raw in _LITERALS:
        value = _LITERALS[raw]
        return _kind(value), value
    if _NUMBER.fullmatch(raw):
        value = json.loads(raw)
        return _kind(value), value
    if _NUMERIC.match(raw):
        return _NOT_NUMBER, raw
    return "str", raw
