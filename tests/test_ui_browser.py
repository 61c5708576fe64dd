"""The viewer in a real headless Chromium (Debian's ``chromium`` + ``chromium-driver``,
driven by selenium with the driver given by path: Selenium Manager cannot download one).

``fsm ui`` runs in a subprocess on a free loopback port with a token, exactly as a
user starts it.  Without Chromium these tests skip on a developer's machine and fail
in CI (``CI`` set), where ``.ci/run`` installs it.
"""

from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
import zlib
from collections import Counter
from typing import Iterator

import pytest

from fsm_engine import SqliteStore
from fsm_engine.store import InstanceFilter
from observe_fixtures import QUOTED_STATE, XSS, Family, Fleet, build_family

pytestmark = pytest.mark.browser

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
DRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
TOKEN = "browser-test-token-1"
ENTRY = [sys.executable, "-c", "from fsm_engine.cli import main; main()"]


def _need_browser() -> None:
    missing = [p for p in (CHROMIUM, DRIVER) if not os.path.exists(p)]
    try:
        import selenium  # noqa: F401
    except ImportError:
        missing.append("the selenium package")
    if not missing:
        return
    message = f"needs {', '.join(missing)} (apt-get install chromium chromium-driver)"
    if os.environ.get("CI"):
        pytest.fail(f"CI must run the browser tests: {message}")
    pytest.skip(message)


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
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


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
        driver.get(f"{server}/?token={TOKEN}")  # the cookie it sets opens every other page
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def ids_on_page(driver: object) -> list[str]:
    from selenium.webdriver.common.by import By
    return [row.get_attribute("data-id")
            for row in driver.find_elements(By.CSS_SELECTOR, "tr.instance-row")]  # type: ignore[attr-defined]


