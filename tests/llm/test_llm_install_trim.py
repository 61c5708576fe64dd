"""The first-install build compiles only what the wheel uses, on every usable CPU."""

from __future__ import annotations

import os

from fsm_engine.llm import install


def test_the_multimodal_library_and_https_are_not_built():
    for machine in ("x86_64", "aarch64"):
        flags = install._cmake_args(machine).split()
        assert "-DLLAVA_BUILD=OFF" in flags  # libmtmd: 51 of 178 objects, never loaded
        assert "-DLLAMA_OPENSSL=OFF" in flags  # model downloads over HTTPS: not used
        assert flags[0] == "-DGGML_NATIVE=OFF"  # the portable flags stay


def test_the_build_runs_one_compile_job_per_usable_cpu(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("CMAKE_BUILD_PARALLEL_LEVEL", raising=False)
    seen: list[dict[str, str]] = []

    def pip(*args: str, env: dict[str, str] | None = None) -> None:
        if args[0] == "wheel":
            seen.append(dict(env or {}))
            out = args[args.index("-w") + 1]
            name = f"llama_cpp_python-{install.LLAMA_CPP_VERSION}-py3-none-linux_x86_64.whl"
            open(os.path.join(out, name), "wb").close()
    monkeypatch.setattr(install, "_pip", pip)
    monkeypatch.setattr(install, "_installed_from", lambda: None)
    install.ensure_installed()
    assert seen and seen[0]["CMAKE_BUILD_PARALLEL_LEVEL"] == str(len(os.sched_getaffinity(0)))
    assert seen[0]["CMAKE_ARGS"] == install.CMAKE_ARGS
