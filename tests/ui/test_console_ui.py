"""The console (``fsm ui --write``) in-process over a SQLite file: the token, CSRF, the
confirmation step, every action with its operator in the history, bulk by the viewer's
filters, signed review links (valid once, until expiry, for one item only), and the
read-only viewer's lack of any POST route.  The same through Chromium is in
``test_console_browser.py``."""

from __future__ import annotations

import asyncio
import re
import urllib.parse
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("starlette")
from conftest import ROOT  # noqa: E402
from starlette.testclient import TestClient  # noqa: E402

from fsm_engine import Engine, load_machine  # noqa: E402
from fsm_engine.runtime.kinds import review_links  # noqa: E402
from fsm_engine.ui import create_app  # noqa: E402
from fsm_engine.ui.actions import Console  # noqa: E402

TOKEN = "console-token-for-tests"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


class Setup:
    def __init__(self, tmp_path: Path, now: list[float]) -> None:
        self.db = str(tmp_path / "fsm.db")
        self.engine = Engine(self.db, llm=None)
        self.console, _ = load_machine(str(ROOT / "tests/helpers/console_machine.py"))
        self.inbox, _ = load_machine(str(ROOT / "tests/helpers/console_machine.py") + ":inbox")
        self.reviewed, _ = load_machine(str(ROOT / "tests/helpers/review_machine.py"))
        self.store = self.engine.store  # as `fsm ui --write` serves: one connection
        self.now = now
        app = create_app(self.store, token=TOKEN,
                         console=Console(self.engine, clock=lambda: self.now[0]))
        self.client = TestClient(app, headers=AUTH)
        self.anon = TestClient(app)

    def queued(self, n: int = 1) -> list[str]:
        return self.engine.start_many(self.console, [{"n": i} for i in range(n)], enqueue=True)

    def waiting(self, machine: Any, data: dict[str, Any]) -> str:
        iid = self.engine.start(machine, data)
        asyncio.run(self.engine.run(iid))
        return iid

    def close(self) -> None:
        self.engine.close()


@pytest.fixture
def now() -> list[float]:
    import time
    return [time.time()]


@pytest.fixture
def s(tmp_path: Path, now: list[float]):
    setup = Setup(tmp_path, now)
    yield setup
    setup.close()


def csrf(page: str) -> str:
    found = re.search(r'name="csrf" value="([0-9a-f]+)"', page)
    assert found, page
    return found.group(1)


def confirm(client: TestClient, path: str, **fields: str) -> Any:
    """GET the confirmation page, then POST its form with ``fields``."""
    page = client.get(path)
    assert page.status_code == 200, page.text
    return client.post(path, data={"csrf": csrf(page.text), **fields})


def operators(s: Setup, iid: str) -> list[tuple[str, Any]]:
    return [(h.kind, h.detail.get("operator")) for h in s.engine.store.history(iid)]


def test_the_console_needs_the_token_and_the_viewer_none_of_its_routes(s: Setup) -> None:
    [iid] = s.queued()
    path = f"/console/instances/{iid}/pause"
    assert s.anon.get(path).status_code == 401
    assert s.anon.post(path, data={"as": "x"}).status_code == 401
    assert s.engine.store.get(iid).status == "pending"
    viewer = TestClient(create_app(s.store))  # fsm ui without --write
    for p in ("/", f"/instances/{iid}", "/machines/console", path, "/console/bulk/cancel",
              "/review/abc"):
        assert viewer.post(p, data={"as": "x"}).status_code in (404, 405), p
    assert "actions:" not in viewer.get(f"/instances/{iid}").text
    assert 'id="act-pause"' in s.client.get(f"/instances/{iid}").text


def test_pause_unpause_cancel_through_the_console_name_the_operator(s: Setup) -> None:
    [iid] = s.queued()
    page = s.client.get(f"/console/instances/{iid}/pause")
    assert "status → paused" in page.text and iid in page.text
    assert s.engine.store.get(iid).status == "pending"  # a confirmation page changes nothing
    done = confirm(s.client, f"/console/instances/{iid}/pause", **{"as": "ann", "why": "audit"})
    assert done.status_code == 200 and "paused" in done.text
    assert s.engine.store.get(iid).status == "paused"
    confirm(s.client, f"/console/instances/{iid}/unpause", **{"as": "bob"})
    confirm(s.client, f"/console/instances/{iid}/cancel", **{"as": "cy"})
    assert s.engine.store.get(iid).status == "cancelled"
    assert operators(s, iid) == [("pause", "ann"), ("unpause", "bob"), ("cancel", "cy")]
    again = confirm(s.client, f"/console/instances/{iid}/cancel", **{"as": "cy"})
    assert again.status_code == 409 and len(operators(s, iid)) == 3  # final: refused
    nameless = confirm(s.client, f"/console/instances/{iid}/pause")
    assert nameless.status_code == 400 and "as" in nameless.text


