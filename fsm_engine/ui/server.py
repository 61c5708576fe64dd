"""``fsm ui``: serve the viewer with uvicorn on one read-only connection.

Every connection must send a request whole — its header and its body — within
``request_timeout_s`` (``$FSM_UI_HEADER_TIMEOUT``, default 10 s) of opening or of its
previous response, else it is closed: a half-sent request or a body that never ends (a
stalled or hostile client) holds nothing for longer.  At most ``max_pending``
(``$FSM_UI_MAX_PENDING``, default 100) connections at once may be waiting with a
request neither whole nor past the gate (the token, a signed link: ``headers
.authenticated``); a connection beyond them is answered 503 at once and closed, so slow
peers cannot exhaust the file descriptors.  An idle keep-alive connection is closed
after 5 s, and a request header over 16 KB is refused (uvicorn's h11 limits).  SIGTERM
or Ctrl-C ends the open streams first (they end at their next read, with no ``final``
event), then waits at most ``GRACE_S`` seconds for the other responses in flight before
cutting them.
"""

from __future__ import annotations

import asyncio
import os
import socket
import sys
from collections.abc import Sequence
from typing import Any, ClassVar

from uvicorn.protocols.http.h11_impl import H11Protocol

from ..errors import InvalidInput
from ..store import open_store, store_url
from .app import create_app
from .headers import AUTHENTICATED, SECURITY_HEADERS
from .hosts import HostRule

#: Seconds a connection has to send a request whole (``$FSM_UI_HEADER_TIMEOUT``).
REQUEST_TIMEOUT_S = 10.0
#: Most connections waiting with a request neither whole nor authenticated
#: (``$FSM_UI_MAX_PENDING``).
MAX_PENDING = 100
#: Seconds an idle keep-alive connection stays open.
KEEP_ALIVE_S = 5
#: Most bytes of a request's header.
MAX_HEADER_BYTES = 16 * 1024
#: Seconds a stop (SIGTERM, Ctrl-C) waits for responses in flight before cancelling them:
#: an instance's stream ends only when it is final, so without it an open stream held
#: ``fsm ui`` (and its console's engine) running for good.
GRACE_S = 2

_BUSY = b"503: too many requests waiting to be whole; try again\n"
BUSY_RESPONSE = (b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain; charset=utf-8\r\n"
                 + b"".join(f"{k}: {v}\r\n".encode() for k, v in SECURITY_HEADERS.items())
                 + b"retry-after: 1\r\nconnection: close\r\ncontent-length: "
                 + str(len(_BUSY)).encode() + b"\r\n\r\n" + _BUSY)


class DeadlineProtocol(H11Protocol):
    """uvicorn's h11 protocol with one deadline per request (header and body), armed when
    the connection opens and after each response, cleared when the request is whole; and
    a bound on the connections pending (armed, and not yet past the gate).

    ``serve`` gives each server a subclass with its own ``pending`` set."""

    request_timeout_s: ClassVar[float] = REQUEST_TIMEOUT_S
    max_pending: ClassVar[int] = MAX_PENDING
    pending: ClassVar[set[Any]] = set()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._deadline: asyncio.TimerHandle | None = None
        self._arm(answer_busy=True)

    def _arm(self, *, answer_busy: bool = False) -> None:
        """Start the deadline of the next request (the connection pending again); beyond
        ``max_pending``: 503 (a new connection) or closed (after a response)."""
        self._disarm()
        if len(self.pending) >= self.max_pending:
            if answer_busy:
                self.transport.write(BUSY_RESPONSE)
            self.transport.close()
            return
        self.pending.add(self)
        self._deadline = self.loop.call_later(self.request_timeout_s, self._expired)

    def _disarm(self) -> None:
        self.pending.discard(self)
        timer = getattr(self, "_deadline", None)
        if timer is not None:
            timer.cancel()
            self._deadline = None

    def _expired(self) -> None:
        self._deadline = None
        self.pending.discard(self)
        if not self.transport.is_closing():
            self.transport.close()

    def _passed(self, cycle: Any) -> None:
        """The request of ``cycle`` passed the gate: no longer pending (its deadline holds)."""
        if self.cycle is cycle and not cycle.response_complete:
            self.pending.discard(self)

    def handle_events(self) -> None:
        before = self.cycle
        super().handle_events()
        cycle = self.cycle
        if cycle is None:
            return
        if cycle is not before:  # a request's header arrived: the gate can tell us
            scope: Any = cycle.scope
            scope.setdefault("extensions", {})[AUTHENTICATED] = lambda: self._passed(cycle)
        if not cycle.more_body and not cycle.response_complete:
            self._disarm()  # whole: its answer may take as long as it takes (a stream)

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to a request h11 cannot read, with the security headers."""
        import h11
        headers = [(b"content-type", b"text/plain; charset=utf-8"), (b"connection", b"close"),
                   *((k.lower().encode(), v.encode()) for k, v in SECURITY_HEADERS.items())]
        for event in (h11.Response(status_code=400, headers=headers, reason=b"Bad Request"),
                      h11.Data(data=msg.encode("ascii", "replace")), h11.EndOfMessage()):
            self.transport.write(self.conn.send(event))
        self._disarm()
        self.transport.close()

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


def _positive(name: str, default: float) -> float:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise InvalidInput(f"{name}={raw!r}: expected a number > 0")
    return value


def make_protocol() -> type[DeadlineProtocol]:
    """A protocol class for one server: its deadline, its bound, its own pending set."""
    return type("ServerProtocol", (DeadlineProtocol,), {
        "request_timeout_s": _positive("FSM_UI_HEADER_TIMEOUT", REQUEST_TIMEOUT_S),
        "max_pending": max(1, int(_positive("FSM_UI_MAX_PENDING", MAX_PENDING))),
        "pending": set()})


def listen(host: str, port: int) -> socket.socket:
    """A socket listening on ``host``:``port`` (0: a free port); ``InvalidInput`` when it
    cannot bind."""
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
    made = make_protocol()  # (an env var's bad value: refused before anything is opened)
    # with the console the pages read through the engine's own connection: a second,
    # read-only SQLite connection in this process to the same file loses the engine's
    # writes once another process opens and closes the database (its WAL is reset)
    store = engine.store if engine is not None else open_store(store_url(db), readonly=True)
    try:
        sock = listen(host, port)
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
    try:
        run(app, sock, made)
    finally:
        (engine or store).close()


def run(app: Any, sock: socket.socket, protocol: type[DeadlineProtocol] | None = None) -> None:
    """Serve the ASGI ``app`` on the listening ``sock`` until SIGTERM or Ctrl-C, with the
    bounds of the module doc (``DeadlineProtocol``, the keep-alive and header limits,
    ``GRACE_S``; ``protocol``: one made by ``make_protocol()``, default a new one); closes ``sock``
    at the end.  ``fsm ui`` and ``fsm serve`` both run so."""
    import uvicorn
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off",
                            http=protocol or make_protocol(), timeout_keep_alive=KEEP_ALIVE_S,
                            h11_max_incomplete_event_size=MAX_HEADER_BYTES,
                            timeout_graceful_shutdown=GRACE_S)
    server = _server_class()(config)
    try:
        server.run(sockets=[sock])
    except KeyboardInterrupt:
        pass
    finally:
        sock.close()
    sys.stdout.flush()
