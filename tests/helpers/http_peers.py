"""Hostile HTTP peers on loopback, as raw socket servers (no HTTP library on the server side).

``Peer(behaviour)`` listens on 127.0.0.1 (optionally TLS with a self-signed certificate
made by the ``openssl`` CLI) and runs ``behaviour(conn, request_bytes, peer)`` once per
connection in its own thread.  ``peer.sent`` counts the bytes written to clients,
``peer.connections`` the connections accepted (TLS handshakes included, failed or not).
"""

from __future__ import annotations

import json
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

Behaviour = Callable[[socket.socket, bytes, "Peer"], None]

CHUNK = b"x" * 65536
#: an endless body stops here, so that unfixed code fails an assertion instead of the machine
ENDLESS_STOP = 256 * 1024 * 1024


def completion(model: str = "m", content: str = '{"a": 1}') -> bytes:
    """A valid chat-completions reply as JSON bytes."""
    return json.dumps({"id": "c1", "object": "chat.completion", "created": 0, "model": model,
                       "choices": [{"index": 0, "finish_reason": "stop",
                                    "message": {"role": "assistant", "content": content}}],
                       "usage": {"prompt_tokens": 5, "completion_tokens": 2,
                                 "total_tokens": 7}}).encode()


def self_signed(tmp: Path) -> tuple[str, str]:
    """A self-signed certificate for 127.0.0.1 made by the ``openssl`` CLI: (cert, key)."""
    cert, key = tmp / "peer.crt", tmp / "peer.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    return str(cert), str(key)


class Peer:
    """A loopback server running ``behaviour`` per connection (see the module docstring)."""

    def __init__(self, behaviour: Behaviour, tls: tuple[str, str] | None = None) -> None:
        self.behaviour = behaviour
        self.sent = 0
        self.connections = 0
        self.requests: list[bytes] = []
        self._lock = threading.Lock()
        self._ctx: ssl.SSLContext | None = None
        if tls:
            self._ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            self._ctx.load_cert_chain(*tls)
        self._sock = socket.create_server(("127.0.0.1", 0))
        self.port = self._sock.getsockname()[1]
        self._closed = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    @property
    def url(self) -> str:
        return f"{'https' if self._ctx else 'http'}://127.0.0.1:{self.port}"

    def send(self, conn: socket.socket, data: bytes) -> None:
        conn.sendall(data)
        with self._lock:
            self.sent += len(data)

    def _serve(self) -> None:
        while not self._closed.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            with self._lock:
                self.connections += 1
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        try:
            if self._ctx is not None:
                conn = self._ctx.wrap_socket(conn, server_side=True)
            request = _read_request(conn)
            self.requests.append(request)
            self.behaviour(conn, request, self)
        except (OSError, ssl.SSLError):
            pass  # the client hung up (what a capped client does)
        finally:
            conn.close()

    def close(self) -> None:
        self._closed.set()
        self._sock.close()


def _read_request(conn: socket.socket) -> bytes:
    """The request head and its Content-Length body."""
    data = b""
    while b"\r\n\r\n" not in data:
        got = conn.recv(65536)
        if not got:
            return data
        data += got
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(body) < length:
        got = conn.recv(65536)
        if not got:
            break
        body += got
    return head + b"\r\n\r\n" + body


def endless(conn: socket.socket, request: bytes, peer: Peer) -> None:
    """200 with a body that never ends (until ENDLESS_STOP bytes)."""
    peer.send(conn, b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    b"Connection: close\r\n\r\n{\"a\": \"")
    while peer.sent < ENDLESS_STOP:
        peer.send(conn, CHUNK)


def trickle(conn: socket.socket, request: bytes, peer: Peer) -> None:
    """A valid reply sent one byte per second, head first (stops after 20 s)."""
    body = completion()
    data = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Pad: "
            + b"p" * 64 + b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    started = time.monotonic()
    for i in range(len(data)):
        if time.monotonic() - started > 20:
            return
        peer.send(conn, data[i:i + 1])
        time.sleep(1.0)


def ok(conn: socket.socket, request: bytes, peer: Peer) -> None:
    """200 with a valid chat completion."""
    body = completion()
    peer.send(conn, b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
              + str(len(body)).encode() + b"\r\n\r\n" + body)


def redirect(location: str, status: int = 302) -> Behaviour:
    """A ``status`` redirect to ``location`` with an empty body."""
    def answer(conn: socket.socket, request: bytes, peer: Peer) -> None:
        peer.send(conn, f"HTTP/1.1 {status} Moved\r\nLocation: {location}\r\n"
                        "Content-Length: 0\r\n\r\n".encode())
    return answer


def huge_length(conn: socket.socket, request: bytes, peer: Peer) -> None:
    """200 announcing a 10 GB body, then sending it slowly."""
    peer.send(conn, b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    b"Content-Length: 10000000000\r\n\r\n")
    for _ in range(200):
        peer.send(conn, CHUNK)
        time.sleep(0.05)


def slow_body(conn: socket.socket, request: bytes, peer: Peer) -> None:
    """The head at once, then a valid body one byte per second (stops after 20 s)."""
    body = completion()
    peer.send(conn, b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
              + str(len(body)).encode() + b"\r\n\r\n")
    for i in range(min(len(body), 20)):
        peer.send(conn, body[i:i + 1])
        time.sleep(1.0)


def gzipped(conn: socket.socket, request: bytes, peer: Peer) -> None:
    """A gzip-compressed reply, whatever the request's Accept-Encoding."""
    import gzip
    body = gzip.compress(completion())
    peer.send(conn, b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
              b"Content-Encoding: gzip\r\nContent-Length: " + str(len(body)).encode()
              + b"\r\n\r\n" + body)


def mute(conn: socket.socket, request: bytes, peer: Peer) -> None:
    """Never answers (the request read already blocks on a TLS ClientHello)."""
    time.sleep(20)
