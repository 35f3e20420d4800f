"""Bounds on what a client can make the engine server hold: body size, connections, read time.

- `BodyLimit` (ASGI middleware): a body over `max_body_bytes` is a 413 (and the connection
  closes) before it is read whole: a Content-Length over the cap is refused unread, a chunked
  body is counted as it streams in.
- `bounded_h11(limits)`: uvicorn's h11 protocol with a read deadline (a request's head and
  body must arrive within `request_read_timeout` seconds, else the connection is dropped) and
  a connection cap: over `max_connections`, the oldest connection with no request in flight
  (idle keep-alive or a half-sent head) is closed to make room, so idle sockets cannot lock
  out `/health`; if none is idle, uvicorn's own `limit_concurrency` answers 503. Every
  connection it takes gets TCP_NODELAY (`no_delay`), so a streamed event leaves when written.
- `quiet_accept_errors(loop)` and `BackoffSocket`: asyncio logs every failed accept (EMFILE
  ...) with a traceback and goes on trying, thousands a second once the fd limit is hit; with
  these one try fails per burst and one line is logged per interval.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import resource
import socket
import time
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass, field
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger("engine.limits")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class Throttle:
    """Say a recurring event at most once per `interval` seconds, with how often it happened."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self.last: float | None = None
        self.count = 0

    def due(self) -> int:
        """Count one event; the number to report if a line is due now, else 0."""
        self.count += 1
        now = time.monotonic()
        if self.last is not None and now - self.last < self.interval:
            return 0
        n, self.last, self.count = self.count, now, 0
        return n


LOG_INTERVAL = 10.0  # seconds between two lines about the same recurring event


