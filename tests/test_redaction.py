"""Credentials never printed, stored or served (issue 19, finding 7).

A PostgreSQL password given as ``?password=`` (not ``user:pass@``) and credentials inside
``OPENAI_BASE_URL`` (``user:pass@``, ``?api_key=``, ``&token=``) must not reach: a
connection error, ``Store.url``/``repr``, the viewer's banner, the ``view:`` hint, any
viewer page (the 503 page included), ``history.error``/``last_error``/attempts, the CLI's
output or a log line.  Real PostgreSQL, real SQLite, real subprocesses.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from plain_source import PLAIN

from fsm_engine.errors import StoreError
from fsm_engine.store import InstanceFilter, open_store
from fsm_engine.testing.contract import fleet
from fsm_engine.testing.postgres import PASSWORD, PostgresCluster, free_port

ENTRY = [sys.executable, "-m", "fsm_engine.cli"]
SECRETS = ("PW-SECRET-1", "KEY-SECRET-2", "TOK-SECRET-3")

MACHINE = '''
from pydantic import BaseModel

from fsm_engine import Machine, RetryPolicy, State, Transition, fire


class C(BaseModel):
    note: str = ""


async def ask(ctx, step):
    out = await step.llm.complete([{"role": "user", "content": "hi"}], max_tokens=5)
    return fire("next", note=out.text)

machine = Machine(name="leaky", initial="ask", context=C, max_transitions=5, states=[
    State("ask", action=ask, retry=RetryPolicy(max_attempts=2, initial_interval=0.01)),
    State("done", final=True), State("failed", final=True, failure=True)],
    transitions=[Transition("next", "ask", "done")])
'''


def query_password_url(cluster: PostgresCluster) -> str:
    """A fresh schema's URL with the password as ``?password=`` (no ``user:pass@``)."""
    url = cluster.database().replace(f":{PASSWORD}@", "@")
    assert PASSWORD not in url
    return url + f"&password={PASSWORD}"


@pytest.mark.parametrize("text,gone,kept", [
    ("postgresql://u:s3cr%40t@h:5/db", "s3cr", "postgresql://u@h:5/db"),
    ("postgresql://u:p@ss@h/db", "p@ss", "postgresql://u@h/db"),
    ("postgresql://u@h/db?sslmode=require&password=s3cret", "s3cret",
     "postgresql://u@h/db?sslmode=require"),
    ("postgresql://h/db?PassWord=s3cret&sslpassword=k3y", "s3cret", "postgresql://h/db"),
    ("postgresql://h/db?pass%77ord=s3cret&x=1", "s3cret", "postgresql://h/db?x=1"),
    ("postgresql://h/db?password%3Ds3cret", "s3cret", "postgresql://h/db"),
    ("http://h/v1?api_key=s3cret;apikey=s3cret&key=s3cret&auth=s3cret&secret=s3cret&x=1",
     "s3cret", "http://h/v1?x=1"),
    ("https://h/cb#access_token=s3cret", "s3cret", "https://h/cb"),
    ("host=db port=5 password=s3cret dbname=x", "s3cret", "host=db port=5 password=*** dbname=x"),
    ("host=db password = 'with space s3cret' user=u", "s3cret", "password = *** user=u"),
    ("failed at postgresql://u:s3cret@h/db: refused", "s3cret", "at postgresql://u@h/db: refused"),
    ("header Authorization: Bearer s3cret-abcdef", "s3cret", "Authorization: ***"),
    ("Authorization: Basic czNjcmV0OnB3", "czNjcmV0", "Authorization: ***"),
    ("sent Bearer s3cret-abcdef", "s3cret", "sent Bearer ***"),
    ("basic information and tokens_used=5 token_budget=9", "",
     "basic information and tokens_used=5 token_budget=9"),
    ("nothing here: a=1 b=two", "", "nothing here: a=1 b=two"),
    # English words that merely contain pass/key/auth/token are not secrets (issue 36)
    ("author=Bob; passage=Call me Ishmael; keyboard=qwerty monkey=1 authored_by=ann",
     "", "author=Bob; passage=Call me Ishmael; keyboard=qwerty monkey=1 authored_by=ann"),
    ("http://h/a?author=bob&passage=x&tokens=3", "", "http://h/a?author=bob&passage=x&tokens=3"),
    # credential-looking names, as words or snake/camel segments
    ("db_pass=s3cret clientSecret=s3cret X-Api-Key=s3cret authToken=s3cret", "s3cret",
     "db_pass=*** clientSecret=*** X-Api-Key=*** authToken=***"),
    ("PGPASSWORD=s3cret auth_header=s3cret private_key=s3cret sessionkey=s3cret", "s3cret",
     "PGPASSWORD=*** auth_header=*** private_key=*** sessionkey=***"),
    # values shaped like well-known credentials, wherever they stand
    ("the model said sk-proj-abcdefghijklmnop1234 and ghp_abcdefghijklmnopqrstuvwxyz0123",
     "abcdefghijklmnop", "the model said *** and ***"),
    ("AKIAABCDEFGHIJKLMNOP eyJhbGciOiJIUzI1.eyJzdWIiOiIxMjM0.c2lnbmF0dXJlX3g", "AKIAAB",
     "*** ***"),
])
def test_redact_every_form(text: str, gone: str, kept: str) -> None:
    from fsm_engine.redaction import redact
    got = redact(text)
    assert (not gone or gone not in got) and kept in got, got