def test_send_fork_and_rerun_through_the_console(s: Setup) -> None:
    iid = s.waiting(s.inbox, {})
    bad = confirm(s.client, f"/console/instances/{iid}/send",
                  **{"as": "dee", "trigger": "release", "update": '{"count": "many"}'})
    assert bad.status_code == 400 and s.engine.store.history(iid) == []
    sent = confirm(s.client, f"/console/instances/{iid}/send",
                   **{"as": "dee", "trigger": "release", "update": '{"note": "ok"}'})
    assert sent.status_code == 200, sent.text
    rec = s.engine.store.get(iid)
    assert rec.status == "completed" and rec.context["note"] == "ok"
    assert operators(s, iid) == [("transition", "dee")]
    forked = confirm(s.client, f"/console/instances/{iid}/rerun", **{"as": "eve", "state": "hold"})
    assert forked.status_code == 200, forked.text
    [fork] = s.engine.forks(iid)
    assert fork.state == "hold" and fork.status != "completed"
    assert fork.fork_options == {"by": "eve"}  # who made it, on the record it made
    page = s.client.get(f"/instances/{fork.id}").text
    assert '<span id="forked-by">eve</span>' in page
    again = confirm(s.client, f"/console/instances/{iid}/fork",
                    **{"as": "<b>fay</b>", "state": "hold"})
    assert again.status_code == 200, again.text
    [other] = [f for f in s.engine.forks(iid) if f.id != fork.id]
    assert other.fork_options == {"by": "<b>fay</b>"}
    assert "&lt;b&gt;fay&lt;/b&gt;" in s.client.get(f"/instances/{other.id}").text  # as text