def default_max_connections() -> int:
    """1000, or fewer where the fd limit is low (64 fds stay for the process itself)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 1000
    return max(8, min(1000, soft - 64))


@dataclass(frozen=True)
class Limits:
    max_body_bytes: int = 1 << 20
    max_prompts_per_request: int = 64
    max_connections: int = field(default_factory=default_max_connections)
    request_read_timeout: float = 10.0  # head + body of one request
    keep_alive_timeout: float = 5.0  # idle between requests on one connection


class BodyLimit:
    """ASGI middleware: read the body up to the cap, 413 beyond it, replay it to the app."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def _too_large(self, send: Send, size: str) -> None:
        msg = f"request body is {size}; this server takes at most {self.max_bytes} bytes"
        err = {"message": msg, "type": "invalid_request_error", "param": None, "code": None}
        body = json.dumps({"error": err}).encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),  # the rest of the body is never read
        ]
        await send({"type": "http.response.start", "status": 413, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        for name, value in scope["headers"]:
            # h11 has checked that it is all digits; 19 of them are over any sane cap
            if name == b"content-length" and (len(value) > 18 or int(value) > self.max_bytes):
                return await self._too_large(send, f"{value.decode()} bytes (Content-Length)")
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None  # the client left before sending its body: nothing to answer
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                return await self._too_large(send, f"over {self.max_bytes} bytes (streamed)")
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()  # then only http.disconnect comes

        return await self.app(scope, replay, send)


LINGER_S = 1.0  # after answering a body unread: how long to read and drop what still comes


class _LingeringTransport:
    """The connection's transport as uvicorn sees it, but a close() while the client is still
    sending a body we answered without reading (a 413) becomes a lingering close: our side
    shuts, what still comes is dropped unread for up to LINGER_S, then the socket closes. A
    plain close with unread data would send a reset, and the client might lose the answer."""

    def __init__(self, transport: asyncio.Transport, protocol: Any) -> None:
        self.raw, self.protocol = transport, protocol

    def __getattr__(self, name: str) -> Any:
        return getattr(self.raw, name)

    def close(self) -> None:
        p = self.protocol
        if p.lingering or self.raw.is_closing() or p.conn.their_state is not h11.SEND_BODY:
            self.raw.close()
            return
        p.lingering = True
        self.raw.resume_reading()  # flow control may have paused it
        if self.raw.can_write_eof():
            self.raw.write_eof()  # after the answer, which is already buffered
        p.loop.call_later(LINGER_S, self.raw.close)


def bounded_h11(limits: Limits) -> type[H11Protocol]:
    """An h11 protocol class bound to these limits (uvicorn takes a class as `http=`)."""

    evictions = Throttle(LOG_INTERVAL)

    class BoundedH11Protocol(H11Protocol):
        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            self.lingering, self.dropped = False, 0
            no_delay(transport)
            super().connection_made(_LingeringTransport(transport, self))  # type: ignore[arg-type]
            self.opened_at = time.monotonic()
            self.read_timer: asyncio.TimerHandle | None = None
            self._arm_read_timer()
            live = [c for c in self.connections if not c.transport.is_closing()]
            if len(live) > limits.max_connections:
                self._evict_one(live)

        def _idle(self) -> bool:
            return self.cycle is None or self.cycle.response_complete

        def _evict_one(self, live: list[H11Protocol]) -> None:
            idle = [
                c for c in live if c is not self and isinstance(c, BoundedH11Protocol) and c._idle()
            ]
            if idle:
                min(idle, key=lambda c: c.opened_at).transport.raw.close()
                if n := evictions.due():
                    log.warning(
                        "over %d connections: closed the oldest idle one (%d time(s) since the "
                        "last such line)",
                        limits.max_connections,
                        n,
                    )

        def _arm_read_timer(self) -> None:
            if self.read_timer is None:
                self.read_timer = self.loop.call_later(
                    limits.request_read_timeout, self._read_timed_out
                )

        def _disarm_read_timer(self) -> None:
            if self.read_timer is not None:
                self.read_timer.cancel()
                self.read_timer = None

        def _read_timed_out(self) -> None:
            self.read_timer = None
            if self._reading():
                log.debug(
                    "dropped a connection: no whole request within %g s",
                    limits.request_read_timeout,
                )
                self.transport.raw.close()

        def _reading(self) -> bool:
            """True while the client owes us the rest of a request (not between requests)."""
            if self.conn.their_state is h11.SEND_BODY:
                return True
            if self.conn.their_state is not h11.IDLE:
                return False
            # IDLE: a fresh connection, or one that has sent part of its next request's head
            return self.cycle is None or bool(self.conn.trailing_data[0])

        def data_received(self, data: bytes) -> None:
            if self.lingering:  # the rest of a body we answered unread: dropped, bounded
                self.dropped += len(data)
                if self.dropped > limits.max_body_bytes:
                    self.transport.raw.close()
                return
            if self.conn.their_state is not h11.DONE:
                self._arm_read_timer()
            super().data_received(data)
            if self.conn.their_state not in (h11.IDLE, h11.SEND_BODY):
                self._disarm_read_timer()  # the whole request is in

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm_read_timer()
            super().connection_lost(exc)

    return BoundedH11Protocol


ACCEPT_FAILED = "socket.accept() out of system resource"  # asyncio's message
OUT_OF_RESOURCES = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)


def no_delay(transport: asyncio.BaseTransport) -> None:
    """TCP_NODELAY on a TCP connection's socket (nothing on any other kind).

    asyncio sets it itself only where the socket's `proto` attribute is IPPROTO_TCP; a socket
    made as `socket.socket(AF_INET, SOCK_STREAM)` has proto 0, and so has every connection it
    accepts. Without it, Nagle holds each small write until the last is ACKed, and
    a keep-alive client delays that ACK ~40 ms: a second streamed response on one connection
    came as its head, then every SSE event in one burst ~40 ms later (issue #39)."""
    sock = transport.get_extra_info("socket")
    if sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return
    with contextlib.suppress(OSError):  # already closed: nothing to stream to
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class BackoffSocket(socket.socket):
    """A listening socket whose accept() stops the rest of a burst after one out-of-resources
    failure. asyncio's accept loop goes on after such a failure (up to `backlog` tries in one
    tick), scheduling one retry and logging one traceback per try; with this it meets one
    failure per tick, so one retry timer is pending and one line is due."""

    _failed = False

    @classmethod
    def wrap(cls, sock: socket.socket) -> BackoffSocket:
        """The same socket; its family, type and protocol as the kernel says (a TCP socket
        made with proto 0 is IPPROTO_TCP here, so asyncio sets TCP_NODELAY on what it
        accepts)."""
        return cls(fileno=sock.detach())

    def _clear(self) -> None:
        self._failed = False

    def accept(self) -> tuple[socket.socket, Any]:
        if self._failed:
            raise BlockingIOError(errno.EAGAIN, "backing off after an accept failure")
        try:
            return super().accept()
        except OSError as exc:
            if exc.errno in OUT_OF_RESOURCES:
                self._failed = True
                asyncio.get_running_loop().call_soon(self._clear)  # after this burst
            raise


def quiet_accept_errors(loop: asyncio.AbstractEventLoop, interval: float = LOG_INTERVAL) -> None:
    """Log failed accepts (EMFILE, ENFILE, ENOBUFS, ENOMEM) once per `interval`, one line with
    the count since the last (asyncio logs each with a traceback, thousands a second); every
    other loop error goes to the default handler."""
    failures = Throttle(interval)

    def handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        if context.get("message") != ACCEPT_FAILED:
            loop.default_exception_handler(context)
        elif n := failures.due():
            log.error(
                "accept failed: %s (%d time(s) since the last such line); new connections "
                "wait in the backlog: raise the fd limit or lower --max-connections",
                context.get("exception"),
                n,
            )

    loop.set_exception_handler(handler)
