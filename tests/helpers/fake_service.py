"""A small real HTTP service with an OpenAI-style surface that can be told to misbehave.

`python tests/helpers/fake_service.py --port N --mode ok|500|garbage|hang|noisy [--salt S]
[--ids ...]`

- ok: /health, /health_generate, /v1/models, /v1/completions (also SSE streaming) answer at
  once; the "greedy" output is a deterministic function of the prompt and `--salt`;
- 500: every endpoint answers HTTP 500 with an error body;
- garbage: health answers, completions answer 200 with a body that is not JSON;
- hang: health answers, completions never answer;
- noisy: like ok, but about a quarter of the prompts get a different answer every time;
- `--ids native`: completions carry no token ids, SGLang's native /generate gives `output_ids`;
  `--ids none`: no ids anywhere (checks must fall back to text);
- `--hang-after N`: completions after the first N never answer (a level that never ends).
Used by the healthcheck tests for failures the reference engine never makes, and as the
instant server in the load generator's capacity benchmark.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def tokens(prompt: str, n: int, salt: str) -> list[int]:
    seed = hashlib.sha256((salt + "\0" + prompt).encode()).digest()
    return [32 + (seed[i % len(seed)] + i) % 95 for i in range(n)]


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # stream each token now, not after a delayed ACK
    mode = "ok"
    salt = ""
    ids = "inline"  # inline: completions carry token_ids; native: only /generate; none
    hang_after = -1  # completions after this many hang (-1: never)
    served = 0
    lock = threading.Lock()

    def log_message(self, *args: object) -> None:  # quiet
        pass

    def _send(self, status: int, body: bytes, ctype: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _json(self, status: int, doc: object) -> None:
        self._send(status, json.dumps(doc).encode())

    def do_GET(self) -> None:  # noqa: N802
        if self.mode == "500":
            return self._json(500, {"error": {"message": "internal error", "type": "server"}})
        if self.path in ("/health", "/health_generate"):
            return self._send(200, b"")
        if self.path == "/v1/models":
            return self._json(200, {"object": "list", "data": [{"id": "fake", "object": "model"}]})
        return self._json(404, {"error": {"message": "not found"}})

    def do_POST(self) -> None:  # noqa: N802
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.mode == "500":
            return self._json(500, {"error": {"message": "internal error", "type": "server"}})
        if self.path == "/generate" and self.ids == "native":  # SGLang's native API
            req = json.loads(body or b"{}")
            n = int(req.get("sampling_params", {}).get("max_new_tokens", 16))
            out = tokens(req.get("text", ""), n, self.salt)
            return self._json(200, {"text": "".join(map(chr, out)), "output_ids": out})
        if self.path != "/v1/completions":
            return self._json(404, {"error": {"message": "not found"}})
        if self.mode == "garbage":
            return self._send(200, b"<html>definitely not json", "text/html")
        with Handler.lock:
            Handler.served += 1
            late = 0 <= Handler.hang_after < Handler.served
        if self.mode == "hang" or late:
            time.sleep(3600)
        req = json.loads(body or b"{}")
        prompt = req.get("prompt", "")
        prompt = prompt if isinstance(prompt, str) else json.dumps(prompt)
        salt = self.salt
        if self.mode == "noisy" and hashlib.sha256(prompt.encode()).digest()[0] % 4 == 0:
            salt += str(time.perf_counter_ns())  # this prompt's answer changes every time
        ids = tokens(prompt, int(req.get("max_tokens", 16)), salt)
        if not req.get("stream"):
            choice = {"index": 0, "text": "".join(map(chr, ids)), "finish_reason": "length"}
            if self.ids == "inline":
                choice["token_ids"] = ids
            doc = {"object": "text_completion", "model": "fake", "choices": [choice]}
            return self._json(200, doc)
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for i in ids:
            chunk = {"choices": [{"index": 0, "text": chr(i), "token_ids": [i]}]}
            self._chunk(f"data: {json.dumps(chunk)}\n\n".encode())
        self._chunk(b"data: [DONE]\n\n")
        self._chunk(b"")

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--mode", choices=["ok", "500", "garbage", "hang", "noisy"], default="ok")
    p.add_argument("--salt", default="")
    p.add_argument("--ids", choices=["inline", "native", "none"], default="inline")
    p.add_argument("--hang-after", type=int, default=-1)
    args = p.parse_args()
    Handler.mode, Handler.salt, Handler.ids = args.mode, args.salt, args.ids
    Handler.hang_after = args.hang_after
    server = ThreadingHTTPServer((args.host, args.port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        server.shutdown()


if __name__ == "__main__":
    main()
