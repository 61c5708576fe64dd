"""Debian's headless Chromium for the viewer and console tests: where the browser and
its driver are, skipping (failing in CI) without them, and waiting on what a page does
(``load``, ``navigate``, ``read``); drivers are ``object`` (selenium is imported lazily)."""

from __future__ import annotations

import os
import shutil

import pytest

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
DRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"


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


def loaded(driver: object, expect: str = "") -> None:
    """Wait until the current document has finished loading and its URL contains
    ``expect`` (a path or query fragment), so nothing read next belongs to a page that is
    about to be replaced."""
    from selenium.webdriver.support.ui import WebDriverWait
    WebDriverWait(driver, 20).until(  # type: ignore[arg-type]
        lambda d: d.execute_script("return document.readyState") == "complete"
        and expect in d.current_url)


def load(driver: object, url: str) -> None:
    """Open ``url`` and wait until it is the loaded page."""
    driver.get(url)  # type: ignore[attr-defined]
    loaded(driver, url.split("://", 1)[-1].split("/", 1)[-1])


def navigate(driver: object, css: str, expect: str) -> None:
    """Click the element at ``css`` and wait until the page it leads to (its URL holding
    ``expect``) replaced this one and has loaded."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait
    old = driver.find_element(By.TAG_NAME, "html")  # type: ignore[attr-defined]
    driver.find_element(By.CSS_SELECTOR, css).click()  # type: ignore[attr-defined]
    WebDriverWait(driver, 20).until(lambda _: gone(old))
    loaded(driver, expect)


def gone(element: object) -> bool:
    """True once ``element`` left the document: ``staleness_of``, also when Chromium says
    so as an inspector error ("Node with given id does not belong to the document", seen
    here when the page is replaced while the check runs) instead of a stale reference."""
    from selenium.common.exceptions import StaleElementReferenceException, WebDriverException
    try:
        element.is_enabled()  # type: ignore[attr-defined]
    except StaleElementReferenceException:
        return True
    except WebDriverException as exc:
        if "does not belong to the document" in str(exc):
            return True
        raise
    return False


READ = """
const [css, attrs] = arguments;
const text = e => (e.innerText === undefined ? e.textContent : e.innerText).trim();
return Array.from(document.querySelectorAll(css), e => attrs.length
  ? attrs.map(a => a === "text" ? text(e) : a === "cells"
      ? Array.from(e.querySelectorAll("td"), text) : (e.getAttribute(a) || ""))
  : text(e));
"""


def read(driver: object, css: str, *attrs: str) -> list:
    """Every element at ``css`` in ONE script run, as plain values (no element handle
    outlives the call): its text, or with ``attrs`` a list of those attributes per element
    (``"text"``: its text, ``"cells"``: its ``td`` texts)."""
    return driver.execute_script(READ, css, list(attrs))  # type: ignore[attr-defined]
