"""The reply cache of model calls (``State(cache=CachePolicy(ttl_s=…))``), in the store.

A call's key is SHA-256 of its provider name, model, messages and parameters
(``max_tokens``, ``temperature``, ``json_schema`` …; a per-call ``timeout`` is
left out); nothing else (no API key, base URL or header) goes into it.  Only
successful replies that were not cut at ``max_tokens`` are stored.

Every successful call also records its key and reply text in its history row's
``llm_calls`` entry (``key``, ``reply``), in the step's own commit: no extra
write.  A fork made with ``reuse_llm`` reads them back from its original's
history (``RecordedReplies``), whatever cache policy the state had.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..errors import FsmError, StoreError
from ..store import details
from ..store.records import ReplyRow

log = logging.getLogger("fsm_engine")

if TYPE_CHECKING:
    from ..llm.base import Completion
    from ..store.base import Store

#: Call parameters that do not change the answer (left out of the key).
_NOT_IN_KEY = frozenset({"timeout"})


def reply_key(provider: Any, messages: list[dict[str, str]], params: dict[str, Any]) -> str:
    """The cache key of a call (64 hex digits)."""
    doc = {"provider": getattr(provider, "name", "llm"), "model": getattr(provider, "model", None),
           "messages": messages,
           "params": {k: v for k, v in params.items() if k not in _NOT_IN_KEY}}
    blob = json.dumps(doc, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


class ReplyCache:
    """Reads and writes one state's cached replies (``ttl_s`` seconds old at most)."""

    def __init__(self, store: Store, ttl_s: float, clock: Callable[[], float]) -> None:
        self.store, self.ttl_s, self.clock = store, ttl_s, clock

    def get(self, key: str) -> Completion | None:
        """The cached answer under ``key`` (0 tokens billed), or None."""
        from ..llm.base import Completion
        try:
            row = self.store.get_reply(key, self.clock() - self.ttl_s)
        except StoreError as exc:  # the cache is an optimisation: a store fault is a miss
            log.warning("reply cache unreadable, calling the model: %s", exc)
            return None
        if row is None:
            return None
        return Completion(text=row.text, prompt_tokens=0, completion_tokens=0,
                          finish_reason=row.finish_reason, model=row.model)

    def put(self, key: str, provider: Any, out: Completion) -> None:
        """Store a successful answer (not one cut at ``max_tokens``)."""
        if out.finish_reason == "length":
            return
        try:
            self.store.put_reply(ReplyRow(key=key, provider=getattr(provider, "name", "llm"),
                                          model=out.model, text=out.text,
                                          finish_reason=out.finish_reason,
                                          created_at=self.clock()))
        except StoreError as exc:  # never lose the model's answer over a cache write
            log.warning("reply cache write dropped: %s", exc)


class RecordedReplies:
    """The replies recorded in one instance's history (``llm_calls`` entries with a
    ``key`` and a ``reply``), by key; read once, on the first lookup."""

    def __init__(self, store: Store, instance_id: str) -> None:
        self.store, self.instance_id = store, instance_id
        self._by_key: dict[str, Completion] | None = None

    def _load(self) -> dict[str, Completion]:
        from ..llm.base import Completion
        found: dict[str, Completion] = {}
        try:
            rows = self.store.history(self.instance_id)
        except FsmError as exc:  # the original was pruned (or unreadable): call the model
            log.warning("recorded replies of %s unreadable, calling the model: %s",
                        self.instance_id, exc)
            return found
        for row in rows:
            for call in details.llm_calls(row.detail):
                key, text = call.get("key"), call.get("reply")
                if key and text is not None and call.get("error") is None:
                    model = (call.get("model") or "").partition(":")[2]
                    found.setdefault(key, Completion(
                        text=text, prompt_tokens=0, completion_tokens=0,
                        finish_reason=call.get("finish_reason") or "stop", model=model))
        return found

    def get(self, key: str) -> Completion | None:
        """The original's reply to the call with this key (0 tokens), or None."""
        if self._by_key is None:
            self._by_key = self._load()
        return self._by_key.get(key)
