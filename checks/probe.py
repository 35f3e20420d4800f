"""`python -m checks.probe --json --url URL [options] -- CMD...`: watch the service while CMD runs.

The interference probe, run on the host next to the service. It sends the service one fixed,
short, greedy request (`/v1/completions`, temperature 0, `--max-tokens` tokens, EOS ignored)
again and again and times each answer, in three phases:

- before: `--before` requests (after 2 uncounted warm-ups), the service's own latency;
- during: while CMD runs (started in its own process group), at most `--max-during` requests
  and at most `--max-seconds` of CMD's life. The limit is the before-p50 plus `--threshold`
  (0.10 = +10%). CMD's whole process group is killed at once (SIGKILL) and the probe says
  `tripped` and `stopped_early` when the service is clearly past it: the p50 of the last
  `--min-during` requests above twice the limit (a gross slow-down, caught in a few
  requests), or three in four of the last `--window` requests above the limit (their p25
  over it: a sustained rise, which a single slow answer of a noisy service is not). A
  request that fails counts as an infinitely slow one; during CMD a request gives up after
  5x the limit (at least 1 s), so a stalled service trips the probe within seconds. CMD
  still running at `--max-seconds` is killed too (`timed_out`);
- after: `--after` requests, to show whether the service recovered.

At the end, a p50 of all the requests during CMD above the limit also says `tripped` (the
rise the verdict rules on), without `stopped_early`. When the service's own spread before CMD
(IQR / p50) is wider than the threshold, `warnings` says that a rise below that spread cannot
be told from noise.

CMD runs in its own process group inside the probe's session (so the Host layer's sweep of the
session still reaches it); it is killed with the probe: a TERM, HUP or INT to the probe kills
CMD's group first, and on Linux CMD gets SIGKILL if the probe itself dies (PR_SET_PDEATHSIG).
CMD's stdout and stderr go to temp files (never a full pipe); when stdout is one JSON
document it comes back parsed as `cmd.document`. If the service does not answer before CMD
starts, CMD runs unwatched and the document says `measured: false`.
Exit 0: measured, no interference, and CMD exited 0; 1: otherwise; 2: bad input.

`python -m checks.probe --json --url URL --counters` instead prints the service's counters
once (`/get_server_info` and the samples of `/metrics`), for `ops profile` to take the
difference of two such snapshots around a load level. Stdlib only.

Prints (`checks.docs.ProbeDoc`):
    ok            bool   measured, not tripped, and CMD exited 0
    measured      bool   the service answered before CMD (`unmeasured_reason` if not)
    threshold, limit_ms   the allowed rise and the p50 it makes
    before, during, after   `Phase`: n, answered, failed, ms, p25_ms, p50_ms, p75_ms, errors
                            (during also at_s: when each request went out)
    tripped, stopped_early, trip   interference, and the rule that killed CMD early
    warnings      list   a noisy baseline, a p50 past the limit
    cmd           dict   `CmdRun`: argv, pid, rc, killed, timed_out, duration_s, document
                         (CMD's JSON stdout), stdout_tail, stderr_tail
With --counters (`checks.docs.CountersDoc`): at, server_info, server_info_status, metrics
(/metrics samples by name{labels}, buckets left out), metrics_status.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from checks.docs import Counters
from checks.http import get, post
from checks.module import EXIT_FAIL, EXIT_PASS, exit_json, parser

PROMPT = "The capital of France is"
WARMUP = 2
TAIL = 4000  # characters of CMD's stderr kept


def p50(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def summary(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """Latencies (ms) of the answered requests, their quartiles, and the failures."""
    ms = [s["ms"] for s in samples if s["ms"] is not None]
    q = statistics.quantiles(ms, n=4, method="inclusive") if len(ms) > 1 else [None] * 3
    return {
        "n": len(samples),
        "answered": len(ms),
        "failed": len(samples) - len(ms),
        "ms": [round(x, 3) for x in ms],
        "p25_ms": q[0],
        "p50_ms": p50(ms),
        "p75_ms": q[2],
        "errors": sorted({s["error"] for s in samples if s["error"]}),
    }


class Prober:
    """One fixed greedy request, timed; failures are samples too (ms None, with the error)."""

    def __init__(self, url: str, max_tokens: int, timeout: float, model: str | None) -> None:
        self.url, self.timeout = url, timeout
        self.body: dict[str, Any] = {
            "prompt": PROMPT,
            "max_tokens": max_tokens,
            "temperature": 0,
            "ignore_eos": True,
        }
        if model:
            self.body["model"] = model
        self.t0 = time.monotonic()

    def once(self, timeout: float | None = None) -> dict[str, Any]:
        at = time.monotonic() - self.t0
        res = post(self.url, "/v1/completions", self.body, timeout=timeout or self.timeout)
        ok = res.ok and isinstance(res.json, dict) and bool(res.json.get("choices"))
        return {
            "at_s": round(at, 4),
            "ms": res.latency_s * 1000 if ok else None,
            "error": None if ok else res.evidence()[:200],
        }

    def phase(self, n: int, interval: float) -> list[dict[str, Any]]:
        out = []
        for _ in range(n):
            out.append(self.once())
            time.sleep(interval)
        return out


def stop_rule(samples: list[dict[str, Any]], limit: float, args: Any) -> dict[str, Any] | None:
    """Is the service clearly past the limit now? (a failed request counts as infinitely slow)"""
    ms = [s["ms"] if s["ms"] is not None else math.inf for s in samples]

    def show(v: float) -> str:
        return "failed" if math.isinf(v) else f"{v:.2f} ms"

    if len(ms) >= args.min_during:
        recent = statistics.median(ms[-args.min_during :])
        if recent > 2 * limit:
            return {
                "rule": "gross",
                "value_ms": None if math.isinf(recent) else round(recent, 3),
                "why": f"p50 of the last {args.min_during} probe requests {show(recent)} > "
                f"twice the limit {limit:.2f} ms",
            }
    if len(ms) >= args.window:
        last = ms[-args.window :]
        q1 = statistics.quantiles(last, n=4, method="inclusive")[0] if len(last) > 1 else last[0]
        if q1 > limit:
            return {
                "rule": "sustained",
                "value_ms": None if math.isinf(q1) else round(q1, 3),
                "why": f"3 in 4 of the last {args.window} probe requests slower than the limit "
                f"{limit:.2f} ms (their p25 {show(q1)})",
            }
    return None


def _child_setup(parent: int) -> None:
    """In CMD before exec: its own process group; SIGKILL when the probe dies (Linux)."""
    os.setpgid(0, 0)
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:  # the probe died before the line above: do not run at all
        os._exit(1)


def start(cmd: list[str], out_f: Any, err_f: Any) -> subprocess.Popen[bytes]:
    """Start CMD; a TERM, HUP or INT to the probe from now on kills CMD's group, then exits."""
    parent = os.getpid()
    proc = subprocess.Popen(
        cmd, stdout=out_f, stderr=err_f, preexec_fn=lambda: _child_setup(parent)
    )

    def die(signum: int, _frame: Any) -> None:
        kill_group(proc)
        raise SystemExit(128 + signum)

    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, die)
    return proc


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def watch(args: Any, cmd: list[str]) -> dict[str, Any]:
    """The three phases around CMD; the trip decision; CMD's outcome."""
    probe = Prober(args.url, args.max_tokens, args.request_timeout, args.model)
    probe.phase(WARMUP, args.interval)
    before = probe.phase(args.before, args.interval)
    base = p50([s["ms"] for s in before if s["ms"] is not None])
    measured = base is not None and sum(s["ms"] is not None for s in before) >= max(
        3, args.before // 2
    )
    limit = base * (1 + args.threshold) if measured and base is not None else None
    give_up = min(args.request_timeout, max(1.0, 5 * limit / 1000)) if limit else None
    out_f = tempfile.TemporaryFile()
    err_f = tempfile.TemporaryFile()
    started = time.monotonic()
    proc = start(cmd, out_f, err_f)
    during: list[dict[str, Any]] = []
    trip: dict[str, Any] | None = None
    timed_out = False
    while proc.poll() is None:
        if time.monotonic() - started > args.max_seconds:
            kill_group(proc)
            timed_out = True
            break
        if not measured or len(during) >= args.max_during:
            time.sleep(0.05)
            continue
        during.append(probe.once(give_up))
        hit = stop_rule(during, limit, args) if limit is not None and base is not None else None
        if hit is not None and proc.poll() is None:
            kill_group(proc)
            trip = {
                **hit,
                "at_s": round(time.monotonic() - started, 3),
                "limit_ms": round(limit, 3),
                "reason": f"{hit['why']} (before: p50 {base:.2f} ms, threshold "
                f"+{args.threshold:.0%}): command killed",
            }
            break
        time.sleep(args.interval)
    rc = proc.wait()
    duration = time.monotonic() - started
    after = probe.phase(args.after, args.interval) if measured else []
    out_f.seek(0)
    err_f.seek(0)
    stdout = out_f.read().decode("utf-8", "replace")
    stderr = err_f.read().decode("utf-8", "replace")
    document = None
    with contextlib.suppress(ValueError):
        document = json.loads(stdout) if stdout.strip() else None
    d = summary(during)
    overall = d["p50_ms"] if d["failed"] * 2 < max(d["n"], 1) else math.inf
    exceeded = bool(measured and limit is not None and d["n"] and overall > limit)
    b = summary(before)
    warnings = []
    if measured and b["p25_ms"] is not None and base:
        spread = (b["p75_ms"] - b["p25_ms"]) / base
        if spread > args.threshold:
            warnings.append(
                f"the service's own latency spread before the command (IQR {spread:.0%} of the "
                f"p50) is wider than the threshold +{args.threshold:.0%}: a rise smaller than "
                "that cannot be told from noise"
            )
    if exceeded and trip is None:
        warnings.append(
            f"the p50 during the command, {overall:.2f} ms, is past the limit {limit:.2f} ms"
        )
    return {
        "measured": measured,
        "unmeasured_reason": None
        if measured
        else "the service did not answer the probe before CMD started: "
        + "; ".join(summary(before)["errors"] or ["too few answers"]),
        "threshold": args.threshold,
        "limit_ms": limit,
        "request": probe.body,
        "during_request_timeout_s": give_up,
        "interval_s": args.interval,
        "window": args.window,
        "before": b,
        "during": {**d, "at_s": [s["at_s"] for s in during]},
        "after": summary(after),
        "tripped": trip is not None or exceeded,
        "stopped_early": trip is not None,
        "trip": trip,
        "warnings": warnings,
        "cmd": {
            "argv": cmd,
            "pid": proc.pid,
            "rc": rc,
            "killed": trip is not None or timed_out,
            "timed_out": timed_out,
            "duration_s": round(duration, 3),
            "document": document if isinstance(document, dict) else None,
            "stdout_tail": "" if isinstance(document, dict) else stdout[-TAIL:],
            "stderr_tail": stderr[-TAIL:],
        },
    }