def submit(driver: object) -> None:
    """Click the form's apply button and wait until the next page replaced this one."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait
    old = driver.find_element(By.TAG_NAME, "html")  # type: ignore[attr-defined]
    driver.find_element(By.ID, "f-apply").click()  # type: ignore[attr-defined]
    WebDriverWait(driver, 20).until(ec.staleness_of(old))
    WebDriverWait(driver, 20).until(  # type: ignore[arg-type]
        lambda d: d.execute_script("return document.readyState") == "complete")


def test_list_filters_through_the_form(browser: object, server: str, fleet: Fleet) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select
    d = browser
    d.get(f"{server}/")  # type: ignore[attr-defined]
    assert len(ids_on_page(d)) == sum(map(len, fleet.ids.values()))
    Select(d.find_element(By.ID, "f-machine")).select_by_value("router")  # type: ignore[attr-defined]
    submit(d)
    assert sorted(ids_on_page(d)) == sorted(fleet.ids["router"])
    Select(d.find_element(By.ID, "f-machine")).select_by_value("")  # type: ignore[attr-defined]
    Select(d.find_element(By.ID, "f-status")).select_by_value("completed")  # type: ignore[attr-defined]
    submit(d)
    assert sorted(ids_on_page(d)) == sorted(fleet.ids["moderation"] + fleet.ids["quoted"])
    box = d.find_element(By.ID, "f-q")  # type: ignore[attr-defined]
    box.clear()
    box.send_keys(fleet.ids["quoted"][0][:8])
    submit(d)
    assert ids_on_page(d) == fleet.ids["quoted"]


def test_instance_page_shows_the_path_with_edge_counts(browser: object, server: str,
                                                       fleet: Fleet) -> None:
    from selenium.webdriver.common.by import By
    store = SqliteStore(fleet.db, readonly=True)
    rec = max(store.list(machine="moderation"), key=lambda r: r.loop_count)
    moves = Counter(h.trigger for h in store.history(rec.id))
    store.close()
    d = browser
    d.get(f"{server}/instances/{rec.id}")  # type: ignore[attr-defined]
    svg = d.find_element(By.CSS_SELECTOR, "#diagram svg")  # type: ignore[attr-defined]
    assert svg.size["width"] > 300
    labels = [t.text for t in svg.find_elements(By.TAG_NAME, "text")]
    for trigger, n in moves.items():
        assert any(t.startswith(trigger) and t.endswith(f"×{n}") for t in labels), (trigger, labels)
    current = [t for t in labels if t == rec.state]
    assert current, labels
    rows = d.find_elements(By.CSS_SELECTOR, "tr.history-row")  # type: ignore[attr-defined]
    assert len(rows) == sum(moves.values())


def test_machine_page_counts_equal_the_store(browser: object, server: str, fleet: Fleet) -> None:
    from selenium.webdriver.common.by import By
    store = SqliteStore(fleet.db, readonly=True)
    where = InstanceFilter(machine="moderation")
    by_status, by_state = store.count(where, "status"), store.count(where, "state")
    taken = Counter((h.source, h.trigger, h.dest) for r in store.list(machine="moderation")
                    for h in store.history(r.id))
    store.close()
    d = browser
    d.get(f"{server}/machines/moderation")  # type: ignore[attr-defined]
    assert d.find_element(By.ID, "machine-total").text == str(sum(by_status.values()))  # type: ignore[attr-defined]
    shown = {row.get_attribute("data-key"): int(row.find_elements(By.TAG_NAME, "td")[1].text)
             for row in d.find_elements(By.CSS_SELECTOR, "#by-status tr")}  # type: ignore[attr-defined]
    assert shown == by_status
    now = {row.get_attribute("data-state"): int(row.get_attribute("data-now"))
           for row in d.find_elements(By.CSS_SELECTOR, "tr.state-row")}  # type: ignore[attr-defined]
    assert {k: v for k, v in now.items() if v} == by_state
    edges = {}
    for row in d.find_elements(By.CSS_SELECTOR, "tr.edge-row"):  # type: ignore[attr-defined]
        cells = [c.text for c in row.find_elements(By.TAG_NAME, "td")]
        edges[(cells[0], cells[1], cells[2])] = int(cells[4])
    assert edges == dict(taken)
    labels = [t.text for t in d.find_elements(By.CSS_SELECTOR, "#diagram svg text")]  # type: ignore[attr-defined]
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
    d.get(f"{server}/machines/moderation")  # type: ignore[attr-defined]
    png = d.get_screenshot_as_png()  # type: ignore[attr-defined]
    (tmp_path / "machine.png").write_bytes(png)
    width, height = struct.unpack(">II", png[16:24])
    assert (width, height) >= (800, 600) and len(png) > 20_000
    pixels = _png_pixels(png)
    assert len(set(pixels[i:i + 3] for i in range(1, len(pixels) - 3, 997))) > 20  # many colours


def test_no_script_from_the_database_runs(browser: object, server: str, fleet: Fleet) -> None:
    from selenium.common.exceptions import NoAlertPresentException
    from selenium.webdriver.common.by import By
    d = browser
    pages = [f"/instances/{fleet.ids['quoted'][0]}", "/machines/quoted", "/?q=__xss"]
    pages += [f"/instances/{i}" for i in fleet.ids["moderation"]]
    for page in pages:
        d.get(server + page)  # type: ignore[attr-defined]
        assert d.execute_script("return typeof window.__xss") == "undefined"  # type: ignore[attr-defined]
        assert d.execute_script("return document.scripts.length") == 0  # type: ignore[attr-defined]
        with pytest.raises(NoAlertPresentException):
            d.switch_to.alert.text  # type: ignore[attr-defined]
        logs = d.get_log("browser")  # type: ignore[attr-defined]
        assert not [entry for entry in logs if "alert" in entry.get("message", "")], logs
    d.get(f"{server}/instances/{fleet.ids['quoted'][0]}")  # type: ignore[attr-defined]
    assert XSS in d.find_element(By.ID, "context").text  # type: ignore[attr-defined]
    body = d.find_element(By.TAG_NAME, "body").text  # type: ignore[attr-defined]
    assert QUOTED_STATE in body  # the quoted, marked-up state name shows as plain text


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
        d.get(f"{server}/machines/moderation")  # type: ignore[attr-defined]
        assert "401" in d.find_element("tag name", "body").text  # type: ignore[attr-defined]
    finally:
        d.get(f"{server}/?token={TOKEN}")  # type: ignore[attr-defined]


def _cells(row: object, css: str) -> str:
    from selenium.webdriver.common.by import By
    return row.find_element(By.CSS_SELECTOR, css).text  # type: ignore[attr-defined]


def test_instance_page_shows_children_and_lineage(browser: object, family_server: str,
                                                  family: Family) -> None:
    from selenium.webdriver.common.by import By
    store = SqliteStore(family.db, readonly=True)
    kids = {k.id: k for k in store.children(family.parent)}
    fork = store.get(family.fork)
    store.close()
    assert len(kids) == 3 and {k.status for k in kids.values()} == {"completed", "failed"}
    d = browser
    d.get(f"{family_server}/instances/{family.parent}")  # type: ignore[attr-defined]
    shown = {}
    for row in d.find_elements(By.CSS_SELECTOR, "#children tr.child"):  # type: ignore[attr-defined]
        link = row.find_element(By.TAG_NAME, "a")
        shown[link.text] = (_cells(row, ".branch"), _cells(row, ".status"),
                            _cells(row, ".state"), int(_cells(row, ".tokens")),
                            link.get_attribute("href"))
    assert shown == {k.id: (k.branch, k.status, k.state, k.tokens_used,
                            f"{family_server}/instances/{k.id}") for k in kids.values()}
    assert sum(v[3] for v in shown.values()) == 10  # two children called the model: 5 each
    forks = [a.text for a in d.find_elements(By.CSS_SELECTOR, "#forks tr.fork a")]  # type: ignore[attr-defined]
    assert forks == [family.fork]
    d.find_element(By.CSS_SELECTOR, "#forks tr.fork a").click()  # type: ignore[attr-defined]
    assert d.find_element(By.ID, "instance-id").text == family.fork  # type: ignore[attr-defined]
    lineage = d.find_element(By.ID, "forked-from")  # type: ignore[attr-defined]
    assert lineage.find_element(By.TAG_NAME, "a").text == family.parent
    assert d.find_element(By.ID, "forked-at-seq").text == str(fork.forked_at_seq) == "1"  # type: ignore[attr-defined]
    assert len(d.find_elements(By.CSS_SELECTOR, "#children tr.child")) == 3  # type: ignore[attr-defined]
    d.get(f"{family_server}/instances/{next(iter(kids))}")  # type: ignore[attr-defined]
    assert d.find_element(By.CSS_SELECTOR, "#parent a").text == family.parent  # type: ignore[attr-defined]
    assert not d.find_elements(By.ID, "forks")  # type: ignore[attr-defined]


def test_a_takeover_shows_as_a_history_row(browser: object, family_server: str,
                                           family: Family) -> None:
    from selenium.webdriver.common.by import By
    d = browser
    d.get(f"{family_server}/instances/{family.adopted}")  # type: ignore[attr-defined]
    rows = d.find_elements(By.CSS_SELECTOR, "tr.history-row.kind-recovery")  # type: ignore[attr-defined]
    assert len(rows) == 1
    assert "taken over by" in rows[0].text and "without giving the instance back" in rows[0].text
    labels = [t.text for t in d.find_elements(By.CSS_SELECTOR, "#diagram svg text")]  # type: ignore[attr-defined]
    assert not any(t.startswith("recovery") for t in labels), labels  # not drawn as a move
    assert any("1 takeover" in t for t in labels), labels
