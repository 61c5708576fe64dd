"""A provider that replays canned replies: deterministic tests and demos without a model.

A script is a JSONL file, one reply per line (blank lines are skipped)::

    {"text": "{\\"ok\\": true}", "prompt_tokens": 12, "completion_tokens": 30}
    {"text": "cut", "prompt_tokens": 12, "completion_tokens": 64, "finish_reason": "length"}
    {"text": "", "delay_s": 0.2, "error": "http429", "retry_after": 0.05}

Keys: ``text`` (str), ``prompt_tokens``/``completion_tokens`` (int >= 0,
default 0), ``finish_reason`` (default ``"stop"``), ``delay_s`` (seconds to
sleep before answering), ``error`` (one of :data:`ERROR_KINDS`: raise that
:class:`~fsm_engine.errors.ProviderError`, carrying the line's token counts as
billed usage) and ``retry_after`` (seconds, for ``http429``).  Replies are
served in order and the script cycles when it runs out.

Tool calls (an agent state's turn, ``fsm_engine.definition.agent``)::

    {"tool_calls": [{"name": "grep", "arguments": {"pattern": "copyleft"}}]}

``tool_calls`` (a list of ``{"name": str, "arguments": object}``) is served as the text
``{"tool_calls": [...]}``, the agent protocol's form of several calls in one turn.

Streamed replies (``Provider.stream``): ``chunks`` (a list of strings; ``text`` may be left
out, else it must equal their concatenation) are yielded one by one, ``chunk_delay_s``
seconds apart (after ``delay_s``), or, with no ``chunk_delay_s``, together as one list (the
pieces of one network read; a step's ``async for`` still gets each); a line without
``chunks`` streams its ``text`` as one piece.  A line with both ``chunks`` and ``error``
yields its chunks, then raises: a reply cut mid-stream.

Keyed replies, so that concurrent instances each get theirs::

    {"match": "GNU GENERAL PUBLIC", "text": "{\"decision\": \"review\"}"}
    {"input": {"path": "/usr/share/common-licenses/MIT"}, "text": "..."}
    {"input": "Apache", "text": "..."}

``match`` is a substring of the call's messages (any role); ``input`` is either
an object whose every key must equal the calling instance's input value, or a
substring of that input's JSON.  A call takes the next reply of the first keyed
group (lines with the same ``match`` and ``input``, in file order, cycling) that
fits it; a call no keyed line fits takes the next unkeyed line; with no unkeyed
line it fails with ``ClientError`` (a mistake in the script, not a flaky model).
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fsm_engine import json_input
from fsm_engine.errors import (
    ClientError,
    InvalidInput,
    ProviderError,
    ProviderTimeout,
    ProviderUnavailable,
    RateLimited,
    ServerError,
)
from fsm_engine.llm.base import Completion, JsonSchema, Message, Piece, Provider

__all__ = ["Scripted", "Reply", "ERROR_KINDS", "LOG_ENV"]

#: When set, every call appends ``{start, end, tokens, pid}`` to this file (JSON lines).
LOG_ENV = "FSM_SCRIPTED_LOG"

ERROR_KINDS: dict[str, tuple[type[ProviderError], int | None]] = {
    "timeout": (ProviderTimeout, None),
    "unavailable": (ProviderUnavailable, None),
    "http429": (RateLimited, 429),
    "http500": (ServerError, 500),
    "http400": (ClientError, 400),
}
"""Script ``error`` values → (exception class, HTTP status)."""

_KEYS = {"text", "prompt_tokens", "completion_tokens", "finish_reason", "delay_s",
         "error", "retry_after", "match", "input", "tool_calls", "chunks", "chunk_delay_s"}


@dataclass(frozen=True, slots=True)
class Reply:
    """One validated script line (times in seconds, counts in tokens)."""

    text: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: str = "stop"
    delay_s: float = 0.0
    error: str | None = None
    retry_after: float | None = None
    match: str | None = None
    input: Any = None
    chunks: tuple[str, ...] | None = None
    chunk_delay_s: float = 0.0

    @property
    def keyed(self) -> bool:
        """True when the line only serves calls its ``match`` / ``input`` fit."""
        return self.match is not None or self.input is not None

    def fits(self, prompt: str, caller_input: dict[str, Any] | None) -> bool:
        """Whether this keyed line may answer a call with this prompt text and input."""
        if self.match is not None and self.match not in prompt:
            return False
        if self.input is None:
            return True
        if caller_input is None:
            return False
        if isinstance(self.input, dict):
            return all(caller_input.get(k) == v for k, v in self.input.items())
        return str(self.input) in json.dumps(caller_input, ensure_ascii=False)

    def exception(self, model: str) -> ProviderError:
        """The ProviderError this reply stands for (only when ``error`` is set)."""
        cls, status = ERROR_KINDS[self.error or ""]
        return cls(f"scripted {self.error} from model {model!r}", status=status,
                   retry_after=self.retry_after, prompt_tokens=self.prompt_tokens,
                   completion_tokens=self.completion_tokens)


def _check(obj: Any) -> Reply:
    """Validate one decoded line; raise ValueError naming the problem."""
    if not isinstance(obj, dict):
        raise ValueError(f"expected a JSON object, got {type(obj).__name__}")
    unknown = sorted(set(obj) - _KEYS)
    if unknown:
        raise ValueError(f"unknown key(s) {unknown}; allowed: {sorted(_KEYS)}")
    if "tool_calls" in obj:
        if "text" in obj:
            raise ValueError("'tool_calls' and 'text' exclude each other")
        obj = {k: v for k, v in obj.items() if k != "tool_calls"} | {
            "text": _tool_calls_text(obj["tool_calls"])}
    if "text" not in obj and "error" not in obj and "chunks" not in obj:
        raise ValueError("needs 'text' (or 'chunks', 'error' or 'tool_calls')")
    obj = _with_chunks(dict(obj))
    reply = Reply(**obj)
    _check_numbers(reply)
    _check_matching(reply)
    return reply


def _tool_calls_text(calls: Any) -> str:
    """A ``tool_calls`` line's list as the reply text ``{"tool_calls": [...]}``."""
    if not isinstance(calls, list) or not all(
            isinstance(c, dict) and isinstance(c.get("name"), str)
            and isinstance(c.get("arguments", {}), dict) and set(c) <= {"name", "arguments"}
            for c in calls):
        raise ValueError("'tool_calls' must be a list of {\"name\": str, \"arguments\": {...}}")
    return json.dumps({"tool_calls": calls}, ensure_ascii=False)


