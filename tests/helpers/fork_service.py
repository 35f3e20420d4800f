"""A stand-in for the SGLang service with the DDTree fork: HTTP like the fork's server, and a
scheduler that calls the fork module's functions per request and per step as its worker does.

    python tests/helpers/fork_service.py --port N [--budget 16] [--verify-ms 2]

Start it the way a release starts the service (`current/`, the release's `service.env`, its
`site/` first on PYTHONPATH so the import hook installs, the stand-in fork package after it);
it imports `sglang.srt.speculative.dflash_ddtree_utils` at start, as the fork's worker does, so
whatever the hook put in place is what it calls.

One scheduler thread runs the decode steps over the requests in flight (at most --max-batch).
A step, per request: the drafter's top-K log-probs in the caller's shape (H = K = budget rows,
float32 on the CPU, rounded through bf16 as a bf16 drafter's are: scores tie), then
`build_ddtree_tree_from_topk(top_log_probs, top_token_ids, budget)` (one request per call;
with `workspace=` by keyword where the module has the workspace class, its tensors copied
out before the next call, as the worker does); then the target's verify forward for the whole
batch (a sleep of --verify-ms, plus --verify-ms-per-request each: the GPU's part, the GIL let
go); then, per request, the target's greedy token at every node and
`follow_verified_tree(child_maps, posterior)`: the accepted nodes' tokens and the bonus token
are the request's next tokens.

The "model" is a hash: the target's next token after a context is T(hash of the context), and
the drafter proposes T's chain with some noise; so the output of a prompt is the target's own
greedy sequence whatever tree is built (speculative decoding is lossless), and the accept
length is what the trees and the walk make of it. Endpoints: `/health`, `/health_generate`,
`/v1/models`, `/get_server_info` (`internal_states[0].avg_spec_accept_length`, the steps, which
functions serve), `/v1/completions` (`prompt` a string or token ids, `max_tokens`, `stream`:
SSE chunks, one per step, with `token_ids`; otherwise one JSON answer with `token_ids`).
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import signal
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import sglang.srt.speculative.dflash_ddtree_utils as ddtree  # the hook acts here
import torch

MASK = (1 << 64) - 1
MODEL = "fork-standin"


def mix(h: int, token: int) -> int:
    """The context's hash after one more token."""
    h = ((h ^ (token + 0x9E37)) * 0x9E3779B97F4A7C15 + 0x632BE59BD9B4E019) & MASK
    return h ^ (h >> 29)


def target(h: int, vocab: int) -> int:
    """The target model's greedy next token after the context hashed as `h`."""
    return (h >> 17) % vocab


@dataclass
class Request:
    h: int  # the context's hash
    max_tokens: int
    out: queue.Queue = field(default_factory=queue.Queue)  # lists of new tokens; None: done
    made: int = 0


class Scheduler:
    """The decode loop: the fork's functions per request and per step (module doc)."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.budget, self.vocab = args.budget, args.vocab
        self.verify_s, self.per_request_s = args.verify_ms / 1e3, args.verify_ms_per_request / 1e3
        self.max_batch, self.agree = args.max_batch, args.agree
        self.build = ddtree.build_ddtree_tree_from_topk
        self.follow = ddtree.follow_verified_tree
        ws_cls = getattr(ddtree, "DFlashDDTreeBuildWorkspace", None)
        self.workspace = ws_cls() if ws_cls is not None else None
        self.pending: queue.Queue[Request] = queue.Queue()
        self.active: list[Request] = []
        self.steps = self.request_steps = self.committed = 0
        self.lock = threading.Lock()

    def submit(self, prompt: list[int], max_tokens: int) -> Request:
        h = 0x1234_5678
        for t in prompt:
            h = mix(h, t)
        req = Request(h=h, max_tokens=max_tokens)
        self.pending.put(req)
        return req

    def run(self) -> None:
        while True:
            if not self.active:
                self.active.append(self.pending.get())
            while len(self.active) < self.max_batch:
                try:
                    self.active.append(self.pending.get_nowait())
                except queue.Empty:
                    break
            self.step(self.active)
            self.active = [r for r in self.active if r.made < r.max_tokens]

    def drafter(self, h: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Top-K log-probs and ids [budget, budget]: row d proposes T's chain, mostly."""
        b, v = self.budget, self.vocab
        g = torch.Generator().manual_seed(h & 0x7FFF_FFFF_FFFF_FFFF)
        logits = torch.randn(b, v, generator=g) * 2.0
        chain = h
        for d in range(b):
            t = target(chain, v) if (chain >> 7) % 100 < self.agree else (chain >> 23) % v
            logits[d, t] += 9.0
            chain = mix(chain, t)
        lp, ids = torch.log_softmax(logits, -1).topk(b, dim=-1)
        return lp.to(torch.bfloat16).float().contiguous(), ids.contiguous()

    def step(self, batch: list[Request]) -> None:
        trees = []
        for req in batch:  # one request per call, as the worker does
            lp, ids = self.drafter(req.h)
            if self.workspace is not None:
                tree = self.build(lp, ids, self.budget, workspace=self.workspace)
                tree = tuple(x.clone() if isinstance(x, torch.Tensor) else x for x in tree)
            else:
                tree = self.build(lp, ids, self.budget)
            trees.append(tree)
        time.sleep(self.verify_s + self.per_request_s * len(batch))  # the target's forward
        for req, tree in zip(batch, trees, strict=True):
            tokens, parents, maps = tree[0].tolist(), tree[2], tree[3]
            ctx = [req.h]
            for i in range(1, len(parents)):
                ctx.append(mix(ctx[parents[i]], tokens[i - 1]))
            post = torch.tensor([target(h, self.vocab) for h in ctx], dtype=torch.long)
            path, bonus = self.follow(maps, post)
            new = [tokens[n - 1] for n in path[1:]] + [int(bonus)]
            new = new[: req.max_tokens - req.made]
            for t in new:
                req.h = mix(req.h, t)
            req.made += len(new)
            with self.lock:
                self.request_steps += 1
                self.committed += len(new)
            req.out.put(new)
            if req.made >= req.max_tokens:
                req.out.put(None)
        with self.lock:
            self.steps += 1

    def info(self) -> dict[str, Any]:
        with self.lock:
            avg = self.committed / self.request_steps if self.request_steps else None
            steps, rsteps = self.steps, self.request_steps
        serving = {
            name: getattr(fn, "ddtree_ops_backend", None) or "stock"
            for name, fn in (("build", self.build), ("follow", self.follow))
        }
        return {
            "model": MODEL,
            "budget": self.budget,
            "max_batch": self.max_batch,
            "internal_states": [
                {"avg_spec_accept_length": avg, "steps": steps, "request_steps": rsteps}
            ],
            "ddtree_module": ddtree.__file__,
            "serving": serving,
            "workspace": self.workspace is not None,
        }


