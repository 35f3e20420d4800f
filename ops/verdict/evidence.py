"""The evidence `ops report` decides from: typed models of the record sections it reads.

Every command writes `runs/<dir>/record.json` (ops.hosts.records): the envelope `schema, command,
target, started, finished, inputs, outcome, exit_code` plus one section per kind of evidence,
under these top-level keys (a record may hold several; a rollout directory may hold one
record per step in sub-directories, e.g. `<rollout>/<nn>-<step>/record.json`):

    healthcheck  ops.sections.health.HealthReport (pre/post-flight; token identity, A/A runs).
                 Which flight it is: `inputs.role` ("preflight" | "postflight") or the
                 directory name containing "preflight" / "postflight"; without either, a
                 healthcheck after a successful deploy record (by `started`) is a post-flight,
                 any other a pre-flight. One run with `inputs.record_golden` compared nothing.
    bench        BenchSection: `ops bench`'s guard, interference probe, environment, KernelRows.
    profile      ProfileSection: `ops profile`, per concurrency: step time, stage times,
                 tokens/s, accept length; every number says `source`: measured | derived |
                 hook (measured by the SGLang import hook's per-process stage clock).
    measure      MeasureSection: rollout's `measure`, tokens/s before/after the switch, with an
                 A/A pair (two runs of the unchanged service) first.
    change       Change: which component switches from which backend to which (rollout, or
                 `ops report --change`).

The sections' models live in ops.sections (one module per section; its docstring maps each
to its producer); this module reads records back into them.

`load_record(path)` reads and validates one record; a missing file, bad JSON or a bad field
raises `BadRecord`, one line naming the file and the field (exit 2). A number no run could
have measured (a 5e-324 tokens/s run, a batch of -inf, NaN A/A runs) is such a bad field; a
number ops does write for "not measured" (a 0 us quartile, a probe p50 of null) is read as
absent. `gather` reads the records one at a time (`read_evidence`: each document is let go
once its sections are models) and refuses records over REPORT_MAX_BYTES in all.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, Field, ValidationError, model_validator

from ops.errors import OpsError
from ops.files import MIB, FileRefused, not_regular, read_text_bounded
from ops.hosts.records import RUNNING
from ops.sections.bench import BenchSection
from ops.sections.change import Change
from ops.sections.common import OpenModel
from ops.sections.health import HealthReport, Identity
from ops.sections.measure import MeasureSection
from ops.sections.profile import ProfileSection

M = TypeVar("M", bound=BaseModel)
SECTIONS = ("healthcheck", "bench", "profile", "measure", "change")
RECORD_MAX_BYTES = 64 * MIB  # a rollout's biggest record is a few MB
REPORT_MAX_BYTES = 256 * MIB  # all the records one report reads (a rollout's: a few MB)


class BadRecord(OpsError):
    """A record that cannot be used: names the file and the field."""

    def __init__(self, path: Path | str, field: str, problem: str) -> None:
        # the file as a whole (field "record.json") is named once (probe37bj L3: said twice)
        where = str(path) if field == "record.json" else f"{path}: {field}"
        super().__init__(f"{where}: {problem}")
        self.path = str(path)
        self.field = field

    def to_dict(self) -> dict[str, Any]:
        return {**super().to_dict(), "file": self.path, "field": self.field}


class Record(OpenModel):
    """One `record.json`'s envelope, with the extras the report reads (ENVELOPE_EXTRAS); its
    sections are read apart (`read_evidence`), so no record's bulk is kept."""

    schema_: str = Field(alias="schema")
    command: str
    target: str
    started: str
    finished: str | None = None
    inputs: dict[str, Any] = Field(default_factory=dict)
    outcome: str
    exit_code: int | None = Field(...)  # None only in a record of a run that did not finish
    path: str = ""

    @model_validator(mode="after")
    def _finished_has_code(self) -> Record:
        if self.exit_code is None and not self.unfinished:
            raise ValueError(
                f"exit_code: null in a record whose outcome is {self.outcome!r} "
                f"(only a run that did not finish has none)"
            )
        return self

    @property
    def unfinished(self) -> bool:
        """Written at its command's start and never replaced (ops.hosts.records): it runs still, or
        was killed before its end."""
        return self.outcome == RUNNING


def unfinished_line(rec: Record) -> str:
    """What the report says of a record whose run did not finish."""
    pid = (rec.model_extra or {}).get("pid")
    by = f" (pid {pid})" if isinstance(pid, int) else ""
    return (
        f"{rec.path}: `ops {rec.command}` on {rec.target} started {rec.started}{by} and did "
        "not finish (killed, or still running): it holds no result"
    )


