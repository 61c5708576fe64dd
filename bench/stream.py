"""Streaming (issue 22): latency from the model emitting a piece to a subscriber in another
process receiving it, the cost of streaming a step nobody watches, and store growth.

    python bench/stream.py [--pieces 400] [--every 0.02] [--instances 300] [--no-postgres]

- **latency**: a worker streams one reply of ``pieces`` pieces, one every ``every`` seconds,
  each carrying its emission time; an ``engine.stream`` subscriber in a second process
  (its own store connection) notes when each arrives.  p50/p99 per backend (SQLite, and
  PostgreSQL in a throwaway cluster).
- **unwatched cost**: ``instances`` instances of a one-call machine run with
  ``step.llm.complete`` and with ``step.llm.stream(...).text()`` (scripted replies: one
  piece, and 30 pieces), nobody subscribed; process CPU per step (threads included) and
  the ratio stream / complete.  SQLite ``synchronous=NORMAL``, as the W1/W2 benches.
- **store growth**: bytes the stream log takes per 1,000 streamed tokens (one token ≈ one
  4-character piece), SQLite pages and PostgreSQL ``pg_total_relation_size``.

Timings on a shared machine vary; the ratios and percentiles are what to read.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]

from pydantic import BaseModel  # noqa: E402

from fsm_engine import Engine, Machine, State, Step, Transition  # noqa: E402
from fsm_engine.llm.base import Completion, Provider  # noqa: E402
from fsm_engine.llm.scripted import Scripted  # noqa: E402

MSG = [{"role": "user", "content": "go"}]


class Ctx(BaseModel):
    n: int = 0
    said: str = ""


async def plain(ctx: Ctx, step: Step) -> dict[str, Any]:
    return {"said": (await step.llm.complete(MSG, max_tokens=64)).text}


async def streamed(ctx: Ctx, step: Step) -> dict[str, Any]:
    return {"said": await step.llm.stream(MSG, max_tokens=64).text()}


def machine(action: Any, name: str) -> Machine:
    return Machine(name=name, context=Ctx, initial="ask", states=[
        State("ask", action=action), State("done", final=True)],
        transitions=[Transition("ok", "ask", "done")])


class Clock(Provider):
    """Streams ``pieces`` pieces ``every`` seconds apart: each ``"T;"`` (its emission time,
    epoch seconds) with ``stamp``, else a 4-character word (a token's worth of English)."""

    name, model = "clock", "clock"

    def __init__(self, pieces: int, every: float, *, stamp: bool = True) -> None:
        self.pieces, self.every, self.stamp = pieces, every, stamp

    async def complete(self, messages: Any, **kwargs: Any) -> Completion:
        raise NotImplementedError

    async def stream(self, messages: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        parts = []
        for _ in range(self.pieces):
            await asyncio.sleep(self.every)
            piece = f"{time.time():.6f};" if self.stamp else "tok "
            parts.append(piece)
            yield piece
        yield Completion("".join(parts), 1, self.pieces, "stop", self.model)


SUBSCRIBER = """
import asyncio, json, sys, time
sys.path.insert(0, sys.argv[3])
from fsm_engine.runtime.stream_read import events
from fsm_engine.store import open_store
store = open_store(sys.argv[1], readonly=True)
lags = []


async def main():
    print("ready", flush=True)
    async for ev in events(store, sys.argv[2]):
        now = time.time()
        if ev.kind == "chunk":
            lags.extend(now - float(t) for t in ev.text.split(";") if t)
asyncio.run(main())
print(json.dumps(lags))
"""


def latency(url: str, pieces: int, every: float) -> list[float]:
    """Seconds from emission to receipt of each piece, subscriber in another process."""
    engine = Engine(url, llm=Clock(pieces, every), seed=1)
    m = machine(streamed, "clocked")
    iid = engine.start(m, {})
    sub = subprocess.Popen([sys.executable, "-c", SUBSCRIBER, url, iid, str(ROOT)],
                           stdout=subprocess.PIPE, text=True)
    assert sub.stdout is not None and sub.stdout.readline().strip() == "ready"
    time.sleep(0.5)  # the subscriber is polling before the first piece
    asyncio.run(engine.run(iid))
    out, _ = sub.communicate(timeout=120)
    engine.close()
    lags: list[float] = json.loads(out.strip().splitlines()[-1])
    assert len(lags) == pieces, (len(lags), pieces)
    return lags


def cpu_per_step(url: str, action: Any, replies: list[dict[str, Any]], n: int,
                 llm: Any = None) -> float:
    """Process CPU seconds per step of ``n`` one-call instances (the machine has one
    transition: one step each), answered by ``llm`` (default: ``replies``, scripted)."""
    engine = Engine(url, llm=llm or Scripted.from_replies(replies), seed=1,
                    breaker=None)
    m = machine(action, f"m{id(action)}")
    ids = [engine.start(m, {"n": i}) for i in range(n)]
    start = time.process_time()
    asyncio.run(engine.run_many(ids))
    spent = time.process_time() - start
    assert all(engine.store.get(i).status == "completed" for i in ids)
    engine.close()
    return spent / n


def sqlite_bytes(path: str) -> int:
    import sqlite3
    conn = sqlite3.connect(path)
    try:
        (pages,), = conn.execute("SELECT COUNT(*) FROM dbstat WHERE name LIKE '%stream_rows%'")
        return int(pages) * int(conn.execute("PRAGMA page_size").fetchone()[0])
    except sqlite3.OperationalError:  # no dbstat in this build: the file's growth instead
        return -1
    finally:
        conn.close()


def growth(url: str, tokens: int, every: float, pg: Any = None) -> float:
    """Bytes of stream log per 1,000 tokens streamed at ``every`` seconds a token."""
    engine = Engine(url, llm=Clock(tokens, every, stamp=False), seed=1)
    iid = engine.start(machine(streamed, "grown"), {})
    asyncio.run(engine.run(iid))
    engine.close()
    if pg is None:
        size = sqlite_bytes(url)
    else:
        schema = url.rsplit("%3D", 1)[1]
        [(size,)] = pg.sql(f"SELECT pg_total_relation_size('{schema}.stream_rows')")
    return 1000 * size / tokens


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pieces", type=int, default=400)
    ap.add_argument("--every", type=float, default=0.02)
    ap.add_argument("--instances", type=int, default=300)
    ap.add_argument("--no-postgres", action="store_true")
    ap.add_argument("--repeat", type=int, default=3, help="runs of each unwatched variant")
    ap.add_argument("--parts", default="latency,unwatched,http,growth")
    args = ap.parse_args()
    parts = set(args.parts.split(","))
    tmp = Path(tempfile.mkdtemp(prefix="fsm-stream-bench-"))
    cluster = None
    if not args.no_postgres and parts & {"latency", "growth"}:
        from fsm_engine.testing.postgres import PostgresCluster
        cluster = PostgresCluster().start()
    try:
        if "latency" in parts:
            _latencies(tmp, cluster, args.pieces, args.every)
        if "unwatched" in parts:
            _unwatched(tmp, args.instances, args.repeat)
        if "http" in parts:
            _http_unwatched(tmp, args.instances, args.repeat)
        if "growth" in parts:
            print(f"store growth sqlite: {growth(str(tmp / 'grow.db'), 1000, 0.002):.0f} B per "
                  "1,000 tokens (4-character pieces, one per 2 ms)")
            if cluster is not None:
                print(f"store growth postgres: "
                      f"{growth(cluster.database(), 1000, 0.002, cluster):.0f} B per 1,000 tokens")
    finally:
        if cluster is not None:
            cluster.stop()


def _latencies(tmp: Path, cluster: Any, pieces: int, every: float) -> None:
    urls = {"sqlite": str(tmp / "lat.db")}
    if cluster is not None:
        urls["postgres"] = cluster.database()
    for name, url in urls.items():
        lags = [1000 * x for x in latency(url, pieces, every)]
        print(f"latency {name}: p50 {statistics.median(lags):.1f} ms, "
              f"p99 {pct(lags, 0.99):.1f} ms, max {max(lags):.1f} ms "
              f"({len(lags)} pieces, one per {1000 * every:g} ms)")


SERVER = r"""
import json, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
PIECES = ["xxxx"] * 30


class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        usage = {"prompt_tokens": 5, "completion_tokens": 30, "total_tokens": 35}
        if not body.get("stream"):
            data = json.dumps({"id": "c", "object": "chat.completion", "created": 0,
                               "model": "m", "usage": usage, "choices": [{"index": 0,
                               "finish_reason": "stop", "message": {"role": "assistant",
                               "content": "".join(PIECES)}}]}).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        def ev(choices, extra=None):
            d = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m",
                 "choices": choices, **(extra or {})}
            return b"data: " + json.dumps(d).encode() + b"\n\n"
        out = [ev([{"index": 0, "delta": {"content": p}, "finish_reason": None}])
               for p in PIECES]
        out.append(ev([{"index": 0, "delta": {}, "finish_reason": "stop"}]))
        out.append(ev([], {"usage": usage}))
        out.append(b"data: [DONE]\n\n")
        data = b"".join(out)
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


server = ThreadingHTTPServer(("127.0.0.1", 0), H)
print(server.server_address[1], flush=True)
server.serve_forever()
"""


def _http_unwatched(tmp: Path, instances: int, repeat: int) -> None:
    """The same over HTTP: an OpenAI-compatible server in another process (its CPU not
    counted) answering 30 tokens, whole or as 30 Server-Sent Events."""
    from fsm_engine.llm.openai_compat import OpenAICompatible
    server = subprocess.Popen([sys.executable, "-c", SERVER], stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        base = f"http://127.0.0.1:{server.stdout.readline().strip()}/v1"
        runs: dict[str, list[float]] = {"plain": [], "stream": []}
        for r in range(repeat):
            for name, action in (("plain", plain), ("stream", streamed)):
                llm = OpenAICompatible(base_url=base, model="m", api_key="sk-bench",
                                       concurrency=8)
                url = f"sqlite:///{tmp}/http-{name}-{r}.db"
                runs[name].append(cpu_per_step(url, action, [], instances, llm))
        a, b = statistics.median(runs["plain"]), statistics.median(runs["stream"])
        print(f"unwatched, OpenAI-compatible HTTP, 30 tokens: complete {1e6 * a:.0f} µs "
              f"CPU/step, stream {1e6 * b:.0f} µs CPU/step (medians of {repeat}): "
              f"ratio {b / a:.3f}")
    finally:
        server.kill()
        server.wait()


def _unwatched(tmp: Path, instances: int, repeat: int) -> None:
    one = [{"text": "x" * 120, "prompt_tokens": 5, "completion_tokens": 30}]
    many = [{"chunks": ["xxxx"] * 30, "prompt_tokens": 5, "completion_tokens": 30}]
    for label, replies in (("1 piece", one), ("30 pieces", many)):
        runs: dict[str, list[float]] = {"plain": [], "stream": []}
        for r in range(repeat):  # interleaved: the machine's load hits both alike
            for name, action in (("plain", plain), ("stream", streamed)):
                url = f"sqlite:///{tmp}/{name}-{len(replies[0])}-{r}.db"
                runs[name].append(cpu_per_step(url, action, replies, instances))
        a, b = statistics.median(runs["plain"]), statistics.median(runs["stream"])
        print(f"unwatched, {label}: complete {1e6 * a:.0f} µs CPU/step, stream "
              f"{1e6 * b:.0f} µs CPU/step (medians of {repeat}): ratio {b / a:.3f}")


if __name__ == "__main__":
    main()
