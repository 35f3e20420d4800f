"""`ops report` on hostile records (probe37 P91, P94), through the real CLI on real files:

- one leaf of a rollout's records set to a value ops could write (a 0 us quartile, a probe
  with no sample before the bench) is reported as unmeasured; a value that is nonsense (a
  5e-324 tokens/s run, a batch of -inf, NaN A/A runs) is exit 2, one line naming the file and
  the field; never exit 4 ("internal error", an ops bug) and never a traceback;
- a compact one-leaf fuzz of those records (the prober's fuzzrep.py, deterministic) holds that
  for a few hundred mutations;
- a record with a nonsense number (a wall share outside [0, 1], its prefill part larger than
  the share or not a number, a negative stage time, a service speedup <= 0) is exit 2 naming
  the file and the field, where it was a traceback or a nonsense f, ceiling or speedup; the
  same records unmutated still make a report;
- many large records do not add up in memory (each parsed document is let go once read), and
  records over 256 MiB in all are refused before they are read, naming the run dir.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from helpers.cli import run_ops
from test_report import RECORDS, ops_report

REPO = Path(__file__).resolve().parent.parent
ROLLOUT = REPO / "tests" / "fixtures" / "records" / "rollout_attn"
MEASURE, BENCH, PRE = "06-measure/record.json", "02-bench/record.json", "01-preflight/record.json"


def _env(tmp: Path) -> dict[str, str]:
    return {**os.environ, "OPS_RUNS_DIR": str(tmp / "runs"), "COLUMNS": "200"}


def _key(k: str) -> str | int:
    return int(k) if k.isdigit() else k


def mutate(run: Path, rel: str, path: str, value: Any) -> None:
    """Set one leaf (dot path) of `run/rel` to `value`, written as Python's json writes it."""
    doc = json.loads((run / rel).read_text())
    node = doc
    keys = [_key(k) for k in path.split(".")]
    for k in keys[:-1]:
        node = node[k]
    node[keys[-1]] = value
    (run / rel).write_text(json.dumps(doc))


def report(tmp: Path, *runs: Path) -> subprocess.CompletedProcess[str]:
    args = [str(r) for r in runs]
    return run_ops("report", *args, "--out", str(tmp / "out"), env=_env(tmp), cwd=REPO)


def clean(res: subprocess.CompletedProcess[str]) -> None:
    out = res.stdout + res.stderr
    assert "Traceback" not in out and "internal error" not in out, out[-3000:]


NONSENSE = [
    (MEASURE, "measure.levels.0.aa.0.0", 5e-324, "measure.levels.0.aa: arm 0: run 0"),
    (MEASURE, "measure.levels.0.before.1", 5e-324, "measure.levels.0.before: run 1"),
    (MEASURE, "measure.levels.0.before.1", 1e-300, "measure.levels.0.before: run 1"),
    (BENCH, "bench.rows.2.p25_us", -5e-324, "bench.rows.2.p25_us"),
    (BENCH, "bench.rows.2.p75_us", -1, "bench.rows.2.p75_us"),
    (BENCH, "bench.rows.0.shape.batch", float("-inf"), "bench.rows.0.shape"),
    (BENCH, "bench.rows.0.shape.batch", [], "bench.rows.0.shape"),
    (BENCH, "bench.rows.0.shape.batch", "str", "bench.rows.0.shape"),
    (PRE, "healthcheck.modules.identity.aa_runs", float("nan"), "modules.identity.aa_runs"),
    (
        "05-postflight/record.json",
        "healthcheck.modules.identity.aa_runs",
        float("nan"),
        "modules.identity.aa_runs",
    ),
]


@pytest.mark.parametrize(("rel", "path", "value", "field"), NONSENSE)
def test_a_nonsense_value_is_exit_2_naming_the_file_and_field(
    tmp_path: Path, rel: str, path: str, value: Any, field: str
) -> None:
    run = tmp_path / "run"
    shutil.copytree(ROLLOUT, run)
    mutate(run, rel, path, value)
    res = report(tmp_path, run)
    clean(res)
    assert res.returncode == 2, (res.returncode, res.stderr[-2000:])
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), res.stderr
    assert str(run / rel) in lines[0] and field in lines[0], lines[0]