def _loc(err: dict[str, Any]) -> str:
    return ".".join(str(p) for p in err["loc"]) or "(document)"


ENVELOPE_EXTRAS = ("decision", "pid")  # a decide step's decision (its threshold); an unfinished pid


def load_record(path: Path) -> tuple[Record, dict[str, Any]]:
    """The record's envelope and its raw document; BadRecord names the file and the field."""
    try:
        text = read_text_bounded(path, max_bytes=RECORD_MAX_BYTES, what="record")
    except FileRefused as exc:
        raise BadRecord(path, "record.json", exc.problem) from None
    except FileNotFoundError:
        raise BadRecord(path, "record.json", "no such file") from None
    except OSError as exc:
        raise BadRecord(path, "record.json", exc.strerror or str(exc)) from None
    except UnicodeDecodeError as exc:
        raise BadRecord(path, "(document)", f"not UTF-8 text (byte {exc.start})") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BadRecord(path, "(document)", f"not JSON: {exc.msg} at line {exc.lineno}") from None
    except ValueError as exc:  # an integer too long to convert (probe37az M2: exit 4)
        raise BadRecord(path, "(document)", f"not readable: {str(exc).split(';')[0]}") from None
    except RecursionError:
        raise BadRecord(path, "(document)", "not a record: nested too deeply") from None
    if not isinstance(doc, dict):
        raise BadRecord(path, "(document)", "not a JSON object")
    keep = (*Record.model_fields, "schema", *ENVELOPE_EXTRAS)
    rec = validate(path, Record, {k: v for k, v in doc.items() if k in keep})
    rec.path = str(path)
    return rec, doc


def validate(path: Path | str, model: type[M], data: Any, prefix: str = "") -> M:
    """model.model_validate(data), a failure turned into BadRecord naming the first bad field."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        e = exc.errors()[0]
        field = ".".join(p for p in (prefix, _loc(e)) if p)
        msg = e["msg"].removeprefix("Value error, ")  # our own validator's words, as written
        raise BadRecord(path, field, msg[:1].lower() + msg[1:]) from None


class HealthEntry(BaseModel):
    """One healthcheck record as a pre- or post-flight."""

    role: Literal["preflight", "postflight"]
    path: str
    outcome: str
    report: HealthReport | None = None  # None when the healthcheck itself errored
    error: str = ""
    golden_recorded: bool = False  # it recorded the golden set: its identity compared nothing
    by: str = ""  # the command that ran it as one of its steps ("deploy"), "" for its own step

    @property
    def name(self) -> str:
        """How the report names this flight: "preflight", or "deploy's preflight" for the one a
        deploy ran inside a rollout, so a rollout's two pre-flights read apart; the run that
        recorded the golden set says so ("preflight recording the golden set"), apart from the
        run that then compared with it."""
        name = f"{self.by}'s {self.role}" if self.by else self.role
        return f"{name} recording the golden set" if self.golden_recorded else name


class Evidence(BaseModel):
    """Everything the report reads, gathered from the records given."""

    records: list[Record] = Field(default_factory=list)
    target: str = ""
    health: list[HealthEntry] = Field(default_factory=list)
    bench: list[tuple[str, BenchSection]] = Field(default_factory=list)
    bench_errors: list[tuple[str, str]] = Field(default_factory=list)
    # profiles that ended in an error: (record, the error's own words), for the HOLD's reason
    profile_errors: list[tuple[str, str]] = Field(default_factory=list)
    profile: ProfileSection | None = None
    profile_path: str = ""
    measure: MeasureSection | None = None
    change: Change | None = None
    change_path: str = ""
    deployed: bool = False
    unfinished: list[Record] = Field(default_factory=list)  # runs that did not finish

    def flights(self, role: str) -> list[HealthEntry]:
        return [h for h in self.health if h.role == role]


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0  # load_record says what is wrong with it


def record_files(paths: list[Path]) -> list[Path]:
    """record.json files in the given run dirs (and their sub-dirs), or the files themselves;
    BadRecord when they hold more than REPORT_MAX_BYTES in all (naming the biggest run dir)."""
    found: list[Path] = []
    sizes: dict[Path, int] = {}
    for p in paths:
        if not p.exists():
            where = p if p.suffix == ".json" else p / "record.json"
            raise BadRecord(where, "record.json", "no such file or directory")
        if p.is_dir():
            subs = _records_under(p)
            if not subs:
                raise BadRecord(p / "record.json", "record.json", _missing_why(p / "record.json"))
        else:
            subs = [p]
        sizes[p] = sum(_size(f) for f in subs if f not in found)
        found += subs
    total = sum(sizes.values())
    if total > REPORT_MAX_BYTES:
        big = max(sizes, key=lambda p: sizes[p])
        of = f" (of {total / MIB:.0f} MiB in all)" if len(sizes) > 1 else ""
        raise BadRecord(
            big,
            "record.json",
            f"too big to report on: its records hold "
            f"{sizes[big] / MIB:.0f} MiB{of}, over the {REPORT_MAX_BYTES // MIB} MiB "
            "one report reads",
        )
    return list(dict.fromkeys(found))


def _missing_why(path: Path) -> str:
    """Why a run directory gave no record: its record.json is absent, or no regular file."""
    try:
        return not_regular(path) or "no such file"
    except OSError:
        return "no such file"


SCAN_MAX_DIRS = 20_000  # a rollout's run directory holds tens; a whole disk is not a run dir


def _records_under(root: Path) -> list[Path]:
    """Every record.json under `root`, sorted; a directory that cannot be listed or that goes
    away while it is read is passed over (a records directory being pruned, /proc); BadRecord
    past SCAN_MAX_DIRS directories (`ops report /`: name the run directories instead)."""
    found: list[Path] = []
    for n, (here, _dirs, files) in enumerate(os.walk(root, onerror=lambda e: None), start=1):
        if n > SCAN_MAX_DIRS:
            raise BadRecord(
                root,
                "(directory)",
                f"over {SCAN_MAX_DIRS} directories under it: name the run directories to report on",
            )
        if "record.json" in files:
            found.append(Path(here) / "record.json")
    return sorted(found)


def _role(rec: Record, path: Path) -> Literal["preflight", "postflight"] | None:
    """The flight a healthcheck record says it is: inputs.role, else its directory's name."""
    role = rec.inputs.get("role")
    if role in ("preflight", "postflight"):
        return role
    for part in reversed(path.parts[-3:-1]):
        if "postflight" in part:
            return "postflight"
        if "preflight" in part:
            return "preflight"
    return None