def test_forged_posts_are_refused_and_write_nothing(s: Setup) -> None:
    [iid, other] = s.queued(2)
    path = f"/console/instances/{iid}/pause"
    assert s.client.post(path, data={"as": "mal"}).status_code == 403  # no CSRF token
    assert s.client.post(path, data={"as": "mal", "csrf": "0" * 64}).status_code == 403
    token_of_other = csrf(s.client.get(f"/console/instances/{other}/pause").text)
    assert s.client.post(path, data={"as": "mal", "csrf": token_of_other}).status_code == 403
    token = csrf(s.client.get(path).text)
    cross = s.client.post(path, data={"as": "mal", "csrf": token},
                          headers={"Origin": "http://evil.example"})
    assert cross.status_code == 403
    big = s.client.post(path, content=b"as=x&csrf=" + token.encode() + b"&pad=" + b"x" * 70_000,
                        headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert big.status_code == 400
    assert s.engine.store.history(iid) == [] and s.engine.store.get(iid).status == "pending"


def test_bulk_by_the_viewers_filters_confirms_the_count_first(s: Setup) -> None:
    ids = s.queued(30)
    path = "/console/bulk/cancel?" + urllib.parse.urlencode({"machine": "console",
                                                             "status": "pending"})
    page = s.client.get(path)
    assert re.search(r"<strong>30</strong> instance\(s\) match", page.text)
    assert all(s.engine.store.get(i).status == "pending" for i in ids)
    plan = re.search(r'name="plan" value="([0-9a-f]+)"', page.text)
    assert plan, page.text  # the digest of the 30 it counted, signed with the form
    done = s.client.post(path, data={"csrf": csrf(page.text), "plan": plan.group(1), "as": "ops"})
    assert "30 changed" in done.text
    assert {s.engine.store.get(i).status for i in ids} == {"cancelled"}
    assert {operators(s, i)[-1] for i in ids} == {("cancel", "ops")}


def _review(s: Setup) -> tuple[str, str]:
    iid = s.waiting(s.reviewed, {"text": "hello"})
    [item] = s.engine.reviews(instance_id=iid)
    return iid, item.id


def _link_path(link: review_links.Link) -> str:
    return urllib.parse.urlsplit(review_links.url("http://testserver", link))._replace(
        scheme="", netloc="").geturl()


def test_a_signed_link_decides_its_item_once_and_nothing_else(s: Setup) -> None:
    iid, item = _review(s)
    other_iid, other = _review(s)
    link = review_links.sign(s.engine.store, item, "rita", 3600, s.now[0])
    path = _link_path(link)
    page = s.anon.get(path)  # no token needed
    assert page.status_code == 200 and "deciding as" in page.text and "rita" in page.text
    forged = path.replace(item, other, 1)
    assert s.anon.get(forged).status_code == 400  # another item: the signature fails
    assert s.anon.get(path.replace("by=rita", "by=mallory")).status_code == 400
    assert s.anon.get(f"/console/reviews/{other}").status_code == 401  # no other action
    assert s.anon.get(f"/instances/{iid}").status_code == 401
    assert s.anon.post(path, data={"choice": "approve"}).status_code == 403  # needs its CSRF
    done = s.anon.post(path, data={"csrf": csrf(page.text), "choice": "approve",
                                   "note": "fine"})
    assert done.status_code == 200, done.text
    [decided] = s.engine.reviews(status="decided")
    assert (decided.id, decided.decided_by, decided.choice) == (item, "rita", "approve")
    assert s.engine.store.get(other_iid).status == "waiting"
    reused = s.anon.post(path, data={"csrf": csrf(page.text), "choice": "reject"})
    assert reused.status_code == 400 and "already used" in reused.text
    assert s.anon.get(path).status_code == 400


def test_an_expired_or_rotated_link_is_refused(s: Setup) -> None:
    _, item = _review(s)
    link = review_links.sign(s.engine.store, item, "rita", 60, s.now[0])
    path = _link_path(link)
    assert s.anon.get(path).status_code == 200
    s.now[0] += 61
    expired = s.anon.get(path)
    assert expired.status_code == 400 and "expired" in expired.text
    s.now[0] -= 61
    review_links.rotate_key(s.engine.store)
    assert s.anon.get(path).status_code == 400
    assert s.engine.reviews(status="open")[0].id == item  # still undecided


def test_a_new_review_item_is_posted_to_the_webhook_with_a_working_link(
        tmp_path: Path, now: list[float], monkeypatch: pytest.MonkeyPatch) -> None:
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    got: list[tuple[str, dict[str, Any]]] = []
    arrived = threading.Event()

    class Hook(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            got.append((self.headers.get("Idempotency-Key", ""), json.loads(body)))
            self.send_response(204)
            self.end_headers()
            arrived.set()

        def log_message(self, *args: Any) -> None:
            pass
    server = ThreadingHTTPServer(("127.0.0.1", 0), Hook)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("FSM_REVIEW_WEBHOOK", f"http://127.0.0.1:{server.server_address[1]}/h")
    monkeypatch.setenv("FSM_REVIEW_LINK_BASE", "http://console.example:8765")
    monkeypatch.setenv("FSM_REVIEW_REVIEWER", "oncall")
    s = Setup(tmp_path, now)
    try:
        iid, item = _review(s)
        assert arrived.wait(30), "the webhook got nothing"
        [(key, body)] = got
        assert key == item and body["item"] == item and body["instance_id"] == iid
        assert body["prompt"] == "Is this label right?" and body["choices"] == ["approve", "reject"]
        link = urllib.parse.urlsplit(body["link"])
        assert link.netloc == "console.example:8765" and link.path == f"/review/{item}"
        path = f"{link.path}?{link.query}"
        page = s.anon.get(path)
        assert page.status_code == 200 and "oncall" in page.text
        done = s.anon.post(path, data={"csrf": csrf(page.text), "choice": "reject"})
        assert done.status_code == 200, done.text
        [row] = [h for h in s.engine.store.history(iid) if h.kind == "review"]
        assert row.detail["operator"] == "oncall" and row.detail["review"]["by"] == "oncall"
    finally:
        s.close()
        server.shutdown()
        server.server_close()


def test_a_signed_link_page_shows_its_item_and_nothing_of_the_fleet(s: Setup) -> None:
    _, item = _review(s)
    s.queued(3)
    page = s.anon.get(_link_path(review_links.sign(s.engine.store, item, "rita", 60, s.now[0])))
    assert page.status_code == 200
    assert "machine-link" not in page.text and "/machines/" not in page.text
    assert "machine-link" in s.client.get("/").text


def test_the_browsers_fetch_metadata_decides_over_a_null_origin(s: Setup) -> None:
    [iid] = s.queued()
    path = f"/console/instances/{iid}/pause"
    token = csrf(s.client.get(path).text)
    for headers in ({"Sec-Fetch-Site": "cross-site", "Origin": "null"},
                    {"Sec-Fetch-Site": "same-site"}, {"Origin": "null"}):
        refused = s.client.post(path, data={"as": "x", "csrf": token}, headers=headers)
        assert refused.status_code == 403, headers
    ok = s.client.post(path, data={"as": "x", "csrf": token},
                       headers={"Sec-Fetch-Site": "same-origin", "Origin": "null"})
    assert ok.status_code == 200 and s.engine.store.get(iid).status == "paused"
