"""The tool calls of a streamed OpenAI-compatible chat completion, put together from their
fragments (``choices[0].delta.tool_calls[i]``: ``index``, ``id``, ``function.name``,
``function.arguments``, each a piece of its call; a name sent again is not a piece more:
``_named``; the ``id`` is not kept: the journal numbers calls itself).  Hostile input:
shapes are checked, the calls counted (``MAX_CALLS``); the body's size cap (``llm.http``)
bounds their text.

Two forms come out of them:

- what a subscriber reads as the reply is written (``ToolDeltas.take``, ``close``): the
  agent protocol's text ``{"tool_calls": [{"name": NAME, "arguments": …}, …]}`` with each
  call's arguments as the model's fragments arrive (a call is shown once its name came;
  an event for a call before the one shown is kept, not shown);
- the reply itself (``ToolDeltas.text``), exactly what ``complete()`` makes of the same
  calls (``tool_transcript.calls_text``: each call's arguments parsed by the depth-checked
  ``json_input``, re-serialised; arguments that are not JSON kept as their text), so reply
  keys, the journal and the native transcript do not depend on whether a turn streamed.
  The two differ only in the arguments' spacing (and, for arguments that are not JSON, in
  their quoting): the stream shows what the model sent.
"""

from __future__ import annotations

import json
from typing import Any

from fsm_engine.errors import ServerError
from fsm_engine.llm.tool_transcript import calls_text

__all__ = ["ToolDeltas", "MAX_CALLS"]

#: Most tool calls one streamed reply may make (distinct ``index`` values).
MAX_CALLS = 128


def _named(pieces: list[str], name: str) -> None:
    """Note a delta's ``function.name`` in a call's name ``pieces``: OpenAI sends it once,
    in the call's first delta; llama.cpp's server again in every delta (the same name: not
    a piece more), some servers the name so far (a longer one: it replaces it)."""
    so_far = "".join(pieces)
    if name == so_far:
        return
    if so_far and name.startswith(so_far):
        pieces[:] = [name]
    else:
        pieces.append(name)


class ToolDeltas:
    """The tool calls of one streamed reply, by ``index`` (see the module doc); ``where``
    names the server in an error.  ``fragments``: the pieces noted (one token each, about,
    for a reply without usage)."""

    __slots__ = ("where", "calls", "shown", "opened", "shown_args", "fragments")

    def __init__(self, where: str) -> None:
        self.where = where
        #: index -> (name pieces, argument pieces), in the order the indexes came
        self.calls: dict[int, tuple[list[str], list[str]]] = {}
        self.shown: set[int] = set()  # calls whose opening was shown
        self.opened: int | None = None  # the call whose arguments the shown text is in
        self.shown_args = False  # some of that call's arguments were shown
        self.fragments = 0

    def take(self, deltas: Any, after_text: bool) -> str:
        """Note one event's ``delta.tool_calls`` (``after_text``: reply text came before);
        the text it adds to what subscribers read (``""``: none).  ``ServerError`` past
        ``MAX_CALLS`` calls."""
        if type(deltas) is not list:
            return ""
        out = []
        for delta in deltas:
            if type(delta) is not dict:
                continue
            index = delta.get("index")
            if type(index) is not int or index < 0:  # (a server that numbers nothing: one
                index = self.opened if self.opened is not None else 0  # call at a time)
            fn = delta.get("function")
            name = fn.get("name") if type(fn) is dict else None
            args = fn.get("arguments") if type(fn) is dict else None
            call = self.calls.get(index)
            if call is None:
                if len(self.calls) >= MAX_CALLS:
                    raise ServerError(f"{self.where} streamed more than {MAX_CALLS} tool calls")
                call = self.calls[index] = ([], [])
            if type(name) is str and name:
                _named(call[0], name)
            if type(args) is str and args:
                call[1].append(args)
                self.fragments += 1
            out.append(self._shown(index, call, args if type(args) is str else "", after_text))
        return "".join(out)

    def _shown(self, index: int, call: tuple[list[str], list[str]], args: str,
               after_text: bool) -> str:
        """What subscribers read of this delta of call ``index``."""
        if index == self.opened:
            self.shown_args = self.shown_args or bool(args)
            return args
        if index in self.shown or not call[0]:  # an earlier call, or no name yet: kept only
            return ""
        if self.opened is None:
            head = ("\n" if after_text else "") + '{"tool_calls": ['
        else:
            head = self._rest() + "}, "
        self.shown.add(index)
        self.opened = index
        so_far = "".join(call[1])
        self.shown_args = bool(so_far)
        return f'{head}{{"name": {json.dumps("".join(call[0]), ensure_ascii=False)}, ' \
               f'"arguments": {so_far}'

    def _rest(self) -> str:
        """What closes the shown call's arguments: ``{}`` when none were shown."""
        return "" if self.shown_args else "{}"

    def close(self) -> str:
        """The text that ends what subscribers read (``""``: no call was shown)."""
        return "" if self.opened is None else self._rest() + "}]}"

    def text(self) -> str | None:
        """The reply: ``complete()``'s text of these calls, in ``index`` order (``None``:
        no call)."""
        if not self.calls:
            return None
        return calls_text([("".join(name), "".join(args) or "{}")
                           for _, (name, args) in sorted(self.calls.items())])