def test_an_integer_too_long_to_read_is_exit_2_naming_the_file(tmp_path: Path) -> None:
    """probe37az M2 (medium): a record holding an integer of 5000 digits (past the 4300 that
    Python converts) made `ops report` an internal error, exit 4. It is a record that cannot
    be read: one line, exit 2, naming the file."""
    run = tmp_path / "run"
    shutil.copytree(ROLLOUT, run)
    text = (run / BENCH).read_text()
    (run / BENCH).write_text(text.replace('"schema": ', '"n": ' + "9" * 5000 + ', "schema": ', 1))
    assert "9" * 5000 in (run / BENCH).read_text()
    res = report(tmp_path, run)
    clean(res)
    assert res.returncode == 2, (res.returncode, res.stderr[-2000:])
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), res.stderr
    assert str(run / BENCH) in lines[0] and "(4300 digits)" in lines[0], lines[0]


@pytest.mark.parametrize("value", [0, 0.0])
def test_a_zero_quartile_is_unmeasured_not_a_crash(tmp_path: Path, value: float) -> None:
    """A 0 us quartile (under the timer's resolution) is one ops could write: the row's
    spread falls back to its median, and the report is made."""
    run = tmp_path / "run"
    shutil.copytree(ROLLOUT, run)
    rows = json.loads((run / BENCH).read_text())["bench"]["rows"]
    for i in range(len(rows)):
        mutate(run, BENCH, f"bench.rows.{i}.p25_us", value)
    res = report(tmp_path, run)
    clean(res)
    assert res.returncode in (0, 1, 3), res.stderr[-2000:]
    md = (tmp_path / "out" / "report.md").read_text()
    med = f"{rows[2]['median_us']:.4g}"
    assert f"{med}..{med}" in md or f"{med}..{rows[2]['p75_us']:.4g}" in md, md


