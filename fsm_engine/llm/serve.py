"""The model child process: llama.cpp behind ``llama_cpp.server``'s OpenAI-compatible app.

Started by :class:`fsm_engine.llm.child.ModelServer` as ``python -m
fsm_engine.llm.serve --model PATH --port N …``; not meant to be run by hand
(for a server of your own use ``python -m llama_cpp.server``).  Native code
runs only here, so a crash of llama.cpp (SIGSEGV, an OOM kill, an abort)
ends this process, never the engine.

What it does, in order:

1. reads its API key, the first line of its standard input (a pipe only the
   parent holds: never on the command line nor in the environment), then
   watches standard input: end of file means the parent is gone (also after a
   SIGKILL of the parent, whose pipe end the kernel closes), and the process
   exits at once;
2. loads the model through ``llama_cpp.server.app.create_app``; a GGUF with
   no chat template of its own gets the Gemma 3 template when its
   ``general.architecture`` is a Gemma one, and any other such model is
   refused (exit 3) unless ``--chat-format`` names a llama-cpp-python format;
3. runs a self-test, one two-token completion, so a native build that cannot
   run on this CPU fails here, before any instance depends on it;
4. prints one JSON line ``{"ready": true, …}`` on standard output and serves
   HTTP on ``127.0.0.1:PORT`` until SIGTERM or the end of standard input.

Every route asks for the key (``Authorization: Bearer KEY``; 401 without it),
there is no CORS middleware (a browser page gets no ``Access-Control-Allow-Origin``)
and no ``/docs`` or ``/openapi.json``.  ``GET /fsm/perf`` returns llama.cpp's own
counters for the context (:func:`perf`): prompt tokens evaluated and their
milliseconds, generated tokens and theirs, so a caller can see how many prompt
tokens a call really evaluated (the rest came from the KV cache: the longest
common prefix with the previous call, or a state kept in the RAM cache).

Exit status: 0 stopped, 3 refused configuration (one line
``fsm-serve: error: …`` on standard error), a signal for a native crash.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from typing import Any

from fsm_engine.errors import ClientError

# The Gemma 3 chat template (as in Google's tokenizer_config.json, minus image parts and the
# strict role-alternation check).  The packaged Gemma GGUF carries no template, and without one
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
REFUSED = 3
#: Bytes of KV states kept for prefix reuse (llama-cpp-python's LlamaRAMCache): a state
#: after each call, so a re-ask or a later call sharing a prefix resumes from it.
RAM_CACHE_BYTES = 256 << 20
#: Seconds an idle keep-alive connection stays open.  Longer than the client pool's own
#: expiry (httpx's 5 s): were it equal, as uvicorn's default is, a request sent as the pool
#: reuses a connection at 5 s lands on a socket the server just closed ("Connection
#: error.", no HTTP status), which the supervisor takes for a failing child.
KEEP_ALIVE_S = 60


class Refused(ClientError):
    """A configuration this process will not serve (exit 3, the message on stderr)."""


def _read_key() -> str:
    """The API key: the first line of standard input (exit 0 when the parent is gone)."""
    key = sys.stdin.buffer.readline().strip().decode("ascii", "replace")
    if not key:
        os._exit(0)
    return key


def _watch_parent() -> None:
    """Exit the moment standard input reaches end of file (the parent is gone)."""
    def watch() -> None:
        try:
            while sys.stdin.buffer.read(4096):
                pass
        finally:
            os._exit(0)
    threading.Thread(target=watch, daemon=True, name="fsm-parent-watch").start()


def _no_repack() -> None:
    """Load weights without llama.cpp's extra buffer types (AMX / repacked weights).

    The escape hatch for a native build whose AMX path crashes: the model
    then runs on the plain CPU kernels.  llama-cpp-python has no argument for
    ``llama_model_params.use_extra_bufts``, so the default-params function
    that ``Llama.__init__`` calls is wrapped.
    """
    import llama_cpp.llama_cpp as lib

    original = lib.llama_model_default_params

    def params() -> Any:
        value = original()
        value.use_extra_bufts = False
        return value
    lib.llama_model_default_params = params


def _gemma3_handler(llama: Any) -> Any:
    """A chat handler rendering :data:`GEMMA3_TEMPLATE`, stopping at ``<end_of_turn>``/EOS."""
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    end_of_turn = llama.tokenize(b"<end_of_turn>", add_bos=False, special=True)
    formatter = Jinja2ChatFormatter(GEMMA3_TEMPLATE, eos_token="<end_of_turn>",
                                    bos_token="<bos>",
                                    stop_token_ids=[*end_of_turn, llama.token_eos()])
    return formatter.to_chat_handler()


def choose_template(metadata: dict[str, str], chat_format: str | None) -> str:
    """Which prompt format a model gets: ``"named"``, ``"own"`` or ``"gemma3"``.

    Raises :class:`Refused` for a model with no template of its own that is
    not a Gemma model, when no ``chat_format`` was named.
    """
    if chat_format:
        return "named"
    if metadata.get("tokenizer.chat_template"):
        return "own"
    arch = metadata.get("general.architecture", "")
    if arch.startswith("gemma"):
        return "gemma3"
    raise Refused(f"the model (architecture {arch or 'unknown'!r}) has no chat template and is "
                  "not a Gemma model: name its prompt format with FSM_CHAT_FORMAT (a "
                  "llama-cpp-python chat format, e.g. chatml)")


def perf(llama: Any) -> dict[str, float]:
    """llama.cpp's counters since the context was made: ``n_p_eval`` prompt tokens evaluated
    (batches of more than one token), ``t_p_eval_ms`` their milliseconds, ``n_eval`` tokens
    decoded one at a time (generation), ``t_eval_ms``, ``t_load_ms``."""
    import llama_cpp

    data = llama_cpp.llama_perf_context(llama.ctx)
    return {name: getattr(data, name) for name in
            ("n_p_eval", "t_p_eval_ms", "n_eval", "t_eval_ms", "t_load_ms")}


def _lean_states(llama: Any) -> None:
    """Make the RAM cache's saved states small: llama-cpp-python copies its whole logits
    array into each state (``n_batch`` rows × the vocabulary: 311 MB for Qwen's 151,936
    tokens) although a restored prefix is always followed by at least one evaluated token,
    whose logits are the ones sampled.  Only the KV state (~12 KB a token for Qwen2.5-0.5B)
    and one logits row are kept."""
    import numpy as np
    from llama_cpp.llama import LlamaState

    original = llama.save_state

    def save_state() -> Any:
        scores, llama.scores = llama.scores, np.zeros((1, llama.n_vocab()), dtype=np.single)
        try:
            state: LlamaState = original()
        finally:
            llama.scores = scores
        return state
    llama.save_state = save_state


def _lock_down(app: Any, llama: Any) -> None:
    """No CORS middleware, no API docs; add the authenticated ``GET /fsm/perf``."""
    from fastapi import Depends
    from llama_cpp.server.app import authenticate
    from starlette.middleware.cors import CORSMiddleware

    app.user_middleware[:] = [m for m in app.user_middleware if m.cls is not CORSMiddleware]
    app.middleware_stack = None  # built on the first request, from the list above
    docs = {app.openapi_url, app.docs_url, app.redoc_url, app.swagger_ui_oauth2_redirect_url}
    app.router.routes[:] = [r for r in app.router.routes if getattr(r, "path", None) not in docs]
    app.add_api_route("/fsm/perf", lambda: perf(llama), methods=["GET"],
                      dependencies=[Depends(authenticate)])


def _load(args: argparse.Namespace, key: str) -> tuple[Any, Any]:
    """Build the server app (loading the model); return (app, llama)."""
    from llama_cpp.server import app as server_app
    from llama_cpp.server.settings import ModelSettings, ServerSettings

    model = ModelSettings(model=args.model, model_alias=args.alias, n_ctx=args.n_ctx,
                          n_threads=args.n_threads, n_threads_batch=args.n_threads,
                          seed=args.seed, chat_format=args.chat_format, verbose=False,
                          cache=args.cache_bytes > 0, cache_type="ram",
                          cache_size=max(args.cache_bytes, 1))
    # interrupt_requests off: by default llama_cpp.server cuts a streaming generation short
    # when any other request arrives (a budget check's token count of another instance), and
    # the stream ends empty (tests/llm/test_stream_model.py)
    server = ServerSettings(host="127.0.0.1", port=args.port, api_key=key,
                            interrupt_requests=False)
    app = server_app.create_app(server_settings=server, model_settings=[model])
    llama: Any = server_app._llama_proxy._current_model  # type: ignore[union-attr]  # the one
    _lock_down(app, llama)
    if args.cache_bytes > 0:
        _lean_states(llama)
    how = choose_template(dict(llama.metadata), args.chat_format)
    if how == "gemma3":
        llama.chat_handler = _gemma3_handler(llama)
    return app, llama


def _self_test(llama: Any) -> float:
    """One two-token completion; returns its milliseconds (a broken build crashes here)."""
    started = time.perf_counter()
    llama.create_chat_completion(messages=[{"role": "user", "content": "Say OK."}],
                                 max_tokens=2, temperature=0.0)
    return (time.perf_counter() - started) * 1000.0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m fsm_engine.llm.serve")
    parser.add_argument("--model", required=True, help="path of the GGUF file")
    parser.add_argument("--alias", required=True, help="the model name the server answers to")
    parser.add_argument("--port", type=int, required=True, help="loopback port to listen on")
    parser.add_argument("--n-ctx", type=int, default=2048, help="context size, tokens")
    parser.add_argument("--n-threads", type=int, default=1, help="CPU threads")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--chat-format", default=None, help="a llama-cpp-python chat format")
    parser.add_argument("--cache-bytes", type=int, default=RAM_CACHE_BYTES,
                        help="RAM for KV states kept for prefix reuse (0: none)")
    parser.add_argument("--no-repack", action="store_true",
                        help="no extra weight buffer types (AMX / repacking)")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Serve until SIGTERM or end of standard input; see the module docstring."""
    args = _parser().parse_args(argv)
    key = _read_key()
    _watch_parent()
    if args.no_repack:
        _no_repack()
    started = time.perf_counter()
    try:
        app, llama = _load(args, key)
    except Refused as exc:
        print(f"fsm-serve: error: {exc}", file=sys.stderr, flush=True)
        return REFUSED
    except (ValueError, RuntimeError) as exc:  # an unreadable file, not a GGUF
        print(f"fsm-serve: error: llama.cpp cannot load {args.model}: {exc}", file=sys.stderr,
              flush=True)
        return REFUSED
    load_s = time.perf_counter() - started
    selftest_ms = _self_test(llama)
    print(json.dumps({"ready": True, "load_s": round(load_s, 3),
                      "selftest_ms": round(selftest_ms, 1), "no_repack": args.no_repack,
                      "n_threads": args.n_threads, "cache_bytes": args.cache_bytes,
                      "arch": llama.metadata.get("general.architecture")}), flush=True)
    import uvicorn

    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning",
                timeout_keep_alive=KEEP_ALIVE_S)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
