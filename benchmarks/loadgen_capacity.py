"""How many requests per second the load generator (`checks.loadtest`) sustains on this machine.

A benchmark, not a test: it starts a minimal asyncio server in its own process that answers
every POST at once with a fixed streamed completion (chunked SSE, N tokens), then runs
`python -m checks.loadtest` against it at several concurrency levels and prints req/s and
tokens/s; with --out, writes the JSON. Whatever the generator reaches here is an upper bound
on what it can measure, so a service far below it is measured, not the generator.

    python benchmarks/loadgen_capacity.py --out benchmarks/results/RUN/loadgen-capacity.json

(RUN: one folder per run, `<date>-<commit>-loadgen-capacity`, with the command in its
`command.txt`; see `benchmarks/results/INDEX.md`)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import socket
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def sse_response(tokens: int) -> bytes:
    chunks = b""
    for i in range(tokens):
        data = json.dumps({"choices": [{"index": 0, "text": "x", "token_ids": [33 + i % 90]}]})
        event = f"data: {data}\n\n".encode()
        chunks += f"{len(event):x}\r\n".encode() + event + b"\r\n"
    done = b"data: [DONE]\n\n"
    chunks += f"{len(done):x}\r\n".encode() + done + b"\r\n0\r\n\r\n"
    head = (
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    return head + chunks


async def serve(port: int, tokens: int) -> None:
    answer = sse_response(tokens)

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                await reader.readexactly(length)
                writer.write(answer)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", port)
    async with server:
        await server.serve_forever()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    p.add_argument("--tokens", type=int, default=1, help="tokens in each streamed answer")
    p.add_argument("--concurrency", default="1,16,64,256")
    p.add_argument("--requests", type=int, default=4000)
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    if args.serve:
        asyncio.run(serve(args.serve, args.tokens))
        return
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, __file__, "--serve", str(port), "--tokens", str(args.tokens)]
    )
    try:
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
                break
            except OSError:
                time.sleep(0.05)
        rows = []
        for c in [int(x) for x in args.concurrency.split(",")]:
            cmd = [
                sys.executable,
                "-m",
                "checks.loadtest",
                "--json",
                "--url",
                f"http://127.0.0.1:{port}",
                "--concurrency",
                str(c),
                "--requests",
                str(args.requests),
                "--output-len",
                str(args.tokens),
            ]
            doc = json.loads(
                subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, check=True).stdout
            )
            lv = doc["level"]
            rows.append(
                {
                    "concurrency": c,
                    "completed": lv["completed"],
                    "failed": lv["failed"],
                    "request_per_s": lv["request_per_s"],
                    "output_tok_per_s": lv["output_tok_per_s"],
                }
            )
            print(
                f"c={c:4d}  {lv['request_per_s']:8.0f} req/s  "
                f"{lv['output_tok_per_s']:9.0f} tok/s  failed={lv['failed']}"
            )
    finally:
        server.terminate()
        server.wait()
    result = {
        "benchmark": "loadgen_capacity",
        "tokens_per_answer": args.tokens,
        "requests_per_level": args.requests,
        "cpus": os.cpu_count(),
        "machine": platform.platform(),
        "python": platform.python_version(),
        "command": " ".join(sys.argv),
        "levels": rows,
    }
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
