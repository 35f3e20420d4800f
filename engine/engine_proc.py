"""The HTTP front end in its own process, the engine in the main one (`--frontend process`).

In one process the event loop's thread and the scheduler's thread share one GIL: every
request parsed, every SSE chunk written and every access-log line takes it from the step's
host-side work (a torch path launching hundreds of small ops slows in proportion). As SGLang
splits its HTTP server from its scheduler, `python -m engine --frontend process` keeps the model
and the scheduler in the main process (its pid is the service's, the one on the GPU) and
serves HTTP from a spawned child that shares the listening socket. They talk over one duplex
pipe:
- front end -> engine: ("submit", rid, fields), ("cancel", rid), ("call", cid, "info" or
  "metrics");
- engine -> front end: ("up", pid) once it reads the pipe (its libraries imported; until then
  the front end answers /get_server_info and /metrics itself: `EngineClient.starting_info`);
  ("ready", preset) or ("failed", error) once loading ends; ("updates", [(rid, Update), ...])
  once per scheduler iteration; ("reply", cid, value).
`EngineClient` is the front end's engine handle (the interface `engine.server.create_app`
uses, as `engine.engine_state.EngineState` is in one process); `serve_engine` runs the
engine's side. A TERM to the engine is passed on to the front end, which drains as uvicorn
does (no new connections, the requests in flight finish) and then closes the pipe; the engine
exits when it reads end-of-file, and a front end whose engine is gone stops serving. Neither
this module nor `engine.server` imports torch: the front end never loads the model's libraries.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from engine.config import Preset
from engine.limits import Limits
from engine.requests import GenRequest, Sink, Update, deliver
from engine.tokenizer import ByteTokenizer

log = logging.getLogger("engine.frontend")

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"  # both processes' log lines

CALL_TIMEOUT_S = 30.0


class EngineClient:
    """The front end's handle on an engine in another process (see the module docstring)."""

    frontend = "process"

    def __init__(self, conn: Connection, model_name: str, mode: str) -> None:
        self.conn, self.model_name, self.mode = conn, model_name, mode
        self.tok = ByteTokenizer()
        self.preset: Preset | None = None
        self.load_error: str | None = None
        self.created = int(time.time())
        self.ready = threading.Event()
        self.on_load_failed: Callable[[], None] = lambda: None  # also when the engine is gone
        self._ids = itertools.count(1)
        self._sinks: dict[int, Sink] = {}  # rid -> sink, until its final update
        self._calls: dict[int, asyncio.Future[Any]] = {}
        self._gone = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self.engine_up = False  # the engine reads the pipe ("up"): calls go to it

    # -- the engine handle (the event loop's thread) -----------------------------------------
    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        threading.Thread(target=self._read, name="engine-pipe", daemon=True).start()

    def stop(self) -> None:
        self._gone = True
        self.conn.close()

    def alive(self) -> bool:
        return not self._gone

    def submit(self, req: GenRequest) -> None:
        req.rid = next(self._ids)
        self._sinks[req.rid] = req.sink
        fields = {
            "prompt_ids": req.prompt_ids,
            "max_tokens": req.max_tokens,
            "stop": req.stop,
            "ignore_eos": req.ignore_eos,
            "temperature": req.temperature,
            "seed": req.seed,
            "group": req.group,
        }
        if not self._send(("submit", req.rid, fields)):
            self._sinks.pop(req.rid, None)
            req.sink(Update([], True, "error", "the engine process is gone"))

    def cancel(self, req: GenRequest) -> None:
        if req.rid in self._sinks:
            self._send(("cancel", req.rid))

    async def info(self) -> dict[str, Any]:
        if not self.engine_up and not self._gone:
            return self.starting_info()
        return await self._call("info")

    async def metrics(self) -> str:
        if not self.engine_up and not self._gone:
            return "# the engine process is starting: no samples yet\n"
        return await self._call("metrics")

    async def shadow(self, body: Any) -> dict[str, Any]:
        if not self.engine_up and not self._gone:
            return {"error": "the engine is not serving yet", "status": 503}
        return await self._call("shadow", body)

    def starting_info(self) -> dict[str, Any]:
        """/get_server_info before the engine reads the pipe (it is still importing torch, a
        second or more): answered here at once, not after that import."""
        return {
            "model": self.model_name,
            "pid": os.getppid(),  # the engine: this front end's parent, which holds the model
            "frontend": self.frontend,
            "ready": False,
            "starting": "the engine process is importing its libraries; the model loads next",
            "mode": self.mode,
        }

    # -- internals ----------------------------------------------------------------------------
    def _send(self, msg: tuple) -> bool:
        if self._gone:
            return False
        try:
            self.conn.send(msg)
            return True
        except (OSError, ValueError):  # the engine closed its end
            self._gone = True
            return False

    async def _call(self, name: str, arg: Any = None) -> Any:
        assert self._loop is not None
        cid = next(self._ids)
        fut: asyncio.Future[Any] = self._loop.create_future()
        self._calls[cid] = fut
        try:
            if not self._send(("call", cid, name, arg)):
                raise RuntimeError("the engine process is gone")
            return await asyncio.wait_for(fut, CALL_TIMEOUT_S)
        finally:
            self._calls.pop(cid, None)

    def _read(self) -> None:
        """The pipe's reader thread: every message is handed to the event loop at once."""
        loop = self._loop
        assert loop is not None
        while True:
            try:
                msg = self.conn.recv()
            except (EOFError, OSError):
                break
            try:
                loop.call_soon_threadsafe(self._handle, msg)
            except RuntimeError:  # the loop closed: shutting down
                break
        self._gone = True
        if not self.ready.is_set() and self.load_error is None:
            self.load_error = "the engine process ended before it was ready"
        try:
            loop.call_soon_threadsafe(self._engine_gone)
        except RuntimeError:
            pass

    def _handle(self, msg: tuple) -> None:
        kind = msg[0]
        if kind == "updates":
            batch = []
            for rid, update in msg[1]:
                sink = self._sinks.pop(rid, None) if update.finished else self._sinks.get(rid)
                if sink is not None:
                    batch.append((sink, update))
            deliver(batch)
        elif kind == "reply":
            fut = self._calls.get(msg[1])
            if fut is not None and not fut.done():
                fut.set_result(msg[2])
        elif kind == "up":
            self.engine_up = True
        elif kind == "ready":
            self.preset = msg[1]
            self.ready.set()
        elif kind == "failed":
            self.load_error = msg[1]
            self.on_load_failed()

    def _engine_gone(self) -> None:
        """The engine's end closed: fail what is in flight, and stop serving."""
        for rid in list(self._sinks):
            self._sinks.pop(rid)(Update([], True, "error", "the engine process ended"))
        for fut in self._calls.values():
            if not fut.done():
                fut.set_exception(RuntimeError("the engine process ended"))
        self.on_load_failed()


