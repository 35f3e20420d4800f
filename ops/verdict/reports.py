"""Build a report from run records and write it: the evidence of the records, its decision at
the threshold they were decided at, and report.md / report.html / report.json, each written
atomically. What `ops report` and a rollout's report step share (neither goes through the
other: the CLI only parses and prints).

Runs on the operator's machine from records alone.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from checks.atomic import write_atomic
from ops.errors import OpsError

if TYPE_CHECKING:  # imported where used: `ops` starts without the report's models
    from ops.sections.change import Change
    from ops.verdict.decide import Decision
    from ops.verdict.evidence import Evidence, Record


def _sha256(path: Path) -> str:
    with path.open("rb") as f:  # streamed: a record is not held whole a second time
        return hashlib.file_digest(f, "sha256").hexdigest()


DEFAULT_THRESHOLD = 0.03


def recorded_threshold(records: list[Record]) -> float | None:
    """The threshold the records were decided at: a decide record's `decision.threshold`, a
    rollout's playbook (`inputs.resolved.threshold`); None where no record holds one. Records
    decided at different thresholds are exit 2: the report would have to pick one
    (--threshold does)."""
    seen: dict[float, str] = {}
    for rec in records:
        dec, resolved = (rec.model_extra or {}).get("decision"), rec.inputs.get("resolved")
        value = dec.get("threshold") if isinstance(dec, dict) else None
        if value is None and isinstance(resolved, dict):
            value = resolved.get("threshold")
        if isinstance(value, int | float) and not isinstance(value, bool):
            seen.setdefault(round(float(value), 9), rec.path)
    if len(seen) > 1:
        each = ", ".join(f"{v:g} in {where}" for v, where in sorted(seen.items()))
        raise OpsError(
            f"the records were decided at different thresholds ({each}): pass --threshold"
        )
    return next(iter(seen), None)


def build(
    paths: list[Path],
    *,
    threshold: float | None,
    concurrency: int | None,
    change: Change | None,
) -> tuple[Evidence, Decision, list[dict[str, str]]]:
    """The evidence of `paths` and its decision; `threshold` None: the one the records were
    decided at (recorded_threshold), else DEFAULT_THRESHOLD."""
    from ops.verdict.decide import decide
    from ops.verdict.evidence import gather

    if threshold is not None and not 0 <= threshold < 1:
        raise OpsError(f"--threshold must be in [0, 1), got {threshold}")
    ev = gather(paths, change)
    if threshold is None:
        threshold = recorded_threshold(ev.records)
        threshold = DEFAULT_THRESHOLD if threshold is None else threshold
    sources = [{"path": r.path, "sha256": _sha256(Path(r.path))} for r in ev.records]
    return ev, decide(ev, threshold, concurrency), sources


def write_reports(
    dest: Path, fmts: list[str], ev: Evidence, d: Decision, sources: list[dict[str, str]]
) -> list[str]:
    """report.<fmt> for each format and report.json, each written atomically, readable by all."""
    from ops.verdict.render import context, render  # here: jinja2 only where a report is written

    ctx = context(d, ev, [s["path"] for s in sources])
    docs = {f"report.{fmt}": render(fmt, ctx) for fmt in fmts}
    docs["report.json"] = json.dumps(report_doc(d, ev, sources), indent=2) + "\n"
    files = []
    for name, text in docs.items():
        path = dest / name
        try:
            write_atomic(path, text.encode())
            path.chmod(0o644)  # a report is for anyone to read (mkstemp makes 0600)
        except OSError as exc:
            raise OpsError(f"{path}: cannot write the report ({exc.strerror or exc})") from None
        files.append(str(path))
    return files


def summary(d: Decision, sources: list[dict[str, str]]) -> dict[str, Any]:
    return {**d.model_dump(mode="json"), "records": sources}


def report_doc(d: Decision, ev: Evidence, sources: list[dict[str, str]]) -> dict[str, Any]:
    """What report.json and `ops report --json` say: the decision, its records, the gain audit."""
    from ops.verdict.gain_audit import audit_doc

    return {**summary(d, sources), "gain_audit": audit_doc(d, ev)}