def _with_chunks(obj: dict[str, Any]) -> dict[str, Any]:
    """``obj`` with ``chunks`` as a tuple and ``text`` their concatenation; ValueError when
    they are not a list of strings or disagree with ``text``."""
    chunks = obj.get("chunks")
    if chunks is None:
        return obj
    if not isinstance(chunks, list) or not all(isinstance(c, str) for c in chunks):
        raise ValueError("'chunks' must be a list of strings")
    joined = "".join(chunks)
    if obj.setdefault("text", joined) != joined:
        raise ValueError("'text' must equal the concatenation of 'chunks' (or be left out)")
    obj["chunks"] = tuple(chunks)
    return obj


def _check_numbers(reply: Reply) -> None:
    """Text and finish reason are strings, token counts ints >= 0, delays seconds >= 0."""
    if not isinstance(reply.text, str) or not isinstance(reply.finish_reason, str):
        raise ValueError("'text' and 'finish_reason' must be strings")
    for key in ("prompt_tokens", "completion_tokens"):
        value = getattr(reply, key)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError(f"{key!r} must be an integer >= 0, got {value!r}")
    for key in ("delay_s", "retry_after", "chunk_delay_s"):
        value = getattr(reply, key)
        if value is not None and (not isinstance(value, (int, float)) or isinstance(value, bool)
                                  or not math.isfinite(value) or value < 0):
            raise ValueError(f"{key!r} must be a finite number of seconds >= 0, got {value!r}")


def _check_matching(reply: Reply) -> None:
    """The error kind is known; ``match`` and ``input`` have their shapes."""
    if reply.error is not None and reply.error not in ERROR_KINDS:
        raise ValueError(f"unknown error {reply.error!r}; expected one of {sorted(ERROR_KINDS)}")
    if reply.match is not None and (not isinstance(reply.match, str) or not reply.match):
        raise ValueError("'match' must be a non-empty string (a substring of the prompt)")
    if reply.input is not None and not isinstance(reply.input, (dict, str)):
        raise ValueError("'input' must be an object (keys the instance input must equal) "
                         "or a string (a substring of its JSON)")


