"""`python -m checks.loadtest --json --url URL --concurrency C --requests N`: one closed-loop level.

C workers each keep one streaming greedy completion in flight (ignore_eos, fixed input and
output lengths) until N requests are done, after a warm-up that is not counted. Per request:
time to first token, inter-token latencies, time per output token, end-to-end latency. The
client is asyncio on raw HTTP/1.1 keep-alive connections (stdlib only), so on two cores it
stays far from being the bottleneck (README: measured capacity). Read-only: it calls no
endpoint that changes the service's state (no cache flush, no profiler start).

Before any prompt is made, the shape is checked against the service's context length
(`max_model_len` of /v1/models, else /get_server_info's): input + output tokens over it is bad
input (exit 2, one message naming the limit and where the service said it); where the service
reports none, over `MAX_TOKENS_UNREPORTED` (2^20 tokens) is. No length asked for allocates more.

Whatever a server answers (a bad status line, an SSE event that is not a JSON object, an
oversized event, garbage), that request is counted as failed with the reason, and the module
still prints its one JSON document (exit 1), never a traceback.

Prints (`checks.docs.LoadtestDoc`):
    ok           bool   no request failed
    url, requests, warmup, input_len, output_len   what ran
    level        dict   `LevelDoc`: concurrency, completed, failed, errors (reason -> count),
                        duration_s, request_per_s, output_tok_per_s, output_tokens,
                        ttft_ms / tpot_ms / itl_ms / e2e_ms (`Dist`: p50, p90, p99, mean),
                        accept_length (value and where the service reported it),
                        counters (with --counters, `WindowCounters`: the service's counters,
                        as `checks.probe --counters` takes them, at `start` (right before the
                        first measured request is sent; every measured request waits for it)
                        and `end` (right after the last measured request completed), so their
                        difference is the engine's work in exactly the `duration_s` window;
                        start_lead_s, end_lag_s: the client-side slack on either side)
    error, message      the load generator itself crashed (error "crashed", no level)
"""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from checks.docs import Counters, WindowCounters
from checks.http import get
from checks.module import EXIT_FAIL, EXIT_PASS, exit_json, parser
from checks.probe import counters

MAX_EVENT = 2**20  # bytes of one SSE event (or of data without an event boundary)
MAX_BODY = 64 * 2**20  # a non-streamed answer's Content-Length
ERROR_BODY = 4096  # bytes kept of an error answer's body (its reason is in the first few)
MAX_HEADERS = 100
# prompt + output tokens of a request where the service reports no context length: no model
# served today takes more, and a prompt this long is ~8 MB here, not gigabytes
MAX_TOKENS_UNREPORTED = 2**20


class ProtocolError(ValueError):
    """The server's answer is not the HTTP/SSE we asked for."""


def _excerpt(data: bytes, n: int = 80) -> str:
    return repr(data[:n])[2:-1] + ("..." if len(data) > n else "")


@dataclass
class Sample:
    ok: bool
    start: float = 0.0
    ttft: float | None = None
    e2e: float | None = None
    tokens: int = 0
    itl: list[float] = field(default_factory=list)
    error: str | None = None


