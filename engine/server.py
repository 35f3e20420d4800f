"""OpenAI-compatible HTTP server (FastAPI + uvicorn) over the scheduler, SGLang-like endpoints.

The endpoints talk to an engine handle: `engine.engine_state.EngineState` (the scheduler in
this process) or `engine.engine_proc.EngineClient` (the scheduler in another, `--frontend
process`). This module imports no torch, so a front-end process starts without it.
`POST /v1/completions` (text or token-id prompts, greedy, stop strings, SSE streaming; each
choice carries `token_ids`), `GET /v1/models`, `/health` (503 while loading), `/health_generate`
(one real token), `/get_server_info` (config, mode, backends and their source, limits, pid,
`internal_states`, the garbage collector's pauses), `/metrics` (Prometheus text). The model
loads in a background thread, and what it built is frozen out of later collections; requests
reach the scheduler thread through a queue and come back into an asyncio.Queue per
request, all of one step's updates through one `loop.call_soon_threadsafe` (the asyncio thread
wakes once per step, not once per request). Inputs are bounded (`engine.limits`): body
size, prompts per request, connections and read time; the prompts of one request form one
fairness group in the scheduler, and a client that leaves stops its generation.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from engine.limits import BodyLimit, Limits, bounded_h11, quiet_accept_errors
from engine.protocol import (
    BadRequest,
    Completion,
    cut_at_stop,
    error_body,
    load_json,
    parse_completion,
)
from engine.requests import GenRequest, Update
from engine.tokenizer import BOS_ID

log = logging.getLogger("engine.server")


def _error(
    status: int, message: str, type_: str = "invalid_request_error", **kw: Any
) -> JSONResponse:
    return JSONResponse(error_body(message, type_, **kw), status_code=status)


def _chunk(state: Any, rid: str, choice: dict) -> str:
    body = {
        "id": rid,
        "object": "text_completion",
        "created": int(time.time()),
        "model": state.model_name,
        "choices": [choice],
    }
    return f"data: {json.dumps(body)}\n\n"


async def _client_left(request: Request) -> None:
    """Return once the client disconnects (call after the body has been read)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def build_server(app: FastAPI, host: str, port: int, log_level: str, limits: Limits) -> Any:
    """The uvicorn server for `app`, bounded by `limits` (h11 sizes, connections, keep-alive)."""
    import uvicorn

    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        http=bounded_h11(limits),
        # beyond max_connections the oldest idle connection is closed; when none is idle
        # uvicorn answers 503 (it also bounds in-flight request tasks)
        limit_concurrency=limits.max_connections + 1,
        timeout_keep_alive=limits.keep_alive_timeout,  # type: ignore[arg-type]
    )
    return uvicorn.Server(config)