def test_postgres_store_url_and_connection_errors(pg_cluster: PostgresCluster) -> None:
    url = query_password_url(pg_cluster)
    store = open_store(url)
    try:
        assert PASSWORD not in store.url and PASSWORD not in repr(store)
        assert "options=" in store.url  # what is not a secret is kept
        with pytest.raises(StoreError) as caught:  # a server-side error names the URL
            store.query(InstanceFilter(text="\x00"))
        assert PASSWORD not in str(caught.value)
    finally:
        store.close()
    port = free_port()
    for bad in (f"postgresql://postgres@127.0.0.1:{port}/x?password={SECRETS[0]}",
                f"postgresql://postgres@127.0.0.1:{port}/x?pass%77ord={SECRETS[0]}",
                f"host=127.0.0.1 port={port} user=postgres password={SECRETS[0]} dbname=x"):
        from fsm_engine.store.postgres import PostgresStore
        with pytest.raises(StoreError) as caught:
            PostgresStore(bad, connect_timeout=2)
        assert SECRETS[0] not in str(caught.value), str(caught.value)


def _run(args: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*ENTRY, *args], capture_output=True, text=True, timeout=180,
                          env={**os.environ, **env})


def test_cli_error_lines_and_view_hint(pg_cluster: PostgresCluster, tmp_path: Path) -> None:
    bad = f"postgresql://postgres@127.0.0.1:{free_port()}/x?password={SECRETS[0]}"
    got = _run(["list", "--db", bad])
    assert got.returncode == 2 and got.stderr.startswith("fsm: error: cannot connect")
    assert SECRETS[0] not in got.stdout + got.stderr
    url = query_password_url(pg_cluster)
    module = tmp_path / "leaky.py"
    module.write_text(PLAIN)
    (tmp_path / "in.json").write_text("{}")
    (tmp_path / "replies.jsonl").write_text('{"text": "x"}\n')
    got = _run(["run", str(module), "--input", str(tmp_path / "in.json"), "--db", url,
                "--local", "--llm", f"scripted:{tmp_path / 'replies.jsonl'}"])
    assert got.returncode == 0, got.stderr
    assert "view: " in got.stdout and "options=" in got.stdout
    assert PASSWORD not in got.stdout + got.stderr