class Conn:
    """One keep-alive HTTP/1.1 connection that posts JSON and reads SSE or JSON answers."""

    def __init__(self, host: str, port: int) -> None:
        self.error_body = b""  # the last error answer's body (at most ERROR_BODY bytes)
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def _open(self) -> None:
        self.reader, self.writer = await asyncio.open_connection(self.host, self.port)

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.reader = self.writer = None

    async def post_stream(self, path: str, body: dict[str, Any], on_event) -> int:
        """POST; call on_event(data_dict) per SSE event; return the HTTP status."""
        if self.writer is None:
            await self._open()
        assert self.reader is not None and self.writer is not None
        payload = json.dumps(body).encode()
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
            f"Content-Type: application/json\r\nAccept: text/event-stream\r\n"
            f"Content-Length: {len(payload)}\r\n\r\n"
        ).encode()
        self.writer.write(head + payload)
        await self.writer.drain()
        status_line = await self.reader.readline()
        if not status_line:
            raise ConnectionError("connection closed before the status line")
        words = status_line.split()
        if len(words) < 2 or not words[0].startswith(b"HTTP/") or not words[1].isdigit():
            raise ProtocolError(f"bad status line: {_excerpt(status_line)}")
        status = int(words[1])
        headers: dict[str, str] = {}
        while True:
            line = await self.reader.readline()
            if line in (b"\r\n", b"\n", b""):
                break
            if len(headers) >= MAX_HEADERS:
                raise ProtocolError(f"more than {MAX_HEADERS} header lines")
            k, _, v = line.decode("latin-1").partition(":")
            headers[k.strip().lower()] = v.strip()
        buf = b""
        self.error_body = b""

        def feed(data: bytes) -> None:
            nonlocal buf
            if status != 200:  # an error's body is the service's own words: kept, not parsed
                self.error_body = (self.error_body + data)[:ERROR_BODY]
                return
            buf = (buf + data).replace(b"\r\n", b"\n")
            while b"\n\n" in buf:
                event, buf = buf.split(b"\n\n", 1)
                for ln in event.split(b"\n"):
                    if ln.startswith(b"data:"):
                        text = ln[5:].strip()
                        if text and text != b"[DONE]":
                            on_event(parse_event(text))
            if len(buf) > MAX_EVENT:
                raise ProtocolError(f"no SSE event boundary in {MAX_EVENT} bytes")

        if headers.get("transfer-encoding", "").lower() == "chunked":
            while True:
                size_line = (await self.reader.readline()).split(b";")[0].strip()
                try:
                    size = int(size_line or b"0", 16)
                except ValueError:
                    raise ProtocolError(f"bad chunk size: {_excerpt(size_line)}") from None
                if size == 0:
                    await self.reader.readline()
                    break
                if size > MAX_EVENT:
                    raise ProtocolError(f"chunk of {size} bytes (limit {MAX_EVENT})")
                feed(await self.reader.readexactly(size))
                await self.reader.readexactly(2)
        elif "content-length" in headers:
            length = headers["content-length"]
            if not length.isdigit() or int(length) > MAX_BODY:
                raise ProtocolError(f"bad or too large Content-Length: {length[:40]!r}")
            feed(await self.reader.readexactly(int(length)) + b"\n\n")
        else:
            while block := await self.reader.read(65536):
                feed(block)
            feed(b"\n\n")
            await self.close()
        if headers.get("connection", "").lower() == "close":
            await self.close()
        return status


def parse_event(text: bytes) -> dict[str, Any]:
    """One SSE `data:` payload: a JSON object, or ProtocolError saying what came instead."""
    try:
        ev = json.loads(text)
    except ValueError:
        raise ProtocolError(f"SSE event is not JSON: {_excerpt(text)}") from None
    if not isinstance(ev, dict):
        raise ProtocolError(f"SSE event is not a JSON object: {_excerpt(text)}")
    return ev


def event_tokens(ev: dict[str, Any]) -> int:
    choices = ev.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return 0
    ids = choices[0].get("token_ids")
    if isinstance(ids, list):
        return len(ids)
    return 1 if choices[0].get("text") else 0


async def one_request(conn: Conn, path: str, body: dict[str, Any], timeout: float) -> Sample:
    s = Sample(ok=False, start=time.perf_counter())
    last = s.start

    def on_event(ev: dict[str, Any]) -> None:
        nonlocal last
        n = event_tokens(ev)
        if n == 0:
            return
        now = time.perf_counter()
        if s.ttft is None:
            s.ttft = now - s.start
        else:
            s.itl.append(now - last)
        last = now
        s.tokens += n

    try:
        status = await asyncio.wait_for(conn.post_stream(path, body, on_event), timeout)
    except (TimeoutError, asyncio.TimeoutError):
        await conn.close()
        s.error = f"timeout after {timeout:g}s"
        return s
    except Exception as exc:  # noqa: BLE001 - any answer we cannot use is this request's failure
        await conn.close()
        s.error = f"{type(exc).__name__}: {exc}"[:300]
        return s
    s.e2e = time.perf_counter() - s.start
    s.ok = status == 200 and s.tokens > 0
    if not s.ok:
        s.error = f"HTTP {status}" if status != 200 else "no tokens streamed"
        said = error_text(conn.error_body) if status != 200 else None
        if said:
            s.error += f": {said}"
    return s


def error_text(body: bytes) -> str | None:
    """The service's own reason from an error body: OpenAI's {"error": {"message": ...}},
    FastAPI's {"detail": ...}, or the body's first line; at most 200 characters."""
    text = body.decode("utf-8", "replace").strip()
    if not text:
        return None
    try:
        doc = json.loads(text)
    except ValueError:
        return text.splitlines()[0][:200]
    if isinstance(doc, dict):
        err = doc.get("error")
        msg = err.get("message") if isinstance(err, dict) else err if isinstance(err, str) else None
        msg = msg or doc.get("detail") or doc.get("message")
        if isinstance(msg, str) and msg.strip():
            return msg.strip()[:200]
    return text[:200]


