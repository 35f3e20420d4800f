"""Bounded reads in the checks, against real misbehaving TCP servers on loopback.

`checks.http`: a server that trickles one byte a second is cut at the call's total deadline
(in the headers and in the body), and a 300 MB body is not read whole. `checks.health` on such
a server ends in about its `--timeout`. `checks.loadtest` answered with a bad status line, an
SSE event that is not a JSON object, or garbage still prints its one JSON document, exit 1.
"""

from __future__ import annotations

import json
import socket
import socketserver
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator

import pytest
from helpers import REPO

from checks.http import MAX_BODY, get

Handler = Callable[[socket.socket, threading.Event], None]


class RawServer:
    """A threaded TCP server on a free loopback port; `handler(conn, stop)` answers each client."""

    def __init__(self, handler: Handler) -> None:
        self.stop = threading.Event()
        self.sent = 0
        outer = self

        class _H(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                try:
                    handler(self.request, outer.stop)
                except OSError:
                    pass

        socketserver.ThreadingTCPServer.allow_reuse_address = True
        self.server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _H)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.stop.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def serve() -> Iterator[Callable[[Handler], RawServer]]:
    servers: list[RawServer] = []

    def start(handler: Handler) -> RawServer:
        servers.append(RawServer(handler))
        return servers[-1]

    yield start
    for s in servers:
        s.close()


def _read_request(conn: socket.socket) -> None:
    conn.settimeout(5)
    conn.recv(65536)


def _drip(data: bytes, head: bytes = b"") -> Handler:
    """Send `head` at once, then `data` one byte a second."""

    def handler(conn: socket.socket, stop: threading.Event) -> None:
        _read_request(conn)
        conn.sendall(head)
        for i in range(len(data)):
            if stop.wait(1.0):
                return
            conn.sendall(data[i : i + 1])

    return handler


def _run_module(*args: str, timeout: float = 60) -> tuple[int, dict, str, float]:
    t0 = time.monotonic()
    res = subprocess.run(
        [sys.executable, "-m", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
    )
    elapsed = time.monotonic() - t0
    assert res.stdout.count("\n") == 1, res.stdout + res.stderr  # one JSON document
    return res.returncode, json.loads(res.stdout), res.stderr, elapsed


def test_trickling_headers_end_at_the_total_deadline(serve) -> None:
    srv = serve(_drip(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"))
    t0 = time.monotonic()
    res = get(srv.url, "/health", timeout=1.5)
    assert time.monotonic() - t0 < 3
    assert res.status is None and res.error == "timeout after 1.5s" and not res.ok


def test_trickling_body_ends_at_the_total_deadline(serve) -> None:
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n"
    srv = serve(_drip(b"x" * 100, head))
    t0 = time.monotonic()
    res = get(srv.url, "/v1/models", timeout=1.5)
    assert time.monotonic() - t0 < 3
    assert res.status == 200 and not res.ok
    assert res.error == "timeout after 1.5s while reading the body"
    assert "HTTP 200, timeout after 1.5s" in res.evidence()


def test_checks_health_on_a_trickling_server_ends_in_about_its_timeout(serve) -> None:
    srv = serve(_drip(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok" * 10))
    rc, doc, stderr, elapsed = _run_module(
        "checks.health", "--json", "--url", srv.url, "--timeout", "2"
    )
    assert rc == 1 and "Traceback" not in stderr
    assert elapsed < 5, f"took {elapsed:.1f}s"
    checks = {c["name"]: c for c in doc["checks"]}
    assert checks["health"]["status"] == "fail"
    assert checks["health"]["evidence"] == f"{srv.url}/health: timeout after 2s"
    for name in ("health_generate", "models", "smoke", "server_info"):
        assert checks[name]["status"] == "skip"
        assert checks[name]["detail"] == "not tried: /health got no answer (timeout after 2s)"


def _huge(with_length: bool) -> Callable[[RawServer], Handler]:
    def make(box: list[RawServer]) -> Handler:
        def handler(conn: socket.socket, stop: threading.Event) -> None:
            _read_request(conn)
            head = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
            head += f"Content-Length: {300 * 2**20}\r\n\r\n" if with_length else "\r\n"
            conn.sendall(head.encode())
            block = b"0" * 65536
            for _ in range(300 * 16):  # 300 MB
                if stop.is_set():
                    return
                conn.sendall(block)
                box[0].sent += len(block)

        return handler

    return make


@pytest.mark.parametrize("with_length", [True, False])
def test_300_mb_body_is_not_read_whole(serve, with_length: bool) -> None:
    box: list[RawServer] = []
    srv = serve(_huge(with_length)(box))
    box.append(srv)
    res = get(srv.url, "/metrics", timeout=20)
    assert res.status == 200 and not res.ok and res.json is None
    assert res.error == f"body over {MAX_BODY} bytes, not read further"
    assert len(res.body) <= MAX_BODY
    assert "not read further" in res.evidence()
    time.sleep(0.3)
    assert srv.sent < 100 * 2**20, f"the client took {srv.sent} bytes"


def _answer(raw: bytes, *, chunked_sse: bool = False) -> Handler:
    def handler(conn: socket.socket, stop: threading.Event) -> None:
        _read_request(conn)
        if chunked_sse:
            conn.sendall(
                b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n"
                + f"{len(raw):x}\r\n".encode()
                + raw
                + b"\r\n0\r\n\r\n"
            )
        else:
            conn.sendall(raw)
        conn.close()

    return handler


@pytest.mark.parametrize(
    ("handler", "error"),
    [
        (_answer(b"garbage\r\n\r\n"), "ProtocolError: bad status line: garbage"),
        (_answer(b"\x00\xff\xfe binary \x01\r\n"), "ProtocolError: bad status line: "),
        (_answer(b"data: [1, 2]\n\n", chunked_sse=True), "SSE event is not a JSON object"),
        (_answer(b"data: 5\n\n", chunked_sse=True), "SSE event is not a JSON object: 5"),
        (_answer(b"data: {not json\n\n", chunked_sse=True), "SSE event is not JSON"),
        (_answer(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"), "chunk size"),
    ],
)
def test_checks_loadtest_survives_bad_answers(serve, handler: Handler, error: str) -> None:
    srv = serve(handler)
    rc, doc, stderr, _ = _run_module(
        "checks.loadtest",
        "--json",
        "--url",
        srv.url,
        "--concurrency",
        "1",
        "--requests",
        "2",
        "--warmup",
        "0",
        "--timeout",
        "5",
    )
    assert rc == 1 and doc["ok"] is False and "Traceback" not in stderr
    level = doc["level"]
    assert level["failed"] == 2 and level["completed"] == 0
    (reason,) = level["errors"]
    assert error in reason, reason


@pytest.mark.parametrize(
    "url", ["http://127.0.0.1:99999", "http://127.0.0.1:abc", "ftp://127.0.0.1:1", "http://:80"]
)
@pytest.mark.parametrize("module", ["checks.health", "checks.identity", "checks.loadtest"])
def test_bad_urls_are_bad_input_documents(module: str, url: str) -> None:
    import json as _json
    import subprocess as _sp
    import sys as _sys

    extra = {"checks.identity": ["--record-golden", "-"], "checks.loadtest": ["--concurrency", "1"]}
    extra = extra.get(module, [])
    res = _sp.run(
        [_sys.executable, "-m", module, "--json", "--url", url, *extra],
        capture_output=True,
        text=True,
        timeout=60,
    )
    doc = _json.loads(res.stdout)
    assert res.returncode == 2 and doc["error"] == "bad_input" and "--url" in doc["message"]
    assert "Traceback" not in res.stderr
