"""The viewer's pages in-process (Starlette's test client over a read-only store): filters,
sorting, paging, escaping, the token gate, error pages, and reads that never block a writer.
The same pages in a real Chromium are in ``test_ui_browser.py``."""

from __future__ import annotations

import html
import re
import sqlite3
import subprocess
import sys
from collections import Counter

import pytest

pytest.importorskip("starlette")
from observe_fixtures import QUOTED_STATE, XSS, Fleet  # noqa: E402
from procs import stop  # noqa: E402
from starlette.testclient import TestClient  # noqa: E402

from fsm_engine import SqliteStore, StoreError  # noqa: E402
from fsm_engine.ui import create_app  # noqa: E402

ENTRY = [sys.executable, "-c", "from fsm_engine.cli import main; main()"]
TOKEN = "s3cret-token-for-tests"


@pytest.fixture(scope="module")
def store(fleet: Fleet):
    s = SqliteStore(fleet.db, readonly=True)
    yield s
    s.close()


@pytest.fixture(scope="module")
def client(store: SqliteStore) -> TestClient:
    return TestClient(create_app(store))


def row_ids(page: str) -> list[str]:
    return re.findall(r'class="instance-row" data-id="([0-9a-f]+)"', page)


def test_list_shows_every_instance_newest_first(client: TestClient, store: SqliteStore) -> None:
    r = client.get("/")
    assert r.status_code == 200
    assert row_ids(r.text) == [rec.id for rec in reversed(store.list())]
    assert 'id="total">9<' in r.text


def test_list_filters(client: TestClient, fleet: Fleet, store: SqliteStore) -> None:
    assert sorted(row_ids(client.get("/?machine=router").text)) == sorted(fleet.ids["router"])
    assert sorted(row_ids(client.get("/?status=failed").text)) == sorted(fleet.ids["router"])
    assert row_ids(client.get("/?machine=moderation&status=failed").text) == []
    assert sorted(row_ids(client.get("/?reason=loop_limit").text)) == sorted(fleet.ids["router"])
    assert row_ids(client.get("/?state=" + QUOTED_STATE).text) == []  # it ended in done
    probed = [r.id for r in reversed(store.list()) if "WINDOW.__XSS" in str(r.context).upper()]
    assert fleet.ids["quoted"][0] in probed and len(probed) > 1  # the machine and model replies
    assert row_ids(client.get("/?q=window.__XSS").text) == probed  # case-insensitive
    assert row_ids(client.get("/?q=" + fleet.ids["router"][0][:6]).text) == [fleet.ids["router"][0]]
    assert "No instance matches" in client.get("/?machine=nope").text


def test_list_sorts_and_pages(client: TestClient, store: SqliteStore) -> None:
    by_tokens = sorted(store.list(), key=lambda r: (-r.tokens_used, -(r.key or 0)))
    assert row_ids(client.get("/?sort=tokens").text) == [r.id for r in by_tokens]
    asc = [r.id for r in store.list()]
    assert row_ids(client.get("/?dir=asc&per=20").text) == asc
    pages = [row_ids(client.get(f"/?dir=asc&per=20&page={p}").text) for p in (1, 2)]
    assert pages == [asc, []]
    first = client.get("/?per=20&sort=transitions").text
    assert 'id="next"' not in first and "page 1 of 1" in first


def test_bad_parameters_are_a_400_page_not_a_traceback(client: TestClient) -> None:
    for url in ("/?status=bogus", "/?page=x"):
        r = client.get(url)
        assert r.status_code == 400 and "Traceback" not in r.text
    assert client.get("/?sort=evil;drop").status_code == 200  # unknown sort: the default


def test_instance_page_has_path_history_attempts_and_outbox(client: TestClient,
                                                            store: SqliteStore) -> None:
    rec = next(r for r in store.list(machine="moderation") if store.attempts(r.id))
    page = client.get(f"/instances/{rec.id}").text
    assert page.count('class="history-row') == len(store.history(rec.id))
    assert "<svg" in page and "<!--" not in page and "<?xml" not in page
    moves = Counter((h.source, h.trigger, h.dest) for h in store.history(rec.id))
    labels = [html.unescape(t) for t in re.findall(r"<text[^>]*>([^<]*)</text>", page)]
    for (_, trigger, _), n in moves.items():
        assert any(t.startswith(trigger) and t.endswith(f"×{n}") for t in labels), (trigger, n)
    assert 'id="attempts"' in page and "ServerError" in page
    assert 'id="outbox"' in page and f"{rec.id}:notify:1" in page


def test_unknown_instance_and_machine_are_404_and_400(client: TestClient) -> None:
    assert client.get("/instances/deadbeef0000").status_code == 404
    assert client.get("/machines/nope").status_code == 400
    assert client.get("/no/such/page").status_code == 404


