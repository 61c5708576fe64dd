"""The console's doors against hostile input, in-process over a SQLite file (issue 36,
items 11 and 15): deep JSON and an over-long form are 400s with nothing spent, every
error response carries the security headers, the cookie holds a session value derived
from the token (never the token), a bulk confirmation is bound to its whole action (its
query and the set it counted) and its POST touches no instance it did not count, and a
signed link's use is recorded in the decision's history row (which link, not its
secret).  The same against a real server process is in ``test_console_slow_peers.py``."""

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
from fsm_engine.ui.headers import SECURITY_HEADERS  # noqa: E402

TOKEN = "console-token-for-tests"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
DEEP = "[" * 5000 + "]" * 5000


class Setup:
    def __init__(self, tmp_path: Path) -> None:
        import time
        self.engine = Engine(str(tmp_path / "fsm.db"), llm=None)
        helpers = ROOT / "tests/helpers"
        self.console, _ = load_machine(str(helpers / "console_machine.py"))
        self.inbox, _ = load_machine(str(helpers / "console_machine.py") + ":inbox")
        self.reviewed, _ = load_machine(str(helpers / "review_machine.py"))
        self.store = self.engine.store
        self.now = time.time()
        self.app = create_app(self.store, token=TOKEN,
                              console=Console(self.engine, clock=lambda: self.now))
        self.client = TestClient(self.app, headers=AUTH)
        self.anon = TestClient(self.app)

    def queued(self, n: int = 1) -> list[str]:
        return self.engine.start_many(self.console, [{"n": i} for i in range(n)], enqueue=True)

    def waiting(self, machine: Any, data: dict[str, Any]) -> str:
        iid = self.engine.start(machine, data)
        asyncio.run(self.engine.run(iid))
        return iid

    def review(self) -> tuple[str, str]:
        iid = self.waiting(self.reviewed, {"text": "hello"})
        [item] = self.engine.reviews(instance_id=iid)
        return iid, item.id

    def link(self, item: str) -> str:
        link = review_links.sign(self.store, item, "rita", 3600, self.now)
        return urllib.parse.urlsplit(review_links.url("http://testserver", link))._replace(
            scheme="", netloc="").geturl()


@pytest.fixture
def s(tmp_path: Path):
    setup = Setup(tmp_path)
    yield setup
    setup.engine.close()


def form_of(page: str) -> dict[str, str]:
    """The hidden fields of a confirmation page's form."""
    fields = dict(re.findall(r'<input type="hidden" name="(\w+)" value="([^"]*)">', page))
    assert "csrf" in fields, page
    return fields


def secured(response: Any) -> bool:
    return all(response.headers.get(k) == v for k, v in SECURITY_HEADERS.items())


def test_deep_json_and_too_many_fields_are_400s_that_spend_nothing(s: Setup) -> None:
    iid = s.waiting(s.inbox, {})
    path = f"/console/instances/{iid}/send"
    hidden = form_of(s.client.get(path).text)
    deep = s.client.post(path, data={**hidden, "as": "dee", "trigger": "release",
                                     "update": '{"note": ' + DEEP + "}"})
    assert deep.status_code == 400 and "nests deeper than 100" in deep.text
    assert secured(deep) and s.store.history(iid) == []
    fields = {f"f{i}": "x" for i in range(201)}
    many = s.client.post(path, data={**hidden, **fields})
    assert many.status_code == 400 and secured(many)

    rid, item = s.review()
    link = s.link(item)
    hidden = form_of(s.anon.get(link).text)
    spent = s.anon.post(link, data={**hidden, "choice": "approve",
                                    "edit": '{"label": ' + DEEP + "}"})
    assert spent.status_code == 400 and secured(spent)
    assert s.engine.review(item).status == "open"
    done = s.anon.post(link, data={**hidden, "choice": "approve", "edit": '{"label": "ok"}'})
    assert done.status_code == 200, done.text  # the link was not spent
    assert s.engine.review(item).status == "decided"