def prompt_ids(prompt: Any) -> list[int]:
    if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
        return prompt
    return list(str(prompt).encode())


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    sched: Scheduler

    def log_message(self, *args: object) -> None:
        pass

    def _json(self, status: int, doc: object) -> None:
        body = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802
        if self.path in ("/health", "/health_generate"):
            return self._json(200, {"status": "ok"})
        if self.path == "/v1/models":
            card = {"id": MODEL, "object": "model", "max_model_len": 8192}
            return self._json(200, {"object": "list", "data": [card]})
        if self.path == "/get_server_info":
            return self._json(200, self.sched.info())
        return self._json(404, {"error": {"message": "not found"}})

    def do_POST(self) -> None:  # noqa: N802
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.path != "/v1/completions":
            return self._json(404, {"error": {"message": "not found"}})
        try:
            req = json.loads(body or b"{}")
            ids = prompt_ids(req.get("prompt", ""))
            n = int(req.get("max_tokens", 16))
        except (ValueError, TypeError) as exc:
            return self._json(400, {"error": {"message": f"bad request: {exc}"}})
        r = self.sched.submit(ids, max(n, 1))
        if not req.get("stream"):
            out: list[int] = []
            while (new := r.out.get()) is not None:
                out += new
            choice = {
                "index": 0,
                "text": "".join(chr(32 + t % 95) for t in out),
                "token_ids": out,
                "finish_reason": "length",
            }
            usage = {"prompt_tokens": len(ids), "completion_tokens": len(out)}
            return self._json(
                200,
                {"object": "text_completion", "model": MODEL, "choices": [choice], "usage": usage},
            )
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        while (new := r.out.get()) is not None:
            text = "".join(chr(32 + t % 95) for t in new)
            chunk = {
                "object": "text_completion",
                "model": MODEL,
                "choices": [{"index": 0, "text": text, "token_ids": new}],
            }
            self._chunk(f"data: {json.dumps(chunk)}\n\n".encode())
        self._chunk(b"data: [DONE]\n\n")
        self._chunk(b"")

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--budget", type=int, default=16, help="tree budget (H = K = budget)")
    p.add_argument("--vocab", type=int, default=2048)
    p.add_argument("--verify-ms", type=float, default=2.0, help="the verify forward, per step")
    p.add_argument("--verify-ms-per-request", type=float, default=0.1)
    p.add_argument("--max-batch", type=int, default=32)
    p.add_argument("--agree", type=int, default=75, help="% the drafter proposes the target's")
    args = p.parse_args()
    torch.set_num_threads(1)
    Handler.sched = Scheduler(args)
    threading.Thread(target=Handler.sched.run, daemon=True, name="scheduler").start()
    server = ThreadingHTTPServer((args.host, args.port), Handler)
    server.daemon_threads = True

    def stop(signum: int, frame: object) -> None:
        # the port first: a many-threaded process dies thread by thread, and its listening
        # socket would outlive the pid the process manager saw go (a restart then finds the
        # port held by "another user's process")
        server.socket.close()
        os._exit(0)

    signal.signal(signal.SIGTERM, stop)
    print(
        f"fork stand-in: serving {ddtree.__name__} ({Handler.sched.info()['serving']}) on "
        f"{args.host}:{args.port}",
        flush=True,
    )
    server.serve_forever()


if __name__ == "__main__":
    main()