def counters(url: str, timeout: float) -> Counters:
    """One snapshot: /get_server_info's JSON and /metrics' samples (buckets left out).

    /metrics is asked first, so that /get_server_info (with the engine's clock and stage
    timings) is the last thing read before whatever the caller times next. A /metrics that
    timed out with no answer at all stands for both (the same service would hang again)."""
    metrics = get(url, "/metrics", timeout=timeout)
    if metrics.status is None and (metrics.error or "").startswith("timeout"):
        info = metrics  # no answer in the whole timeout: a hung service, not asked twice
    else:
        info = get(url, "/get_server_info", timeout=timeout)
    samples: dict[str, float] = {}
    if metrics.ok:
        for line in metrics.body.splitlines():
            if not line or line.startswith("#") or "_bucket{" in line:
                continue
            name, _, value = line.rpartition(" ")
            with contextlib.suppress(ValueError):
                samples[name] = float(value)
    return {
        "at": time.time(),
        "server_info": info.json if info.ok and isinstance(info.json, dict) else None,
        "server_info_status": info.status if info.status is not None else info.error,
        "metrics": samples if metrics.ok else None,
        "metrics_status": metrics.status if metrics.status is not None else metrics.error,
    }


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    cmd: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, cmd = argv[:cut], argv[cut + 1 :]
    p = parser("checks.probe", "Watch a service's latency while a command runs next to it.")
    p.add_argument("--url", required=True, help="service base URL")
    p.add_argument("--counters", action="store_true", help="print the service's counters only")
    p.add_argument("--threshold", type=float, default=0.10, help="allowed rise of the p50")
    p.add_argument("--before", type=int, default=20, help="requests before CMD")
    p.add_argument("--after", type=int, default=10, help="requests after CMD")
    p.add_argument("--min-during", type=int, default=3, help="requests the gross rule looks at")
    p.add_argument("--window", type=int, default=8, help="requests the sustained rule looks at")
    p.add_argument("--max-during", type=int, default=20000, help="most requests during CMD")
    p.add_argument("--max-seconds", type=float, default=3600, help="CMD is killed after this")
    p.add_argument("--interval", type=float, default=0.05, help="pause between requests (s)")
    p.add_argument("--max-tokens", type=int, default=8, help="tokens per probe request")
    p.add_argument("--request-timeout", type=float, default=10.0, help="per request (s)")
    p.add_argument("--model", default=None)
    args = p.parse_args(argv)
    if not args.url.startswith(("http://", "https://")):
        p.error(f"--url must be http(s)://, got {args.url!r}")
    if args.counters:
        if cmd:
            p.error("--counters takes no command")
        exit_json({"ok": True, "module": "checks.probe", **counters(args.url, 10.0)})
    if not cmd:
        p.error("give the command to watch after `--`")
    if args.threshold < 0 or min(args.before, args.window, args.min_during, args.max_tokens) < 1:
        p.error("--threshold must be >= 0; --before, --window, --min-during, --max-tokens >= 1")
    if args.after < 0 or args.max_during < 1 or args.max_seconds <= 0 or args.interval < 0:
        p.error("--after >= 0, --max-during >= 1, --max-seconds > 0, --interval >= 0")
    try:
        doc = watch(args, cmd)
    except FileNotFoundError as exc:
        p.error(f"cannot run the command: {exc}")
    ok = doc["measured"] and not doc["tripped"] and doc["cmd"]["rc"] == 0
    exit_json({"ok": ok, "module": "checks.probe", **doc}, EXIT_PASS if ok else EXIT_FAIL)


if __name__ == "__main__":
    main()
