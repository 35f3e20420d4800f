"""Where a running reference engine's time goes under a fixed load, from its own stage clock.

    python benchmarks/service_stages.py --url http://127.0.0.1:30190 [--prompt-len 1024]
        [--max-tokens 64] [--requests 12] [--concurrency 1] [--json F]

Sends `--requests` completions (prompt: `--prompt-len` ASCII bytes, so that many tokens with the
BOS; greedy, `--max-tokens`, EOS ignored) with `--concurrency` in flight, and reads
`/get_server_info` before and after: per prefill its seconds and the attention inside them, per
step (mean over the window's steps) the attention stage and the whole step, and the CUDA
allocator's device allocations, frees and retries over the window. What it is for: the
same numbers as `engine.attn_bench` and the kernel bench's stage rows, but measured inside the
serving process (docs/performance.md, the HTTP front end). Stdlib only, and `kernels.cli` for
its flags.
"""

from __future__ import annotations

import json
import sys
import threading
import time
import urllib.error
import urllib.request

from kernels.cli import OneLineParser


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=30) as r:
        return json.load(r)


def _complete(url: str, prompt: str, max_tokens: int) -> None:
    body = json.dumps(
        {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
    ).encode()
    req = urllib.request.Request(
        url + "/v1/completions", body, {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=120) as r:
        json.load(r)


def _totals(info: dict) -> dict:
    st = info["internal_states"][0]
    pre = st["prefill_time_breakdown"]
    steps = st["step_time_breakdown"]
    n = sum(v["steps"] for v in steps.values())
    tot = {k: sum(v["total_s"].get(k, 0.0) for v in steps.values()) for k in ("attention", "step")}
    alloc = {k: v for k, v in (info.get("cuda_allocator") or {}).items() if k.startswith("num_")}
    return {"prefills": pre["prefills"], "prefill_s": pre["total_s"]["prefill"],
            "prefill_attention_s": pre["total_s"]["attention"], "steps": n, **tot,
            **alloc}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = OneLineParser(prog="python benchmarks/service_stages.py")
    ap.add_argument("--url", required=True)
    ap.add_argument("--prompt-len", type=int, default=1024)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--requests", type=int, default=12)
    ap.add_argument("--concurrency", type=int, default=1)
    ap.add_argument("--warm", type=int, default=2, help="untimed requests first")
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    if min(a.prompt_len, a.max_tokens, a.requests, a.concurrency) < 1 or a.warm < 0:
        print("error: --prompt-len, --max-tokens, --requests, --concurrency must be >= 1 and "
              "--warm >= 0", file=sys.stderr)  # fmt: skip
        return 2
    if not a.url.startswith(("http://", "https://")):
        print(f"error: --url {a.url}: not an http:// or https:// URL", file=sys.stderr)
        return 2
    if a.json:
        try:  # an unwritable --json fails now, not after the load has run
            open(a.json, "w").close()
        except OSError as exc:
            print(f"error: --json {a.json}: {exc.strerror or exc}", file=sys.stderr)
            return 2
    base = a.url.rstrip("/")
    # distinct prompts (no cache in the engine, but the drafter's lookup sees the text)
    prompts = [("abcdefghij klmnopqrst"[i % 7 :] * a.prompt_len)[: a.prompt_len - 1]
               for i in range(a.requests + a.warm)]  # fmt: skip
    try:
        for p in prompts[: a.warm]:
            _complete(base, p, a.max_tokens)
        before, t0 = _totals(_get(base + "/get_server_info")), time.perf_counter()
        todo = list(prompts[a.warm :])
        lock = threading.Lock()
        failed: list[Exception] = []  # a worker's error ends the run, reported as the warm-up's

        def worker() -> None:
            while True:
                with lock:
                    if not todo or failed:
                        return
                    p = todo.pop()
                try:
                    _complete(base, p, a.max_tokens)
                except (OSError, ValueError) as exc:
                    with lock:
                        failed.append(exc)

        threads = [threading.Thread(target=worker) for _ in range(a.concurrency)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for extra in failed[1:]:  # only the first is reported: the others' responses closed
            if isinstance(extra, urllib.error.HTTPError):
                extra.close()
        if failed:
            raise failed[0]
        wall = time.perf_counter() - t0
        info = _get(base + "/get_server_info")
        after = _totals(info)
    except urllib.error.HTTPError as exc:  # 400: the engine refused this input (e.g. too long)
        with exc:  # its response, read or not, closed
            why = exc.read().decode(errors="replace")[:200].replace("\n", " ")
        why = why if exc.code == 400 else ""
        print(f"error: {base}: {exc} {why}".rstrip(), file=sys.stderr)
        return 2 if exc.code == 400 else 1
    except OSError as exc:
        print(f"error: {base}: {exc}", file=sys.stderr)
        return 1
    except (ValueError, KeyError, TypeError) as exc:  # a server that answers, but not an engine
        print(f"error: {base}: not a reference engine ({type(exc).__name__}: {exc})",
              file=sys.stderr)  # fmt: skip
        return 1
    d = {k: after[k] - before[k] for k in after}
    n_pre, n_steps = max(d["prefills"], 1), max(d["steps"], 1)
    out = {
        "url": base, "prompt_len": a.prompt_len, "max_tokens": a.max_tokens,
        "requests": a.requests, "concurrency": a.concurrency, "wall_s": wall,
        "tokens_per_s": a.requests * a.max_tokens / wall,
        "prefill_ms": 1000 * d["prefill_s"] / n_pre,
        "prefill_attention_ms": 1000 * d["prefill_attention_s"] / n_pre,
        "step_ms": 1000 * d["step"] / n_steps, "step_attention_ms": 1000 * d["attention"] / n_steps,
        "delta": d, "cuda_alloc_conf": info.get("cuda_alloc_conf"),
    }  # fmt: skip
    print(json.dumps(out))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
