"""``fsm serve``'s app in process (issue 38 item 7): its bounds (a body's size and its read
deadline, a slow body included; a request's deadline), the bearer-only token, the Host
check, the error shape of each refusal, the audit of a send, and the OpenAPI document
(valid 3.1 structure, every schema valid JSON Schema with every ``$ref`` resolving, its
paths exactly the app's routes)."""

from __future__ import annotations

import asyncio
import json
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("starlette")
pytest.importorskip("httpx")
from conftest import ROOT  # noqa: E402
from jsonschema import Draft202012Validator  # noqa: E402
from referencing import Registry, Resource  # noqa: E402
from referencing.jsonschema import DRAFT202012  # noqa: E402
from starlette.routing import Route  # noqa: E402
from starlette.testclient import TestClient  # noqa: E402

from fsm_engine import Engine  # noqa: E402
from fsm_engine.ui.api import CODES, Limits, create_api, start  # noqa: E402
from fsm_engine.ui.hosts import HostRule  # noqa: E402

MODULE = str(ROOT / "tests/helpers/api_machine.py")
TOKEN = "api-test-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    eng = Engine(str(tmp_path / "fsm.db"), llm=None)
    yield eng
    eng.close()


def _app(engine: Engine, **kwargs: Any) -> Any:
    cm = engine.load(MODULE)
    return create_api(engine, {cm.spec.name: cm}, token=TOKEN, **kwargs)


def _client(app: Any) -> TestClient:
    return TestClient(app, base_url="http://127.0.0.1:8766", raise_server_exceptions=False)


def _code(response: Any) -> str:
    """The error's code, after checking the stable shape and the status it goes with."""
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message"}, body
    assert response.status_code == CODES[body["error"]["code"]]
    assert response.headers["content-type"].startswith("application/json")
    return str(body["error"]["code"])