def _load_jsonl(path: Path) -> list[Reply]:
    """Read and validate a script file; raise InvalidInput naming file and line."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise InvalidInput(f"cannot read script {str(path)!r}: {exc.strerror or exc}") from None
    replies = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        value = json_input.parse(line, f"{path}:{number}: bad script line")  # depth-checked
        try:
            replies.append(_check(value))
        except (ValueError, TypeError) as exc:
            raise InvalidInput(f"{path}:{number}: bad script line: {exc}") from None
    return replies


class Scripted(Provider):
    """Replay canned replies in order, cycling; safe to share between tasks and threads.

    ``calls`` counts calls served; ``requests`` keeps each call's messages.
    Raises the scripted :class:`~fsm_engine.errors.ProviderError` for error lines.
    """

    name = "scripted"

    def __init__(self, path: str | Path, *, model: str | None = None) -> None:
        path = Path(path)
        # (the model is the file's name: an ``llm_calls`` entry, a breaker or a header names
        # it ``scripted:FILE``, the provider's kind once)
        self._init(_load_jsonl(path), model or path.name, str(path))

    @classmethod
    def from_replies(cls, replies: list[dict[str, Any]], *, model: str = "scripted") -> Scripted:
        """Build from reply dicts (same keys as a script line); InvalidInput names the bad index."""
        checked = []
        for index, obj in enumerate(replies):
            try:
                checked.append(_check(obj))
            except (ValueError, TypeError) as exc:
                raise InvalidInput(f"scripted reply #{index}: {exc}") from None
        self = cls.__new__(cls)
        self._init(checked, model, "<replies>")
        return self

    def _init(self, replies: list[Reply], model: str, source: str) -> None:
        if not replies:
            raise InvalidInput(f"script {source!r} has no replies")
        self.model = model
        self.replies = tuple(replies)
        self.source = source
        self.calls = 0
        self.requests: list[list[Message]] = []
        self._lock = threading.Lock()
        #: replies grouped by their key (None: unkeyed), groups in first-seen order
        self._groups: dict[str | None, list[Reply]] = {}
        for reply in replies:
            key = json.dumps([reply.match, reply.input], sort_keys=True) if reply.keyed else None
            self._groups.setdefault(key, []).append(reply)
        self._cursor: dict[str | None, int] = {}

    def __repr__(self) -> str:
        return f"Scripted({self.source!r}, replies={len(self.replies)}, calls={self.calls})"

    def _next(self, messages: list[Message]) -> Reply:
        from fsm_engine.llm.base import CALLER_INPUT
        prompt = "\n".join(str(m.get("content", "")) for m in messages)
        caller = CALLER_INPUT.get()
        with self._lock:
            self.calls += 1
            self.requests.append(list(messages))
            for key, group in self._groups.items():
                if key is not None and group[0].fits(prompt, caller):
                    return self._take(key, group)
            if None in self._groups:
                return self._take(None, self._groups[None])
        raise ClientError(f"no scripted reply of {self.source!r} fits this call "
                          "(no keyed line matches and there is no unkeyed line)", status=400)

    def _take(self, key: str | None, group: list[Reply]) -> Reply:
        n = self._cursor.get(key, 0)
        self._cursor[key] = n + 1
        return group[n % len(group)]

    async def complete(self, messages: list[Message], *, max_tokens: int = 256,
                       temperature: float = 0.0, json_schema: JsonSchema | None = None,
                       stop: list[str] | None = None) -> Completion:
        """Serve the next scripted reply after its ``delay_s`` (seconds); parameters are ignored.

        Raises the line's ProviderError when it has an ``error``.
        """
        reply = self._next(messages)
        start = time.time()
        if reply.delay_s:
            await asyncio.sleep(reply.delay_s)
        self._log(start, reply)
        if reply.error:
            raise reply.exception(self.model)
        return Completion(reply.text, reply.prompt_tokens, reply.completion_tokens,
                          reply.finish_reason, self.model)

    async def stream(self, messages: list[Message], *, max_tokens: int = 256,
                     temperature: float = 0.0, json_schema: JsonSchema | None = None,
                     stop: list[str] | None = None) -> AsyncIterator[Piece]:
        """The next scripted reply as pieces: its ``chunks`` (``chunk_delay_s`` apart, after
        ``delay_s``: each a ``str``; with no ``chunk_delay_s`` they arrive together, one
        ``list``, as the events of one network read do; else its ``text`` as one piece),
        then its ``Completion``; a line with an ``error`` raises it after its chunks."""
        reply = self._next(messages)
        start = time.time()
        if reply.delay_s:
            await asyncio.sleep(reply.delay_s)
        chunks = reply.chunks
        if chunks is None:
            if reply.text and not reply.error:
                yield reply.text
        elif not reply.chunk_delay_s:
            got = [c for c in chunks if c]
            if got:
                yield got if len(got) > 1 else got[0]
        else:
            for n, piece in enumerate(chunks):
                if n:
                    await asyncio.sleep(reply.chunk_delay_s)
                if piece:
                    yield piece
        self._log(start, reply)
        if reply.error:
            raise reply.exception(self.model)
        yield Completion(reply.text, reply.prompt_tokens, reply.completion_tokens,
                         reply.finish_reason, self.model)

    def _log(self, start: float, reply: Reply) -> None:
        """One JSON line per call in ``$FSM_SCRIPTED_LOG`` when set (tests of shared limits
        read it): ``{start, end, tokens, pid, input}`` (epoch seconds; tokens billed; the
        calling instance's input)."""
        path = os.environ.get(LOG_ENV)
        if not path:
            return
        from fsm_engine.llm.base import CALLER_INPUT
        line = json.dumps({"start": start, "end": time.time(), "pid": os.getpid(),
                           "tokens": reply.prompt_tokens + reply.completion_tokens,
                           "input": CALLER_INPUT.get()}, default=str) + "\n"
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:  # one write of a short line with O_APPEND: processes never interleave
            os.write(fd, line.encode())
        finally:
            os.close(fd)
