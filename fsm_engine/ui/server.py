"""``fsm ui``: serve the viewer with uvicorn on one read-only connection.

Every connection must send a request's whole header within ``header_timeout_s``
(``$FSM_UI_HEADER_TIMEOUT``, default 10 s) of opening or of its previous response,
else it is closed: a half-sent request (a stalled or hostile client) holds nothing.
An idle keep-alive connection is closed after 5 s, and a request header over 16 KB
is refused (uvicorn's h11 limits).  SIGTERM or Ctrl-C ends the open streams first (they
end at their next read, with no ``final`` event), then waits at most ``GRACE_S`` seconds
for the other responses in flight before cutting them.
"""

from __future__ import annotations

import asyncio
import os
import socket
import sys
from collections.abc import Sequence
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

from ..errors import InvalidInput
from ..store import open_store, store_url
from .app import create_app
from .hosts import HostRule

#: Seconds a connection has to send a request's header (``$FSM_UI_HEADER_TIMEOUT``).
HEADER_TIMEOUT_S = 10.0
#: Seconds an idle keep-alive connection stays open.
KEEP_ALIVE_S = 5
#: Most bytes of a request's header.
MAX_HEADER_BYTES = 16 * 1024
#: Seconds a stop (SIGTERM, Ctrl-C) waits for responses in flight before cancelling them:
#: an instance's stream ends only when it is final, so without it an open stream held
#: ``fsm ui`` (and its console's engine) running for good.
GRACE_S = 2


class HeaderTimeoutProtocol(H11Protocol):
    """uvicorn's h11 protocol with a deadline for each request's header: set when the
    connection opens and after each response, cleared when a request's header is in."""

    header_timeout_s = HEADER_TIMEOUT_S

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._header_timer: asyncio.TimerHandle | None = None
        self._arm()

    def _arm(self) -> None:
        self._disarm()
        self._header_timer = self.loop.call_later(self.header_timeout_s, self._expired)

    def _disarm(self) -> None:
        timer = getattr(self, "_header_timer", None)
        if timer is not None:
            timer.cancel()
            self._header_timer = None

    def _expired(self) -> None:
        self._header_timer = None
        if not self.transport.is_closing():
            self.transport.close()

    def handle_events(self) -> None:
        before = self.cycle
        super().handle_events()
        if self.cycle is not before:  # a request's header arrived
            self._disarm()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)


def _server_class() -> Any:
    import uvicorn

    class Server(uvicorn.Server):
        """uvicorn's server, ending the open streams first when it stops (an unfinished
        instance's stream never ends by itself)."""

        async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
            from .stream import stop_all
            stop_all()
            await super().shutdown(sockets)
    return Server


def _header_timeout() -> float:
    raw = os.environ.get("FSM_UI_HEADER_TIMEOUT", "").strip()
    if not raw:
        return HEADER_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise InvalidInput(f"FSM_UI_HEADER_TIMEOUT={raw!r}: expected seconds > 0")
    return value


def _listen(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host.strip("[]"), port))
        sock.listen(128)  # before the URL is printed: a client connecting at once is queued
    except OSError as exc:
        sock.close()
        raise InvalidInput(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    return sock


def serve(db: str | None, *, host: str = "127.0.0.1", port: int = 8765,
          token: str | None = None, refresh_s: int = 3,
          allowed_hosts: Sequence[str] = (), engine: Any = None) -> None:
    """Open the store ``db`` names (a SQLite file or URL, or ``postgresql://…``; None:
    ``$FSM_DB``, else ``fsm.db``) read-only and serve the viewer until interrupted.

    Prints the URL to open on stdout (with ``?token=`` when a token is set,
    since a browser cannot send a bearer header by itself).  ``port`` 0 picks
    a free port.  Only requests whose ``Host`` names this server or one of
    ``allowed_hosts`` are answered (``ui.hosts``).  ``engine`` (``fsm ui --write``,
    with ``token``): the console's actions write through it (``ui.actions``; closed at
    the end); None: read-only.  Raises ``StoreError`` for a missing or unreadable
    database, ``InvalidInput`` for a port it cannot bind.
    """
    import uvicorn
    HeaderTimeoutProtocol.header_timeout_s = _header_timeout()
    # with the console the pages read through the engine's own connection: a second,
    # read-only SQLite connection in this process to the same file loses the engine's
    # writes once another process opens and closes the database (its WAL is reset)
    store = engine.store if engine is not None else open_store(store_url(db), readonly=True)
    try:
        sock = _listen(host, port)
    except InvalidInput:
        (engine or store).close()
        raise
    bound = sock.getsockname()[1]
    shown = f"[{host}]" if ":" in host else host
    mode = "read-only" if engine is None else "with the console (writes enabled)"
    print(f"fsm ui: serving {store.url} {mode} on http://{shown}:{bound}/"
          + (f"?token={token}" if token else "") + "  (Ctrl-C stops)", flush=True)
    console = None
    if engine is not None:
        from .actions import Console
        console = Console(engine)
    app: Any = create_app(store, token=token, refresh_s=refresh_s,
                          hosts=HostRule(host, bound, tuple(allowed_hosts)), console=console)
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off",
                            http=HeaderTimeoutProtocol, timeout_keep_alive=KEEP_ALIVE_S,
                            h11_max_incomplete_event_size=MAX_HEADER_BYTES,
                            timeout_graceful_shutdown=GRACE_S)
    server = _server_class()(config)
    try:
        server.run(sockets=[sock])
    except KeyboardInterrupt:
        pass
    finally:
        (engine or store).close()
        sock.close()
    sys.stdout.flush()
