"""Issue 40 through the real `ops` CLI, against a service with the DDTree fork and the hook:
the stand-in service (tests/helpers/fork_service.py: HTTP like the fork's server, the fork
module's functions called per request and per step as its worker calls them) is `local`'s
service, started by ops's process manager from a release's `current/` with its `service.env`
(the release's `site/` on PYTHONPATH, so the import hook installs; the stand-in fork package
and the test candidates after it).

- `ops profile` reads the hook's counters around each level's window: f of `tree_build` and
  `accept` with `source: hook`, per process, combined as stated; with the shadow armed in the
  setting (`shadow:tree_build=cpp/2`), s from the service's own calls and 0 mismatches; `ops
  rollout` on that target decides from them (f_source hook, s from the shadow).
- A builder that breaks ties the other way, shadowed, is caught: `ops healthcheck` fails naming
  the saved case while the service's answers stay the stock ones (token identity passes
  against a golden set recorded before).
- The healthcheck's hook check fails where the setting asked for something that is not in
  place ("stock builder in use because ..."), passes `off` and a working `measure`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from helpers import REPO
from helpers import fork_standin as fs
from helpers.cli import ops_json
from helpers.local import end_services
from helpers.sshd import free_port

from ops.verdict.evidence import gather

SERVICE = REPO / "tests" / "helpers" / "fork_service.py"
LOAD = ["-c", "1,4", "--requests", "12", "--input-len", "8", "--output-len", "16"]
PLAYBOOK = """\
name: hook-rollout
change: {component: tree_build, baseline: reference, candidate: cpp}
threshold: 0.03
load: {concurrency: [1, 4], requests: 12, input_len: 8, output_len: 16}
steps:
  - {step: healthcheck, name: preflight, aa_runs: 0}
  - {step: bench}
  - {step: profile}
  - {step: decide}
  - {step: report}
"""


class Fork:
    """`local` is the stand-in fork service, run from a release under tmp/root."""

    def __init__(self, tmp: Path) -> None:
        self.tmp, self.root = tmp, tmp / "root"
        self.current = fs.release(self.root)
        self.url = f"http://127.0.0.1:{free_port()}"
        self.inventory = tmp / "ops.toml"
        self.inventory.write_text(
            f"[targets.local]\nremote_root = '{self.root}'\n"
            f"[targets.local.service]\nname = 'fork'\nurl = '{self.url}'\nstop_timeout = 5\n"
            f'command = "{{python}} {SERVICE} --port {{port}} --verify-ms 2"\n'
        )
        self.env = {**os.environ, "OPS_RUNS_DIR": str(tmp / "runs")}

    def setting(self, spec: str, standin: Path = fs.V2) -> None:
        """The release's service.env with DDTREE_OPS_SGLANG=spec (read at the next start)."""
        fs.service_env(self.current, spec, standin, fs.CANDIDATES)

    def __call__(self, *args: str, timeout: float = 300) -> tuple[int, dict, str]:
        return ops_json(*args, inventory=self.inventory, env=self.env, timeout=timeout)

    def record(self, doc: dict) -> dict:
        return json.loads((Path(doc["run_dir"]) / "record.json").read_text())

    def hook_row(self) -> tuple[int, dict, dict]:
        code, doc, _ = self("healthcheck", "local", "--max-tokens", "8")
        (row,) = [c for c in doc["checks"] if c["name"] == "hook"]
        return code, doc, row


@pytest.fixture
def fork(tmp_path: Path):
    f = Fork(tmp_path)
    yield f
    end_services(f.root)