class _RemoteSink:
    """A request's sink on the engine's side: its id, for the front end's own sink."""

    __slots__ = ("rid",)

    def __init__(self, rid: int) -> None:
        self.rid = rid

    def __call__(self, update: Update) -> None:  # never called: dispatch reads `rid`
        raise AssertionError("a remote sink is dispatched, not called")


def serve_engine(state: Any, conn: Connection) -> int:
    """The engine's side (main process): load in a thread and tell the front end when it is
    done, while serving the front end's requests and calls until the pipe closes. `state` is
    an `engine.engine_state.EngineState`. Returns the exit code (1: the model failed to load)."""
    lock = threading.Lock()  # the scheduler's thread and this one both send
    live: dict[int, GenRequest] = {}

    def send(msg: tuple) -> None:
        with lock:
            conn.send(msg)

    def dispatch(batch: list[tuple[Sink, Update]]) -> None:
        out = []
        for sink, update in batch:
            rid = sink.rid  # type: ignore[attr-defined]
            out.append((rid, update))
            if update.finished:
                live.pop(rid, None)
        try:
            send(("updates", out))
        except OSError:  # the front end is gone; the main loop sees it too
            pass

    def load() -> None:  # in a thread: calls (/get_server_info) are answered meanwhile
        state.load(dispatch)
        try:
            if state.load_error is not None:
                send(("failed", state.load_error))  # the front end stops, the pipe closes
            else:
                send(("ready", state.preset))
                log.info("engine pid %d serving its front end", os.getpid())
        except OSError:
            pass

    state.gc.install()
    try:
        send(("up", os.getpid()))
    except OSError:  # the front end is gone already: the loop below reads end-of-file
        pass
    threading.Thread(target=load, name="engine-load", daemon=True).start()
    try:
        while True:
            try:
                msg = conn.recv()
            except (EOFError, OSError):
                break
            try:
                _handle_request(state, msg, live, send)
            except Exception:  # a message this side cannot use: say so, keep serving
                log.exception("engine: a front-end message it could not handle: %.200r", msg)
    finally:
        state.stop()
    return 1 if state.load_error is not None else 0


def _handle_request(
    state: Any, msg: tuple, live: dict[int, GenRequest], send: Callable[[tuple], None]
) -> None:
    """One front-end message on the engine's side: a submit, a cancel or a call."""
    kind = msg[0]
    if kind == "submit":
        _, rid, fields = msg
        req = GenRequest(sink=_RemoteSink(rid), **fields)
        req.rid = rid
        live[rid] = req
        state.submit(req)
    elif kind == "cancel":
        req = live.get(msg[1])
        if req is not None:
            state.cancel(req)
    elif kind == "call":
        cid, name = msg[1], msg[2]
        arg = msg[3] if len(msg) > 3 else None  # ("call", id, name[, argument])
        if name == "info":
            value = state.info_doc()
        elif name == "metrics":
            value = state.metrics_text()
        elif name == "shadow":
            value = state.shadow_call(arg)
        else:
            raise ValueError(f"unknown call {name!r}")
        send(("reply", cid, value))
    else:
        raise ValueError(f"unknown message kind {kind!r}")


def frontend_main(
    conn: Connection,
    sock: Any,
    model_name: str,
    mode: str,
    limits: Limits,
    host: str,
    port: int,
    log_level: str,
) -> None:
    """The spawned front end: the HTTP app over an `EngineClient`, on the inherited socket.

    A terminal's Ctrl-C reaches both processes; the engine stops this one itself (a TERM: a
    graceful stop; then its pipe closing). SIGINT is ignored here, so uvicorn's re-raise of it
    after its own graceful stop (or one while it starts) is no KeyboardInterrupt traceback and
    no exit 1."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.basicConfig(level=log_level.upper(), format=LOG_FORMAT)
    from engine.limits import BackoffSocket
    from engine.server import build_server, create_app

    client = EngineClient(conn, model_name, mode)
    app = create_app(client, limits)
    server = build_server(app, host, port, log_level, limits)
    client.on_load_failed = lambda: setattr(server, "should_exit", True)
    log.info("front end pid %d listening on http://%s:%d", os.getpid(), host, port)
    server.run(sockets=[BackoffSocket.wrap(sock)])