async def sweep_level(
    url: str,
    c: int,
    n: int,
    warmup: int,
    body: dict,
    timeout: float,
    snap: Callable[[], Counters] | None = None,
) -> tuple[list[Sample], float, WindowCounters | None]:
    """The level's measured samples, their wall (first start to last end), and with `snap` the
    service's counters taken right before the first measured request goes out (every measured
    request waits for that snapshot) and right after the last one completed."""
    parts = urllib.parse.urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    path = (parts.path.rstrip("/") or "") + "/v1/completions"
    counter = iter(range(warmup + n))
    samples: list[Sample] = []
    start: asyncio.Future[tuple[Counters, float]] | None = None

    async def take_start() -> tuple[Counters, float]:
        assert snap is not None
        doc = await asyncio.to_thread(snap)
        return doc, time.perf_counter()

    async def worker() -> None:
        nonlocal start
        conn = Conn(host, port)
        for i in counter:
            if i >= warmup and snap is not None:
                if start is None:  # the first measured request: one snapshot for all
                    start = asyncio.ensure_future(take_start())
                await start
            s = await one_request(conn, path, body, timeout)
            if i >= warmup:
                samples.append(s)
        await conn.close()

    await asyncio.gather(*(worker() for _ in range(c)))
    first = min((s.start for s in samples), default=0)
    last = max((s.start + (s.e2e or 0) for s in samples), default=0)
    window: WindowCounters | None = None
    if snap is not None and start is not None:
        asked = time.perf_counter()
        start_doc, start_back = start.result()
        window = {
            "start": start_doc,
            "end": snap(),
            "start_lead_s": round(first - start_back, 6),
            "end_lag_s": round(asked - last, 6),
        }
    return samples, last - first, window


def pct(values: list[float], p: float) -> float | None:
    if not values:
        return None
    xs = sorted(values)
    k = (len(xs) - 1) * p / 100
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return (xs[lo] + (xs[hi] - xs[lo]) * (k - lo)) * 1000  # ms


def dist(values: list[float]) -> dict[str, float | None]:
    return {
        "p50": pct(values, 50),
        "p90": pct(values, 90),
        "p99": pct(values, 99),
        "mean": statistics.fmean(values) * 1000 if values else None,
    }


def accept_length(url: str) -> dict[str, Any]:
    info = get(url, "/get_server_info", timeout=5)
    if info.ok and isinstance(info.json, dict):
        states = info.json.get("internal_states")
        if isinstance(states, list) and states and isinstance(states[0], dict):
            value = states[0].get("avg_spec_accept_length")
            if value is not None:
                return {"value": value, "source": "/get_server_info"}
    metrics = get(url, "/metrics", timeout=5)
    if metrics.ok:
        for line in metrics.body.splitlines():
            if "accept_length" in line and not line.startswith("#") and "_bucket" not in line:
                name, _, value = line.rpartition(" ")
                try:
                    return {"value": float(value), "source": f"/metrics {name}"}
                except ValueError:
                    continue
    return {"value": None, "source": "not reported by the service"}


def _positive_int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None


def context_length(url: str) -> tuple[int | None, str]:
    """The service's context length in tokens and where it said so: `max_model_len` of
    /v1/models (the reference engine, SGLang, vLLM), else `context_length` / `max_model_len`
    of /get_server_info; (None, "") where it reports none."""
    models = get(url, "/v1/models", timeout=5)
    cards = models.json.get("data") if models.ok and isinstance(models.json, dict) else None
    for card in cards if isinstance(cards, list) else []:
        n = _positive_int(card.get("max_model_len")) if isinstance(card, dict) else None
        if n:
            return n, "max_model_len of /v1/models"
    info = get(url, "/get_server_info", timeout=5)
    if info.ok and isinstance(info.json, dict):
        for key in ("context_length", "max_model_len"):
            n = _positive_int(info.json.get(key))
            if n:
                return n, f"{key} of /get_server_info"
    return None, ""