def test_a_probe_with_no_sample_before_is_unmeasured(tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(ROLLOUT, run)
    mutate(run, BENCH, "bench.probe.p50_before_ms", None)
    res = report(tmp_path, run)
    clean(res)
    assert res.returncode in (0, 1, 3), res.stderr[-2000:]
    md = (tmp_path / "out" / "report.md").read_text()
    assert "Probe p50 latency before n/a ms" in md and "(n/a)" in md, md
    html = (tmp_path / "out" / "report.html").read_text()
    assert '<td>before</td><td class="n">n/a</td>' in html, html


# -- the prober's one-leaf fuzz, compact --------------------------------------------------------

VALUES = [
    5e-324,
    -5e-324,
    1e-300,
    1e308,
    -1,
    0,
    float("nan"),
    float("inf"),
    float("-inf"),
    "str",
    None,
    [],
    {},
    10**400,
    True,
    2**63,
]
FUZZ = 200  # mutations: about 50 ms each in one process

# One process runs every mutation through `ops`'s own entry point (what `python -m ops` runs),
# so a few hundred fit in seconds; each prints its exit code and whether a traceback showed.
DRIVER = """
import contextlib, io, json, sys
from ops.__main__ import run
for line in sys.stdin:
    rel, path, value, work = json.loads(line)
    keys = path  # JSON keeps a list index an int and a mapping key a string
    doc = json.loads(open(f"{work}/{rel}.orig").read())
    node = doc
    for k in keys[:-1]:
        node = node[k]
    node[keys[-1]] = value
    open(f"{work}/{rel}", "w").write(json.dumps(doc))
    sys.argv = ["ops", "report", work, "--out", work + "-out"]
    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        try:
            run()
            code = 0
        except SystemExit as exc:
            code = exc.code
    open(f"{work}/{rel}", "w").write(open(f"{work}/{rel}.orig").read())
    text = err.getvalue() + out.getvalue()
    print(json.dumps([rel, path, repr(value), code, "Traceback" in text, text[-300:]]), flush=True)
"""


def _leaves(x: Any, path: tuple = ()) -> list[tuple]:
    if isinstance(x, dict) and x:
        return [leaf for k, v in x.items() for leaf in _leaves(v, (*path, k))]
    if isinstance(x, list) and x:
        return [leaf for i, v in enumerate(x) for leaf in _leaves(v, (*path, i))]
    return [path]


def test_one_leaf_fuzz_never_gives_an_internal_error(tmp_path: Path) -> None:
    work = tmp_path / "run"
    shutil.copytree(ROLLOUT, work)
    cases = []
    for f in sorted(work.rglob("record.json")):
        rel = str(f.relative_to(work))
        shutil.copy(f, f"{f}.orig")
        doc = json.loads(f.read_text())
        cases += [(rel, p) for p in _leaves(doc) if p and p[0] != "schema"]
    rng = random.Random(37)
    picks = [(*rng.choice(cases), rng.choice(VALUES)) for _ in range(FUZZ)]
    picks += [(rel, tuple(map(_key, path.split("."))), v) for rel, path, v, _ in NONSENSE]
    lines = "".join(json.dumps([rel, list(p), v, str(work)]) + "\n" for rel, p, v in picks)
    res = subprocess.run(
        [sys.executable, "-c", DRIVER],
        input=lines,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
        env=_env(tmp_path),
    )
    assert res.returncode == 0, res.stderr[-3000:]
    results = [json.loads(ln) for ln in res.stdout.splitlines()]
    assert len(results) == len(picks), res.stderr[-3000:]
    bad = [r for r in results if r[3] not in (0, 1, 2, 3) or r[4]]
    assert not bad, bad[:10]
    assert {r[3] for r in results} >= {2}, results[:5]


# -- memory: many large records ------------------------------------------------------------------


def _big_records(run: Path, n: int, mib: int) -> None:
    """`n` pre-flight records, each padded with `mib` MiB of floats the report does not read."""
    base = json.loads((ROLLOUT / PRE).read_text())
    floats = "0.123," * (mib * 2**20 // 6)
    for i in range(n):
        doc = {**base, "started": f"2025-01-{i + 1:02d}T00:00:00Z", "pad": []}
        text = json.dumps(doc).replace('"pad": []', f'"pad": [{floats}0.5]')
        (run / f"{i:02d}-preflight").mkdir(parents=True)
        (run / f"{i:02d}-preflight" / "record.json").write_text(text)


def _peak_rss_mib(tmp: Path, run: Path) -> tuple[int, subprocess.CompletedProcess[str]]:
    """`ops report RUN` in a fresh wrapper process: its only child's peak RSS (MiB)."""
    wrapper = (
        "import resource, subprocess, sys\n"
        "r = subprocess.run(sys.argv[1:])\n"
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss // 1024)\n"
        "sys.exit(r.returncode)\n"
    )
    argv = [
        sys.executable,
        "-c",
        wrapper,
        sys.executable,
        "-m",
        "ops",
        "report",
        str(run),
        "--out",
        str(tmp / f"out-{run.name}"),
    ]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=REPO, env=_env(tmp))
    return int(res.stdout.split()[-1]), res


def test_many_large_records_do_not_add_up_in_memory(tmp_path: Path) -> None:
    """Five 20 MiB records cost about what one does: no parsed document is kept (before the
    fix, each was kept to the end: 5 x the one record's peak)."""
    one, five = tmp_path / "one", tmp_path / "five"
    _big_records(one, 1, 20)
    _big_records(five, 5, 20)
    peak_one, res = _peak_rss_mib(tmp_path, one)
    clean(res)
    assert res.returncode in (0, 1, 3), res.stderr[-2000:]
    peak_five, res = _peak_rss_mib(tmp_path, five)
    clean(res)
    assert res.returncode in (0, 1, 3), res.stderr[-2000:]
    assert peak_five < 1.5 * peak_one, (peak_one, peak_five)


def test_records_over_the_reports_limit_are_refused_before_reading(tmp_path: Path) -> None:
    run = tmp_path / "runs-dir"
    for i in range(5):  # sparse: 60 MiB each (under the 64 MiB of one record), 300 MiB in all
        (run / f"{i:02d}-bench").mkdir(parents=True)
        with (run / f"{i:02d}-bench" / "record.json").open("wb") as f:
            f.truncate(60 * 2**20)
    res = report(tmp_path, run)
    clean(res)
    assert res.returncode == 2, res.stderr[-2000:]
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, res.stderr
    assert str(run) in lines[0] and "300 MiB" in lines[0] and "256 MiB" in lines[0], lines[0]


def _load(name: str) -> dict:
    return json.loads((RECORDS / name / "record.json").read_text())


def _records(tmp: Path, mutate: Callable[[dict[str, dict]], None]) -> list[str]:
    """The attention rollout's records (change, bench, wall-share profile, measure with the
    service's s), mutated, written under tmp; preflight from the fixtures."""
    change = _load("rollout_attn_change")
    prof = _load("profile_attn_wall")
    for lv in prof["profile"]["levels"]:
        lv["wall_share"]["attention"]["prefill"] = 0.1
    meas = _load("rollout_attn/06-measure")
    for lv in meas["measure"]["levels"]:
        lv["service_speedup"] = {"total": 2.5, "steps": 2.8, "prefill": 1.9}
    recs = {"change": change, "bench": _load("bench_attn"), "profile": prof, "measure": meas}
    mutate(recs)
    out = [str(RECORDS / "preflight_ok")]
    for name, rec in recs.items():
        d = tmp / "recs" / name
        d.mkdir(parents=True)
        (d / "record.json").write_text(json.dumps(rec))
        out.append(str(d))
    return out


def _share(recs: dict[str, dict]) -> dict[str, Any]:
    return recs["profile"]["profile"]["levels"][0]["wall_share"]["attention"]


def _svc(recs: dict[str, dict], value: dict[str, Any]) -> None:
    recs["measure"]["measure"]["levels"][0]["service_speedup"] = value


CASES: list[tuple[str, Callable[[dict[str, dict]], None], str, str]] = [
    (
        "share_negative",
        lambda r: _share(r).update(value=-0.2),
        "profile",
        "profile.levels.0.wall_share: attention.value: a share of the wall time",
    ),
    (
        "share_over_one",
        lambda r: _share(r).update(value=1.5),
        "profile",
        "attention.value: a share of the wall time is in [0, 1], got 1.5",
    ),
    (
        "share_p25_negative",
        lambda r: _share(r).update(p25=-0.5),
        "profile",
        "attention.p25: a share of the wall time is in [0, 1], got -0.5",
    ),
    (
        "prefill_over_share",
        lambda r: _share(r).update(prefill=0.9),
        "profile",
        "attention.prefill: the part in prefill is in [0, the share 0.25], got 0.9",
    ),
    (
        "prefill_negative",
        lambda r: _share(r).update(prefill=-0.1),
        "profile",
        "attention.prefill: the part in prefill is in [0, the share 0.25], got -0.1",
    ),
    (
        "prefill_string",
        lambda r: _share(r).update(prefill="abc"),
        "profile",
        "attention.prefill: must be a number, got 'abc'",
    ),
    (
        "prefill_list",
        lambda r: _share(r).update(prefill=[1]),
        "profile",
        "attention.prefill: must be a number, got [1]",
    ),
    (
        "stage_negative",
        lambda r: r["profile"]["profile"]["levels"][1]["stage_ms"]["attention"].update(value=-3),
        "profile",
        "profile.levels.1.stage_ms: attention.value: a time is a number",
    ),
    (
        "service_total_negative",
        lambda r: _svc(r, {"total": -1}),
        "measure",
        "measure.levels.0.service_speedup: total: a speedup is a number > 0",
    ),
    (
        "service_steps_zero",
        lambda r: _svc(r, {"steps": 0}),
        "measure",
        "steps: a speedup is a number > 0, got 0.0",
    ),
]


@pytest.mark.parametrize(
    ("mutate", "record", "words"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_a_nonsense_number_in_a_record_is_exit_2_naming_file_and_field(
    tmp_path: Path, mutate: Callable[[dict[str, dict]], None], record: str, words: str
) -> None:
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "ops",
            "report",
            *_records(tmp_path, mutate),
            "--json",
            "--out",
            str(tmp_path / "out"),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "OPS_RUNS_DIR": str(tmp_path / "runs")},
    )
    assert res.returncode == 2, res.stderr[-2000:]
    assert "Traceback" not in res.stderr
    line = res.stderr.strip()
    assert "\n" not in line, line
    assert line.startswith(f"error: {tmp_path / 'recs' / record / 'record.json'}: "), line
    assert words in line, line


def test_the_unmutated_records_still_make_a_report(tmp_path: Path) -> None:
    code, doc = ops_report(tmp_path, *_records(tmp_path, lambda r: None), args=("-c", "1"))
    assert code in (0, 1, 3), doc
    row = next(r for r in doc["amdahl"] if r["concurrency"] == 1)
    assert row["f"] == pytest.approx(0.25)
    assert row["service_speedup"] == {"total": 2.5, "steps": 2.8, "prefill": 1.9}


def test_a_directory_that_is_no_run_dir_is_one_line_exit_2(tmp_path: Path) -> None:
    """probe37b B8: /proc (directories that cannot be listed or that vanish as they are read)
    and a whole disk were exit 4 tracebacks of the scan; now the scan passes over what it cannot
    list and stops, one line and exit 2, past SCAN_MAX_DIRS directories."""
    res = report(tmp_path, Path("/proc"))
    assert res.returncode == 2, res.stderr
    assert "internal error" not in res.stderr and "Traceback" not in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1, res.stderr


def test_a_scan_over_too_many_directories_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ops.verdict import evidence

    monkeypatch.setattr(evidence, "SCAN_MAX_DIRS", 6)  # runs/ and six below it: seven
    for i in range(6):
        (tmp_path / "runs" / f"d{i}").mkdir(parents=True)
    with pytest.raises(evidence.BadRecord, match="over 6 directories under it"):
        evidence.record_files([tmp_path / "runs"])
    shutil.rmtree(tmp_path / "runs" / "d5")
    (tmp_path / "runs" / "d4" / "record.json").write_text("{}")
    assert evidence.record_files([tmp_path / "runs"]) == [tmp_path / "runs" / "d4" / "record.json"]