def _viewer(url: str) -> tuple[subprocess.Popen[str], str, str]:
    proc = subprocess.Popen([*ENTRY, "ui", "--db", url, "--port", "0"], text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    line = proc.stdout.readline()  # type: ignore[union-attr]
    assert " on http://" in line, (line, proc.poll() is not None and proc.stderr.read())  # type: ignore[union-attr]
    return proc, line, line.split(" on ")[1].split()[0]


def test_viewer_banner_pages_and_503_page(pg_cluster: PostgresCluster) -> None:
    url = query_password_url(pg_cluster)
    store = open_store(url)
    fleet(store)
    store.close()
    proc, banner, base = _viewer(url)
    try:
        assert PASSWORD not in banner
        for path, status in (("", 200), ("?q=%00", 503), ("instances/nope", 404),
                             ("instances/d", 200), ("machines/m1", 200)):
            page = httpx.get(base + path, timeout=30)
            assert page.status_code == status, (path, page.status_code)
            assert PASSWORD not in page.text, path
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_openai_base_url_credentials_not_stored(store_url: str, tmp_path: Path) -> None:
    """A model server that cannot be reached: the errors stored for the instance (history,
    last_error, attempts), the run's header and every line of output hold none of the
    credentials in ``OPENAI_BASE_URL``."""
    module = tmp_path / "leaky.py"
    module.write_text(MACHINE)
    (tmp_path / "in.json").write_text("{}")
    base = (f"http://bob:{SECRETS[0]}@127.0.0.1:{free_port()}/v1"
            f"?api_key={SECRETS[1]}&token={SECRETS[2]}")
    got = _run(["run", str(module), "--input", str(tmp_path / "in.json"), "--db", store_url,
                "--local", "--llm", "openai", "--json"],
               OPENAI_BASE_URL=base, FSM_MODEL="m", OPENAI_API_KEY="sk-x")
    assert got.returncode == 1, (got.stdout[-2000:], got.stderr[-2000:])
    records = json.loads(got.stdout)
    assert records[0]["status"] == "failed"
    store = open_store(store_url)
    try:
        rec = store.get(records[0]["id"])
        stored = json.dumps([rec.last_error, [h.error for h in store.history(rec.id)],
                             [a.error for a in store.attempts(rec.id)]])
    finally:
        store.close()
    assert "unreachable" in stored and "127.0.0.1" in stored
    for secret in SECRETS:
        assert secret not in stored and secret not in got.stdout + got.stderr, secret


def test_provider_texts_and_log_lines(caplog: pytest.LogCaptureFixture) -> None:
    from fsm_engine.llm import OpenAICompatible
    base = f"http://bob:{SECRETS[0]}@127.0.0.1:1/v1?api_key={SECRETS[1]}"
    llm = OpenAICompatible(base_url=base, model="m", api_key="sk-x")
    caplog.set_level(logging.DEBUG)
    texts = [repr(llm), llm.describe()]
    import asyncio
    try:
        asyncio.run(llm.complete([{"role": "user", "content": "hi"}], timeout=5))
    except Exception as exc:  # noqa: BLE001 - the mapped provider error
        texts.append(str(exc))
    texts += [r.getMessage() for r in caplog.records]
    joined = "\n".join(texts)
    assert "127.0.0.1" in joined
    assert SECRETS[0] not in joined and SECRETS[1] not in joined, joined


ACTION = '''
from pydantic import BaseModel

from fsm_engine import Machine, RetryPolicy, State, Transition, fire


class C(BaseModel):
    note: str = ""


def call(ctx, step):
    raise ConnectionError("cannot reach https://bob:PW-SECRET-1@api.example/v1"
                          "?api_key=KEY-SECRET-2 (dsn host=db password=TOK-SECRET-3)")

machine = Machine(name="calls", initial="call", context=C, states=[
    State("call", action=call, retry=RetryPolicy(max_attempts=2, initial_interval=0.01)),
    State("done", final=True), State("failed", final=True, failure=True)],
    transitions=[Transition("next", "call", "done")])
'''


def test_an_action_error_quoting_credentials_is_stored_redacted(engine_factory: object,
                                                                tmp_path: Path) -> None:
    """An action's own exception text (a URL with credentials, a DSN) is redacted before
    it is stored as last_error, a history row's error or an attempt's error."""
    from fsm_engine.runtime import load_machine
    module = tmp_path / "calls.py"
    module.write_text(ACTION)
    machine, _ = load_machine(str(module))
    engine = engine_factory(llm=None)  # type: ignore[operator]
    iid = engine.start(machine, {})
    import asyncio
    rec = asyncio.run(engine.run(iid))
    assert rec.status == "failed"
    stored = json.dumps([rec.last_error, [h.error for h in engine.store.history(iid)],
                         [a.error for a in engine.store.attempts(iid)]])
    assert "api.example" in stored and "ConnectionError" in stored
    for secret in SECRETS:
        assert secret not in stored, (secret, stored)


@pytest.mark.parametrize("name,secret", [
    ("password", True), ("PASSWD", True), ("pass", True), ("sslpassword", True), ("pwd", True),
    ("secret", True), ("client_secret", True), ("token", True), ("access_token", True),
    ("key", True), ("api_key", True), ("apikey", True), ("X-Api-Key", True), ("auth", True),
    ("authorization", True), ("sig", True), ("pass%77ord", True),
    ("tokens_used", False), ("token_budget", False), ("max_tokens", False), ("sslmode", False),
    ("options", False), ("keepalives", False), ("idempotency_key", False), ("host", False),
])
def test_secret_names(name: str, secret: bool) -> None:
    from fsm_engine.redaction import redact, secret_name
    assert secret_name(name) is secret
    assert ("s3cret" not in redact(f"{name}=s3cret")) is secret
