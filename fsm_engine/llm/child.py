"""Supervision of the model child process (:mod:`fsm_engine.llm.serve`).

:class:`ModelServer` starts the child lazily, waits for its self-test and its
HTTP port, notices when it dies, restarts it with exponential backoff and
stops it with the engine.  The child never outlives the parent: it exits when
its standard input (a pipe only the parent holds) reaches end of file, which
the kernel delivers also when the parent is SIGKILLed; ``atexit`` and a
finaliser stop it when the parent exits without closing the provider.

Each child gets a new random API key, written as the first line of that same pipe (never
on its command line or in its environment), and only an allow-list of the parent's
environment (:data:`CHILD_ENV`): database URLs, proxy settings and credentials stay out.
Every HTTP request to it carries the key (:attr:`ModelServer.api_key`); loopback clients
here ignore ``HTTP(S)_PROXY``.

Failure mapping (what a caller of :meth:`ModelServer.ensure` or
:meth:`ModelServer.explain` sees):

======================================================  ======================
what happened                                           error
======================================================  ======================
the child refused the model (exit 3: no chat template)  ClientError (its line)
the child crashed in its start-up self-test twice,      ClientError naming the
also with weight repacking off                          rebuild command
the child died during a call (signal or exit)           ServerError (retryable)
the child is in its restart backoff                     ProviderUnavailable with
                                                        ``retry_after`` seconds
the child did not get ready within ``start_timeout``    ProviderUnavailable
======================================================  ======================

A native crash in the self-test is first retried with llama.cpp's extra
weight buffers off (``serve --no-repack``: the AMX path of a native build is
what crashes on AMX CPUs whose kernel does not enable AMX, llama.cpp #20824);
only when that crashes too is the build declared unusable.
"""

from __future__ import annotations

import asyncio
import atexit
import collections
import contextlib
import json
import logging
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
import weakref
from typing import Any

from fsm_engine.errors import ClientError, ProviderError, ProviderUnavailable, ServerError

__all__ = ["ModelServer", "REBUILD_HINT", "CHILD_ENV", "child_env"]

log = logging.getLogger(__name__)
REBUILD_HINT = ("llama-cpp-python was built for another CPU; rebuild it portably with "
                "`python -m fsm_engine.llm.install`")
#: The parent's variables the child gets (an allow-list: everything else, FSM_DB,
#: DATABASE_URL, proxy settings, credentials of any name, stays out).
CHILD_ENV = ("PATH", "HOME", "LANG", "LANGUAGE", "TMPDIR", "TZ", "PYTHONPATH",
             "VIRTUAL_ENV", "XDG_CACHE_HOME", "OMP_NUM_THREADS", "OMP_PROC_BIND", "OMP_PLACES",
             "OMP_WAIT_POLICY", "OPENBLAS_NUM_THREADS", "GOMP_SPINCOUNT", "LD_LIBRARY_PATH")
#: Prefixes of further allowed names: locale, llama.cpp's own (GGML_*, LLAMA_ARG_* are not
#: read by the library), and the model settings (FSM_LLM_THREADS …; FSM_LLM_<NAME> specs
#: name providers, they hold no secret either).
CHILD_ENV_PREFIXES = ("LC_", "GGML_", "FSM_LLM_", "FSM_CHAT_FORMAT", "FSM_TEST_TAG")
# (FSM_TEST_TAG: a marker the tests use to find their own children in /proc)
_live: weakref.WeakSet[ModelServer] = weakref.WeakSet()


def _stop_all() -> None:
    for server in list(_live):
        server.stop()


atexit.register(_stop_all)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _how_it_ended(code: int) -> str:
    if code < 0:
        try:
            return signal.Signals(-code).name
        except ValueError:
            return f"signal {-code}"
    return f"exit status {code}"


