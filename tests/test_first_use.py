"""First use through the real CLI: golden files and tables at 80 columns.

A bad `--golden FILE` is named by its path; `--record-golden` over an existing golden set
keeps the old one (`golden.json.1`, then `.2`) and says so in the output and the record. At
80 columns the loadtest and healthcheck tables show every number of the run's record (the
loadtest's headers with units), and `--aa-runs` shows in the healthcheck table.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from helpers.local import Ops


@pytest.fixture
def ops(tmp_path: Path):
    o = Ops(tmp_path)
    o.configure()
    assert o.json("service", "start", "local")[0] == 0
    yield o
    o.stop()


def _record(stderr: str) -> dict:
    match = re.search(r"record: (\S+record\.json)", stderr)
    assert match, stderr
    return json.loads(Path(match.group(1)).read_text())


def table_rows(text: str, key: int) -> list[list[str]]:
    """Body rows of the rich tables in `text`; a cell spread over lines is joined by spaces.
    A line whose `key` cell is empty continues the row above."""
    rows: list[list[str]] = []
    for line in text.splitlines():
        if not line.startswith("│"):
            continue
        cells = [c.strip() for c in line.split("│")[1:-1]]
        if cells[key] or not rows or len(rows[-1]) != len(cells):
            rows.append(cells)
        else:
            rows[-1] = [f"{a} {b}".strip() for a, b in zip(rows[-1], cells, strict=True)]
    return rows


def _same_number(cell: str, value: float | None) -> bool:
    if value is None:
        return cell == "-"
    return abs(float(cell) - value) <= 0.05 + 1e-9


def test_bad_golden_file_is_named_by_its_path(ops: Ops) -> None:
    bad = ops.tmp / "my-golden.json"
    for text, why in (("{not json", "Expecting property name"), ("[1, 2]", "not a golden set")):
        bad.write_text(text)
        res = ops("healthcheck", "local", "--golden", str(bad))
        assert res.returncode == 2 and "Traceback" not in res.stderr
        assert f"golden file {bad}: " in res.stderr and why in res.stderr
        assert ": -:" not in res.stderr


def test_record_golden_keeps_the_previous_sets(ops: Ops) -> None:
    ops.env["COLUMNS"] = "250"  # the paths stay on one line of the human table
    golden = ops.tmp / "root" / "golden" / "golden.json"
    code, rep = ops.json("healthcheck", "local", "--record-golden", "--max-tokens", "4")
    assert code == 0 and rep["modules"]["identity"]["kept"] is None
    first = golden.read_text()
    code, rep = ops.json("healthcheck", "local", "--record-golden", "--max-tokens", "4")
    assert code == 0 and rep["modules"]["identity"]["kept"] == f"{golden}.1"
    detail = next(c["detail"] for c in rep["checks"] if c["name"] == "identity")
    assert detail.endswith(f"; the previous golden set is kept as {golden}.1")
    record = json.loads((Path(rep["run_dir"]) / "record.json").read_text())
    assert {"name": "identity", "detail": detail} in [
        {"name": c["name"], "detail": c["detail"]} for c in record["healthcheck"]["checks"]
    ]
    assert Path(f"{golden}.1").read_text() == first
    second = golden.read_text()
    res = ops("healthcheck", "local", "--record-golden", "--max-tokens", "4")  # human output
    shown = {r[0]: r[2] for r in table_rows(res.stdout, key=0)}["identity"]
    assert res.returncode == 0 and f"kept as {golden}.2" in shown
    assert Path(f"{golden}.2").read_text() == second
    assert Path(f"{golden}.1").read_text() == first
    assert json.loads(golden.read_text())["recorded"] != json.loads(second)["recorded"]

    mine = ops.tmp / "mine.json"  # a local golden file is kept the same way
    for _ in range(2):
        code, rep = ops.json(
            "healthcheck", "local", "--record-golden", "--golden", str(mine), "--max-tokens", "4"
        )
        assert code == 0
    assert rep["modules"]["identity"]["kept"] == f"{mine}.1"
    assert json.loads(Path(f"{mine}.1").read_text())["prompts"]


def test_loadtest_table_at_80_columns_shows_every_number(ops: Ops) -> None:
    ops.env["COLUMNS"] = "80"
    res = ops("loadtest", "local", "-c", "1,4", "--requests", "8", "--output-len", "8")
    assert res.returncode == 0, res.stderr
    assert max(len(line) for line in res.stdout.splitlines()) <= 80
    for head in ("req/s", "tok/s", "p50 ms", "p90 ms", "p99 ms", "mean ms", "time s"):
        assert head in res.stdout
    levels = _record(res.stderr)["loadtest"]["levels"]
    throughput = [r for r in table_rows(res.stdout, key=0) if len(r) == 7]
    latency = [r for r in table_rows(res.stdout, key=1) if len(r) == 6]
    assert [r[0] for r in throughput] == ["1", "4"]
    assert len(latency) == 4 * len(levels)
    for lv, row in zip(levels, throughput, strict=True):
        assert row[1:3] == [str(lv["completed"]), str(lv["failed"])]
        assert _same_number(row[3], lv["request_per_s"])
        assert _same_number(row[4], lv["output_tok_per_s"])
        assert _same_number(row[5], lv["accept_length"]["value"])
        assert _same_number(row[6], lv["duration_s"])
    for i, lv in enumerate(levels):
        rows = latency[4 * i : 4 * i + 4]
        assert rows[0][0] == str(lv["concurrency"])
        for row, key in zip(rows, ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"), strict=True):
            assert row[1] == key.split("_")[0].upper()
            for cell, stat in zip(row[2:], ("p50", "p90", "p99", "mean"), strict=True):
                assert _same_number(cell, lv[key][stat]), (row, key, stat)


def test_healthcheck_table_at_80_columns_shows_every_detail_and_aa_runs(ops: Ops) -> None:
    ops.env["COLUMNS"] = "80"
    assert ops.json("healthcheck", "local", "--record-golden", "--max-tokens", "4")[0] == 0
    res = ops("healthcheck", "local", "--aa-runs", "2")
    assert res.returncode == 0, res.stderr
    assert max(len(line) for line in res.stdout.splitlines()) <= 80
    checks = _record(res.stderr)["healthcheck"]["checks"]
    rows = {r[0]: r for r in table_rows(res.stdout, key=0)}
    assert list(rows) == [c["name"] for c in checks]
    for c in checks:  # every character of every detail is in the table, only wrapped
        assert rows[c["name"]][1] == c["status"]
        assert "".join(rows[c["name"]][2].split()) == "".join(c["detail"].split())
    identity = " ".join(rows["identity"][2].split())
    assert "34/34 prompts token-identical (100.0%)" in identity
    assert "0 nondeterministic in 2 A/A runs" in identity
