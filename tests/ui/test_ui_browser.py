"""The viewer in a real headless Chromium (Debian's ``chromium`` + ``chromium-driver``,
driven by selenium with the driver given by path: Selenium Manager cannot download one).

``fsm ui`` runs in a subprocess on a free loopback port with a token, exactly as a
user starts it.  Without Chromium these tests skip on a developer's machine and fail
in CI (``CI`` set), where ``.ci/run`` installs it.
"""

from __future__ import annotations

import re
import shutil
import struct
import subprocess
import tempfile
import urllib.error
import urllib.request
import zlib
from collections import Counter
from collections.abc import Iterator

import pytest
from browser import CHROMIUM, DRIVER, _need_browser, load, navigate, read
from cli import ENTRY
from observe_fixtures import QUOTED_STATE, XSS, Family, Fleet, build_family
from procs import stop  # noqa: E402

from fsm_engine import SqliteStore
from fsm_engine.store import InstanceFilter

pytestmark = pytest.mark.browser

TOKEN = "browser-test-token-1"


def _serve(db: str) -> Iterator[str]:
    """``fsm ui --port 0 --token … --refresh 0`` on ``db`` in a subprocess; yields its base
    URL (no reload of running instances' pages races the form: the reload is tested in
    test_ui.py)."""
    proc = subprocess.Popen([*ENTRY, "ui", "--db", db, "--port", "0", "--token", TOKEN,
                             "--refresh", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline() if proc.stdout else ""  # printed once it listens
        match = re.search(r"http://127\.0\.0\.1:(\d+)/", line)
        assert match, (line, proc.stderr.read() if proc.poll() is not None and proc.stderr else "")
        yield f"http://127.0.0.1:{match.group(1)}"
    finally:
        stop(proc)


@pytest.fixture(scope="module")
def server(fleet: Fleet) -> Iterator[str]:
    """The viewer on the session's fleet."""
    yield from _serve(fleet.db)


@pytest.fixture(scope="module")
def family(tmp_path_factory: pytest.TempPathFactory) -> Family:
    return build_family(str(tmp_path_factory.mktemp("family") / "family.db"))


@pytest.fixture(scope="module")
def family_server(family: Family) -> Iterator[str]:
    """The viewer on the family database (same token: the browser's cookie, set for the
    host 127.0.0.1 whatever the port, opens it too)."""
    yield from _serve(family.db)


@pytest.fixture(scope="module")
def browser(server: str) -> Iterator[object]:
    _need_browser()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    profile = tempfile.mkdtemp(prefix="fsm-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--no-first-run", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--window-size=1400,1000",
                f"--user-data-dir={profile}"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=DRIVER), options=options)
    driver.set_page_load_timeout(30)
    try:
        load(driver, f"{server}/?token={TOKEN}")  # the cookie it sets opens every other page
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def submit(driver: object, expect: str) -> None:
    """Click the form's apply button and wait until the result page (its URL holding
    ``expect``) replaced this one and has loaded."""
    navigate(driver, "#f-apply", expect)


def ids_on_page(driver: object) -> list[str]:
    return [row[0] for row in read(driver, "tr.instance-row", "data-id")]


def test_list_filters_through_the_form(browser: object, server: str, fleet: Fleet) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select
    d = browser
    load(d, f"{server}/")
    assert len(ids_on_page(d)) == sum(map(len, fleet.ids.values()))
    Select(d.find_element(By.ID, "f-machine")).select_by_value("router")  # type: ignore[attr-defined]
    submit(d, "machine=router&")
    assert sorted(ids_on_page(d)) == sorted(fleet.ids["router"])
    Select(d.find_element(By.ID, "f-machine")).select_by_value("")  # type: ignore[attr-defined]
    Select(d.find_element(By.ID, "f-status")).select_by_value("completed")  # type: ignore[attr-defined]
    submit(d, "machine=&status=completed&")
    assert sorted(ids_on_page(d)) == sorted(fleet.ids["moderation"] + fleet.ids["quoted"])
    box = d.find_element(By.ID, "f-q")  # type: ignore[attr-defined]
    box.clear()
    box.send_keys(fleet.ids["quoted"][0][:8])
    submit(d, f"q={fleet.ids['quoted'][0][:8]}&")
    assert ids_on_page(d) == fleet.ids["quoted"]


def test_instance_page_shows_the_path_with_edge_counts(browser: object, server: str,
                                                       fleet: Fleet) -> None:
    from selenium.webdriver.common.by import By
    store = SqliteStore(fleet.db, readonly=True)
    rec = max(store.list(machine="moderation"), key=lambda r: r.loop_count)
    moves = Counter(h.trigger for h in store.history(rec.id))
    store.close()
    d = browser
    load(d, f"{server}/instances/{rec.id}")
    svg = d.find_element(By.CSS_SELECTOR, "#diagram svg")  # type: ignore[attr-defined]
    assert svg.size["width"] > 300
    labels = read(d, "#diagram svg text")
    for trigger, n in moves.items():
        assert any(t.startswith(trigger) and t.endswith(f"×{n}") for t in labels), (trigger, labels)
    current = [t for t in labels if t == rec.state]
    assert current, labels
    assert len(read(d, "tr.history-row")) == sum(moves.values())


def test_machine_page_counts_equal_the_store(browser: object, server: str, fleet: Fleet) -> None:
    store = SqliteStore(fleet.db, readonly=True)
    where = InstanceFilter(machine="moderation")
    by_status, by_state = store.count(where, "status"), store.count(where, "state")
    taken = Counter((h.source, h.trigger, h.dest) for r in store.list(machine="moderation")
                    for h in store.history(r.id))
    store.close()
    d = browser
    load(d, f"{server}/machines/moderation")
    assert read(d, "#machine-total") == [str(sum(by_status.values()))]
    shown = {key: int(cells[1]) for key, cells in read(d, "#by-status tr", "data-key", "cells")}
    assert shown == by_status
    now = {state: int(n) for state, n in read(d, "tr.state-row", "data-state", "data-now")}
    assert {k: v for k, v in now.items() if v} == by_state
    edges = {(c[0], c[1], c[2]): int(c[4]) for [c] in read(d, "tr.edge-row", "cells")}
    assert edges == dict(taken)
    labels = read(d, "#diagram svg text")
    for (_, trigger, _), n in taken.items():
        assert any(t.startswith(trigger) and t.endswith(f"×{n}") for t in labels), trigger


def _png_pixels(png: bytes) -> bytes:
    """The decompressed scanlines of a PNG (enough to tell one colour from many)."""
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    pos, data = 8, b""
    while pos < len(png):
        length, kind = struct.unpack(">I4s", png[pos:pos + 8])
        if kind == b"IDAT":
            data += png[pos + 8:pos + 8 + length]
        pos += 12 + length
    return zlib.decompress(data)


def test_screenshot_is_not_blank(browser: object, server: str, tmp_path) -> None:
    d = browser
    load(d, f"{server}/machines/moderation")
    png = d.get_screenshot_as_png()  # type: ignore[attr-defined]
    (tmp_path / "machine.png").write_bytes(png)
    width, height = struct.unpack(">II", png[16:24])
    assert (width, height) >= (800, 600) and len(png) > 20_000
    pixels = _png_pixels(png)
    assert len(set(pixels[i:i + 3] for i in range(1, len(pixels) - 3, 997))) > 20  # many colours


def test_no_script_from_the_database_runs(browser: object, server: str, fleet: Fleet) -> None:
    from selenium.common.exceptions import NoAlertPresentException
    d = browser
    pages = [f"/instances/{fleet.ids['quoted'][0]}", "/machines/quoted", "/?q=__xss"]
    pages += [f"/instances/{i}" for i in fleet.ids["moderation"]]
    for page in pages:
        load(d, server + page)
        assert d.execute_script("return typeof window.__xss") == "undefined"  # type: ignore[attr-defined]
        assert d.execute_script("return document.scripts.length") == 0  # type: ignore[attr-defined]
        with pytest.raises(NoAlertPresentException):
            _ = d.switch_to.alert.text  # type: ignore[attr-defined]
        logs = d.get_log("browser")  # type: ignore[attr-defined]
        assert not [entry for entry in logs if "alert" in entry.get("message", "")], logs
    load(d, f"{server}/instances/{fleet.ids['quoted'][0]}")
    assert XSS in read(d, "#context")[0]
    assert QUOTED_STATE in read(d, "body")[0]  # the quoted, marked-up state name shows as plain text


def test_requests_without_the_token_get_401(server: str) -> None:
    for url in (f"{server}/", f"{server}/machines/moderation", f"{server}/static/style.css",
                f"{server}/?token=wrong"):
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(url, timeout=10)
        assert info.value.code == 401
    ok = urllib.request.Request(f"{server}/", headers={"Authorization": f"Bearer {TOKEN}"})
    with urllib.request.urlopen(ok, timeout=10) as response:
        assert response.status == 200


def test_a_fresh_browser_without_the_token_sees_401(browser: object, server: str) -> None:
    d = browser
    d.delete_all_cookies()  # type: ignore[attr-defined]
    try:
        load(d, f"{server}/machines/moderation")
        assert "401" in read(d, "body")[0]
    finally:
        load(d, f"{server}/?token={TOKEN}")


CHILDREN = """
return Array.from(document.querySelectorAll("#children tr.child"), row => {
  const cell = css => row.querySelector(css).innerText.trim();
  const link = row.querySelector("a");
  return [link.innerText.trim(), cell(".branch"), cell(".status"), cell(".state"),
          cell(".tokens"), link.href];
});
"""


def test_instance_page_shows_children_and_lineage(browser: object, family_server: str,
                                                  family: Family) -> None:
    store = SqliteStore(family.db, readonly=True)
    kids = {k.id: k for k in store.children(family.parent)}
    fork = store.get(family.fork)
    store.close()
    assert len(kids) == 3 and {k.status for k in kids.values()} == {"completed", "failed"}
    d = browser
    load(d, f"{family_server}/instances/{family.parent}")
    rows = d.execute_script(CHILDREN)  # type: ignore[attr-defined]
    shown = {r[0]: (r[1], r[2], r[3], int(r[4]), r[5]) for r in rows}
    assert shown == {k.id: (k.branch, k.status, k.state, k.tokens_used,
                            f"{family_server}/instances/{k.id}") for k in kids.values()}
    assert sum(v[3] for v in shown.values()) == 10  # two children called the model: 5 each
    assert read(d, "#forks tr.fork a") == [family.fork]
    navigate(d, "#forks tr.fork a", f"/instances/{family.fork}")
    assert read(d, "#instance-id") == [family.fork]
    assert read(d, "#forked-from a") == [family.parent]
    assert read(d, "#forked-at-seq") == [str(fork.forked_at_seq)] == ["1"]
    assert len(read(d, "#children tr.child")) == 3
    load(d, f"{family_server}/instances/{next(iter(kids))}")
    assert read(d, "#parent a") == [family.parent]
    assert read(d, "#forks") == []


def test_a_takeover_shows_as_a_history_row(browser: object, family_server: str,
                                           family: Family) -> None:
    d = browser
    load(d, f"{family_server}/instances/{family.adopted}")
    rows = read(d, "tr.history-row.kind-recovery")
    assert len(rows) == 1
    assert "taken over by" in rows[0] and "its process was gone" in rows[0]
    labels = read(d, "#diagram svg text")
    assert not any(t.startswith("recovery") for t in labels), labels  # not drawn as a move
    assert any("1 takeover" in t for t in labels), labels
