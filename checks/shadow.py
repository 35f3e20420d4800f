"""`python -m checks.shadow --json --url URL --component C --backend KIND --forwards N`: arm
the service's shadow (engine.shadow; `--forwards 0` disarms), for `ops profile` to time a
candidate beside the serving backend on the service's own forwards (C: attention, tree_build).

POSTs `{C: KIND, "forwards": N}` to `/shadow` and prints the service's answer: the
shadow's doc when it armed, else why not. A service without the endpoint (a real SGLang: 404)
is `offered: false`, which the profile records and goes on without. Stdlib only.

Prints (`checks.docs.ShadowDoc`): ok, module, offered (the service has /shadow: null when
nothing answered), status (the
HTTP status, or null when nothing answered), shadow (the doc, when armed), message (why not).
Exit 0: armed (or disarmed); 1: the service refused or did not answer; 2: bad input.
"""

from __future__ import annotations

from typing import Any

from checks.http import post
from checks.module import EXIT_FAIL, EXIT_PASS, exit_json, parser

MAX_FORWARDS = 20_000  # engine.shadow.MAX_FORWARDS (the engine says so again if it differs)


def arm(
    url: str, component: str, backend: str | None, forwards: int, timeout: float
) -> dict[str, Any]:
    body: dict[str, Any] = {"forwards": forwards}
    if backend is not None:
        body[component] = backend
    res = post(url, "/shadow", body, timeout=timeout)
    doc: dict[str, Any] = {"module": "checks.shadow", "status": res.status}
    if res.status == 200 and isinstance(res.json, dict):
        return {**doc, "ok": True, "offered": True, "shadow": res.json, "message": None}
    # only a 404 / 405 says the service has no /shadow; nothing answering says nothing of it
    offered: bool | None = None if res.status is None else res.status not in (404, 405)
    err = res.json.get("error") if isinstance(res.json, dict) else None
    said = err.get("message") if isinstance(err, dict) else err if isinstance(err, str) else None
    if offered is False:
        why = f"the service has no /shadow endpoint (HTTP {res.status}): it cannot time a shadow"
    elif said:
        why = str(said)
    else:
        why = res.error or f"HTTP {res.status}: {res.text[:200]}"
    return {**doc, "ok": False, "offered": offered, "shadow": None, "message": why}


def main(argv: list[str] | None = None) -> None:
    p = parser("checks.shadow", "Arm (or disarm) a service's shadow.")
    p.add_argument("--url", required=True, help="service base URL")
    p.add_argument("--component", default="attention", choices=("attention", "tree_build"))
    p.add_argument("--backend", default=None, help="the candidate backend, e.g. cuda")
    p.add_argument("--forwards", type=int, required=True, help="forwards to sample; 0 disarms")
    p.add_argument("--timeout", type=float, default=30.0, help="seconds for the request")
    args = p.parse_args(argv)
    if not 0 <= args.forwards <= MAX_FORWARDS:
        p.error(f"--forwards must be 0..{MAX_FORWARDS}, got {args.forwards}")
    if args.forwards > 0 and not args.backend:
        p.error("--backend is required to arm (--forwards > 0)")
    if args.timeout <= 0:
        p.error("--timeout must be > 0")
    backend = args.backend if args.forwards else None
    doc = arm(args.url, args.component, backend, args.forwards, args.timeout)
    exit_json(doc, EXIT_PASS if doc["ok"] else EXIT_FAIL)


if __name__ == "__main__":
    main()
