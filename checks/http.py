"""A small blocking HTTP client for the checks (stdlib only): never raises, says what happened.

Every call returns an `HttpResult` with the status, a body excerpt, the parsed JSON (when the
body is JSON), the latency and, when no usable HTTP answer came, the error (refused, timeout,
body too large, ...). Checks turn that into evidence a person can read:
"HTTP 500: {"error": ...}" or "timeout after 5s".

Bounded: `timeout` is a deadline for the whole call (connect, send, status line, headers and
body together), not per socket operation: a timer shuts the socket down when it passes, so a
server that trickles one byte a second cannot keep a check waiting. A body over `max_bytes`
is not read further (the default, 8 MiB, is far above any answer a check expects).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import threading
import time
import urllib.parse
from dataclasses import dataclass
from typing import Any

EXCERPT = 300
MAX_BODY = 8 * 2**20
CHUNK = 65536


@dataclass
class HttpResult:
    url: str
    status: int | None  # None: no HTTP answer at all (see `error`)
    body: str
    json: Any
    latency_s: float
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.status is not None and 200 <= self.status < 300 and self.error is None

    def evidence(self) -> str:
        if self.status is None:
            return f"{self.url}: {self.error}"
        excerpt = self.body[:EXCERPT].replace("\n", " ")
        if self.error:
            return f"{self.url}: HTTP {self.status}, {self.error}" + (
                f": {excerpt}" if excerpt else ""
            )
        return f"{self.url}: HTTP {self.status}: {excerpt}" if excerpt else f"HTTP {self.status}"

    def summary(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "status": self.status,
            "latency_ms": round(self.latency_s * 1000, 2),
            "error": self.error,
            "body_excerpt": self.body[:EXCERPT],
        }


class _Deadline:
    """Shuts a connection's socket down when the call's deadline passes (any read then ends)."""

    def __init__(self, conn: http.client.HTTPConnection, seconds: float) -> None:
        self.conn = conn
        self.passed = threading.Event()
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.daemon = True
        self._timer.start()

    def _expire(self) -> None:
        self.passed.set()
        sock = self.conn.sock
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def cancel(self) -> None:
        self._timer.cancel()


def _read_body(resp: http.client.HTTPResponse, max_bytes: int) -> tuple[bytes, bool]:
    """At most `max_bytes` of the body; True when there was more (left unread)."""
    if resp.length is not None and resp.length > max_bytes:
        return resp.read1(min(CHUNK, max_bytes)), True
    chunks, n = [], 0
    while True:
        block = resp.read1(CHUNK)
        if not block:
            return b"".join(chunks), False
        chunks.append(block)
        n += len(block)
        if n > max_bytes:
            return b"".join(chunks)[:max_bytes], True


def request(
    method: str, url: str, body: Any = None, *, timeout: float = 10.0, max_bytes: int = MAX_BODY
) -> HttpResult:
    """One HTTP request: `timeout` seconds for all of it, at most `max_bytes` of body read."""
    parts = urllib.parse.urlsplit(url)
    conn_cls = (
        http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    )
    conn = conn_cls(parts.hostname or "127.0.0.1", parts.port, timeout=timeout)
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    payload = None if body is None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json"} if payload is not None else {}
    t0 = time.perf_counter()
    deadline = _Deadline(conn, timeout)
    status: int | None = None
    too_big = False
    try:
        conn.connect()  # the timer may fire while connecting: checked right after
        if deadline.passed.is_set():
            raise TimeoutError
        conn.request(method, path, body=payload, headers=headers)
        resp = conn.getresponse()
        status = resp.status
        raw, too_big = _read_body(resp, max_bytes)
        if deadline.passed.is_set():  # the shutdown can look like a clean end of the body
            raise TimeoutError
    except (OSError, http.client.HTTPException) as exc:
        latency = time.perf_counter() - t0
        if deadline.passed.is_set() or isinstance(exc, TimeoutError):
            where = "" if status is None else " while reading the body"
            return HttpResult(url, status, "", None, latency, f"timeout after {timeout:g}s{where}")
        if isinstance(exc, ConnectionRefusedError):
            return HttpResult(url, None, "", None, latency, "connection refused")
        error = f"{type(exc).__name__}: {exc}".rstrip(": ")
        return HttpResult(url, status, "", None, latency, error)
    finally:
        deadline.cancel()
        conn.close()
    latency = time.perf_counter() - t0
    text = raw.decode("utf-8", "replace")
    if too_big:
        error = f"body over {max_bytes} bytes, not read further"
        return HttpResult(url, status, text, None, latency, error)
    try:
        doc = json.loads(text) if text.strip() else None
    except ValueError:  # (JSONDecodeError; an integer too long)
        doc = None
    return HttpResult(url, status, text, doc, latency)


def get(base: str, path: str, *, timeout: float = 10.0, max_bytes: int = MAX_BODY) -> HttpResult:
    return request("GET", base.rstrip("/") + path, timeout=timeout, max_bytes=max_bytes)


def post(
    base: str, path: str, body: Any, *, timeout: float = 30.0, max_bytes: int = MAX_BODY
) -> HttpResult:
    return request("POST", base.rstrip("/") + path, body, timeout=timeout, max_bytes=max_bytes)


def completion_ids(doc: Any) -> tuple[list[int] | None, str | None]:
    """(token ids, text) of the first choice of an OpenAI-style completion response."""
    if not isinstance(doc, dict):
        return None, None
    choices = doc.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return None, None
    first = choices[0]
    ids = first.get("token_ids")
    if ids is None and isinstance(doc.get("output_ids"), list):  # SGLang /generate style
        ids = doc["output_ids"]
    text = first.get("text")
    valid = isinstance(ids, list) and all(isinstance(i, int) for i in ids)
    return (list(ids) if valid else None), (text if isinstance(text, str) else None)