def _lifespan(state: Any) -> Any:
    """Start the engine handle with the app's event loop; stop it when the app stops."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        quiet_accept_errors(asyncio.get_running_loop())
        state.start(asyncio.get_running_loop())
        yield
        state.stop()

    return lifespan


def _add_error_handlers(app: FastAPI) -> None:
    """A validation error is a 400, anything unhandled a 500, both with a JSON error body."""

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        return _error(400, str(exc))

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error")
        return _error(500, f"internal error: {type(exc).__name__}: {exc}", "server_error")


def _submit(
    state: Any,
    prompt: list[int],
    max_tokens: int,
    c: Completion | None = None,
    group: str | None = None,
) -> tuple[GenRequest, asyncio.Queue[Update]]:
    """Hand one prompt to the engine; its updates arrive on the returned queue."""
    queue: asyncio.Queue[Update] = asyncio.Queue()
    req = GenRequest(
        prompt,
        max_tokens,
        queue.put_nowait,  # called on this loop's thread (the engine handle's dispatch)
        group=group,
    )
    if c is None:  # /health_generate: one greedy token, EOS or not
        req.ignore_eos = True
    else:
        req.stop, req.ignore_eos, req.temperature, req.seed = (
            c.stop,
            c.ignore_eos,
            c.temperature,
            c.seed,
        )
    state.submit(req)
    return req, queue


async def _collect(
    state: Any, req: GenRequest, queue: asyncio.Queue[Update]
) -> tuple[list[int], Update]:
    """Every token of one request, and its last update."""
    ids: list[int] = []
    try:
        while True:
            u = await queue.get()
            ids += u.token_ids
            if u.finished:
                return ids, u
    finally:
        state.cancel(req)  # no-op once finished; frees it if the client left


def _add_status_routes(app: FastAPI, state: Any) -> None:
    """/health, /health_generate, /v1/models, /get_server_info, /metrics, /shadow."""

    @app.get("/health")
    async def health() -> JSONResponse:
        if state.ready.is_set():
            if not state.alive():
                return JSONResponse({"status": "failed: scheduler stopped"}, status_code=503)
            return JSONResponse({"status": "ok"})
        status = "failed: " + state.load_error if state.load_error else "loading"
        return JSONResponse({"status": status}, status_code=503)

    @app.get("/health_generate")
    async def health_generate() -> JSONResponse:
        if not state.ready.is_set():
            return _error(503, "engine is loading", "unavailable")
        req, queue = _submit(state, [BOS_ID], 1)
        try:
            ids, u = await asyncio.wait_for(_collect(state, req, queue), timeout=60)
        except TimeoutError:
            return _error(503, "no token within 60 s", "unavailable")
        if u.finish_reason == "error" or len(ids) != 1:
            return _error(503, f"generation failed: {u.error}", "unavailable")
        return JSONResponse({"status": "ok", "token_ids": ids})

    @app.get("/v1/models")
    async def models() -> JSONResponse:
        max_len = state.preset.model.max_seq_len if state.preset else None
        card = {
            "id": state.model_name,
            "object": "model",
            "created": state.created,
            "owned_by": "ddtree-ops",
            "root": state.model_name,
            "max_model_len": max_len,
        }
        return JSONResponse({"object": "list", "data": [card]})

    @app.get("/get_server_info")
    async def server_info() -> JSONResponse:
        return JSONResponse(await state.info())

    @app.get("/metrics")
    async def prometheus() -> PlainTextResponse:
        text = await state.metrics()
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4")

    @app.post("/shadow")
    async def shadow(request: Request) -> JSONResponse:
        """Arm the engine's shadow (engine.shadow): `{"attention": "cuda", "forwards": 400}`
        times that backend beside the serving one on the next 400 forwards; `{"forwards": 0}`
        disarms. The pairs are in /get_server_info's `shadow`."""
        raw = await request.body()
        try:
            body = load_json(raw)
        except BadRequest as e:
            return _error(400, str(e))
        doc = await state.shadow(body)
        if "status" in doc:  # a refusal: {"error": why, "status": code}
            status = doc["status"]
            return _error(
                status, doc["error"], "unavailable" if status == 503 else "invalid_request_error"
            )
        return JSONResponse(doc)


def _add_completion_route(app: FastAPI, state: Any, limits: Limits) -> None:
    """POST /v1/completions: validated, then streamed or answered once every prompt is done."""

    @app.post("/v1/completions")
    async def completions(request: Request) -> Any:
        raw = await request.body()  # at most limits.max_body_bytes (BodyLimit)
        if not state.ready.is_set():
            return _error(503, "engine is loading", "unavailable")
        mc = state.preset.model
        try:
            c = parse_completion(
                load_json(raw),
                mode=state.mode,
                vocab=mc.vocab_size,
                max_seq_len=mc.max_seq_len,
                max_new=state.preset.engine.max_new_tokens,
                tok=state.tok,
                max_prompts=limits.max_prompts_per_request,
            )
        except BadRequest as exc:
            return _error(400, exc.message, param=exc.param, code=exc.code)
        rid = f"cmpl-{uuid.uuid4().hex}"
        if c.stream:
            return StreamingResponse(_stream(state, rid, c), media_type="text/event-stream")
        return await _complete(state, request, rid, c)


