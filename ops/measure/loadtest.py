"""`ops loadtest`: a closed-loop throughput sweep, one `checks.loadtest` level per concurrency.

Each level runs on the host next to the service (so the network between the operator and the
host never enters a latency) and comes back as one JSON document; the sweep is their list.
Ctrl-C stops the level in progress on the host (the Host layer kills what it started) and
raises `LoadtestInterrupted`, which carries the report of the levels that finished.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

from pydantic import BaseModel

from checks.docs import LevelDoc, LoadtestDoc
from ops.errors import HostError, OpsError
from ops.hosts.dataplane import run_check
from ops.hosts.remote import Host

# the shape of a load, wherever one is asked for (`ops loadtest`, a playbook's `load`)
MAX_CONCURRENCY = 4096
MAX_REQUESTS = 100_000  # measured requests per level: its records stay in the host's memory
# one request's timeout: past an hour nothing answers, and the run itself is killed at one
MAX_REQUEST_TIMEOUT_S = 3600.0
# prompt + generated tokens of one request: checks.loadtest.MAX_TOKENS_UNREPORTED, the host's
# cap where the service reports no context length (a test holds the two equal; not imported
# from there: it would load asyncio into every `ops` command)
MAX_TOKENS = 2**20


class LoadtestReport(BaseModel):
    target: str
    url: str
    settings: dict[str, Any]
    levels: list[dict[str, Any]]  # checks.docs.LevelDoc (stdlib TypedDict: see `level_docs`)
    interrupted: bool = False  # Ctrl-C: `levels` are the ones that finished
    planned: list[int] = []
    # no HTTP answer at all from the service before the first level (why): no level was run
    service_down: str | None = None

    @property
    def level_docs(self) -> list[LevelDoc]:
        """The levels, typed (pydantic on Python 3.11 cannot validate a stdlib TypedDict)."""
        return cast(list[LevelDoc], self.levels)

    @property
    def ok(self) -> bool:
        return (
            not self.interrupted
            and not self.service_down
            and all(lv["failed"] == 0 for lv in self.level_docs)
        )


class LoadtestInterrupted(KeyboardInterrupt):
    """Ctrl-C during a sweep; `report` holds the levels that finished before it."""

    def __init__(self, report: LoadtestReport) -> None:
        super().__init__(f"interrupted after {len(report.levels)} of {len(report.planned)} levels")
        self.report = report


def parse_levels(text: str) -> list[int]:
    try:  # an empty level (`1,,2`) is a typo, never dropped in silence (probe37ae L1)
        levels = [int(x) for x in text.split(",")]
    except ValueError:
        raise OpsError(f"--concurrency takes integers like 1,10,64, got {text!r}") from None
    if not levels or any(c < 1 or c > MAX_CONCURRENCY for c in levels):
        raise OpsError(f"--concurrency levels must be in 1..{MAX_CONCURRENCY}, got {text!r}")
    return levels


def run_loadtest(
    host: Host,
    levels: list[int],
    *,
    requests: int = 0,
    input_len: int = 32,
    output_len: int = 32,
    timeout: float = 120.0,
    counters: bool = False,
    on_level: Callable[[int, LevelDoc], None] = lambda c, level: None,
) -> LoadtestReport:
    """Every level in turn; with `counters`, each level also carries the service's counters
    bracketing its measured window (`checks.loadtest --counters`: level["counters"])."""
    url = host.target.service.url
    settings = {
        "requests": requests,
        "input_len": input_len,
        "output_len": output_len,
        "timeout": timeout,
        "greedy": True,
        "ignore_eos": True,
        "stream": True,
    }
    report = LoadtestReport(target=host.name, url=url, settings=settings, levels=[], planned=levels)
    try:
        for c in levels:
            level = _level(host, url, c, requests, input_len, output_len, timeout, counters)
            report.levels.append(dict(level))
            on_level(c, level)
    except KeyboardInterrupt as exc:
        report.interrupted = True
        raise LoadtestInterrupted(report) from exc
    return report


def _level(
    host: Host,
    url: str,
    c: int,
    requests: int,
    input_len: int,
    output_len: int,
    timeout: float,
    counters: bool = False,
) -> LevelDoc:
    """One concurrency level, run on the host by `checks.loadtest`."""
    args = [
        "--url",
        url,
        "--concurrency",
        str(c),
        "--requests",
        str(requests),
        "--input-len",
        str(input_len),
        "--output-len",
        str(output_len),
        "--timeout",
        str(timeout),
        *(["--counters"] if counters else []),
    ]
    doc = cast(LoadtestDoc, run_check(host, "checks.loadtest", args, timeout=3600).data)
    level = doc.get("level")
    if not isinstance(level, dict):
        raise HostError(
            f"c={c}: {doc.get('message') or 'no level in its answer'}",
            target=host.name,
            step="module checks.loadtest",
        )
    return {**level, "requests": doc["requests"], "warmup": doc["warmup"]}
