"""The read-only web viewer (``fsm ui``): Starlette + Jinja2, server-rendered, no scripts.

:func:`create_app` builds the ASGI app over a store (open it read-only);
:func:`fsm_engine.ui.server.serve` runs it with uvicorn.  Needs the ``[ui]`` extra.
"""

from .app import create_app

__all__ = ["create_app"]