class Read(BaseModel):
    """What the report takes from one record: its envelope, its sections as models, and the
    error it holds (a command that failed); the parsed document itself is not kept."""

    rec: Record
    health: HealthReport | None = None
    bench: BenchSection | None = None
    profile: ProfileSection | None = None
    measure: MeasureSection | None = None
    change: Change | None = None
    has_health: bool = False
    error: str = ""


def read_evidence(f: Path) -> Read:
    """One record read and its sections validated; BadRecord on any unusable part. A report's
    own record and one of a run that did not finish are read for their envelope alone."""
    rec, doc = load_record(f)
    got = Read(rec=rec, has_health="healthcheck" in doc, error=_error_text(doc))
    if rec.command == "report" or rec.unfinished:
        return got
    path = Path(rec.path)
    if "healthcheck" in doc:
        got.health = validate(path, HealthReport, doc["healthcheck"], "healthcheck")
        ident = got.health.modules.get("identity")
        if ident is not None:
            validate(path, Identity, ident, "healthcheck.modules.identity")
    if "bench" in doc:
        got.bench = validate(path, BenchSection, doc["bench"], "bench")
        check_speedups(path, got.bench)
    if "profile" in doc:
        got.profile = validate(path, ProfileSection, doc["profile"], "profile")
    elif rec.command == "profile" and rec.exit_code == 0:  # a profile that passed has one
        raise BadRecord(path, "profile", "missing: a profile that passed records its levels")
    if "measure" in doc:
        got.measure = validate(path, MeasureSection, doc["measure"], "measure")
    if doc.get("change") is not None:
        got.change = validate(path, Change, doc["change"], "change")
    return got