def test_every_error_response_carries_the_security_headers(s: Setup,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    viewer = TestClient(create_app(s.store))
    refused = viewer.post("/", data={"as": "x"})
    assert refused.status_code == 405 and secured(refused)
    [iid] = s.queued()
    path = f"/console/instances/{iid}/pause"
    hidden = form_of(s.client.get(path).text)

    def boom(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("a fault nobody expected")
    monkeypatch.setattr(s.engine, "pause", boom)
    broken = TestClient(s.app, headers=AUTH, raise_server_exceptions=False)
    crashed = broken.post(path, data={**hidden, "as": "ann"})
    assert crashed.status_code == 500 and secured(crashed)
    assert "a fault nobody expected" not in crashed.text


def test_the_cookie_holds_a_session_value_never_the_token(s: Setup) -> None:
    first = s.anon.get(f"/?token={TOKEN}")
    assert first.status_code == 200
    cookie = first.headers["set-cookie"]
    assert TOKEN not in cookie
    session = first.cookies.get("fsm_ui_token") or cookie.split(";")[0].split("=", 1)[1]
    assert session and session != TOKEN
    fresh = TestClient(s.app)
    fresh.cookies.set("fsm_ui_token", session)
    assert fresh.get("/").status_code == 200  # the session value works as the cookie
    raw = TestClient(s.app)
    raw.cookies.set("fsm_ui_token", TOKEN)
    assert raw.get("/").status_code == 401  # the token itself is not a cookie value
    forged = TestClient(s.app)
    forged.cookies.set("fsm_ui_token", session[:-1] + ("0" if session[-1] != "0" else "1"))
    assert forged.get("/").status_code == 401


def test_a_bulk_confirmation_is_bound_to_its_query(s: Setup) -> None:
    mine = s.queued(2)
    other = s.engine.start(s.inbox, {})
    confirmed = "/console/bulk/cancel?" + urllib.parse.urlencode({"machine": "console"})
    hidden = form_of(s.client.get(confirmed).text)
    unfiltered = s.client.post("/console/bulk/cancel", data={**hidden, "as": "ops"})
    assert unfiltered.status_code == 403
    widened = s.client.post(confirmed + "&machine=inbox", data={**hidden, "as": "ops"})
    assert widened.status_code == 403
    assert {s.store.get(i).status for i in [*mine, other]} == {"pending"}
    done = s.client.post(confirmed, data={**hidden, "as": "ops"})
    assert done.status_code == 200 and "2 changed" in done.text
    assert s.store.get(other).status == "pending"


def test_a_bulk_post_touches_no_instance_its_confirmation_did_not_count(s: Setup) -> None:
    first = s.queued(3)
    path = "/console/bulk/cancel?" + urllib.parse.urlencode({"machine": "console"})
    page = s.client.get(path)
    assert re.search(r"<strong>3</strong> instance\(s\) match", page.text)
    later = s.queued(2)
    moved = s.client.post(path, data={**form_of(page.text), "as": "ops"})
    assert moved.status_code == 409 and "open the confirmation page again" in moved.text
    assert {s.store.get(i).status for i in [*first, *later]} == {"pending"}
    again = s.client.get(path)
    done = s.client.post(path, data={**form_of(again.text), "as": "ops"})
    assert done.status_code == 200 and "5 changed" in done.text


def test_a_signed_links_use_is_in_the_decisions_history_row(s: Setup) -> None:
    iid, item = s.review()
    link = s.link(item)
    sig = urllib.parse.parse_qs(urllib.parse.urlsplit(link).query)["sig"][0]
    done = s.anon.post(link, data={**form_of(s.anon.get(link).text), "choice": "approve"})
    assert done.status_code == 200, done.text
    [row] = [h for h in s.store.history(iid) if h.kind == "review"]
    used = row.detail["review"]["link"]
    assert used["by"] == "rita" and used["expires"] > s.now and used["id"]
    assert sig not in repr(row.detail)  # which link, never its secret
    other = review_links.sign(s.store, item, "rita", 7200, s.now)  # another link, another id
    assert review_links.link_id(other.sig) != used["id"] == review_links.link_id(sig)


@pytest.mark.parametrize("how", ["option", "env"])
def test_a_blank_token_is_refused_at_start_up_in_one_line(tmp_path: Path, how: str) -> None:
    import os
    import subprocess
    import sys
    db = str(tmp_path / "fsm.db")
    Engine(db, llm=None).close()
    for token in (" " * 12, "\t" * 9, "good-part  more"):
        args = ["--token", token] if how == "option" else []
        env = {**os.environ, "FSM_UI_TOKEN": token} if how == "env" else dict(os.environ)
        done = subprocess.run([sys.executable, "-m", "fsm_engine.cli", "ui", "--write", "--db",
                               db, "--port", "0", *args], env=env, capture_output=True,
                              text=True, timeout=60)
        assert done.returncode == 2 and done.stdout == "", (token, done.stdout)
        assert done.stderr.startswith("fsm: error: --token") and done.stderr.count("\n") == 1
    from fsm_engine.errors import InvalidInput
    engine = Engine(db, llm=None)
    try:
        with pytest.raises(InvalidInput, match="no spaces"):
            create_app(engine.store, token="        ")
    finally:
        engine.close()
