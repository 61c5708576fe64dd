"""``fsm ui``: serve the viewer with uvicorn on one read-only connection."""

from __future__ import annotations

import socket
import sys

from ..store import open_store, store_url
from .app import create_app


def serve(db: str | None, *, host: str = "127.0.0.1", port: int = 8765,
          token: str | None = None,
          refresh_s: int = 3) -> None:
    """Open the store ``db`` names (a SQLite file or URL, or ``postgresql://…``; None:
    ``$FSM_DB``, else ``fsm.db``) read-only and serve the viewer until interrupted.

    Prints the URL to open on stdout (with ``?token=`` when a token is set,
    since a browser cannot send a bearer header by itself).  ``port`` 0 picks
    a free port.  Raises ``StoreError`` for a missing or unreadable database.
    """
    import uvicorn
    store = open_store(store_url(db), readonly=True)
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host.strip("[]"), port))
        sock.listen(128)  # before the URL is printed: a client connecting at once is queued
    except OSError as exc:
        store.close()
        from ..errors import InvalidInput
        raise InvalidInput(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    bound = sock.getsockname()[1]
    shown = f"[{host}]" if ":" in host else host
    print(f"fsm ui: serving {store.url} read-only on http://{shown}:{bound}/"
          + (f"?token={token}" if token else "") + "  (Ctrl-C stops)", flush=True)
    config = uvicorn.Config(create_app(store, token=token, refresh_s=refresh_s), log_level="warning",
                            access_log=False, lifespan="off")
    server = uvicorn.Server(config)
    try:
        server.run(sockets=[sock])
    except KeyboardInterrupt:
        pass
    finally:
        store.close()
        sock.close()
    sys.stdout.flush()
