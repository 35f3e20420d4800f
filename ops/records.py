"""Run records: every command that touches a target leaves `runs/<utc>-<command>-<target>/`.

A run directory is created exclusively (a name is never reused, nothing is overwritten) and
every file in it is written atomically (`checks.atomic.write_atomic`: temp file in the same
directory, fsync, rename), so a crash leaves either the previous state or the complete file,
never half a record. The root is `$OPS_RUNS_DIR` or `./runs`.
"""

from __future__ import annotations

import json
import os
import re
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


@dataclass
class RunDir:
    """One run's directory and its record."""

    path: Path
    command: str
    target: str
    started: str

    @classmethod
    def create(cls, command: str, target: str, root: Path | None = None) -> RunDir:
        root = root or runs_root()
        root.mkdir(parents=True, exist_ok=True)
        now = datetime.now(UTC)
        stamp = now.strftime("%Y%m%dT%H%M%S.%fZ")
        base = f"{stamp}-{_slug(command)}-{_slug(target)}"
        for n in range(1000):
            path = root / (base if n == 0 else f"{base}.{n}")
            try:
                path.mkdir()
            except FileExistsError:
                continue
            return cls(path=path, command=command, target=target, started=now.isoformat())
        raise RuntimeError(f"cannot create a run directory under {root}")

    def write_json(self, name: str, doc: Any) -> Path:
        dest = self.path / name
        write_atomic(
            dest, (json.dumps(doc, indent=2, sort_keys=False, default=str) + "\n").encode()
        )
        return dest

    def write_record(
        self, *, inputs: dict[str, Any], outcome: str, exit_code: int, **sections: Any
    ) -> Path:
        """`record.json`: what was asked, what happened, every check and measurement."""
        doc = {
            "schema": SCHEMA,
            "command": self.command,
            "target": self.target,
            "started": self.started,
            "finished": datetime.now(UTC).isoformat(),
            "inputs": inputs,
            "outcome": outcome,
            "exit_code": exit_code,
            **sections,
        }
        return self.write_json("record.json", doc)
