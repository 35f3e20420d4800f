"""Run records: unique directories, whole files, and a record left behind whatever happens."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from ops.cli.common import recorded
from ops.errors import Unreachable
from ops.hosts.inventory import Target
from ops.hosts.records import RunDir


def test_run_dirs_are_unique_and_files_whole(tmp_path: Path) -> None:
    dirs = {RunDir.create("facts", "ct200", root=tmp_path).path for _ in range(20)}
    assert len(dirs) == 20 and all("-facts-ct200" in d.name for d in dirs)
    run = RunDir.create("bench", "x/../y", root=tmp_path)
    assert run.path.parent == tmp_path and "/" not in run.path.name
    run.write_record(inputs={"a": 1}, outcome="ok", exit_code=0, data=[1, 2])
    run.write_record(inputs={"a": 2}, outcome="ok", exit_code=0)  # replaced whole
    doc = json.loads((run.path / "record.json").read_text())
    assert doc["inputs"] == {"a": 2} and doc["schema"] == "ddtree-ops/record/v1"
    assert sorted(p.name for p in run.path.iterdir()) == ["record.json"]  # no temp files


def test_a_thousand_taken_names_still_give_a_run_dir(tmp_path: Path, monkeypatch) -> None:
    """Every name of the run's microsecond made by hand (probe37e E8): a fresh one, not a
    crash. The clock is held still so that the names can be taken beforehand."""
    import ops.hosts.records as records

    still = datetime(2026, 1, 2, 3, 4, 5, 6, tzinfo=UTC)

    class Frozen(datetime):
        @classmethod
        def now(cls, tz=None):  # noqa: ANN001, ANN206
            return still

    monkeypatch.setattr(records, "datetime", Frozen)
    base = "20260102T030405.000006Z-deploy-local"
    for n in range(1000):
        (tmp_path / (base if n == 0 else f"{base}.{n}")).mkdir()
    run = RunDir.create("deploy", "local", root=tmp_path)
    assert run.unwritten is None and run.path.is_dir() and run.path.name.startswith(base + ".")
    assert len(list(tmp_path.iterdir())) == 1001


@pytest.mark.parametrize(
    ("exc", "outcome", "code"),
    [
        (Unreachable("no route", target="t", step="connect"), "error", 2),
        (ZeroDivisionError("bug"), "crashed", 4),  # EXIT_INTERNAL: a bug, not a fail
        (KeyboardInterrupt(), "interrupted", 130),
    ],
)
def test_record_written_when_the_body_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, exc: BaseException, outcome: str, code: int
) -> None:
    monkeypatch.setenv("OPS_RUNS_DIR", str(tmp_path))

    def body(_run: RunDir):
        raise exc

    with pytest.raises(type(exc)):
        recorded("deploy", Target(name="t"), {"x": 1}, body)
    (run,) = tmp_path.iterdir()
    doc = json.loads((run / "record.json").read_text())
    assert (doc["outcome"], doc["exit_code"], doc["error"]["error"]) == (
        outcome,
        code,
        type(exc).__name__,
    )


def test_looking_commands_keep_only_their_newest_records(tmp_path: Path) -> None:
    """`service status` and `facts` change and measure nothing: their newest ten records per
    target stay, older ones go; records of other commands and targets are never touched."""
    from ops.hosts.records import KEEP_LOOKS

    other = RunDir.create("deploy", "ct200", root=tmp_path, inputs={})
    mine = [RunDir.create("service-status", "ct200", root=tmp_path, inputs={}) for _ in range(25)]
    elsewhere = RunDir.create("service-status", "ct201", root=tmp_path, inputs={})
    left = sorted(p.name for p in tmp_path.iterdir() if "-service-status-ct200" in p.name)
    assert left == sorted(r.path.name for r in mine[-KEEP_LOOKS:])
    assert other.path.is_dir() and elsewhere.path.is_dir()
