"""JSON from outside — a console form's field, a ``--set`` value, an ``--edit`` /
``--json-file`` / ``--input`` file — read by one bounded parser.

:func:`parse` checks the nesting depth *before* parsing, by a scan that recurses
nowhere (strings are skipped whole, so brackets inside them do not count): a document
nesting deeper than ``MAX_DEPTH`` levels below its top-level value is refused with
``InvalidInput`` in one line, where ``json.loads`` would end in a ``RecursionError``
(a 15 KB document 5,000 deep is enough).  Every fault is ``InvalidInput`` naming what
was read.  Nothing here
imports the runtime: the CLI's light commands use it too.
"""

from __future__ import annotations

import json
import re
from typing import Any

from .errors import InvalidInput

__all__ = ["MAX_DEPTH", "parse", "parse_object", "check_depth"]

#: Most levels of containers (dicts, lists) inside one value (``runtime.values`` refuses
#: a deeper context value the same way).
MAX_DEPTH = 100

#: A JSON string (skipped whole) or a bracket.
_TOKEN = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]')


def check_depth(text: str, what: str) -> None:
    """``InvalidInput`` when ``text`` nests containers more than ``MAX_DEPTH`` levels below
    its top-level value (``MAX_DEPTH + 1`` brackets deep); linear time, no recursion."""
    depth = 0
    for match in _TOKEN.finditer(text):
        token = match.group()
        if token == "[" or token == "{":
            depth += 1
            if depth > MAX_DEPTH + 1:
                raise InvalidInput(f"{what}: nests deeper than {MAX_DEPTH} levels of "
                                   "containers")
        elif token == "]" or token == "}":
            depth -= 1


def parse(text: str | bytes, what: str) -> Any:
    """``text`` as a JSON value, depth-checked first (``check_depth``); ``InvalidInput``
    (one line naming ``what``) for anything else.  ``NaN``/``Infinity`` tokens are read
    as Python reads them: where the value goes, ``runtime.values`` refuses them naming
    their field."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidInput(f"{what}: not UTF-8 text") from None
    check_depth(text, what)
    try:
        return json.loads(text)
    except RecursionError:  # (cannot happen after check_depth; kept as the last guard)
        raise InvalidInput(f"{what}: nests too deep") from None
    except ValueError as exc:
        raise InvalidInput(f"{what}: not valid JSON ({str(exc)[:200]})") from None


def parse_object(text: str | bytes, what: str) -> dict[str, Any]:
    """``parse(text, what)`` when it is a JSON object; ``InvalidInput`` else."""
    value = parse(text, what)
    if not isinstance(value, dict):
        raise InvalidInput(f"{what} must be a JSON object")
    return value
