"""Run records: every command that touches a target leaves `runs/<utc>-<command>-<target>/`
(the commands that only look, `service status` and `facts`, keep their newest ten per target).

A run directory is created exclusively (a name is never reused, nothing is overwritten) and
every file in it is written atomically (`checks.atomic.write_atomic`: temp file in the same
directory, fsync, rename; a failed write removes its temp file), so a crash leaves either the
previous state or the complete file, never half a record. The root is `$OPS_RUNS_DIR` or
`./runs`.

A command's run directory holds a record from its start (`create(..., inputs=...)`): outcome
`running`, `finished` and `exit_code` null, the inputs, the start time and ops's pid. The final
record replaces it by one rename, so a run killed outright (SIGKILL, a power cut) still leaves a
record that says it did not finish (`ops.verdict.evidence.Record.unfinished`).

A record that cannot be written (a full disk, a read-only or vanished runs directory) never
changes a command's result: the OSError is kept on the RunDir (`unwritten`: the path and the
error) for the command line to print as one warning line, and the command goes on. A final
record not written leaves the one from the start (`running`) in place, and the warning says so.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from checks.atomic import write_atomic

SCHEMA = "ddtree-ops/record/v1"


def runs_root() -> Path:
    return Path(os.environ.get("OPS_RUNS_DIR") or "runs")


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_") or "x"


RUNNING = "running"  # the outcome of a record whose command has not finished (or was killed)
# commands that only look (they change and measure nothing): their newest KEEP_LOOKS records
# per target are kept, older ones go as a new one is made (a session of `ops service status`
# used to leave dozens of run directories)
LOOKS = frozenset({"service-status", "facts"})
KEEP_LOOKS = 10


def _why(exc: OSError) -> str:
    return f"{exc.strerror} (errno {exc.errno})" if exc.strerror else str(exc)


def _prune_looks(root: Path, suffix: str, keep: Path) -> None:
    """Remove all but the newest KEEP_LOOKS run directories named `<utc><suffix>` (their names
    sort by time): only directories holding nothing but a record, never anything else."""
    try:
        names = sorted(
            e.name
            for e in os.scandir(root)
            if e.is_dir(follow_symlinks=False)
            and re.fullmatch(r"\d{8}T[\d.]+Z" + re.escape(suffix) + r"(\.\d+)?", e.name)
        )
    except OSError:
        return
    for name in names[: max(0, len(names) - KEEP_LOOKS)]:
        path = root / name
        if path == keep:
            continue
        try:
            if {f.name for f in path.iterdir()} <= {"record.json"}:
                (path / "record.json").unlink(missing_ok=True)
                path.rmdir()
        except OSError:
            continue  # a record that cannot go stays: never a reason to fail a command


@dataclass
class RunDir:
    """One run's directory and its record. `unwritten`: why the last record write failed (its
    path and the OS error), None while every record is on disk."""

    path: Path
    command: str
    target: str
    started: str
    unwritten: str | None = None

    @classmethod
    def create(
        cls,
        command: str,
        target: str,
        root: Path | None = None,
        *,
        inputs: dict[str, Any] | None = None,
    ) -> RunDir:
        """A new run directory; with `inputs`, its record from the start (outcome `running`).
        A runs root that cannot be made or written gives a RunDir whose `unwritten` says why."""
        root = root or runs_root()
        now = datetime.now(UTC)
        stamp = now.strftime("%Y%m%dT%H%M%S.%fZ")
        base = f"{stamp}-{_slug(command)}-{_slug(target)}"
        run = cls(path=root / base, command=command, target=target, started=now.isoformat())
        try:
            root.mkdir(parents=True, exist_ok=True)
            for n in range(1000):
                run.path = root / (base if n == 0 else f"{base}.{n}")
                try:
                    run.path.mkdir()
                except FileExistsError:
                    continue
                break
            else:  # a thousand taken (made by hand): a fresh name that cannot be taken
                run.path = Path(tempfile.mkdtemp(prefix=f"{base}.", dir=root))
        except OSError as exc:
            run.unwritten = f"{run.path}: {_why(exc)}"
            return run
        if command in LOOKS:
            _prune_looks(root, f"-{_slug(command)}-{_slug(target)}", keep=run.path)
        if inputs is not None:
            run.write_record(inputs=inputs, outcome=RUNNING, exit_code=None)
        return run

    def write_json(self, name: str, doc: Any) -> Path:
        dest = self.path / name
        write_atomic(
            dest, (json.dumps(doc, indent=2, sort_keys=False, default=str) + "\n").encode()
        )
        return dest

    def write_record(
        self, *, inputs: dict[str, Any], outcome: str, exit_code: int | None, **sections: Any
    ) -> Path | None:
        """`record.json`: what was asked, what happened, every check and measurement (outcome
        `running`: the record at the start, `finished` null). Its path, or None when it could
        not be written (`unwritten` says why; the previous record, if any, stays whole)."""
        running = outcome == RUNNING
        doc = {
            "schema": SCHEMA,
            "command": self.command,
            "target": self.target,
            "started": self.started,
            "finished": None if running else datetime.now(UTC).isoformat(),
            "inputs": inputs,
            "outcome": outcome,
            "exit_code": exit_code,
            **({"pid": os.getpid()} if running else {}),
            **sections,
        }
        try:
            dest = self.write_json("record.json", doc)
        except OSError as exc:
            self.unwritten = f"{self.path / 'record.json'}: {_why(exc)}"
            if not running and (self.path / "record.json").is_file():  # (probe37bo L1)
                self.unwritten += "; the record written at its start stays there, `running`"
            return None
        self.unwritten = None
        return dest
