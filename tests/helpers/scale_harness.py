"""Real `fsm worker` processes on one store, a loopback HTTP sink and an audit trail.

Used by ``tests/runtime/fleet/test_scale_out.py`` (small counts) and ``bench/scale_out.py`` (the
issue's counts).  The reference machine (``machines/moderation.py``) runs with a
scripted model answering after ``delay_s`` and notifies the sink, which records
every POST with its ``Idempotency-Key``.  On PostgreSQL, triggers (installed by
``install_audit``) log every history insert and every change of owner with the
server's clock and the writing process (``application_name`` carries its pid).
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import threading
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from procs import wait_until  # noqa: F401 - its tests import it from here
from worker_procs import WorkerProcs

from fsm_engine.store.records import InstanceFilter

ROOT = Path(__file__).resolve().parents[2]
FSM = str(Path(sys.executable).with_name("fsm"))
MODERATION = "machines/moderation.py"
#: The reference machine's path for a good verdict, as (source, dest) pairs.
PATH = [("init", "collect"), ("collect", "preprocess"), ("preprocess", "infer"),
        ("infer", "validate"), ("validate", "output"), ("output", "notify"), ("notify", "done")]
VERDICT = '{"decision": "approve", "categories": [], "summary": "fine"}'


class Sink:
    """A webhook receiver on 127.0.0.1: every POST's idempotency key, in arrival order."""

    def __init__(self) -> None:
        keys: list[str] = []
        lock = threading.Lock()

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as a real webhook receiver would

            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                length = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(length)
                with lock:
                    keys.append(self.headers.get("Idempotency-Key", ""))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass
        self.keys = keys
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def script(folder: Path, delay_s: float) -> Path:
    """A scripted-model file answering a valid verdict after ``delay_s`` seconds."""
    path = folder / "script.jsonl"
    path.write_text(json.dumps({"text": VERDICT, "prompt_tokens": 50, "completion_tokens": 20,
                                "delay_s": delay_s}) + "\n")
    return path


def inputs(n: int) -> list[dict[str, str]]:
    """``n`` moderation inputs over the license texts every Debian machine has."""
    files = sorted(f for f in glob.glob("/usr/share/common-licenses/*") if os.path.isfile(f))
    return [{"path": files[i % len(files)]} for i in range(n)]


def enqueue(url: str, n: int) -> list[str]:
    """Create ``n`` unowned instances of the reference machine; their ids."""
    from fsm_engine import Engine
    engine = Engine(url)
    try:
        return engine.start_many(MODERATION, inputs(n), enqueue=True)
    finally:
        engine.close()


class Fleet(WorkerProcs):
    """``fsm worker`` processes on one store (each logs to its own file)."""

    def __init__(self, url: str, folder: Path, sink: Sink, *, lease: float = 1.0,
                 concurrency: int = 50, delay_s: float = 0.05, poll: float = 0.2,
                 args: Sequence[str] = (), llm: str | None = None,
                 env: dict[str, str] | None = None) -> None:
        self.url, self.folder = url, folder
        llm = llm or f"scripted:{script(folder, delay_s)}"
        self.argv = [FSM, "worker", "--db", url, "--llm", llm,
                     "--lease", str(lease), "--concurrency", str(concurrency), "--poll", str(poll),
                     "--grace", "10", *args]
        self.env = dict(os.environ, FSM_NOTIFY_URL=sink.url, FSM_MACHINES_ROOT=str(ROOT),
                        PYTHONUNBUFFERED="1", **(env or {}))
        self.procs: list[subprocess.Popen[bytes]] = []

    def spawn(self, n: int = 1) -> None:
        for _ in range(n):
            log = open(self.folder / f"worker{len(self.procs)}.log", "wb")
            self.procs.append(subprocess.Popen(self.argv, env=self.env, cwd=ROOT, stdout=log,
                                               stderr=subprocess.STDOUT))




def completed(store: Any) -> int:
    """Completed instances, counted by the store (a poll that reads every context would
    put its own cost in the server CPU the bench measures)."""
    return store.count(InstanceFilter(statuses=("completed",))).get(None, 0)


def final(store: Any) -> int:
    """Instances in a final status (``check_books`` then says whether all completed)."""
    return store.count(InstanceFilter(statuses=("completed", "failed", "cancelled"))
                       ).get(None, 0)


