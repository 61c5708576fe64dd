"""The portable llama-cpp-python build: flags, the keyed wheel folder, the pinned version."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from fsm_engine.llm import install

ROOT = Path(__file__).resolve().parents[2]


def test_the_pinned_version_is_the_one_the_local_extra_asks_for():
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    pins = [d for d in extra["local"] if d.startswith("llama-cpp-python")]
    assert pins == [f"llama-cpp-python[server]=={install.LLAMA_CPP_VERSION}"]


def test_x86_flags_are_portable_and_never_native_or_amx():
    flags = install._cmake_args("x86_64").split()
    assert "-DGGML_NATIVE=OFF" in flags and "-DGGML_AVX2=ON" in flags
    assert {"-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF", "-DGGML_AMX_BF16=OFF",
            "-DGGML_AVX512=OFF"} <= set(flags)
    assert not [f for f in flags if re.search(r"AMX\w*=ON|NATIVE=ON|AVX512=ON", f)]


def test_other_architectures_build_generic():
    assert install._cmake_args("aarch64").split()[0] == "-DGGML_NATIVE=OFF"
    assert "AVX" not in install._cmake_args("aarch64")


def test_the_wheel_folder_is_keyed_by_the_flags(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    first = install.wheel_dir()
    assert first.parent == tmp_path / "fsm_engine" / "wheels"
    monkeypatch.setattr(install, "CMAKE_ARGS", install.CMAKE_ARGS + " -DGGML_AVX512=ON")
    assert install.wheel_dir() != first  # a wheel built the other way is never reused


def test_a_same_version_wheel_built_elsewhere_is_replaced(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    folder = install.wheel_dir()
    folder.mkdir(parents=True)
    wheel = folder / f"llama_cpp_python-{install.LLAMA_CPP_VERSION}-py3-none-linux_x86_64.whl"
    wheel.write_bytes(b"")
    calls = []
    monkeypatch.setattr(install, "_pip", lambda *args, env=None: calls.append(args))
    monkeypatch.setattr(install, "_installed_from", lambda: "file:///elsewhere/native.whl")
    assert install.ensure_installed() == wheel
    assert calls[0][:4] == ("install", "--disable-pip-version-check", "--force-reinstall", "--no-deps")
    calls.clear()
    monkeypatch.setattr(install, "_installed_from", lambda: wheel.resolve().as_uri())
    install.ensure_installed()
    assert [c for c in calls if "--force-reinstall" in c] == []  # ours already: kept
