"""A small blocking HTTP client for the checks (stdlib only): never raises, says what happened.

Every call returns an `HttpResult` with the status, a body excerpt, the parsed JSON (when the
body is JSON), the latency and, when no HTTP answer came, the error (refused, timeout, ...).
Checks turn that into evidence a person can read: "HTTP 500: {"error": ...}" or
"timeout after 5s".
"""

from __future__ import annotations

import http.client
import json
import time
import urllib.parse
from dataclasses import dataclass
from typing import Any

EXCERPT = 300


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
        return self.status is not None and 200 <= self.status < 300

    def evidence(self) -> str:
        if self.status is None:
            return f"{self.url}: {self.error}"
        excerpt = self.body[:EXCERPT].replace("\n", " ")
        return f"{self.url}: HTTP {self.status}: {excerpt}" if excerpt else f"HTTP {self.status}"

    def summary(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "status": self.status,
            "latency_ms": round(self.latency_s * 1000, 2),
            "error": self.error,
            "body_excerpt": self.body[:EXCERPT],
        }


def request(method: str, url: str, body: Any = None, *, timeout: float = 10.0) -> HttpResult:
    """One HTTP request with a total deadline of about `timeout` seconds."""
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
    try:
        conn.request(method, path, body=payload, headers=headers)
        resp = conn.getresponse()
        raw = resp.read()
        status = resp.status
    except TimeoutError:
        return HttpResult(
            url, None, "", None, time.perf_counter() - t0, f"timeout after {timeout:g}s"
        )
    except ConnectionRefusedError:
        return HttpResult(url, None, "", None, time.perf_counter() - t0, "connection refused")
    except (OSError, http.client.HTTPException) as exc:
        error = f"{type(exc).__name__}: {exc}".rstrip(": ")
        return HttpResult(url, None, "", None, time.perf_counter() - t0, error)
    finally:
        conn.close()
    latency = time.perf_counter() - t0
    text = raw.decode("utf-8", "replace")
    try:
        doc = json.loads(text) if text.strip() else None
    except json.JSONDecodeError:
        doc = None
    return HttpResult(url, status, text, doc, latency)


def get(base: str, path: str, *, timeout: float = 10.0) -> HttpResult:
    return request("GET", base.rstrip("/") + path, timeout=timeout)


def post(base: str, path: str, body: Any, *, timeout: float = 30.0) -> HttpResult:
    return request("POST", base.rstrip("/") + path, body, timeout=timeout)


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