def gather(paths: list[Path], change: Change | None = None) -> Evidence:
    """Read every record under `paths` into one Evidence; BadRecord on any unusable record.
    Each record's document is let go once its sections are models (`read_evidence`)."""
    loaded = [read_evidence(f) for f in record_files(paths)]
    loaded = [r for r in loaded if r.rec.command != "report"]
    loaded.sort(key=lambda r: r.rec.started)
    ev = Evidence(change=change)
    ev.unfinished = [r.rec for r in loaded if r.rec.unfinished]  # evidence of nothing
    loaded = [r for r in loaded if not r.rec.unfinished]
    ev.records = [r.rec for r in loaded]
    targets = sorted({r.target for r in ev.records})
    if len(targets) > 1:
        raise BadRecord(ev.records[0].path, "target", f"records of several targets {targets}")
    ev.target = targets[0] if targets else ""
    for got in loaded:
        rec = got.rec
        path = Path(rec.path)
        if rec.command == "deploy" and rec.exit_code == 0:
            ev.deployed = True
        if got.has_health or rec.command == "healthcheck":
            role = _role(rec, path) or ("postflight" if ev.deployed else "preflight")
            entry = HealthEntry(role=role, path=rec.path, outcome=rec.outcome)
            entry.golden_recorded = rec.inputs.get("record_golden") is True
            if isinstance(rec.inputs.get("by"), str):
                entry.by = rec.inputs["by"]
            entry.report = got.health
            if not got.has_health:
                entry.error = got.error
            ev.health.append(entry)
        if got.bench is not None:
            ev.bench.append((rec.path, got.bench))
        elif rec.command == "bench":
            ev.bench_errors.append((rec.path, got.error))
        if got.profile is None and rec.command == "profile" and got.error:
            ev.profile_errors.append((rec.path, got.error))
        if got.profile is not None:  # a later profile replaces the levels it measured again
            prof = got.profile
            if ev.profile is not None:
                keep = {lv.concurrency: lv for lv in ev.profile.levels}
                keep.update({lv.concurrency: lv for lv in prof.levels})
                prof.levels = [keep[c] for c in sorted(keep)]
            ev.profile, ev.profile_path = prof, rec.path
        if got.measure is not None:
            ev.measure = got.measure
        if got.change is not None:
            ch = got.change
            if change is None and ev.change is not None and ev.change.label != ch.label:
                raise BadRecord(
                    path, "change", f"{ch.label} but {ev.change_path}: {ev.change.label}"
                )
            if change is None:
                ev.change, ev.change_path = ch, rec.path
    return ev


MAX_SPEEDUP = 1e9  # a kernel a billion times faster than its baseline is a broken timing


def check_speedups(path: Path | str, bench: BenchSection) -> None:
    """Every speed-up the report takes from these rows (one row's median over another's, of the
    same kernel and shape, and their IQR ends; a row's own `speedup`) is a finite number in
    (0, MAX_SPEEDUP]: a time like 5e-324 us divides to inf (or near it), which no chart, table
    or gain can hold. BadRecord names the row's field that makes it so."""
    rows = bench.rows
    for i, r in enumerate(rows):
        for base, x in r.speedup.items():
            if not (math.isfinite(x) and 0 < x <= MAX_SPEEDUP):
                raise BadRecord(
                    path,
                    f"bench.rows.{i}.speedup.{base}",
                    f"a speed-up is a finite number in (0, {MAX_SPEEDUP:g}], got {x!r}",
                )
    groups: dict[str, list[int]] = {}
    for i, r in enumerate(rows):
        key = r.kernel + json.dumps(r.shape, sort_keys=True, default=str)
        groups.setdefault(key, []).append(i)
    for idx in groups.values():
        for i in idx:  # rows[i] as the candidate: each of its times under each other impl's
            cand = rows[i]
            times = {"median_us": cand.median_us, "p25_us": cand.p25_us, "p75_us": cand.p75_us}
            for field, den in times.items():
                if den is None or den <= 0:
                    continue  # no time: the report takes no speed-up from it
                for j in (j for j in idx if rows[j].impl != cand.impl):
                    base = rows[j]
                    s = max(base.median_us, base.hi_us) / den
                    if not (math.isfinite(s) and s <= MAX_SPEEDUP):
                        x = f"a {s:g}x" if math.isfinite(s) else "an infinite"
                        raise BadRecord(
                            path,
                            f"bench.rows.{i}.{field}",
                            f"{den!r} us is no measured time: it makes {x} speed-up "
                            f"over {base.impl} (bench.rows.{j}, {base.median_us:g} us), above "
                            f"{MAX_SPEEDUP:g}x",
                        )


def _error_text(doc: dict[str, Any]) -> str:
    e = doc.get("error")
    if isinstance(e, dict):
        return str(e.get("message") or e.get("error") or e)
    return f"outcome {doc.get('outcome')!r}, exit {doc.get('exit_code')}"
