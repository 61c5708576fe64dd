"""``FSM_REVIEW_WEBHOOK``: each new review item is posted, with a signed link, to a webhook
(a chat or mail bridge), so a reviewer gets it without a shell on the database's host.

The ledger calls the hook for every committed step that opened an item
(``Ledger.on_review``); the post runs in a thread of its own (the commit never waits
on it), once per item in this process, with ``Idempotency-Key: ITEM`` for the receiver
to drop a repeat from another process.  The body is JSON: ``item``, ``instance_id``,
``machine``, ``state``, ``prompt``, ``choices``, ``link`` (``runtime.kinds.review_links``:
for the reviewer ``$FSM_REVIEW_REVIEWER``, default ``reviewer``, valid
``$FSM_REVIEW_LINK_TTL``, default ``24h``, under ``$FSM_REVIEW_LINK_BASE``, default
``http://127.0.0.1:8765``) and ``expires`` (epoch s).  The client is the bounded
webhook client of ``fsm_engine.sinks`` (a deadline for the whole exchange, the reply
capped, a redirect not followed); a failure is logged, credentials redacted, never
raised: an unreachable hook does not stop instances.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from ...errors import InvalidInput
from ...redaction import redact
from ...store.facets import MetaStore
from ...store.records import ReviewItem
from . import review_links

log = logging.getLogger("fsm_engine.review_hook")

#: Seconds one post may take in all.
TIMEOUT_S = 10.0


class ReviewHook:
    """Posts new review items to ``url`` (see the module doc)."""

    def __init__(self, store: MetaStore, url: str, *, base: str, by: str, ttl_s: float,
                 clock: Callable[[], float] = time.time,
                 post: Callable[..., Any] | None = None) -> None:
        self.store, self.url, self.base, self.by, self.ttl_s = store, url, base, by, ttl_s
        self.clock = clock
        self._post = post
        self._sent: set[str] = set()
        self._lock = threading.Lock()
        #: Posts still running (a test or a closing process may wait for them).
        self.threads: list[threading.Thread] = []

    def payload(self, item: ReviewItem) -> dict[str, Any]:
        """The JSON body for ``item``, its link signed now."""
        link = review_links.sign(self.store, item.id, self.by, self.ttl_s, self.clock())
        return {"item": item.id, "instance_id": item.instance_id, "machine": item.machine,
                "state": item.state, "prompt": item.prompt, "choices": list(item.choices),
                "link": review_links.url(self.base, link), "expires": link.expires}

    def __call__(self, item: ReviewItem) -> None:
        with self._lock:
            if item.id in self._sent:
                return
            self._sent.add(item.id)
        thread = threading.Thread(target=self._send, args=(item,), daemon=True,
                                  name=f"review-hook-{item.id}")
        self.threads = [t for t in self.threads if t.is_alive()] + [thread]
        thread.start()

    def _send(self, item: ReviewItem) -> None:
        try:
            post = self._post
            if post is None:
                from ...sinks import post_webhook
                post = post_webhook
            post(self.url, self.payload(item), item.id, timeout=TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001 - a hook's failure never stops instances
            log.warning("review webhook: item %s not delivered: %s", item.id,
                        redact(f"{type(exc).__name__}: {exc}"))


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def _ttl(text: str) -> float:
    """``30m``, ``24h``, ``7d`` (or plain seconds) as seconds; ``InvalidInput`` else."""
    raw = text.strip().lower()
    unit = _UNITS.get(raw[-1:], 0)
    try:
        value = float(raw[:-1] if unit else raw) * (unit or 1)
    except ValueError:
        value = 0.0
    if not 0 < value <= review_links.MAX_TTL_S:
        raise InvalidInput(f"FSM_REVIEW_LINK_TTL={text!r}: expected an age such as 24h "
                           "(at most 30d)")
    return value


def from_env(store: MetaStore) -> ReviewHook | None:
    """The hook ``$FSM_REVIEW_WEBHOOK`` asks for (None: unset)."""
    url = os.environ.get("FSM_REVIEW_WEBHOOK", "").strip()
    if not url:
        return None
    return ReviewHook(
        store, url, base=os.environ.get("FSM_REVIEW_LINK_BASE", "http://127.0.0.1:8765"),
        by=os.environ.get("FSM_REVIEW_REVIEWER", "reviewer"),
        ttl_s=_ttl(os.environ.get("FSM_REVIEW_LINK_TTL", "24h")))
