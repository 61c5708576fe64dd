"""The headers every viewer response carries: a strict CSP (no script, no framing),
no MIME sniffing, no referrer, no caching of pages that show stored data.

:class:`Secured` makes that true of every response, errors included (a 405, a 500 of a
fault nobody expected); :func:`authenticated` is how a request tells the server it
passed its gate (``ui.server`` bounds the connections that have not).
"""

from __future__ import annotations

import logging
from typing import Any

__all__ = ["SECURITY_HEADERS", "LIVE_CSP", "Secured", "authenticated", "AUTHENTICATED"]

SECURITY_HEADERS = {
    "Content-Security-Policy": ("default-src 'none'; style-src 'self'; img-src 'self' data:; "
                                "form-action 'self'; base-uri 'none'; frame-ancestors 'none'"),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
}

#: The policy of a running instance's page: the same, plus the viewer's one same-origin
#: script (``static/stream.js``) and its ``EventSource`` to the page's own stream.
LIVE_CSP = ("default-src 'none'; style-src 'self'; img-src 'self' data:; script-src 'self'; "
            "connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'")

#: The ASGI scope extension (``scope["extensions"]``) a server puts there: a callable, no
#: arguments, telling it the request passed its gate (the token, or a signed link).
AUTHENTICATED = "fsm.authenticated"

_RAW = [(k.lower().encode(), v.encode()) for k, v in SECURITY_HEADERS.items()]
_LOG = logging.getLogger("fsm_engine.ui")


def authenticated(scope: Any) -> None:
    """Tell the server serving ``scope`` that its request passed the gate (a no-op when the
    server did not ask: the in-process test client, another server)."""
    hook = (scope.get("extensions") or {}).get(AUTHENTICATED)
    if callable(hook):
        hook()


class Secured:
    """ASGI middleware: every HTTP response carries each of ``SECURITY_HEADERS`` that it
    does not set itself (a page's own policy stays); an exception before any response is
    answered 500 with them and a one-line body, then re-raised for the server's log."""

    def __init__(self, app: Any, failed: tuple[bytes, bytes] = (
            b"text/plain; charset=utf-8", b"500: the viewer failed to answer this request\n")
                 ) -> None:
        #: ``failed``: the content type and body of the 500 (``fsm serve``: its JSON error).
        self.app, self.failed = app, failed

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def secured(message: Any) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                headers = list(message.get("headers") or ())
                have = {bytes(k).lower() for k, _ in headers}
                message["headers"] = headers + [(k, v) for k, v in _RAW if k not in have]
            await send(message)
        try:
            await self.app(scope, receive, secured)
        except Exception:
            if not started:
                _LOG.error("fsm ui: a request failed: answered 500")
                await secured({"type": "http.response.start", "status": 500, "headers": [
                    (b"content-type", self.failed[0])]})
                await send({"type": "http.response.body", "body": self.failed[1]})
            raise
