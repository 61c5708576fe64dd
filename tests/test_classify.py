"""``classify`` against real exceptions (issue 10, item 5): raised by requests, httpx,
urllib3, aiohttp and urllib against real loopback sockets (a closed port, a server that
never answers, an HTTP server answering 429 / 503 / 404), plus OS and DNS errors."""

from __future__ import annotations

import asyncio
import errno
import http.server
import socket
import ssl
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from pydantic import BaseModel

from fsm_engine import Engine, Machine, RetryPolicy, State, Transition
from fsm_engine.policies import RULES, Disposition, by_status, classify, retry_after

requests = pytest.importorskip("requests")
urllib3 = pytest.importorskip("urllib3")

RETRY, FAIL = Disposition.RETRY, Disposition.FAIL


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        status = int(self.path.strip("/") or 200)
        self.send_response(status)
        if status == 429:
            self.send_header("Retry-After", "7")
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args: Any) -> None:
        pass


class Endpoints:
    """URLs on 127.0.0.1: ``http`` (answers the status in the path), ``closed`` (nothing
    listens) and ``silent`` (accepts connections, never answers)."""

    def __init__(self) -> None:
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.http = f"http://127.0.0.1:{self.server.server_address[1]}"
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.closed = f"http://127.0.0.1:{s.getsockname()[1]}/"
        self._silent = socket.socket()
        self._silent.bind(("127.0.0.1", 0))
        self._silent.listen(8)
        self.silent = f"http://127.0.0.1:{self._silent.getsockname()[1]}/"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._silent.close()


@pytest.fixture(scope="module")
def urls() -> Iterator[Endpoints]:
    ep = Endpoints()
    yield ep
    ep.close()


def raised(fn: Callable[[], Any]) -> BaseException:
    try:
        fn()
    except BaseException as exc:  # noqa: BLE001 - the instance under test
        return exc
    raise AssertionError("expected an exception")


def check(exc: BaseException, expected: Disposition, cls: type | tuple[type, ...]) -> None:
    assert isinstance(exc, cls), repr(exc)
    assert classify(exc) is expected, repr(exc)


# -- requests ----------------------------------------------------------------------------

def test_requests(urls: Endpoints) -> None:
    r = requests.exceptions
    check(raised(lambda: requests.get(urls.closed, timeout=2)), RETRY, r.ConnectionError)
    check(raised(lambda: requests.get(urls.silent, timeout=0.2)), RETRY, r.ReadTimeout)
    for status, expected in ((429, RETRY), (503, RETRY), (500, RETRY), (404, FAIL), (401, FAIL)):
        exc = raised(lambda: requests.get(f"{urls.http}/{status}", timeout=2).raise_for_status())
        check(exc, expected, r.HTTPError)
    too_many = raised(lambda: requests.get(f"{urls.http}/429", timeout=2).raise_for_status())
    assert retry_after(too_many) == 7.0
    check(raised(lambda: requests.get("nope://x")), FAIL, r.InvalidSchema)
    check(r.SSLError("certificate verify failed"), FAIL, r.SSLError)
    check(r.ChunkedEncodingError("cut"), RETRY, r.ChunkedEncodingError)


# -- httpx ---------------------------------------------------------------------------------

def test_httpx(urls: Endpoints) -> None:
    check(raised(lambda: httpx.get(urls.closed, timeout=2)), RETRY, httpx.ConnectError)
    check(raised(lambda: httpx.get(urls.silent, timeout=0.2)), RETRY, httpx.ReadTimeout)
    for status, expected in ((429, RETRY), (502, RETRY), (404, FAIL), (422, FAIL)):
        exc = raised(lambda: httpx.get(f"{urls.http}/{status}", timeout=2).raise_for_status())
        check(exc, expected, httpx.HTTPStatusError)
    too_many = raised(lambda: httpx.get(f"{urls.http}/429", timeout=2).raise_for_status())
    assert retry_after(too_many) == 7.0
    check(raised(lambda: httpx.get("nope://x")), FAIL, httpx.UnsupportedProtocol)
    check(httpx.ConnectTimeout("connect timed out"), RETRY, httpx.ConnectTimeout)
    check(httpx.RemoteProtocolError("peer closed"), RETRY, httpx.RemoteProtocolError)


def test_httpx_async(urls: Endpoints) -> None:
    async def get(url: str) -> Any:
        async with httpx.AsyncClient(timeout=0.2) as client:
            return (await client.get(url)).raise_for_status()
    check(raised(lambda: asyncio.run(get(urls.closed))), RETRY, httpx.ConnectError)
    check(raised(lambda: asyncio.run(get(urls.silent))), RETRY, httpx.ReadTimeout)
    check(raised(lambda: asyncio.run(get(f"{urls.http}/503"))), RETRY, httpx.HTTPStatusError)


# -- urllib3 and urllib --------------------------------------------------------------------