def shape_problem(url: str, input_len: int, output_len: int) -> str | None:
    """Why a request of `input_len` prompt and `output_len` generated tokens cannot run on the
    service (its context length, or the hard cap where it reports none); None when it can.
    Asked before any prompt is made, so a hostile length allocates nothing."""
    total = input_len + output_len
    shape = f"--input-len {input_len} + --output-len {output_len} = {total} tokens"
    limit, source = context_length(url)
    if limit is not None and total > limit:
        return f"{shape}: over the service's context length of {limit} tokens ({source})"
    if limit is None and total > MAX_TOKENS_UNREPORTED:
        return (
            f"{shape}: over {MAX_TOKENS_UNREPORTED} tokens, the cap where the service reports "
            "no context length (max_model_len in /v1/models)"
        )
    return None


def summarise(samples: list[Sample], wall: float, c: int) -> dict[str, Any]:
    good = [s for s in samples if s.ok]
    tokens = sum(s.tokens for s in good)
    tpot = [
        (s.e2e - s.ttft) / (s.tokens - 1)
        for s in good
        if s.e2e is not None and s.ttft is not None and s.tokens > 1
    ]
    errors: dict[str, int] = {}
    for s in samples:
        if not s.ok:
            errors[s.error or "?"] = errors.get(s.error or "?", 0) + 1
    return {
        "concurrency": c,
        "completed": len(good),
        "failed": len(samples) - len(good),
        "errors": errors,
        "duration_s": round(wall, 4),
        "request_per_s": len(good) / wall if wall > 0 else None,
        "output_tok_per_s": tokens / wall if wall > 0 else None,
        "output_tokens": tokens,
        "ttft_ms": dist([s.ttft for s in good if s.ttft is not None]),
        "tpot_ms": dist(tpot),
        "itl_ms": dist([x for s in good for x in s.itl]),
        "e2e_ms": dist([s.e2e for s in good if s.e2e is not None]),
    }


def main(argv: list[str] | None = None) -> None:
    p = parser("checks.loadtest", "One closed-loop load level against a service.")
    p.add_argument("--url", required=True)
    p.add_argument("--concurrency", type=int, required=True)
    p.add_argument("--requests", type=int, default=0, help="measured requests (default 4 x C)")
    p.add_argument("--warmup", type=int, default=-1, help="uncounted requests first (default C)")
    p.add_argument("--input-len", type=int, default=32, help="prompt length in tokens")
    p.add_argument("--output-len", type=int, default=32, help="generated tokens per request")
    p.add_argument("--model", default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=120.0, help="per-request timeout (s)")
    p.add_argument(
        "--counters",
        action="store_true",
        help="snapshot the service's counters around the measured window (level.counters)",
    )
    args = p.parse_args(argv)
    if args.concurrency < 1 or args.input_len < 1 or args.output_len < 1 or args.requests < 0:
        p.error("--concurrency, --input-len, --output-len must be >= 1; --requests >= 0")
    problem = shape_problem(args.url, args.input_len, args.output_len)
    if problem:
        p.error(problem)
    n = args.requests or 4 * args.concurrency
    warmup = args.concurrency if args.warmup < 0 else args.warmup
    rng = random.Random(args.seed)
    # token ids 32..126: printable ASCII, valid in byte-level and in large BPE vocabularies
    prompt = [rng.randrange(32, 127) for _ in range(args.input_len)]
    body: dict[str, Any] = {
        "prompt": prompt,
        "max_tokens": args.output_len,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
    }
    if args.model:
        body["model"] = args.model
    snap = (lambda: counters(args.url, 10.0)) if args.counters else None
    try:
        samples, wall, window = asyncio.run(
            sweep_level(args.url, args.concurrency, n, warmup, body, args.timeout, snap)
        )
        level = summarise(samples, wall, args.concurrency)
        level["accept_length"] = accept_length(args.url)
        if window is not None:
            level["counters"] = window
    except Exception as exc:  # noqa: BLE001 - still one JSON document, never a traceback
        exit_json(
            {
                "ok": False,
                "module": "checks.loadtest",
                "url": args.url,
                "error": "crashed",
                "message": f"{type(exc).__name__}: {exc}"[:500],
            },
            EXIT_FAIL,
        )
    ok = level["failed"] == 0
    exit_json(
        {
            "ok": ok,
            "module": "checks.loadtest",
            "url": args.url,
            "requests": n,
            "warmup": warmup,
            "input_len": args.input_len,
            "output_len": args.output_len,
            "level": level,
        },
        EXIT_PASS if ok else EXIT_FAIL,
    )


if __name__ == "__main__":
    main()