def test_machine_page_counts_equal_the_store(client: TestClient, store: SqliteStore) -> None:
    from fsm_engine.store import InstanceFilter
    page = client.get("/machines/moderation").text
    where = InstanceFilter(machine="moderation")
    for status, n in store.count(where, "status").items():
        assert re.search(rf'data-key="{status}">.*?<td class="num">{n}</td>', page)
    for state, n in store.count(where, "state").items():
        assert f'data-state="{state}" data-now="{n}"' in page
    assert 'id="machine-total">6<' in page and "<svg" in page
    assert "verdict_source" in page


def test_model_text_and_state_names_are_escaped(client: TestClient, fleet: Fleet,
                                                store: SqliteStore) -> None:
    pages = [client.get(f"/instances/{fleet.ids['quoted'][0]}"),
             client.get("/machines/quoted"), client.get("/?machine=quoted")]
    pages += [client.get(f"/instances/{i}") for i in fleet.ids["moderation"]]
    for r in pages:
        assert r.status_code == 200
        assert "<script" not in r.text.lower()
        assert "script-src" not in r.headers["content-security-policy"]  # default-src 'none'
        assert r.headers["x-content-type-options"] == "nosniff"
    quoted = pages[0].text
    assert html.escape(XSS, quote=False) in quoted or html.escape(XSS) in quoted
    assert "<b>&amp;</b>" not in quoted  # the state name is text, never markup
    assert html.escape('say "hi"', quote=True) in quoted or "say &#34;hi&#34;" in quoted


