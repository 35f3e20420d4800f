"""`python -m checks.health --json --url URL`: is the service up, answering, and sane?

Checks, each pass / fail / skip with its evidence:
- `health`: GET /health answers 2xx;
- `health_generate`: GET /health_generate answers 2xx (SGLang and the reference engine run one
  real token); a service without it (404) is a skip with that message, not a failure;
- `models`: GET /v1/models lists at least one model;
- `smoke`: a greedy completion of "2+2=" (a few tokens) answers 2xx with a JSON choice; its
  latency and text are reported;
- `server_info`: GET /get_server_info, where the service has it (skip otherwise): accept length.
`--timeout` bounds each request as a whole (`checks.http`); when /health gets no HTTP answer at
all (refused, timed out), the other checks are skipped with that reason instead of each waiting
out its own timeout. Exit 0 when nothing failed, 1 when something did.

Prints (`checks.docs.HealthDoc`):
    ok        bool   nothing failed
    url       str    the service checked
    failed    list   names of the failed checks
    checks    list   one `HealthCheckRow` per check: name, status (pass/fail/skip), detail,
                     http (status, latency, body excerpt), evidence (on a failure); models
                     lists the model ids, smoke its text, token_ids and latency_ms,
                     server_info the avg_spec_accept_length
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from checks.http import HttpResult, completion_ids, get, post
from checks.module import EXIT_FAIL, EXIT_PASS, exit_json, parser

SMOKE_PROMPT = "2+2="


def check(name: str, status: str, detail: str, res: HttpResult | None = None, **extra: Any):
    out: dict[str, Any] = {"name": name, "status": status, "detail": detail, **extra}
    if res is not None:
        out["http"] = res.summary()
        if status == "fail":
            out["evidence"] = res.evidence()
    return out


def check_endpoint(base: str, path: str, name: str, timeout: float, optional: bool) -> dict:
    res = get(base, path, timeout=timeout)
    if res.ok:
        return check(name, "pass", f"{path} answered {res.status}", res)
    if optional and res.status in (404, 405):
        return check(name, "skip", f"{path} not offered by this service (HTTP {res.status})", res)
    return check(name, "fail", f"{path} did not answer 2xx", res)


def check_models(base: str, timeout: float) -> tuple[dict, str | None]:
    res = get(base, "/v1/models", timeout=timeout)
    data = res.json.get("data") if isinstance(res.json, dict) else None
    ids = [m.get("id") for m in data if isinstance(m, dict)] if isinstance(data, list) else []
    if res.ok and ids:
        return check("models", "pass", f"serving {', '.join(map(str, ids))}", res, models=ids), ids[
            0
        ]
    if res.ok:
        return check("models", "fail", "/v1/models answered without a model list", res), None
    return check("models", "fail", "/v1/models did not answer 2xx", res), None


def check_smoke(base: str, model: str | None, timeout: float, max_tokens: int) -> dict:
    body: dict[str, Any] = {"prompt": SMOKE_PROMPT, "max_tokens": max_tokens, "temperature": 0}
    if model:
        body["model"] = model
    res = post(base, "/v1/completions", body, timeout=timeout)
    if not res.ok:
        return check("smoke", "fail", "completion did not answer 2xx", res)
    ids, text = completion_ids(res.json)
    if text is None:
        return check("smoke", "fail", "completion answered without a JSON choice", res)
    return check(
        "smoke",
        "pass",
        f"{SMOKE_PROMPT!r} -> {text!r} in {res.latency_s * 1000:.0f} ms (the words are not "
        "judged: a small test model answers noise; the identity check compares tokens)",
        res,
        text=text,
        token_ids=ids,
        latency_ms=round(res.latency_s * 1000, 2),
    )


def check_server_info(base: str, timeout: float) -> dict:
    res = get(base, "/get_server_info", timeout=timeout)
    if res.status in (404, 405):
        return check("server_info", "skip", "/get_server_info not offered by this service", res)
    if not res.ok or not isinstance(res.json, dict):
        return check("server_info", "fail", "/get_server_info did not answer 2xx with JSON", res)
    states = res.json.get("internal_states")
    accept = None
    if isinstance(states, list) and states and isinstance(states[0], dict):
        accept = states[0].get("avg_spec_accept_length")
    shown = f"{accept:.2f}" if isinstance(accept, (int, float)) else accept  # not 16 decimals
    detail = f"avg_spec_accept_length={shown}" if accept is not None else "answered"
    return check("server_info", "pass", detail, res, avg_spec_accept_length=accept)


def run_checks(base: str, *, timeout: float, max_tokens: int) -> list[dict]:
    """The checks in order; once a request gets no answer at all (it timed out, the connection
    was refused), the rest are not tried: each would only wait as long, and a service that
    leaves a request unanswered is already known not to serve."""
    model: list[str | None] = [None]

    def models() -> dict:
        doc, model[0] = check_models(base, timeout)
        return doc

    steps: list[tuple[str, Callable[[], dict]]] = [
        ("health", lambda: check_endpoint(base, "/health", "health", timeout, optional=False)),
        (
            "health_generate",
            lambda: check_endpoint(
                base, "/health_generate", "health_generate", timeout, optional=True
            ),
        ),
        ("models", models),
        ("smoke", lambda: check_smoke(base, model[0], timeout, max_tokens)),
        ("server_info", lambda: check_server_info(base, timeout)),
    ]
    results: list[dict] = []
    for i, (_, run) in enumerate(steps):
        doc = run()
        results.append(doc)
        if doc.get("http", {}).get("status") is None:  # no answer: the rest would only wait
            path = doc["http"]["url"].split("://", 1)[-1].split("/", 1)[-1]
            why = f"not tried: /{path} got no answer ({doc['http']['error']})"
            results += [check(name, "skip", why) for name, _ in steps[i + 1 :]]
            break
    return results


def main(argv: list[str] | None = None) -> None:
    p = parser("checks.health", "Health, readiness and a smoke completion of a service.")
    p.add_argument("--url", required=True, help="service base URL, e.g. http://127.0.0.1:30000")
    p.add_argument("--timeout", type=float, default=10.0, help="per-request timeout (s)")
    p.add_argument("--max-tokens", type=int, default=4, help="smoke completion length")
    args = p.parse_args(argv)
    if not args.url.startswith(("http://", "https://")):
        p.error(f"--url must be http(s)://, got {args.url!r}")
    results = run_checks(args.url, timeout=args.timeout, max_tokens=args.max_tokens)
    failed = [r["name"] for r in results if r["status"] == "fail"]
    exit_json(
        {
            "ok": not failed,
            "module": "checks.health",
            "url": args.url,
            "failed": failed,
            "checks": results,
        },
        EXIT_FAIL if failed else EXIT_PASS,
    )


if __name__ == "__main__":
    main()