def test_profile_and_rollout_read_f_and_s_from_the_hook(fork: Fork) -> None:
    fork.setting("shadow:tree_build=cpp/2")
    code, doc, err = fork("service", "start", "local")
    assert code == 0, (doc, err)
    code, doc, err = fork("profile", "local", *LOAD, "--shadow", "tree_build=cpp")
    assert code == 0, err
    sec = fork.record(doc)["profile"]
    assert sec["service"]["hook"]["live"] == 1 and not sec["incomplete"], sec["service"]
    assert sec["service"]["hook"]["shadowed"] == {
        "build_ddtree_tree_from_topk": "shadow:tree_build=cpp/2"
    }
    assert [lv["concurrency"] for lv in sec["levels"]] == [1, 4]
    for lv in sec["levels"]:
        assert lv["method"] == "hook" and "cpu_baseline" not in lv, lv
        (proc,) = lv["hook"]["processes"]
        for comp in ("tree_build", "accept"):
            f = lv["wall_share"][comp]
            assert f["source"] == "hook" and 0 < f["value"] < 1, (comp, f)
            assert "import hook" in f["note"] and "the largest share over" in f["note"]
            c = proc["components"][comp]
            assert c["calls"] > 0 and f["n"] == c["calls"]
            # seconds in the function / the window's wall time less the shadow's own time
            wall = lv["load"]["duration_s"] - proc["shadow_overhead_s"]
            assert f["value"] == pytest.approx(c["seconds"] / wall, rel=1e-6)
        sh = lv["shadow"]
        assert (sh["source"], sh["component"], sh["baseline"], sh["candidate"]) == (
            "hook",
            "tree_build",
            "reference",
            "cpp",
        )
        assert sh["every"] == 2 and sh["compared"] > 0 and sh["mismatched"] == 0, sh
        assert sh.get("error") is None and sh["step"]["lo"] <= sh["step"]["s"] <= sh["step"]["hi"]
        # a measured, positive s (which of the two is faster on a loaded 2-core runner is no
        # test's business: numbers live in `python -m integration.percall`, not in asserts)
        assert sh["step"]["s"] > 0 and sh["step"]["base_us"] > 0 and sh["step"]["cand_us"] > 0
    # the records read back as evidence: the hook's f is a measured f like any other
    ev = gather([Path(doc["run_dir"])])
    assert ev.profile is not None
    for lv in ev.profile.levels:
        f, basis = lv.f_of("tree_build")
        assert f.source == "hook" and basis == "wall"
        assert lv.shadow is not None and lv.shadow.step is not None
    # the rollout: preflight (the golden set recorded first), bench (no GPU here), profile,
    # decide: the verdict's f is the hook's, its s the service's own (the shadow)
    code, doc, err = fork("healthcheck", "local", "--record-golden", "--max-tokens", "8")
    assert code == 0, doc
    pb = fork.tmp / "rollout.yaml"
    pb.write_text(PLAYBOOK)
    code, doc, err = fork("rollout", "local", "--playbook", str(pb))
    assert doc["verdict"] in ("GO", "NO-GO", "HOLD") and code in (0, 1, 3), err
    steps = {s["name"]: s for s in doc["steps"]}
    assert steps["preflight"]["status"] == "ok" and steps["profile"]["status"] == "ok", steps
    assert "the import hook's shadow:tree_build=cpp/2" in steps["profile"]["detail"]
    rows = doc["decision"]["amdahl"]
    assert [r["concurrency"] for r in rows] == [1, 4]
    for r in rows:
        assert r["f_source"] == "hook" and r["f_basis"] == "wall" and r["ceiling"] > 0, r
        assert r["speed"] is not None and r["speed"]["source"] == "shadow", r
    md = (Path(doc["run_dir"]) / "report.md").read_text()
    assert "hook" in md


