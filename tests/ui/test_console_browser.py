"""The console (``fsm ui --write`` in a subprocess) in a real headless Chromium: each
action through its confirmation page with the token; without the token 401; a forged
cross-origin form refused; signed review links decide once, not after expiry, and open
nothing else.  Each action leaves one history row naming the operator."""

from __future__ import annotations

import asyncio
import re
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from browser import CHROMIUM, DRIVER, _need_browser, load, navigate, read
from cli import ENTRY
from conftest import ROOT
from procs import stop

from fsm_engine import Engine, load_machine
from fsm_engine.runtime.kinds import review_links
from fsm_engine.store import open_store

pytestmark = pytest.mark.browser

TOKEN = "console-browser-token"


class World:
    """A SQLite file with instances to act on, and `fsm ui --write` serving it."""

    def __init__(self, folder: Path) -> None:
        self.db = str(folder / "console.db")
        eng = Engine(self.db, llm=None)
        try:
            console, _ = load_machine(str(ROOT / "tests/helpers/console_machine.py"))
            inbox = "tests/helpers/console_machine.py:inbox"  # stored as this reference: the console
            # (another process) loads it from there
            reviewed, _ = load_machine(str(ROOT / "tests/helpers/review_machine.py"))
            self.queued = eng.start_many(console, [{"n": i} for i in range(12)], enqueue=True)
            self.inbox = eng.start(inbox, {})
            self.reviewed = [eng.start(reviewed, {"text": t}) for t in ("one", "two", "three")]

            async def settle() -> None:
                for iid in (self.inbox, *self.reviewed):
                    await eng.run(iid)
            asyncio.run(settle())
            self.items = {i.instance_id: i.id for i in eng.reviews()}
        finally:
            eng.close()


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> World:
    return World(tmp_path_factory.mktemp("console"))