async def _complete(state: Any, request: Request, rid: str, c: Completion) -> Response:
    """Every prompt of `c` generated at once (one fairness group); a client that leaves stops
    them all and gets no answer (499)."""
    pending = [_submit(state, p, c.max_tokens, c, group=rid) for p in c.prompts]
    gathered = asyncio.ensure_future(asyncio.gather(*(_collect(state, r, q) for r, q in pending)))
    left = asyncio.ensure_future(_client_left(request))
    await asyncio.wait({gathered, left}, return_when=asyncio.FIRST_COMPLETED)
    left.cancel()
    if not gathered.done():  # the client is gone: stop its generation, answer no one
        for r, _ in pending:
            state.cancel(r)
        gathered.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await gathered
        return Response(status_code=499)
    return _completion_body(state, rid, c, gathered.result())


def _completion_body(
    state: Any, rid: str, c: Completion, results: list[tuple[list[int], Update]]
) -> JSONResponse:
    """The text_completion answer: one choice per prompt, and the usage."""
    choices, completion_tokens = [], 0
    for i, (ids, u) in enumerate(results):
        if u.finish_reason == "error":
            return _error(500, u.error or "generation failed", "server_error")
        text, _ = cut_at_stop(state.tok.decode(ids), c.stop)
        completion_tokens += len(ids)
        choices.append(
            {
                "index": i,
                "text": text,
                "token_ids": ids,
                "logprobs": None,
                "finish_reason": u.finish_reason,
            }
        )
    prompt_tokens = sum(len(p) for p in c.prompts)
    return JSONResponse(
        {
            "id": rid,
            "object": "text_completion",
            "created": int(time.time()),
            "model": state.model_name,
            "choices": choices,
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
        }
    )


async def _stream(state: Any, rid: str, c: Completion) -> AsyncIterator[str]:
    """The SSE chunks of one prompt's generation: text held back while it may still become a
    stop string, then the usage (when asked) and [DONE]."""
    req, queue = _submit(state, c.prompts[0], c.max_tokens, c, group=rid)
    dec = state.tok.stream_decoder()
    hold = max((len(s) for s in c.stop), default=1) - 1
    text, sent, n_ids = "", 0, 0
    try:
        while True:
            u = await queue.get()
            n_ids += len(u.token_ids)
            text += dec.feed(u.token_ids)
            if u.finished:
                text += dec.flush()
            if u.finish_reason == "error":
                yield f"data: {json.dumps(error_body(u.error or 'error', 'server_error'))}\n\n"
                break
            visible, cut = cut_at_stop(text, c.stop)
            end = len(visible) if (u.finished or cut) else max(sent, len(visible) - hold)
            choice = {
                "index": 0,
                "text": visible[sent:end],
                "token_ids": u.token_ids,
                "logprobs": None,
                "finish_reason": u.finish_reason if u.finished else None,
            }
            sent = end
            yield _chunk(state, rid, choice)
            if u.finished:
                break
        if c.include_usage:
            yield _usage_chunk(state, rid, len(c.prompts[0]), n_ids)
        yield "data: [DONE]\n\n"
    finally:
        state.cancel(req)


def _usage_chunk(state: Any, rid: str, prompt_tokens: int, completion_tokens: int) -> str:
    usage = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
    body = {
        "id": rid,
        "object": "text_completion",
        "created": int(time.time()),
        "model": state.model_name,
        "choices": [],
        "usage": usage,
    }
    return f"data: {json.dumps(body)}\n\n"


def create_app(state: Any, limits: Limits | None = None) -> FastAPI:
    """The HTTP app over an engine handle `state`: an `engine.engine_state.EngineState` (the
    scheduler in this process) or an `engine.engine_proc.EngineClient` (in another)."""
    limits = limits or Limits()
    app = FastAPI(title="ddtree reference engine", lifespan=_lifespan(state))
    app.state.engine = state
    app.add_middleware(BodyLimit, max_bytes=limits.max_body_bytes)
    _add_error_handlers(app)
    _add_status_routes(app, state)
    _add_completion_route(app, state, limits)
    return app