def child_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The variables of ``environ`` (default ``os.environ``) the child may see: those named in
    :data:`CHILD_ENV` or starting with one of :data:`CHILD_ENV_PREFIXES`."""
    env = dict(os.environ if environ is None else environ)
    return {k: v for k, v in env.items()
            if k in CHILD_ENV or k.startswith(CHILD_ENV_PREFIXES)}


class _Child:
    """One running child process and what it has printed."""

    def __init__(self, argv: list[str], port: int) -> None:
        self.port = port
        self.key = secrets.token_urlsafe(32)
        self.ready = threading.Event()
        self.info: dict[str, Any] = {}
        self.errors: collections.deque[str] = collections.deque(maxlen=20)
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, env=child_env(),
                                     start_new_session=True)
        assert self.proc.stdin is not None
        with contextlib.suppress(BrokenPipeError):  # died at once: its exit status tells why
            self.proc.stdin.write(self.key.encode() + b"\n")  # the key, by the private pipe
            self.proc.stdin.flush()
        threading.Thread(target=self._read_stdout, daemon=True, name="fsm-model-out").start()
        threading.Thread(target=self._read_stderr, daemon=True, name="fsm-model-err").start()

    def _read_stdout(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            line = raw.decode("utf-8", "replace").strip()
            if line.startswith("{") and not self.ready.is_set():
                try:
                    self.info = json.loads(line)
                except ValueError:
                    continue
                self.ready.set()

    def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        for raw in self.proc.stderr:
            line = raw.decode("utf-8", "replace").rstrip()
            if line:
                self.errors.append(line)
                log.debug("model child: %s", line)

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def auth(self) -> dict[str, str]:
        """The header every request to this child needs."""
        return {"Authorization": f"Bearer {self.key}"}

    def exited(self) -> int | None:
        return self.proc.poll()

    def refusal(self) -> str | None:
        """The child's own one-line error, when it printed one."""
        for line in reversed(self.errors):
            if line.startswith("fsm-serve: error: "):
                return line.removeprefix("fsm-serve: error: ")
        return None

    def stop(self, grace: float = 5.0) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=grace)
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()


