"""Stored text on the terminal as text: never markup, never control sequences.

Every value the CLI prints may come from a model, an HTTP peer or whoever wrote the
database, so:

- :func:`shown` escapes the characters a terminal acts on — C0 controls except
  ``\\n`` and ``\\t``, ESC, DEL and the C1 range (``\\x1b`` becomes the four
  characters ``\\x1b``), the bidirectional controls that reorder what it shows
  (U+202E becomes ``\\u202e``) — and lone surrogates (``\\udcXX``);
- :func:`console` is a rich ``Console`` that parses no markup (``[/oops]`` and
  ``[link=…]`` are printed as they are), no emoji codes and highlights nothing, and
  passes every string it renders (``print``, table cells, titles) through
  :func:`shown`; build ``Text`` objects with :func:`text`;
- :func:`json_text` makes printed JSON safe the same way while keeping it valid JSON
  (``\\u009b`` escapes);
- :class:`SafeFormatter` does it for log lines, after :func:`fsm_engine.redaction.redact`.
"""

from __future__ import annotations

import logging
import re
from typing import IO, Any

from rich.console import Console
from rich.style import Style
from rich.text import Text

from .redaction import redact

__all__ = ["shown", "text", "console", "json_text", "SafeFormatter", "error_line",
           "safe_logging"]

#: The bidirectional controls (ALM, LRM, RLM, the embeddings, overrides and isolates):
#: shown raw they reorder the text around them (U+202E makes ``gnp.exe`` read ``exe.png``).
_BIDI = "\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"
_CONTROL = re.compile(rf"[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029{_BIDI}]")
_JSON_CONTROL = re.compile(rf"[\x7f-\x9f\u2028\u2029{_BIDI}]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group(0))
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def shown(value: object) -> str:
    """``str(value)`` safe for a terminal (see the module doc); any UTF-8 stream takes it."""
    raw = value if isinstance(value, str) else str(value)
    raw = raw.encode("utf-8", "backslashreplace").decode("utf-8")
    return _CONTROL.sub(_escape, raw)


def text(value: object, style: str | Style = "") -> Text:
    """A rich ``Text`` of ``shown(value)``: no markup is parsed in it."""
    return Text(shown(value), style=style)


def json_text(dumped: str) -> str:
    """JSON text (from ``json.dumps``) with DEL, C1 and lone surrogates as ``\\uXXXX``
    escapes: still valid JSON, the same values, nothing a terminal acts on."""
    raw = dumped.encode("utf-8", "backslashreplace").decode("utf-8")
    return _JSON_CONTROL.sub(lambda m: f"\\u{ord(m.group(0)):04x}", raw)


def error_line(message: object) -> str:
    """``fsm: error: MESSAGE`` with credentials redacted and controls escaped."""
    return "fsm: error: " + shown(redact(message))


class SafeConsole(Console):
    """A ``Console`` whose strings are rendered through :func:`shown`, markup off."""

    def render_str(self, text: str, **kwargs: Any) -> Text:
        kwargs["markup"] = False
        kwargs["emoji"] = False
        return super().render_str(shown(text), **kwargs)


def console(*, stderr: bool = False, file: IO[str] | None = None, **kwargs: Any) -> Console:
    """The CLI's console: no markup, no emoji, no highlighting, strings shown safely."""
    return SafeConsole(stderr=stderr, file=file, markup=False, emoji=False, highlight=False,
                       **kwargs)


class SafeFormatter(logging.Formatter):
    """A log formatter whose lines carry no credential and no control sequence."""

    def format(self, record: logging.LogRecord) -> str:
        return shown(redact(super().format(record)))


def safe_logging(fmt: str = "%(message)s", level: int = logging.WARNING) -> None:
    """Log ``level`` and above to stderr through :class:`SafeFormatter` (replacing any
    handler the root logger has): what Python would print by itself, made safe."""
    import sys
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(SafeFormatter(fmt))
    logging.basicConfig(level=level, handlers=[handler], force=True)