def _call(app: Any, path: str, headers: dict[str, str], receive: Any) -> tuple[int, dict[str, Any]]:
    """One raw ASGI POST of ``path`` whose body ``receive`` gives: (status, JSON body)."""
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)
    scope = {"type": "http", "method": "POST", "path": path, "raw_path": path.encode(),
             "query_string": b"", "scheme": "http", "http_version": "1.1",
             "server": ("127.0.0.1", 8766), "client": ("127.0.0.1", 5000),
             "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()]}
    asyncio.run(app(scope, receive, send))
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return sent[0]["status"], json.loads(body)


def test_a_declared_length_over_the_cap_is_refused_before_a_byte_is_read(engine: Engine) -> None:
    app = _app(engine, limits=Limits(max_body=100))
    read: list[int] = []

    async def receive() -> dict[str, Any]:
        read.append(1)
        return {"type": "http.request", "body": b"{}", "more_body": False}
    status, body = _call(app, "/api/machines/door/instances",
                         AUTH | {"Host": "127.0.0.1", "Content-Length": "101"}, receive)
    assert (status, body["error"]["code"], read) == (413, "body_too_large", [])


def test_a_chunked_body_over_the_cap_is_refused_413(engine: Engine) -> None:
    client = _client(_app(engine, limits=Limits(max_body=1000)))

    def chunks() -> Iterator[bytes]:  # no Content-Length: the cap counts what arrives
        yield b'{"input": {"order": "'
        for _ in range(100):
            yield b"x" * 100
        yield b'"}}'
    response = client.post("/api/machines/door/instances", content=chunks(), headers=AUTH)
    assert _code(response) == "body_too_large"
    assert engine.store.list() == []


def test_a_body_that_stalls_is_answered_408_and_nothing_is_written(engine: Engine) -> None:
    app = _app(engine, limits=Limits(body_s=0.2))
    calls = [0]

    async def receive() -> dict[str, Any]:
        calls[0] += 1
        if calls[0] == 1:
            return {"type": "http.request", "body": b'{"input": {"or', "more_body": True}
        await asyncio.Event().wait()  # the rest never comes
        raise AssertionError("unreachable")
    status, body = _call(app, "/api/machines/door/instances", AUTH | {"Host": "127.0.0.1"},
                         receive)
    assert (status, body["error"]["code"]) == (408, "body_timeout")
    assert engine.store.list() == []


def test_a_request_past_its_deadline_is_answered_504(engine: Engine) -> None:
    gate = threading.Event()

    def stuck(*args: Any, **kwargs: Any) -> tuple[str, bool]:
        gate.wait(30)  # a store that does not answer
        return start(*args, **kwargs)
    client = _client(_app(engine, limits=Limits(request_s=0.2), start_fn=stuck))
    try:
        response = client.post("/api/machines/door/instances", json={"input": {"order": "a"}},
                               headers=AUTH)
        assert _code(response) == "deadline_exceeded"
    finally:
        gate.set()


@pytest.mark.parametrize("how", ["none", "wrong", "query", "cookie", "basic"])
def test_only_the_bearer_token_lets_a_request_in(engine: Engine, how: str) -> None:
    client = _client(_app(engine))
    headers = {"wrong": {"Authorization": "Bearer " + TOKEN[:-1] + "X"},
               "basic": {"Authorization": f"Basic {TOKEN}"},
               "cookie": {"Cookie": f"fsm_ui_token={TOKEN}"}}.get(how, {})
    path = "/api/openapi.json" + (f"?token={TOKEN}" if how == "query" else "")
    response = client.get(path, headers=headers)
    assert _code(response) == "unauthorized"
    assert response.headers["www-authenticate"].startswith("Bearer")
    assert client.get("/api/openapi.json", headers=AUTH).status_code == 200


def test_a_host_it_does_not_serve_is_refused_421(engine: Engine) -> None:
    client = TestClient(_app(engine, hosts=HostRule("127.0.0.1", 8766)),
                        base_url="http://evil.example:8766")
    assert _code(client.get("/api/openapi.json", headers=AUTH)) == "misdirected"


@pytest.mark.parametrize(("body", "headers", "code"), [
    ({"input": {"order": "a"}, "extra": 1}, {}, "bad_request"),
    ({"input": ["order"]}, {}, "not_an_object"),
    ({"input": {"order": "a"}, "priority": True}, {}, "bad_request"),
    ({"input": {"order": "a"}, "priority": "high"}, {}, "bad_request"),
    ({"input": {"order": "a"}, "delay": -1}, {}, "bad_request"),
    ({"input": {"order": "a"}}, {"Idempotency-Key": "k" * 201}, "bad_request"),
    ({"input": {"qty": 2}}, {}, "invalid_input"),
    ({"input": {"order": "a", "qty": 0}}, {}, "invalid_input"),
    ({"input": {"order": "a", "lines": [{"count": 2}]}}, {}, "invalid_input"),
])
def test_a_bad_start_is_refused_with_its_code_and_writes_nothing(
        engine: Engine, body: dict[str, Any], headers: dict[str, str], code: str) -> None:
    client = _client(_app(engine))
    response = client.post("/api/machines/door/instances", json=body, headers=AUTH | headers)
    assert _code(response) == code
    assert engine.store.list() == []


def test_an_unexpected_failure_is_a_json_500(engine: Engine) -> None:
    def broken(*args: Any, **kwargs: Any) -> tuple[str, bool]:
        raise RuntimeError("boom")
    client = _client(_app(engine, start_fn=broken))
    response = client.post("/api/machines/door/instances", json={"input": {"order": "a"}},
                           headers=AUTH)
    assert _code(response) == "internal"
    assert "boom" not in response.text


def test_a_send_is_audited_as_the_api_and_validated(engine: Engine) -> None:
    client = _client(_app(engine))
    iid = client.post("/api/machines/door/instances", json={"input": {"order": "a"}},
                      headers=AUTH).json()["id"]
    asyncio.run(engine.run(iid))  # a worker takes it to its wait
    assert client.get(f"/api/instances/{iid}", headers=AUTH).json()["status"] == "waiting"
    bad = client.post(f"/api/instances/{iid}/send", json={"trigger": "release",
                                                          "payload": {"qty": "many"}},
                      headers=AUTH)
    assert _code(bad) == "invalid_input"
    undeclared = client.post(f"/api/instances/{iid}/send", json={"trigger": "nope"},
                             headers=AUTH)
    assert _code(undeclared) == "invalid_input"
    assert engine.store.history(iid) == []  # neither wrote
    sent = client.post(f"/api/instances/{iid}/send",
                       json={"trigger": "release", "payload": {"note": "go"}}, headers=AUTH)
    assert sent.status_code == 200 and sent.json()["state"] == "ship"
    row = engine.store.history(iid)[-1]
    assert (row.trigger, row.detail["operator"], row.delta) == ("release", "api", {"note": "go"})
    again = client.post(f"/api/instances/{iid}/send", json={"trigger": "release"},
                        headers=AUTH)
    assert _code(again) == "not_waiting"


def test_an_instance_of_a_machine_not_served_is_not_found(engine: Engine) -> None:
    from api_machine import other
    client = _client(_app(engine))
    hidden = engine.start_many(other, [{"order": "a"}], enqueue=True)[0]
    for response in (client.get(f"/api/instances/{hidden}", headers=AUTH),
                     client.get(f"/api/instances/{hidden}/stream", headers=AUTH),
                     client.post(f"/api/instances/{hidden}/send", json={"trigger": "release"},
                                 headers=AUTH),
                     client.post("/api/machines/other/instances", json={"input": {}},
                                 headers=AUTH),
                     client.get("/api/instances/nosuch", headers=AUTH)):
        assert _code(response) == "not_found"


# -- the OpenAPI document ------------------------------------------------------------------
_METHODS = {"get", "put", "post", "delete", "options", "head", "patch", "trace"}


def _schemas(node: Any) -> Iterator[Any]:
    """Every Schema Object of the document (under ``schema`` keys and in components)."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "schema":
                yield value
            elif key == "schemas" and isinstance(value, dict):
                yield from value.values()
            else:
                yield from _schemas(value)
    elif isinstance(node, list):
        for value in node:
            yield from _schemas(value)


def _refs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        if isinstance(node.get("$ref"), str):
            yield node["$ref"]
        for value in node.values():
            yield from _refs(value)
    elif isinstance(node, list):
        for value in node:
            yield from _refs(value)


def _check_structure(doc: dict[str, Any]) -> None:
    """OpenAPI 3.1's required structure: the version, info, and per operation its
    responses; each templated path parameter declared in its path."""
    assert re.fullmatch(r"3\.1\.\d+", doc["openapi"])
    assert doc["info"]["title"] and doc["info"]["version"]
    for path, item in doc["paths"].items():
        assert path.startswith("/")
        for method, op in item.items():
            assert method in _METHODS, (path, method)
            assert op["responses"] and all(re.fullmatch(r"[1-5]\d\d|default", s)
                                           for s in op["responses"]), (path, method)
            declared = {p["name"] for p in op.get("parameters", []) if p["in"] == "path"}
            assert declared == set(re.findall(r"\{(\w+)\}", path)), (path, method)
            assert all(p["required"] for p in op.get("parameters", []) if p["in"] == "path")
    for name in doc["components"]["schemas"]:
        assert re.fullmatch(r"[A-Za-z0-9._-]+", name)


def test_the_openapi_document_is_valid_and_names_exactly_the_routes(engine: Engine) -> None:
    app = _app(engine)
    doc = _client(app).get("/api/openapi.json", headers=AUTH).json()
    _check_structure(doc)
    for schema in _schemas(doc):
        Draft202012Validator.check_schema(schema)
    registry = Registry().with_resource("urn:doc", Resource.opaque(doc))
    resolver = registry.resolver("urn:doc")
    refs = set(_refs(doc))
    assert "#/components/schemas/door.Line" in refs  # the input's nested model, hoisted
    for ref in refs:
        resolver.lookup("urn:doc" + ref)  # every $ref resolves inside the document
    # the machine's input schema accepts a valid input and refuses an invalid one
    pointer = "/paths/~1api~1machines~1door~1instances/post/requestBody/content/application~1json"
    as_schema = Registry().with_resource("urn:doc", Resource.from_contents(
        doc, default_specification=DRAFT202012))
    validator = Draft202012Validator({"$ref": f"urn:doc#{pointer}/schema"}, registry=as_schema)
    assert validator.is_valid({"input": {"order": "a", "lines": [{"sku": "x"}]}})
    assert not validator.is_valid({"input": {"order": "a", "lines": [{"count": 1}]}})
    # its paths and methods are the app's routes, neither more nor fewer
    routes = [r for r in app.app.app.router.routes if isinstance(r, Route)]
    documented = {(p, m) for p, item in doc["paths"].items() for m in item}
    matched = set()
    for path, method in documented:
        owners = [r for r in routes if r.path_regex.match(path) and method.upper() in r.methods]
        assert len(owners) == 1, (path, method)
        matched.add((owners[0].path, method))
    assert matched == {(r.path, m.lower()) for r in routes for m in r.methods if m != "HEAD"}


def test_a_served_fan_out_s_children_are_readable(engine: Engine) -> None:
    from parallel_machines import pair
    cm = engine.register(pair)
    client = _client(create_api(engine, {cm.spec.name: cm}, token=TOKEN))
    iid = client.post("/api/machines/pair/instances", json={"input": {}},
                      headers=AUTH).json()["id"]
    assert asyncio.run(engine.run(iid)).status == "completed"
    children = engine.store.children(iid)
    assert children and {c.machine for c in children} != {"pair"}
    for child in children:
        got = client.get(f"/api/instances/{child.id}", headers=AUTH)
        assert got.status_code == 200 and got.json()["parent_id"] == iid


def test_an_idempotency_key_starts_once_and_refuses_another_input(engine: Engine) -> None:
    client = _client(_app(engine))
    path, key = "/api/machines/door/instances", {"Idempotency-Key": "order-42"}
    first = client.post(path, json={"input": {"order": "a"}}, headers=AUTH | key)
    again = client.post(path, json={"input": {"order": "a"}}, headers=AUTH | key)
    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json() == {"id": first.json()["id"], "machine": "door", "created": False}
    other = client.post(path, json={"input": {"order": "b"}}, headers=AUTH | key)
    assert _code(other) == "key_conflict" and first.json()["id"] in other.json()["error"]["message"]
    assert [r.id for r in engine.store.list()] == [first.json()["id"]]
    got = client.get(f"/api/instances/{first.json()['id']}", headers=AUTH).json()
    assert got["key"] == "order-42"


def test_priority_and_delay_reach_the_instance(engine: Engine) -> None:
    client = _client(_app(engine))
    iid = client.post("/api/machines/door/instances",
                      json={"input": {"order": "a"}, "priority": 7, "delay": 3600},
                      headers=AUTH).json()["id"]
    got = client.get(f"/api/instances/{iid}", headers=AUTH).json()
    assert (got["status"], got["priority"]) == ("scheduled", 7)
    assert got["due_at"] - got["created_at"] == pytest.approx(3600, abs=60)


@pytest.mark.parametrize("body", [{"priority": 5000}, {"delay": 1e12}, {"delay": "soon"}])
def test_a_start_option_out_of_range_is_a_400(engine: Engine, body: dict[str, Any]) -> None:
    client = _client(_app(engine))
    response = client.post("/api/machines/door/instances",
                           json={"input": {"order": "a"}} | body, headers=AUTH)
    assert _code(response) == "bad_request"
    assert engine.store.list() == []


def test_every_write_is_audited_in_one_line_and_a_refused_one_is_not(engine: Engine) -> None:
    """A start (created, or named again by its key) and a send each give the audit one
    line naming the write, the instance and the client; a refused write gives none."""
    lines: list[str] = []
    client = _client(_app(engine, audit=lines.append))
    path, key = "/api/machines/door/instances", {"Idempotency-Key": "order-7"}
    iid = client.post(path, json={"input": {"order": "a"}}, headers=AUTH | key).json()["id"]
    client.post(path, json={"input": {"order": "a"}}, headers=AUTH | key)
    assert _code(client.post(path, json={"input": {"order": "b"}}, headers=AUTH | key)) \
        == "key_conflict"
    asyncio.run(engine.run(iid))
    client.post(f"/api/instances/{iid}/send", json={"trigger": "nope"}, headers=AUTH)
    client.post(f"/api/instances/{iid}/send", json={"trigger": "release"}, headers=AUTH)
    client_host = "testclient"  # starlette's TestClient's address
    assert lines == [f"start door {iid} created key order-7 from {client_host}",
                     f"start door {iid} existing key order-7 from {client_host}",
                     f"send release {iid} now {engine.store.get(iid).status} in "
                     f"{engine.store.get(iid).state} from {client_host}"]