class ModelServer:
    """A supervised ``fsm_engine.llm.serve`` child serving one GGUF model on loopback.

    Args:
        model_path: the GGUF file.
        alias: the model name the server answers to (and reports in replies).
        n_ctx: context size in tokens; n_threads: CPU threads; seed: sampling seed.
        chat_format: a llama-cpp-python chat format name for a GGUF without a template.
        start_timeout: seconds to wait for load + self-test + port (default 300).
        backoff: (first, cap) seconds between restarts after the child died;
            doubles per consecutive crash (tenacity's ``wait_exponential`` maths).

    Attributes: ``restarts`` (children started after the first), ``crashes``
    (children that died unasked), ``info`` (the child's ready line: ``load_s``,
    ``selftest_ms``, ``no_repack``, ``arch``).
    """

    def __init__(self, model_path: str, *, alias: str, n_ctx: int = 2048, n_threads: int = 1,
                 seed: int = 0, chat_format: str | None = None, start_timeout: float = 300.0,
                 backoff: tuple[float, float] = (0.5, 30.0)) -> None:
        self.model_path, self.alias = model_path, alias
        self.n_ctx, self.n_threads, self.seed = n_ctx, n_threads, seed
        self.chat_format = chat_format
        self.start_timeout = start_timeout
        self.backoff = backoff
        self.no_repack = False
        self.restarts = self.crashes = 0
        self.info: dict[str, Any] = {}
        self._child: _Child | None = None
        self._started_once = False
        self._not_before = 0.0
        self._streak = 0
        self._start_task: asyncio.Task[str] | None = None
        self._closed = False
        _live.add(self)

    def __repr__(self) -> str:
        pid = self._child.pid if self._child else None
        return f"ModelServer(alias={self.alias!r}, pid={pid}, restarts={self.restarts})"

    @property
    def pid(self) -> int | None:
        """The running child's pid (None when none runs)."""
        child = self._child
        return child.pid if child is not None and child.exited() is None else None

    @property
    def api_key(self) -> str | None:
        """The running child's API key (a new random one per child), None when none runs."""
        child = self._child
        return child.key if child is not None else None

    async def perf(self) -> dict[str, float]:
        """llama.cpp's counters of the ready child (``fsm_engine.llm.serve.perf``).
        Raises ServerError when the child cannot answer."""
        import httpx

        child = self._child
        if child is None or self.base_url is None:
            raise ServerError(f"local model {self.alias!r} is not running")
        try:
            async with httpx.AsyncClient(timeout=10.0, headers=child.auth,
                                         trust_env=False) as client:
                response = await client.get(f"http://127.0.0.1:{child.port}/fsm/perf")
            response.raise_for_status()
            return {k: float(v) for k, v in response.json().items()}
        except (httpx.HTTPError, ValueError, AttributeError) as exc:
            raise ServerError(f"local model {self.alias!r}: no counters ({type(exc).__name__})"
                              ) from None

    @property
    def base_url(self) -> str | None:
        """``http://127.0.0.1:PORT/v1`` of the ready child, else None."""
        child = self._child
        if child is None or child.exited() is not None or not child.ready.is_set():
            return None
        return f"http://127.0.0.1:{child.port}/v1"

    def _argv(self, port: int) -> list[str]:
        argv = [sys.executable, "-m", "fsm_engine.llm.serve", "--model", self.model_path,
                "--alias", self.alias, "--port", str(port), "--n-ctx", str(self.n_ctx),
                "--n-threads", str(self.n_threads), "--seed", str(self.seed)]
        if self.chat_format:
            argv += ["--chat-format", self.chat_format]
        if self.no_repack:
            argv.append("--no-repack")
        return argv

    async def ensure(self) -> str:
        """The base URL of a ready child, starting one if none runs (see the module table).

        The start is the supervisor's own task, shared by every caller and shielded from
        them: a caller that gives up (its step timed out) leaves it running for the next
        one, so a start slower than a step's timeout still completes, once, and never
        leaves a child running that nobody owns.
        """
        if self._closed:
            raise ClientError(f"local model {self.alias!r} was closed")
        url = self.base_url
        if url is not None:
            return url
        return await asyncio.shield(self._starting())

    def _starting(self) -> asyncio.Task[str]:
        """The start under way on this event loop, else a new one."""
        loop = asyncio.get_running_loop()
        task = self._start_task
        if task is None or task.done() or task.get_loop() is not loop:
            task = loop.create_task(self._start_once(), name=f"fsm-model-start-{self.alias}")
            task.add_done_callback(lambda t: t.cancelled() or t.exception())  # seen if unawaited
            self._start_task = task
        return task

    async def _start_once(self) -> str:
        url = self.base_url
        if url is not None:
            return url
        self._reap()
        wait = self._not_before - time.monotonic()
        if wait > 0:
            raise ProviderUnavailable(
                f"local model {self.alias!r} is restarting after a crash; next start in "
                f"{wait:.1f}s", retry_after=wait)
        return await self._start()

    def _reap(self) -> None:
        """Forget a dead child, counting it as a crash and arming the backoff."""
        child = self._child
        if child is None or child.exited() is None:
            return
        self._child = None
        self.crashes += 1
        self._streak += 1
        first, cap = self.backoff
        self._not_before = time.monotonic() + min(cap, first * 2 ** (self._streak - 1))
        log.warning("local model %r child died (%s)", self.alias,
                    _how_it_ended(child.exited() or 0))

    async def _start(self) -> str:
        for _ in range(3):  # a port taken between choosing and binding: choose again
            child = await self._spawn()
            if child is not None:
                return f"http://127.0.0.1:{child.port}/v1"
        raise ProviderUnavailable(f"local model {self.alias!r} could not bind a loopback port")

    async def _spawn(self) -> _Child | None:
        """Start one child and wait for it; None when it lost its port (try another)."""
        if self._started_once:
            self.restarts += 1
        self._started_once = True
        port = _free_port()
        child = _Child(self._argv(port), port)
        try:
            return await self._await_ready(child)
        except BaseException:  # cancelled (the loop closing) or failed: never left running
            if self._child is not child:
                child.stop(grace=1.0)
            raise

    async def _await_ready(self, child: _Child) -> _Child | None:
        """Wait for ``child``'s ready line and HTTP port; adopt it (see :meth:`_spawn`)."""
        deadline = time.monotonic() + self.start_timeout
        while not child.ready.is_set():
            code = child.exited()
            if code is not None:
                return await self._failed_start(child, code)
            if time.monotonic() > deadline:
                child.stop(grace=1.0)
                raise ProviderUnavailable(f"local model {self.alias!r} did not load within "
                                          f"{self.start_timeout:g}s")
            await asyncio.sleep(0.05)
        if not await self._answers(child, deadline):
            code = child.exited()
            if code is not None and "address already in use" in " ".join(child.errors).lower():
                return None
            child.stop(grace=1.0)
            how = _how_it_ended(code) if code is not None else "no reply"
            raise ProviderUnavailable(f"local model {self.alias!r} loaded but its server did "
                                      f"not answer ({how})")
        self._child, self.info, self._streak = child, dict(child.info), 0
        return child

    async def _failed_start(self, child: _Child, code: int) -> _Child | None:
        """A child that exited before its ready line: refused, or crashed in load/self-test."""
        child.stop(grace=0.5)
        refusal = child.refusal()
        if code == 3 and refusal:
            raise ClientError(f"local model {self.alias!r}: {refusal}")
        if code < 0 and not self.no_repack:
            log.warning("local model %r crashed in its self-test (%s); retrying with weight "
                        "repacking off", self.alias, _how_it_ended(code))
            self.no_repack = True
            return await self._spawn()
        tail = refusal or (child.errors[-1] if child.errors else "")
        raise ClientError(f"local model {self.alias!r} crashed while loading or in its "
                          f"self-test ({_how_it_ended(code)}): {REBUILD_HINT}"
                          + (f"; last output: {tail[:200]}" if tail else ""))

    async def _answers(self, child: _Child, deadline: float) -> bool:
        """Poll the child's HTTP port until it answers (True) or the child dies (False)."""
        import httpx

        url = f"http://127.0.0.1:{child.port}/fsm/perf"  # takes no model lock: see alive()
        async with httpx.AsyncClient(timeout=2.0, headers=child.auth, trust_env=False) as client:
            while time.monotonic() < deadline and child.exited() is None:
                try:
                    if (await client.get(url)).status_code == 200:
                        return True
                except httpx.HTTPError:
                    pass
                await asyncio.sleep(0.05)
        return False

    async def alive(self, timeout: float = 2.0) -> bool:
        """True when the child runs and its HTTP loop answers within ``timeout`` seconds
        (a frozen child, e.g. SIGSTOPped, answers nothing; one busy generating still does:
        ``/fsm/perf`` does not wait for the model, unlike ``/v1/models``, which queues behind
        the running generation)."""
        import httpx

        child = self._child
        if child is None or child.exited() is not None:
            return False
        try:
            async with httpx.AsyncClient(timeout=timeout, headers=child.auth,
                                         trust_env=False) as client:
                response = await client.get(f"http://127.0.0.1:{child.port}/fsm/perf")
            return response.status_code == 200
        except httpx.HTTPError:
            return False

    async def explain(self, exc: ProviderError) -> ProviderError:
        """The error a failed call should raise.

        A call that got an HTTP answer (``exc.status`` set) came from a live child:
        ``exc`` itself.  Otherwise (connection reset, timeout) the child is checked:
        one that died (its exit awaited up to 2 s) gives a retryable ``ServerError``
        naming the signal; one that no longer answers at all (frozen) is killed, to
        be restarted by the next call; a live, answering one leaves ``exc`` as it is.
        """
        child = self._child
        if child is None or getattr(exc, "status", None) is not None:
            return exc
        for _ in range(40):
            code = child.exited()
            if code is not None:
                self._reap()
                return ServerError(f"local model {self.alias!r} process died during the call "
                                   f"({_how_it_ended(code)}); it restarts on the next call")
            await asyncio.sleep(0.05)
        if not await self.alive():
            log.warning("local model %r child stopped answering; killing it", self.alias)
            child.proc.kill()
            child.proc.wait(timeout=10)
            self._reap()
            return ServerError(f"local model {self.alias!r} process stopped answering; "
                               "killed, it restarts on the next call")
        return exc

    def stop(self) -> None:
        """Stop the child (SIGTERM, SIGKILL after 5 s); idempotent."""
        child, self._child = self._child, None
        if child is not None:
            child.stop()

    def close(self) -> None:
        """Stop the child and refuse further calls."""
        self._closed = True
        self.stop()
        _live.discard(self)
