"""The deploy's typed options, steps and results (what `ops deploy`, `ops rollback`, the fleet
and the rollout exchange, and what the run records hold)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

Status = Literal["ok", "fail", "skip"]
MAX_KEEP = 1000  # releases kept on a host: past that, prune's listing is the cost
Outcome = Literal[
    "deployed",
    "installed",
    "already-current",
    "failed",
    "rolled-back",
    "dry-run",
    "switched",  # `ops rollback`: switched to the release asked for, restarted, proven
    "interrupted",  # Ctrl-C / SIGTERM: the result says where the host was left
    "not-reached",  # a group's host the rollout stopped before: untouched, never asked
]


class Step(BaseModel):
    name: str
    status: Status
    seconds: float = 0.0
    detail: str = ""
    evidence: list[str] = Field(default_factory=list)
    data: dict[str, Any] = Field(default_factory=dict)


class DeployOptions(BaseModel):
    source: Path | None = None
    ref: str | None = None
    allow_dirty: bool = False
    bootstrap: bool = False
    force: bool = False
    no_restart: bool = False
    dry_run: bool = False
    keep: int = Field(default=5, ge=2, le=MAX_KEEP)
    wait_s: float = 180.0
    max_tokens: int = Field(default=32, ge=1)


class DeployResult(BaseModel):
    target: str
    outcome: Outcome
    release: str | None = None
    before: str | None = None
    after: str | None = None
    steps: list[Step] = Field(default_factory=list)
    failed_step: str | None = None
    message: str = ""

    @property
    def ok(self) -> bool:
        return self.outcome in ("deployed", "installed", "already-current", "dry-run", "switched")

    @property
    def host_trouble(self) -> bool:
        """Failed for the host's sake, not the release's: its disk full or read-only (send,
        finalize: probe37ar L1), a host-side command killed or the link lost (restart,
        post-flight: probe37at L4). Exit 2, a host ops could not act on, as documented, not a
        verdict on the release; the result says where the host was left."""
        step = next((s for s in self.steps if s.name == self.failed_step), None)
        host = step is not None and bool(step.data.get("disk") or step.data.get("host"))
        return self.outcome in ("failed", "rolled-back") and host


class StepFailed(Exception):
    def __init__(self, step: Step) -> None:
        super().__init__(step.detail)
        self.step = step


class DeployInterrupted(KeyboardInterrupt):
    """Ctrl-C (or SIGTERM made one) during a deploy or rollback, after the host was put back
    where it belongs; carries the result with the steps so far and where the host is now."""

    def __init__(self, result: DeployResult) -> None:
        super().__init__(result.message)
        self.result = result


def utc_now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


LINE_SHOWN = 500  # characters of one evidence line kept (a log line can be a GiB: probe37c C1)
DETAIL_SHOWN = 4000  # characters of a step's detail kept


def clip_line(line: str, width: int = LINE_SHOWN) -> str:
    """`line` at most `width` characters; a longer one says how much was cut."""
    if len(line) <= width:
        return line
    return f"{line[:width]}... ({len(line) - width} more characters cut)"


def clip_lines(lines: list[str], keep: int = 40) -> list[str]:
    """At most the last `keep` lines, each at most LINE_SHOWN characters."""
    return [clip_line(str(line)) for line in list(lines)[-keep:]]
