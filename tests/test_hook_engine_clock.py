"""The hook's clock against the engine's own stage clock, on the same steps.

The reference engine runs as a service with the release's hook (tests/helpers/engine_fork_steps.py:
its tree-build and accept stages call the stand-in fork module's builder and walk the fork's
way, one request per call), started the way the service starts (a release's `current/`, its
`service.env`, `site/` on PYTHONPATH, the stand-in fork package, then this checkout for
`engine`). Over the same steps:

- calls agree exactly: the hook's calls of each function == the engine's requests x steps
  (every request of a step builds one tree and walks it once);
- seconds agree within the stated tolerance: the hook times inside each call and the stage
  clock around the whole stage (the same calls, plus the packing of their answers into the
  engine's arrays and the loop), so hook <= stage, and stage - hook <= GAP_PER_CALL per call.
  GAP_PER_CALL is 1 ms: the stage's own work beside a call here is a few tens of us (a 12-node
  tree's arrays copied, a path written), so 1 ms is far from what this machine takes even
  loaded, and far below what a clock in the wrong unit (x1000), a call counted twice or a
  clock that missed the calls would show.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import HELPERS, REPO
from helpers import fork_standin as fs

GAP_PER_CALL = 1e-3  # seconds: see the module's doc
SCRIPT = (HELPERS / "engine_fork_steps.py").read_text()


@pytest.fixture
def current(tmp_path: Path) -> Path:
    return fs.release(tmp_path / "host")


def _run(current: Path, spec: str, standin: Path, **args) -> tuple[dict, dict, list[str]]:
    env = fs.service_env(current, spec, standin, REPO)
    proc = subprocess.Popen(
        [sys.executable, "-c", SCRIPT, json.dumps({"requests": 10, "max_tokens": 20, **args})],
        cwd=current,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stdout.readline()
        assert line, proc.communicate(timeout=60)[1]
        out = json.loads(line)
        res = subprocess.run(
            [sys.executable, "-m", "checks.hook_counters", "--json", "--run", str(current / "run")],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
        )
        doc = json.loads(res.stdout)
    finally:
        _, err = proc.communicate("\n", timeout=60)
    assert proc.returncode == 0, err
    (mine,) = [p for p in doc["processes"] if p["pid"] == out["pid"]]
    return out, mine["components"], err.strip().splitlines()


@pytest.mark.parametrize(
    ("spec", "standin"),
    [("measure", fs.V2), ("tree_build=cpp,accept=cpp", fs.V1)],
    ids=["measure-stock-807ab0e4", "dropins-6d9866b3"],
)
def test_the_hooks_clock_agrees_with_the_engines_stage_clock(
    current: Path, spec: str, standin: Path
) -> None:
    out, hook, err = _run(current, spec, standin)
    assert len(err) == 1 and "ddtree-ops hook: release " in err[0], err
    assert out["steps"] > 10 and out["rows"] > out["steps"]  # batches of several requests
    for comp in ("tree_build", "accept"):
        h, stage = hook[comp], out["stage_s"][comp]
        assert h["calls"] == out["rows"] and h["errors"] == 0, (comp, h, out)
        assert 0 < h["seconds"] <= stage, (comp, h, stage)
        gap = stage - h["seconds"]
        assert gap <= GAP_PER_CALL * h["calls"], (comp, gap, h, stage)
        print(
            f"{spec} {comp}: {h['calls']} calls, hook {h['seconds'] * 1e3:.2f} ms, "
            f"stage {stage * 1e3:.2f} ms, gap {gap / h['calls'] * 1e6:.1f} us/call"
        )
