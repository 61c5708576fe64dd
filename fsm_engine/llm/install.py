"""Build and install llama-cpp-python portably: ``python -m fsm_engine.llm.install``.

Why this exists: pip builds llama-cpp-python from source with llama.cpp's
default ``GGML_NATIVE=ON``, i.e. ``-march=native``.  On an Intel Xeon with AMX
inside a VM whose kernel does not enable AMX, that build segfaults on the
first decode (ggml-org/llama.cpp #20824); a wheel built natively on one CPU
may also use instructions another CPU lacks.  And pip's wheel cache is keyed
by the sdist's URL and hash only (pip ``Cache._get_cache_path_parts``), not by
``CMAKE_ARGS``, so a wheel once built the wrong way would be reused silently.

So this module builds the pinned llama-cpp-python with an explicit,
portable instruction set (:data:`CMAKE_ARGS`: ``GGML_NATIVE=OFF``, AVX2 + FMA
+ F16C on x86-64, AMX off), only the libraries the wheel loads (no multimodal
libmtmd, no HTTPS), one compile job per usable CPU, with pip's cache off, into a wheel directory of
its own keyed by the version and the flags (``$XDG_CACHE_HOME/fsm_engine/
wheels/<key>``), then installs that wheel.  A second run with the same key
installs the kept wheel in seconds.  A llama-cpp-python of the same version that
did not come from that wheel (pip's native build) is replaced, not kept as
"already satisfied".  Afterwards ``pip install -e '.[local]'`` finds the pinned
version already satisfied.

Exit status: 0 installed, 2 the build or install failed (one ``fsm: error:``
line; pip's own output is above it).
"""

from __future__ import annotations

import hashlib
import os
import platform
import subprocess
import sys
from pathlib import Path

__all__ = ["LLAMA_CPP_VERSION", "CMAKE_ARGS", "wheel_dir", "build_wheel", "ensure_installed",
           "main"]

# Keep in step with pyproject.toml's [local] extra (a test checks they agree).
LLAMA_CPP_VERSION = "0.3.36"


def _cmake_args(machine: str) -> str:
    """Portable llama.cpp build flags for ``machine`` (``platform.machine()``)."""
    # Only what the wheel loads: libllama + libggml (llama-cpp-python forces the common
    # library on).  Off: the multimodal libmtmd (51 of 178 objects; only llava-style chat
    # handlers import it), HTTPS model downloads, and tests / examples / tools / the server.
    common = ["-DGGML_NATIVE=OFF", "-DLLAVA_BUILD=OFF", "-DLLAMA_OPENSSL=OFF",
              "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_TOOLS=OFF",
              "-DLLAMA_BUILD_SERVER=OFF"]
    if machine.lower() in ("x86_64", "amd64"):
        # x86-64-v3 (Haswell, 2013+): every current server and laptop has it.  AVX-512
        # and AMX stay off: AMX is what crashes, AVX-512 is absent on many CPUs.
        common += ["-DGGML_AVX=ON", "-DGGML_AVX2=ON", "-DGGML_FMA=ON", "-DGGML_F16C=ON",
                   "-DGGML_BMI2=ON", "-DGGML_AVX512=OFF", "-DGGML_AMX_TILE=OFF",
                   "-DGGML_AMX_INT8=OFF", "-DGGML_AMX_BF16=OFF"]
    return " ".join(common)


CMAKE_ARGS = _cmake_args(platform.machine())


def wheel_dir() -> Path:
    """Where the portable wheel is kept: one folder per (version, flags, Python, arch)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    key = "|".join([LLAMA_CPP_VERSION, CMAKE_ARGS, sys.implementation.cache_tag or "",
                    platform.machine()])
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return Path(base) / "fsm_engine" / "wheels" / f"llama-cpp-python-{LLAMA_CPP_VERSION}-{digest}"


def _jobs() -> int:
    """Compile jobs: the CPUs this process may use (a make generator builds serially else)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _pip(*args: str, env: dict[str, str] | None = None) -> None:
    subprocess.run([sys.executable, "-m", "pip", *args], check=True, env=env)


def _kept_wheel(folder: Path) -> Path | None:
    found = sorted(folder.glob("llama_cpp_python-*.whl")) if folder.is_dir() else []
    return found[-1] if found else None


def build_wheel(folder: Path) -> Path:
    """Build the pinned llama-cpp-python with :data:`CMAKE_ARGS` into ``folder`` (via a
    ``.partial`` sibling renamed at the end) and return the wheel's path.  Raises
    ``subprocess.CalledProcessError`` when pip fails or writes no wheel."""
    print(f"building llama-cpp-python {LLAMA_CPP_VERSION} with CMAKE_ARGS={CMAKE_ARGS!r} "
          f"({_jobs()} compile jobs; a few minutes on 2 cores, once)", flush=True)
    partial = folder.with_name(folder.name + ".partial")
    partial.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "CMAKE_ARGS": CMAKE_ARGS, "FORCE_CMAKE": "1",
           "CMAKE_BUILD_PARALLEL_LEVEL": str(_jobs())}
    _pip("wheel", "--no-cache-dir", "--no-deps", "--no-binary", "llama-cpp-python",
         "-w", str(partial), f"llama-cpp-python=={LLAMA_CPP_VERSION}", env=env)
    if not folder.exists():
        partial.replace(folder)
    wheel = _kept_wheel(folder)
    if wheel is None:
        raise subprocess.CalledProcessError(1, "pip wheel", "no wheel was written")
    return wheel


def ensure_installed() -> Path:
    """Build the portable wheel unless it is kept already, then install it with ``[server]``.

    Returns the wheel's path.  Raises ``subprocess.CalledProcessError`` when pip fails.
    """
    folder = wheel_dir()
    wheel = _kept_wheel(folder) or build_wheel(folder)
    if _installed_from() != wheel.resolve().as_uri():
        # a llama-cpp-python of the same version built another way (pip's default native
        # build) counts as "already satisfied": replace it, then add the [server] extra's deps
        _pip("install", "--disable-pip-version-check", "--force-reinstall", "--no-deps", str(wheel))
    _pip("install", "--disable-pip-version-check", f"{wheel}[server]")
    return wheel


def _installed_from() -> str | None:
    """The URL the installed llama-cpp-python came from (pip's ``direct_url.json``), if any."""
    import importlib.metadata
    import json

    try:
        text = importlib.metadata.distribution("llama-cpp-python").read_text("direct_url.json")
        return str(json.loads(text or "{}").get("url") or "") or None
    except (importlib.metadata.PackageNotFoundError, ValueError):
        return None


def main() -> int:
    """Command-line entry: install, print where the wheel is kept; 0 ok, 2 on failure."""
    try:
        wheel = ensure_installed()
    except (subprocess.CalledProcessError, OSError) as exc:
        print(f"fsm: error: could not build llama-cpp-python portably: {exc}", file=sys.stderr)
        return 2
    print(f"llama-cpp-python {LLAMA_CPP_VERSION} installed from {wheel}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
