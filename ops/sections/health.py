"""The `healthcheck` section: a pre- or post-flight's checks (`Check`: pass, fail or skip, with
its evidence) in one `HealthReport`, as ops.measure.healthcheck builds it, and the fields of its
token-identity module (`Identity`) that the report reads."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from ops.sections.common import OpenModel

Status = Literal["pass", "fail", "skip"]


class Check(BaseModel):
    name: str
    status: Status
    detail: str = ""
    evidence: list[str] = Field(default_factory=list)


class HealthReport(BaseModel):
    target: str
    url: str
    checks: list[Check]
    golden: str | None = None
    modules: dict[str, Any] = Field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.failed

    @property
    def failed(self) -> list[str]:
        return [c.name for c in self.checks if c.status == "fail"]


class Identity(OpenModel):
    """The fields of a healthcheck's `modules.identity` (checks.identity) that the report reads."""

    aa_runs: int = Field(default=0, ge=0, strict=True)
    identity_pct: float = Field(default=0, ge=0, le=100, allow_inf_nan=False)
    matched: int = Field(default=0, ge=0, strict=True)
    total: int = Field(default=0, ge=0, strict=True)
    concurrency: int = Field(default=1, ge=1, strict=True)
    mismatched: list[str] = Field(default_factory=list)
    nondeterministic: list[str] = Field(default_factory=list)