def test_token_gate(store: SqliteStore) -> None:
    gated = TestClient(create_app(store, token=TOKEN))
    assert gated.get("/").status_code == 401
    assert gated.get("/", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert gated.get("/static/style.css").status_code == 401
    assert gated.get("/?token=wrong").status_code == 401
    assert gated.get("/", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200
    browser = TestClient(create_app(store, token=TOKEN))
    first = browser.get(f"/?token={TOKEN}")
    assert first.status_code == 200 and "httponly" in first.headers["set-cookie"].lower()
    assert browser.get("/machines/router").status_code == 200  # the cookie carries on


def test_reads_never_block_a_writer_and_are_not_blocked(fleet: Fleet, client: TestClient) -> None:
    writer = sqlite3.connect(fleet.db, isolation_level=None, timeout=0.1)
    try:
        writer.execute("BEGIN IMMEDIATE")  # an engine in the middle of a group commit
        writer.execute("UPDATE instances SET updated_at = updated_at WHERE 0")
        assert client.get("/").status_code == 200
        assert client.get("/machines/moderation").status_code == 200
        writer.execute("COMMIT")  # and the viewer held no lock that stops it
        writer.execute("BEGIN IMMEDIATE")
        writer.execute("COMMIT")
    finally:
        writer.close()


def test_read_only_store_refuses_writes(fleet: Fleet) -> None:
    s = SqliteStore(fleet.db, readonly=True)
    try:
        with pytest.raises(StoreError):
            s.delete(["x"])
    finally:
        s.close()


def test_fsm_ui_refuses_an_exposed_host_without_token_and_a_missing_db(tmp_path) -> None:
    cases = [(["ui", "--db", str(tmp_path / "none.db")], "no database"),
             (["ui", "--host", "0.0.0.0", "--db", str(tmp_path / "x.db")], "--token")]
    for args, needle in cases:
        proc = subprocess.run([*ENTRY, *args], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.startswith("fsm: error:") and needle in proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1


def test_an_exposed_viewer_answers_401_without_its_token(fleet: Fleet) -> None:
    """``fsm ui --host 0.0.0.0 --token T`` as a user starts it, reached over loopback."""
    import urllib.error
    import urllib.request
    proc = subprocess.Popen([*ENTRY, "ui", "--db", fleet.db, "--host", "0.0.0.0", "--port", "0",
                             "--token", TOKEN, "--refresh", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline() if proc.stdout else ""  # printed once it listens
        match = re.search(r"http://0\.0\.0\.0:(\d+)/\?token=", line)
        assert match, (line, proc.stderr.read() if proc.poll() is not None and proc.stderr else "")
        base = f"http://127.0.0.1:{match.group(1)}"
        for url in (f"{base}/", f"{base}/machines/router", f"{base}/?token=wrong"):
            with pytest.raises(urllib.error.HTTPError) as info:
                urllib.request.urlopen(url, timeout=10)
            assert info.value.code == 401 and fleet.ids["router"][0] not in info.value.read().decode()
        ok = urllib.request.Request(f"{base}/", headers={"Authorization": f"Bearer {TOKEN}"})
        with urllib.request.urlopen(ok, timeout=10) as response:
            assert response.status == 200 and fleet.ids["router"][0] in response.read().decode()
    finally:
        stop(proc)


def test_pages_of_running_instances_reload_and_final_ones_do_not(tmp_path, fleet: Fleet) -> None:
    from fsm_engine.store import InstanceRecord
    db = str(tmp_path / "live.db")
    writer = SqliteStore(db)
    writer.create(InstanceRecord(id="live00000001", machine="router",
                                 module=str(tmp_path / "gone.py"), fingerprint="x",
                                 state="draft", status="running", context={}, input={},
                                 max_transitions=5, token_budget=None, created_at=1.0,
                                 updated_at=2.0))
    reader = SqliteStore(db, readonly=True)
    try:
        live = TestClient(create_app(reader, refresh_s=7))
        page = live.get("/instances/live00000001").text
        assert '<meta http-equiv="refresh" content="7">' in page
        assert "drawn from the recorded history only" in page  # the module is gone
        assert 'http-equiv="refresh"' in live.get("/").text
        never = TestClient(create_app(reader, refresh_s=0))  # fsm ui --refresh 0
        assert 'http-equiv="refresh"' not in never.get("/instances/live00000001").text
        assert 'http-equiv="refresh"' not in never.get("/").text
    finally:
        reader.close()
        writer.close()
    done = TestClient(create_app(SqliteStore(fleet.db, readonly=True)))
    assert 'http-equiv="refresh"' not in done.get(f"/instances/{fleet.ids['router'][0]}").text
    assert 'http-equiv="refresh"' not in done.get("/").text


def test_text_search_finds_a_large_value_stored_beside_the_row(tmp_path) -> None:
    """The list page's ``q`` and ``fsm list --text`` look inside context values kept in
    ``blobs`` (format 9), not only in the row."""
    import json

    from typer.testing import CliRunner

    from fsm_engine.cli import app
    from fsm_engine.testing.contract_context import BIG, big_record
    db = str(tmp_path / "big.db")
    rw = SqliteStore(db)
    found = big_record("aa01")
    found.context["doc"] = BIG + "a needle far down"
    rw.create(found, big_record("aa02"))
    assert "doc" in rw.get("aa01").context_refs
    rw.close()
    ro = SqliteStore(db, readonly=True)
    try:
        assert row_ids(TestClient(create_app(ro)).get("/?q=NEEDLE far").text) == ["aa01"]
    finally:
        ro.close()
    listed = CliRunner().invoke(app, ["list", "--db", db, "--text", "needle far", "--json"])
    assert listed.exit_code == 0, listed.output
    assert [r["id"] for r in json.loads(listed.stdout)] == ["aa01"]


def test_a_pause_row_reads_as_a_pause_not_an_error_on_the_instance_page(tmp_path) -> None:
    """Issue 36 (friction): the history's "error / reason" cell of a pause row showed
    ``(paused)``; it now shows the pause's note (who paused it and why) and no error."""
    from conftest import HELPERS

    from fsm_engine import Engine, load_machine
    db = str(tmp_path / "p.db")
    eng = Engine(db, llm=None)
    [iid] = eng.start_many(load_machine(str(HELPERS / "console_machine.py"))[0], [{}],
                           enqueue=True)
    eng.pause(iid, by="ann", reason="audit <b>")
    eng.close()
    reader = SqliteStore(db, readonly=True)
    try:
        page = TestClient(create_app(reader)).get(f"/instances/{iid}").text
    finally:
        reader.close()
    [cell] = re.findall(r'<td class="error-cell">(.*?)</td>', page)
    assert "paused by ann: audit &lt;b&gt;" in cell
    assert '<span class="reason">' not in cell


def test_a_delayed_start_is_listed_scheduled_with_its_due_time(tmp_path) -> None:
    """Issue 38: the list page shows a scheduled instance's due time in its reason cell,
    and filters by the status; its page holds ``due_at``."""
    from conftest import HELPERS

    from fsm_engine import Engine, load_machine
    db = str(tmp_path / "d.db")
    eng = Engine(db, llm=None)
    machine = load_machine(str(HELPERS / "start_machine.py"))[0]
    later = eng.start(machine, {"n": 1}, delay=3600)
    eng.start(machine, {"n": 2})
    eng.close()
    reader = SqliteStore(db, readonly=True)
    try:
        client = TestClient(create_app(reader))
        page = client.get("/?status=scheduled").text
        detail = client.get(f"/instances/{later}").text
    finally:
        reader.close()
    assert row_ids(page) == [later]
    assert re.search(r"due [0-9:]+ \(in 59 min\)", page)
    assert re.search(r'<dd id="due-at">due [0-9:]+ \(in 59 min\)</dd>', detail)