AUDIT = """
CREATE TABLE audit_history (instance BIGINT, seq INTEGER, app TEXT,
    at DOUBLE PRECISION DEFAULT extract(epoch FROM clock_timestamp()));
CREATE FUNCTION audit_history() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN
    INSERT INTO audit_history(instance, seq, app)
    VALUES (NEW.instance, NEW.seq, current_setting('application_name'));
    RETURN NEW; END $$;
CREATE TRIGGER audit_history AFTER INSERT ON history
    FOR EACH ROW EXECUTE FUNCTION audit_history();
CREATE TABLE audit_owner (instance BIGINT, old_owner TEXT, new_owner TEXT,
    old_lease DOUBLE PRECISION, app TEXT,
    at DOUBLE PRECISION DEFAULT extract(epoch FROM clock_timestamp()));
CREATE FUNCTION audit_owner() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN
    INSERT INTO audit_owner(instance, old_owner, new_owner, old_lease, app)
    VALUES (OLD.key, OLD.owner, NEW.owner,
            (SELECT lease_until FROM workers WHERE id = OLD.owner),
            current_setting('application_name'));
    RETURN NEW; END $$;
CREATE TRIGGER audit_owner AFTER UPDATE ON instances FOR EACH ROW
    WHEN (NEW.owner IS NOT NULL AND OLD.owner IS DISTINCT FROM NEW.owner)
    EXECUTE FUNCTION audit_owner();
CREATE TABLE audit_lease (worker TEXT, heartbeat_at DOUBLE PRECISION,
    lease_until DOUBLE PRECISION,
    at DOUBLE PRECISION DEFAULT extract(epoch FROM clock_timestamp()));
CREATE FUNCTION audit_lease() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN
    INSERT INTO audit_lease(worker, heartbeat_at, lease_until)
    VALUES (NEW.id, NEW.heartbeat_at, NEW.lease_until);
    RETURN NEW; END $$;
CREATE TRIGGER audit_lease AFTER INSERT OR UPDATE ON workers FOR EACH ROW
    EXECUTE FUNCTION audit_lease();
"""


def install_audit(url: str) -> None:
    """Create the audit tables and triggers in the store's schema (PostgreSQL)."""
    import psycopg
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(AUDIT)


def leases_granted(url: str) -> dict[str, float]:
    """Worker id -> the furthest ``lease_until`` any registration or renewal of it ever
    wrote (from ``audit_lease``; a takeover's end of a lease grants nothing)."""
    out: dict[str, float] = {}
    for row in audit(url, "audit_lease"):
        if row["lease_until"] is not None and row["lease_until"] > row["heartbeat_at"]:
            out[row["worker"]] = max(out.get(row["worker"], 0.0), row["lease_until"])
    return out


def audit(url: str, table: str) -> list[dict[str, Any]]:
    import psycopg
    from psycopg.rows import dict_row
    with psycopg.connect(url, autocommit=True) as conn:
        return conn.cursor(row_factory=dict_row).execute(f"SELECT * FROM {table}").fetchall()


def check_books(store: Any, ids: list[str], sink: Sink) -> dict[str, Any]:
    """Every instance completed along the reference path, each step recorded once with
    no gap (takeovers by another worker as ``recovery`` rows in between), one outbox row
    done per instance, the sink holding each key; returns counts and ``takeovers``, the
    ``(instance id, from worker, to worker)`` of each recovery row."""
    records = {r.id: r for r in store.list()}
    statuses = {(records[i].status, records[i].reason) for i in ids}
    assert statuses == {("completed", None)}, (statuses, [
        [(h.kind, h.source, h.dest, h.detail.get("recovery") or h.error) for h in store.history(i)]
        for i in ids if records[i].status != "completed"][:3])
    takeovers = []
    for iid in ids:
        rows = store.history(iid)
        assert [h.seq for h in rows] == list(range(1, len(rows) + 1)), iid
        steps = [h for h in rows if h.kind != "recovery"]
        assert [(h.source, h.dest) for h in steps] == PATH, iid
        for h in rows:
            if h.kind == "recovery":
                info = h.detail["recovery"]
                assert h.source == h.dest and info["from"] != info["to"], (iid, info)
                takeovers.append((iid, info["from"], info["to"]))
    box = store.outbox()
    assert sorted(b.instance_id for b in box) == sorted(ids)  # one key per instance
    assert {b.status for b in box} == {"done"}
    keys = {b.key for b in box}
    assert set(sink.keys) == keys  # every key delivered, and nothing else
    return {"deliveries": len(sink.keys), "repeats": len(sink.keys) - len(keys),
            "outbox_attempts": sum(b.attempts for b in box), "takeovers": takeovers}