def test_urllib3(urls: Endpoints) -> None:
    e = urllib3.exceptions
    pool = urllib3.PoolManager(retries=False, timeout=urllib3.Timeout(connect=2, read=0.2))
    check(raised(lambda: pool.request("GET", urls.closed)), RETRY, e.NewConnectionError)
    check(raised(lambda: pool.request("GET", urls.silent)), RETRY, e.ReadTimeoutError)
    retrying = urllib3.PoolManager(retries=0, timeout=2)
    exc = raised(lambda: retrying.request("GET", urls.closed))
    check(exc, RETRY, e.MaxRetryError)
    status = urllib3.PoolManager(retries=urllib3.Retry(total=0, status_forcelist=[503]))
    check(raised(lambda: status.request("GET", f"{urls.http}/503")), RETRY, e.MaxRetryError)
    check(e.ProtocolError("Connection aborted.", ConnectionResetError(104, "reset")), RETRY,
          e.ProtocolError)
    check(e.SSLError("certificate verify failed"), FAIL, e.SSLError)
    check(raised(lambda: pool.request("GET", "http://[::1")), FAIL, e.LocationParseError)


def test_urllib(urls: Endpoints) -> None:
    exc = raised(lambda: urllib.request.urlopen(urls.closed, timeout=2))
    check(exc, RETRY, urllib.error.URLError)
    check(raised(lambda: urllib.request.urlopen(urls.silent, timeout=0.2)), RETRY, TimeoutError)
    for status, expected in ((429, RETRY), (503, RETRY), (404, FAIL)):
        exc = raised(lambda: urllib.request.urlopen(f"{urls.http}/{status}", timeout=2))
        check(exc, expected, urllib.error.HTTPError)
        if status == 429:
            assert retry_after(exc) == 7.0


# -- aiohttp -------------------------------------------------------------------------------

def test_aiohttp(urls: Endpoints) -> None:
    aiohttp = pytest.importorskip("aiohttp")

    async def get(url: str, timeout: float = 2) -> Any:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as s:
            async with s.get(url, raise_for_status=True) as response:
                return await response.read()
    check(raised(lambda: asyncio.run(get(urls.closed))), RETRY, aiohttp.ClientConnectorError)
    check(raised(lambda: asyncio.run(get(urls.silent, 0.2))), RETRY,
          (aiohttp.ServerTimeoutError, asyncio.TimeoutError))
    for status, expected in ((429, RETRY), (500, RETRY), (403, FAIL)):
        exc = raised(lambda: asyncio.run(get(f"{urls.http}/{status}")))
        check(exc, expected, aiohttp.ClientResponseError)
        if status == 429:
            assert retry_after(exc) == 7.0


# -- the standard library and everything else -----------------------------------------------

@pytest.mark.parametrize("exc,expected", [
    (ConnectionRefusedError(errno.ECONNREFUSED, "refused"), RETRY),
    (ConnectionResetError(errno.ECONNRESET, "reset"), RETRY),
    (TimeoutError("timed out"), RETRY),
    (OSError(errno.ETIMEDOUT, "timed out"), RETRY),
    (OSError(errno.EHOSTUNREACH, "No route to host"), RETRY),
    (OSError(errno.ENETUNREACH, "Network is unreachable"), RETRY),
    (socket.gaierror(socket.EAI_NONAME, "Name or service not known"), RETRY),
    (socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution"), RETRY),
    (socket.gaierror(socket.EAI_SERVICE, "Servname not supported"), FAIL),
    (ssl.SSLCertVerificationError(1, "certificate verify failed"), FAIL),
    (ssl.SSLEOFError(8, "EOF occurred in violation of protocol"), RETRY),
    (FileNotFoundError(errno.ENOENT, "No such file"), FAIL),
    (PermissionError(errno.EACCES, "denied"), FAIL),
    (OSError("no errno"), FAIL),
    (ValueError("bad"), FAIL), (KeyError("k"), FAIL), (TypeError("t"), FAIL),
], ids=lambda v: type(v).__name__ if isinstance(v, BaseException) else str(v))
def test_standard_library(exc: BaseException, expected: Disposition) -> None:
    assert classify(exc) is expected


def test_by_status_and_the_table() -> None:
    assert [by_status(s) for s in (408, 425, 429, 500, 503, 599)] == [RETRY] * 6
    assert [by_status(s) for s in (400, 401, 403, 404, 409, 422, 302, None)] == [FAIL] * 8
    assert all(isinstance(k, tuple) and len(k) == 2 for k in RULES)


# -- through the engine: a requests error in an action retries, a 429 waits Retry-After ------

class Ctx(BaseModel):
    url: str
    body: str = ""


CALLED: list[str] = []


def fetch(ctx: Ctx) -> dict:
    CALLED.append(ctx.url)
    url = ctx.url if len(CALLED) > 1 else ctx.url.replace("/200", "/429")
    response = requests.get(url, timeout=2)
    response.raise_for_status()
    return {"body": response.text}


FETCH = Machine(
    name="fetch", context=Ctx, initial="get",
    states=[State("get", action=fetch, retry=RetryPolicy(max_attempts=2, initial_interval=0.01,
                                                        max_retry_after=0.05)),
            State("done", final=True), State("failed", final=True, failure=True)],
    transitions=[Transition("ok", "get", "done")])


def test_an_action_hitting_429_retries_after_the_header(urls: Endpoints, db_path: str) -> None:
    CALLED.clear()
    eng = Engine(db_path, seed=3)
    rec = asyncio.run(eng.run(eng.start(FETCH, {"url": f"{urls.http}/200"})))
    assert (rec.status, rec.context["body"], len(CALLED)) == ("completed", "{}", 2)
    (attempt,) = eng.store.attempts(rec.id)
    assert attempt.error_class == "HTTPError"
    assert attempt.next_at - attempt.at == pytest.approx(0.05)  # Retry-After 7 s, capped
    eng.close()
