"""``fsm serve``: the HTTP door for other services (issue 38 item 7; ``ui.api``).

The token comes from a file (``--token-file``), never from the command line (where ``ps``
shows it) and is never printed; the server binds loopback unless ``--expose`` says
otherwise, and serves only the machines named with ``--machines``.
"""

from __future__ import annotations

import typer

from ..terminal import shown as text_of
from .common import ALLOWED_HOST, DB, _fail, _open, app
from .observe import _loopback

#: Most bytes of a token file; fewest characters of its token.
MAX_TOKEN_FILE, MIN_TOKEN = 4096, 16


def read_token(path: str) -> str:
    """The bearer token in the file ``path``: its one line (surrounding white space
    stripped), at least ``MIN_TOKEN`` printable characters and no spaces; else a one-line
    error naming the file, never its content."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read(MAX_TOKEN_FILE + 1)
    except OSError as exc:
        _fail(f"cannot read --token-file {path}: {exc.strerror or exc}")
    if len(raw) > MAX_TOKEN_FILE:
        _fail(f"--token-file {path} holds more than {MAX_TOKEN_FILE} bytes: a token is one line")
    try:
        token = raw.decode("utf-8").strip()
    except UnicodeDecodeError:
        _fail(f"--token-file {path} is not UTF-8 text")
    if any(c.isspace() or not c.isprintable() for c in token):
        _fail(f"--token-file {path}: a bearer token is one word of printable characters")
    if len(token) < MIN_TOKEN:
        _fail(f"--token-file {path}: the token must be at least {MIN_TOKEN} characters")
    return token


@app.command()
def serve(machines: list[str] = typer.Option(..., "--machines", metavar="MODULE",
                                             help="A machine module to serve (repeatable): "
                                                  "only these machines' instances can be "
                                                  "started, read or sent to."),
          token_file: str = typer.Option(..., "--token-file", metavar="FILE",
                                         help="A file holding the bearer token every request "
                                              "must send (one word, 16+ characters)."),
          db: str | None = DB,
          host: str = typer.Option("127.0.0.1", "--host",
                                   help="Address to bind; anything but loopback needs "
                                        "--expose."),
          port: int = typer.Option(8766, "--port", min=0, max=65535,
                                   help="TCP port (0: any free port, printed)."),
          expose: bool = typer.Option(False, "--expose",
                                      help="Allow a --host beyond loopback (put TLS in "
                                           "front: the token travels in each request)."),
          allowed_host: list[str] | None = ALLOWED_HOST,
          max_body: int = typer.Option(1024 * 1024, "--max-body", min=1, max=64 * 1024 * 1024,
                                       metavar="BYTES", help="Largest request body.")) -> None:
    """Serve a JSON API (start, send, get, stream; OpenAPI at /api/openapi.json) for other
    services; `fsm worker`s run what it starts."""
    token = read_token(token_file)
    if not _loopback(host) and not expose:
        _fail(f"--host {host} exposes the API beyond this machine: give --expose too")
    try:
        from ..ui.api import Limits, create_api
        from ..ui.hosts import HostRule
        from ..ui.server import listen, make_protocol, run
    except ImportError as exc:
        _fail(f"fsm serve needs the [ui] extra (pip install 'fsm_engine[ui]'): {exc}")
    from ..runtime import Engine, load_machine
    from ..runtime.compiled import compile_machine
    made = make_protocol()
    loaded = list({ref: (machine, ref) for machine, ref in (  # (a module named twice: once)
        load_machine(module, named=True) for module in machines)}.values())
    names = [machine.name for machine, _ in loaded]
    for machine, _ in loaded:
        compile_machine(machine)  # a broken module: refused before the store is opened
        if names.count(machine.name) > 1:
            _fail(f"two --machines modules define machine {machine.name!r}")
    engine = Engine(_open(db, create=True), llm=None)  # (beside workers: either may be first)
    try:
        served = {}
        for machine, ref in loaded:
            engine.trust.allow(ref)  # as Engine.load: the instances naming it may load it
            served[machine.name] = engine.register(machine, ref)
        sock = listen(host, port)
    except BaseException:
        engine.close()
        raise
    bound = sock.getsockname()[1]
    where = f"[{host}]" if ":" in host else host
    typer.echo(text_of(f"fsm serve: machines {', '.join(sorted(served))} of "
                       f"{engine.store.url} on http://{where}:{bound}/api/  (Ctrl-C stops)"))
    try:
        api = create_api(engine, served, token=token, limits=Limits(max_body=max_body),
                         hosts=HostRule(host, bound, tuple(allowed_host or ())),
                         audit=lambda line: typer.echo(text_of(f"fsm serve: {line}")))
        run(api, sock, made)
    finally:
        engine.close()