def test_a_wrong_candidate_is_caught_and_the_answers_stay_the_stocks(fork: Fork) -> None:
    fork.setting("measure")
    code, doc, err = fork("service", "start", "local")
    assert code == 0, (doc, err)
    code, doc, err = fork("healthcheck", "local", "--record-golden", "--max-tokens", "16")
    assert code == 0, doc
    (row,) = [c for c in doc["checks"] if c["name"] == "hook"]
    assert row["status"] == "pass" and "calls counted in 1 live processes" in row["detail"], row
    # the same release, shadowing a builder that breaks ties the other way
    fork.setting("shadow:tree_build=ddtree_test_candidates:tie_flipped")
    code, doc, err = fork("service", "restart", "local")
    assert code == 0, (doc, err)
    code, doc, row = fork.hook_row()
    assert code == 1 and doc["failed"] == ["hook"], doc["failed"]
    identity = next(c for c in doc["checks"] if c["name"] == "identity")
    assert identity["status"] == "pass" and "100.0%" in identity["detail"]  # the stock's answers
    assert row["status"] == "fail", row
    assert row["detail"].startswith("the shadow's candidate answered otherwise than the stock")
    run = fork.root / "current" / "run"
    cases = sorted(p.name for p in run.glob("hook-mismatch-*-tree_build-*.json"))
    assert cases and cases[0] in row["detail"], (cases, row)
    assert "ddtree_test_candidates:tie_flipped: answer[" in row["detail"]
    # the profile says so too, beside s (the level's shadow is not cpp's: no s for the report)
    code, doc, err = fork("profile", "local", *LOAD, "--shadow", "tree_build=cpp")
    sec = fork.record(doc)["profile"]
    assert sec["shadow_mismatched"] and all(m["mismatched"] > 0 for m in sec["shadow_mismatched"])
    for lv in sec["levels"]:
        assert lv["shadow"]["candidate"] == "ddtree_test_candidates:tie_flipped"
        assert "not cpp" in lv["shadow"]["error"]


@pytest.mark.parametrize(
    "spec,standin,status,words",
    [
        ("off", fs.V2, "pass", "stock functions: DDTREE_OPS_SGLANG=off"),
        ("measure", fs.V1, "pass", "stock builder in use because DDTREE_OPS_SGLANG keeps it"),
        ("tree_build=cpp", fs.V2, "pass", "drop-in builder in use (tree_build=cpp, fork 807ab0e4"),
        ("tree_build=gpu", fs.V2, "fail", "stock builder in use because DDTREE_OPS_SGLANG="),
        ("tree_build=cpp", None, "fail", "stock builder in use because sglang.srt.speculative."),
        ("tree_build=cpp", "empty", "skip", "the service has no fork module to act on"),
        ("measure", "unwritable", "fail", "but calls are NOT counted where ops can read them"),
    ],
)
def test_the_healthcheck_says_which_builder_serves_and_fails_a_no_op(
    fork: Fork, tmp_path: Path, spec: str, standin: Path | str | None, status: str, words: str
) -> None:
    """The status a process of the release wrote at its start (the service itself not run:
    its other checks fail; the hook's row is what is looked at)."""
    if standin == "empty":  # no fork module at all (the reference engine's case)
        standin = tmp_path / "nothing"
        standin.mkdir()
    elif standin == "unwritable":  # the counters' directory cannot be made: counted in memory
        (fork.current / "run").mkdir()
        (fork.current / "run" / "hook-counters").write_text("a file, not a directory")
        standin = fs.V1
    elif standin is None:  # a fork version of no known contract: refused, the stock serves
        import shutil

        standin = tmp_path / "fork"
        shutil.copytree(fs.V2, standin, ignore=shutil.ignore_patterns("__pycache__"))
        src = standin / fs.MODULE_FILE
        ws = "    workspace: DFlashDDTreeBuildWorkspace | None = None,\n"
        src.write_text(src.read_text().replace(ws, ws + "    chain_len: int = 0,\n"))
    script = "pass" if status == "skip" else "import sglang.srt.speculative.dflash_ddtree_utils"
    proc = fs.start(fork.current, spec, standin, script)
    assert proc.returncode == 0, proc.stderr
    _, _, row = fork.hook_row()
    assert row["status"] == status and words in row["detail"], row
    if status == "fail":
        assert "DDTREE_OPS_SGLANG=" in row["detail"] and "release 20270101T000000Z" in row["detail"]
