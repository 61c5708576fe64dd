"""Shared fixtures: a fresh SQLite file per test, scripted providers, an engine."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"
HELPERS = TESTS / "helpers"  # shared helper modules (machines, harnesses), imported by bare name
# tests/ mirrors the package (tests/cli/, tests/runtime/kinds/, ...), no folder a package:
# each module is imported by its basename (unique across tests/), so every folder goes on
# sys.path for the helpers (``from cli import run_main``), whichever folder pytest collected
# first.  No test module imports another (tests/test_architecture.py checks): what two share
# lives in tests/helpers/.
_FOLDERS = [ROOT, TESTS, *sorted(d for d in TESTS.rglob("*") if d.is_dir() and d.name != "__pycache__")]
for _path in reversed(_FOLDERS):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from fsm_engine import Engine  # noqa: E402
from fsm_engine.llm import Scripted  # noqa: E402

# llm_fixtures (tests/helpers/) as a plugin: its session-scoped ``llama_server`` is one
# server for the whole run, not one per module that imports it
pytest_plugins = ["fsm_engine.testing.plugin", "llm_fixtures"]

MACHINES = ROOT / "machines"
LICENSES = Path("/usr/share/common-licenses")


#: What a terminal's size reads from; an xdist worker's own (GNU readline, imported in the
#: worker, exports COLUMNS=80 LINES=24) would fix the width of the CLI's module-level console.
TERMINAL_ENV = ("COLUMNS", "LINES")


#: The most xdist workers ``-n auto`` (pyproject's ``addopts``) starts: each runs its own
#: PostgreSQL cluster and the suite's subprocesses, so more than this buys little on a big
#: machine and costs a cluster each.  The fast lane is green at 4 workers on 2 cores.
MAX_AUTO_WORKERS = 4


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:  # noqa: ARG001 - the hook's signature
    """(xdist) ``-n auto``: the CPUs this process may run on, at most MAX_AUTO_WORKERS;
    ``PYTEST_XDIST_AUTO_NUM_WORKERS`` overrides it, as in xdist's own hook."""
    env = os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS", "")
    if env.isdigit():
        return int(env)
    return max(1, min(MAX_AUTO_WORKERS, len(os.sched_getaffinity(0))))


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:  # noqa: ANN001 - xdist's WorkerController
    """(xdist, in the controller) Send each worker the controller's terminal size variables."""
    node.workerinput["terminal_env"] = {k: os.environ.get(k) for k in TERMINAL_ENV}


def pytest_configure(config: pytest.Config) -> None:
    """(in an xdist worker) Set the terminal size variables back to the controller's, so a
    test sees the same environment under ``-n`` as in one process."""
    sent = getattr(config, "workerinput", {}).get("terminal_env")
    for key, value in (sent or {}).items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every ``model`` test in xdist_group ``model`` (``--dist loadgroup``: one worker, one
    model process at a time).  Not in effect with xdist 3.8 on pytest 9: xdist suffixes the
    id through ``item._nodeid``, which pytest 9 no longer reads (issue 37 item 6)."""
    for item in items:
        if item.get_closest_marker("model"):
            item.add_marker(pytest.mark.xdist_group("model"))


@pytest.fixture
def db_path(tmp_path: Path) -> str:
    """A path for a new SQLite database in the test's temp dir."""
    return str(tmp_path / "fsm.db")


@pytest.fixture
def notify_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Route the reference machine's notifications to a JSONL file in tmp."""
    path = tmp_path / "notifications.jsonl"
    monkeypatch.setenv("FSM_NOTIFY_FILE", str(path))
    monkeypatch.delenv("FSM_NOTIFY_URL", raising=False)
    return path


def scripted(*replies: dict) -> Scripted:
    """A scripted provider from reply dicts (text, prompt_tokens, completion_tokens, ...)."""
    return Scripted.from_replies(list(replies))


GOOD_VERDICT = {"text": '{"decision": "approve", "categories": [], "summary": "fine"}',
                "prompt_tokens": 50, "completion_tokens": 20}


@pytest.fixture
def engine(db_path: str):
    """An Engine on a fresh database with a scripted model answering a valid verdict."""
    eng = Engine(db_path, llm=scripted(GOOD_VERDICT), seed=1)
    yield eng
    try:
        eng.close()
    except Exception:
        pass


def license_files(n: int | None = None) -> list[str]:
    """Real input: the license texts every Debian machine has (sorted, regular files)."""
    files = sorted(str(p) for p in LICENSES.iterdir() if p.is_file()) if LICENSES.exists() else []
    return files[:n] if n else files


@pytest.fixture(scope="session")
def fleet(tmp_path_factory: pytest.TempPathFactory):
    """A database of real finished instances of three machines (``observe_fixtures``),
    built once per session for the statistics, viewer and browser tests (read only)."""
    from observe_fixtures import build_fleet
    tmp = tmp_path_factory.mktemp("fleet")
    mp = pytest.MonkeyPatch()
    mp.setenv("FSM_NOTIFY_FILE", str(tmp / "notifications.jsonl"))
    try:
        return build_fleet(str(tmp / "fleet.db"), tmp)
    finally:
        mp.undo()


@pytest.fixture
def sink():
    """A loopback HTTP webhook sink (``scale_harness.Sink``) that counts deliveries by key."""
    from scale_harness import Sink
    s = Sink()
    yield s
    s.close()


@pytest.fixture
def fleets():
    """``scale_harness.Fleet``s made by a test; any worker still running at its end is
    stopped (SIGTERM, then SIGKILL after 15 s)."""
    made: list = []
    yield made
    for fleet in made:
        fleet.stop(timeout=15)