@pytest.fixture(scope="module")
def server(world: World) -> Iterator[str]:
    proc = subprocess.Popen([*ENTRY, "ui", "--write", "--db", world.db, "--port", "0",
                             "--token", TOKEN, "--refresh", "0"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        match = re.search(r"http://127\.0\.0\.1:(\d+)/", line)
        assert match and "console" in line, (line, proc.poll())
        yield f"http://127.0.0.1:{match.group(1)}"
    finally:
        stop(proc)


@pytest.fixture(scope="module")
def browser(server: str) -> Iterator[Any]:
    _need_browser()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    profile = tempfile.mkdtemp(prefix="fsm-console-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--no-first-run", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", f"--user-data-dir={profile}"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(executable_path=DRIVER), options=options)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def _login(d: Any, server: str) -> None:
    load(d, f"{server}/?token={TOKEN}")  # sets the cookie every later page sends


def _act(d: Any, css: str, expect: str, **fields: str) -> str:
    """Click ``css`` to a confirmation page, fill ``fields`` (by element id ``f-NAME``),
    confirm, and return the result page's message."""
    from selenium.webdriver.common.by import By
    navigate(d, css, expect)
    for name, value in fields.items():
        box = d.find_element(By.ID, f"f-{name}")
        if box.tag_name == "select":
            from selenium.webdriver.support.ui import Select
            Select(box).select_by_value(value)
        else:
            box.clear()
            box.send_keys(value)
    navigate(d, "#confirm", expect)
    return " ".join(read(d, "#done-message, #error-message"))


def _rows(db: str, iid: str) -> list[tuple[str, Any]]:
    store = open_store(db, readonly=True)
    try:
        return [(h.kind, h.detail.get("operator")) for h in store.history(iid)]
    finally:
        store.close()


def _status(db: str, iid: str) -> str:
    store = open_store(db, readonly=True)
    try:
        return store.get(iid).status
    finally:
        store.close()


def test_without_the_token_the_console_is_401(browser: Any, server: str, world: World) -> None:
    load(browser, f"{server}/console/instances/{world.queued[0]}/pause")
    assert "401" in browser.find_element("tag name", "body").text


def test_pause_unpause_cancel_send_and_decide_through_the_pages(
        browser: Any, server: str, world: World) -> None:
    d, iid = browser, world.queued[0]
    _login(d, server)
    load(d, f"{server}/instances/{iid}")
    said = _act(d, "#act-pause", "/pause", **{"as": "ann", "why": "maintenance"})
    assert "paused" in said and _status(world.db, iid) == "paused"
    load(d, f"{server}/instances/{iid}")
    _act(d, "#act-unpause", "/unpause", **{"as": "bob"})
    load(d, f"{server}/instances/{iid}")
    _act(d, "#act-cancel", "/cancel", **{"as": "cy"})
    assert _rows(world.db, iid) == [("pause", "ann"), ("unpause", "bob"), ("cancel", "cy")]

    load(d, f"{server}/instances/{world.inbox}")
    said = _act(d, "#act-send", "/send", **{"as": "dee", "trigger": "release",
                                            "update": '{"note": "from the console"}'})
    assert "release sent" in said and _status(world.db, world.inbox) == "completed"
    assert _rows(world.db, world.inbox) == [("transition", "dee")]

    target = world.reviewed[0]
    load(d, f"{server}/instances/{target}")
    said = _act(d, "a.act-review", "/console/reviews/", **{"as": "eve", "choice": "reject",
                                                          "note": "not ok"})
    assert "reject by eve" in said and _status(world.db, target) == "completed"
    assert [r for r in _rows(world.db, target) if r[0] == "review"] == [("review", "eve")]


def test_bulk_cancel_shows_the_count_before_it_changes_anything(
        browser: Any, server: str, world: World) -> None:
    d = browser
    _login(d, server)
    load(d, f"{server}/?machine=console&status=pending")
    pending = [i for i in world.queued if _status(world.db, i) == "pending"]
    navigate(d, "#bulk-cancel", "/console/bulk/cancel")
    assert read(d, "#bulk-count strong") == [str(len(pending))] and len(pending) >= 11
    assert _status(world.db, pending[0]) == "pending"  # the confirmation changed nothing
    from selenium.webdriver.common.by import By
    d.find_element(By.ID, "f-as").send_keys("ops")
    navigate(d, "#confirm", "/console/bulk/cancel")
    assert f"{len(pending)} changed" in " ".join(read(d, "#done-message"))
    assert {_status(world.db, i) for i in world.queued} == {"cancelled"}


class _Evil:
    """Another origin serving a form that posts to the console (a CSRF attempt)."""

    def __init__(self, target: str) -> None:
        page = (f'<form method="post" action="{target}"><input name="as" value="mallory">'
                '<button id="go">go</button></form>').encode()

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                self.send_response(200)
                self.send_header("Content-Type", "text/html")
                self.send_header("Content-Length", str(len(page)))
                self.end_headers()
                self.wfile.write(page)

            def log_message(self, *args: Any) -> None:
                pass
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_a_forged_cross_origin_post_is_refused(browser: Any, server: str, world: World) -> None:
    d, iid = browser, world.reviewed[1]
    _login(d, server)  # the victim is logged in
    evil = _Evil(f"{server}/console/instances/{iid}/pause")
    try:
        load(d, evil.url)
        navigate(d, "#go", "/pause")
        assert "cross-site request: refused" in " ".join(read(d, "#error-message"))
    finally:
        evil.close()
    assert _status(world.db, iid) == "waiting" and _rows(world.db, iid)[-1][0] != "pause"


def test_signed_links_decide_once_and_open_nothing_else(
        browser: Any, server: str, world: World) -> None:
    d = browser
    target, other = world.reviewed[1], world.reviewed[2]
    item = world.items[target]
    made = subprocess.run([*ENTRY, "review", "link", item, "--db", world.db, "--as", "rita",
                           "--ttl", "2h", "--base", server], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert made.returncode == 0, made.stderr
    url = made.stdout.strip()
    load(d, f"{server}/")  # on the console's origin, whose cookies are then dropped:
    d.delete_all_cookies()  # the reviewer has nothing but the link
    load(d, url)
    assert read(d, "#signed-by") == ["rita"]
    load(d, f"{server}/console/reviews/{world.items[other]}")
    assert "401" in d.find_element("tag name", "body").text  # no other action
    load(d, url.replace(item, world.items[other], 1))
    assert "not valid" in " ".join(read(d, "#error-message"))  # nor another item
    load(d, url)
    from selenium.webdriver.support.ui import Select
    Select(d.find_element("id", "f-choice")).select_by_value("approve")
    navigate(d, "#confirm", "/review/")
    said = " ".join(read(d, "#done-message"))
    assert "approve by rita" in said
    rows = _rows(world.db, target)
    assert [r for r in rows if r[0] == "review"] == [("review", "rita")], (rows, said, target)
    load(d, url)
    assert "already used" in " ".join(read(d, "#error-message"))

    store = open_store(world.db)
    try:  # signed two hours ago for one hour
        old = review_links.sign(store, world.items[other], "rita", 3600,
                                time.time() - 7200)
    finally:
        store.close()
    load(d, review_links.url(server, old))
    assert "expired" in " ".join(read(d, "#error-message"))
    assert _status(world.db, other) == "waiting"
