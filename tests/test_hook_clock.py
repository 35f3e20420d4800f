"""The import hook as the service's stage clock, and its shadow, in processes started as the
service starts (a release's `current/`, its `service.env`, `site/` on PYTHONPATH, the stand-in
fork package after it): every call of the builder and the walk counted and timed per process in
`<run>/hook-counters/<pid>.bin`, read by `python -m checks.hook_counters` while the process
lives (and skipped once it is gone); under `shadow:` the stock answers, the very objects, while
the candidate runs beside it on copies, compared element for element, timed; a candidate that
breaks ties the other way is caught, its case saved and replayed.

The script below is the fork's worker's way of calling (H = K = budget rows, one request per
call, the accept walk after the build, the workspace by keyword on the newer fork); it prints
what it did and waits on stdin, so the test reads the counters of a live process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from helpers import REPO
from helpers import fork_standin as fs

from checks import docs
from checks import hook_counters as hc
from integration import hook

BUILD, ACCEPT = "build_ddtree_tree_from_topk", "follow_verified_tree"

SERVICE = textwrap.dedent(
    """
    import importlib.util, json, os, sys, time, torch
    from sglang.srt.speculative import dflash_ddtree_utils as mod
    a = json.loads(sys.argv[1])
    spec = importlib.util.spec_from_file_location("stock_copy", sys.argv[2])
    stock = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(stock)
    build, follow = mod.build_ddtree_tree_from_topk, mod.follow_verified_tree
    ws_cls = getattr(mod, "DFlashDDTreeBuildWorkspace", None)
    ws = ws_cls() if ws_cls is not None and a.get("workspace") else None

    def same(x, y):
        if isinstance(y, torch.Tensor):
            return type(x) is torch.Tensor and x.dtype == y.dtype and torch.equal(x, y)
        if isinstance(y, (list, tuple)):
            return type(x) is type(y) and len(x) == len(y) and all(map(same, x, y))
        return type(x) is type(y) and x == y

    g = torch.Generator().manual_seed(a.get("seed", 0))
    out = {"pid": os.getpid(), "builds": 0, "walks": 0, "errors": 0, "wall_s": 0.0,
           "not_stock": 0, "views": 0, "backend": getattr(build, "ddtree_ops_backend", None)}
    b = a["budget"]
    for i in range(a["n"]):
        lp, ids = torch.log_softmax(torch.randn(b, 2048, generator=g) * 3, -1).topk(b, dim=-1)
        if a.get("bf16"):
            lp = lp.to(torch.bfloat16).float()  # a drafter's bf16 log-probs: ties
        t0 = time.perf_counter()
        tree = build(lp, ids, b, workspace=ws) if ws is not None else build(lp, ids, b)
        t1 = time.perf_counter()
        if ws is not None:  # the stock's answer: views of the workspace's buffers
            buf = ws.visibility_np
            out["views"] += buf is not None and tree[4].data_ptr() == buf.ctypes.data
            tree = tuple(x.clone() if isinstance(x, torch.Tensor) else x for x in tree)
        out["not_stock"] += not same(tree, stock.build_ddtree_tree_from_topk(lp, ids, b))
        post = torch.randint(0, 50000, (len(tree[3]),), generator=g)
        for node, kids in enumerate(tree[3]):
            if kids and i % 5:
                post[node] = next(iter(kids))
        t2 = time.perf_counter()
        walk = follow(tree[3], post)
        out["wall_s"] += (t1 - t0) + time.perf_counter() - t2
        out["not_stock"] += walk != stock.follow_verified_tree(tree[3], post)
        out["builds"] += 1
        out["walks"] += 1
    for _ in range(a.get("raising", 0)):  # K = 0: the fork raises (IndexError), counted
        try:
            build(torch.zeros(b, 0), torch.zeros(b, 0, dtype=torch.long), b)
        except IndexError:
            out["errors"] += 1
    if a.get("fork"):
        r, w = os.pipe()
        child = os.fork()
        if child == 0:
            for _ in range(3):
                build(lp, ids, b)
            os.write(w, b"x")
            sys.stdin.readline()
            os._exit(0)
        os.read(r, 1)
        out["child"] = child
    print(json.dumps(out), flush=True)
    sys.stdin.readline()
    if a.get("fork"):
        os.waitpid(out["child"], 0)
    """
)


class Live:
    """A service process started as the release starts one, read while it runs."""

    def __init__(self, current: Path, spec: str, standin: Path, **args) -> None:
        self.current = current
        stock = str(standin / fs.MODULE_FILE)
        paths = (standin, fs.CANDIDATES)
        self.proc = fs.popen(current, spec, paths, SERVICE, json.dumps(args), stock)
        line = self.proc.stdout.readline()
        assert line, self.proc.communicate(timeout=30)[1]
        self.out = json.loads(line)

    def counters(self, *extra: str) -> tuple[int, dict]:
        return read_counters(self.current, *extra)

    def end(self) -> str:
        _, err = self.proc.communicate("\n", timeout=60)
        assert self.proc.returncode == 0, err
        return err


def read_counters(current: Path, *extra: str) -> tuple[int, dict]:
    """`python -m checks.hook_counters` from the ops checkout (as on `local`), on the release's
    run/."""
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "checks.hook_counters",
            "--json",
            "--run",
            str(current / "run"),
            *extra,
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return res.returncode, json.loads(res.stdout)


def _keys(doc: dict, td: type) -> None:
    required, optional = td.__required_keys__, td.__optional_keys__  # type: ignore[attr-defined]
    assert required <= doc.keys() <= required | optional, (td.__name__, sorted(doc))


@pytest.fixture
def current(tmp_path: Path) -> Path:
    return fs.release(tmp_path)


def _status(current: Path) -> dict:
    return json.loads(fs.status_file(current).read_text())


# ----------------------------------------------------------------------------- the clock


@pytest.mark.parametrize(
    "spec,version,backend",
    [
        ("measure", "6d9866b3", None),
        ("tree_build=reference,accept=reference", "807ab0e4", None),
        ("tree_build=cpp,accept=cpp", "807ab0e4", "cpp"),
    ],
)
def test_every_call_is_counted_and_timed_per_process(
    current: Path, spec: str, version: str, backend: str | None
) -> None:
    svc = Live(current, spec, fs.VERSIONS[version], budget=32, n=40, raising=2, workspace=True)
    try:
        assert svc.out["backend"] == backend and svc.out["not_stock"] == 0, svc.out
        rc, doc = svc.counters()
        assert rc == 0 and doc["ok"], doc
        assert (doc["files"], doc["live"], doc["dead"]) == (1, 1, 0), doc
        (p,) = doc["processes"]
        assert p["pid"] == svc.out["pid"] == svc.proc.pid and p["file"] == f"{p['pid']}.bin"
        tb, ac = p["components"]["tree_build"], p["components"]["accept"]
        assert (tb["calls"], tb["errors"], ac["calls"], ac["errors"]) == (42, 2, 40, 0), p
        assert tb["shadow"] is None and ac["shadow"] is None
        # the time in the functions: inside the script's own clock around the same calls (which
        # also holds the raising calls' absence and the wrapper's entry and exit)
        inside = tb["seconds"] + ac["seconds"]
        assert 0 < inside and svc.out["wall_s"] > 0.5 * inside, (inside, svc.out["wall_s"])
        assert doc["release"] == current.resolve().name
    finally:
        err = svc.end()
    st = _status(current)
    assert st["active"] and st["counters"] == str(
        current.resolve() / "run" / "hook-counters" / f"{svc.out['pid']}.bin"
    )
    if backend is None:
        assert st["asked"] == {} and st["replaced"] == {}
        assert err.strip().splitlines() == [
            f"ddtree-ops hook: release {current.resolve().name}: nothing replaced, calls "
            f"counted in {hook.MODULE} ({spec})"
        ]
    else:
        assert st["asked"] == {BUILD: "tree_build=cpp", ACCEPT: "accept=cpp"} == st["replaced"]
    # the process is gone: its file is skipped, and said
    rc, doc = read_counters(current)
    assert rc == 0 and (doc["files"], doc["live"], doc["dead"]) == (1, 0, 1), doc


def test_a_refused_dropin_leaves_the_stock_serving_and_counted(
    current: Path, tmp_path: Path
) -> None:
    """A fork version of no known contract: nothing replaced, but the clock still runs."""
    import shutil

    fork = tmp_path / "fork"
    shutil.copytree(fs.V2, fork, ignore=shutil.ignore_patterns("__pycache__"))
    src = fork / fs.MODULE_FILE
    ws = "    workspace: DFlashDDTreeBuildWorkspace | None = None,\n"
    src.write_text(src.read_text().replace(ws, ws + "    chain_len: int = 0,\n"))
    svc = Live(current, "tree_build=cpp", fork, budget=16, n=10)
    try:
        assert svc.out["backend"] is None and svc.out["not_stock"] == 0
        _, doc = svc.counters()
        assert doc["processes"][0]["components"]["tree_build"]["calls"] == 10
    finally:
        svc.end()
    st = _status(current)
    assert st["active"] is False and st["asked"] == {BUILD: "tree_build=cpp"}
    assert st["summary"].startswith("stock builder in use because ") and st["module_found"]


def test_a_forked_child_counts_in_a_file_of_its_own(current: Path) -> None:
    svc = Live(current, "measure", fs.V1, budget=16, n=5, fork=True)
    try:
        _, doc = svc.counters()
        got = {p["pid"]: p["components"]["tree_build"]["calls"] for p in doc["processes"]}
        assert got == {svc.out["pid"]: 5, svc.out["child"]: 3}, doc
    finally:
        svc.end()


def test_the_counting_costs_under_a_microsecond_a_call() -> None:
    """`python -m integration.percall --hook` (the number docs/real-service.md states): here a
    short run, with a bound loose enough for a loaded two-core machine."""
    from integration import percall

    doc = percall.hook_costs(calls=4000, rounds=9, budgets=(16,), shadow_reps=60)
    c = doc["count"]
    assert 0 < c["overhead_ns"] < 5 * percall.COUNT_TARGET_NS, c
    assert c["noop_counted_ns"] > c["noop_ns"]
    (row,) = doc["shadow"]
    assert row["budget"] == 16 and row["added_us"] > 0 and row["every"] == 1


def test_loadtest_mode_takes_the_hook_reading_with_the_snapshots(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`checks.hook_counters --loadtest -- ARGS` replaces the one name checks.loadtest takes
    its snapshots by; if checks.loadtest renames it, this fails (not the profile silently)."""
    from checks import loadtest, probe

    assert loadtest.counters is probe.counters
    monkeypatch.setattr(loadtest, "counters", loadtest.counters)  # put back after the test
    monkeypatch.setattr(probe, "counters", lambda url, timeout: {"at": 1.0, "url": url})
    seen: list = []
    monkeypatch.setattr(
        loadtest, "main", lambda argv: seen.append((argv, loadtest.counters("u", 1)))
    )
    hc._loadtest(tmp_path, ["--url", "u"])
    ((argv, snap),) = seen
    assert argv == ["--url", "u"] and snap["at"] == 1.0 and snap["hook"]["live"] == 0


# ----------------------------------------------------------------------------- the shadow


def test_the_shadow_serves_the_stock_and_times_the_candidate_beside_it(current: Path) -> None:
    spec = "shadow:tree_build=cpp,shadow:accept=cpp"
    svc = Live(current, spec, fs.V2, budget=64, n=30, workspace=True)
    try:
        # the stock answered every call (the workspace's own buffers), answers as the stock's
        assert svc.out["views"] == 30 and svc.out["not_stock"] == 0 and svc.out["backend"] is None
        rc, doc = svc.counters("--pairs")
        assert rc == 0 and doc["mismatched"] == 0 and doc["mismatch_files"] == [], doc
        _keys(doc, docs.HookCountersDoc)  # the document is what checks.docs says it is
        _keys(doc["processes"][0], docs.HookProcess)
        comps = doc["processes"][0]["components"]
        assert comps["gpu_accept"] == {"calls": 0, "seconds": 0.0, "errors": 0, "shadow": None}
        for comp in ("tree_build", "accept"):
            _keys(comps[comp], docs.HookFunction)
            _keys(comps[comp]["shadow"], docs.HookShadow)
        for comp in ("tree_build", "accept"):
            sh = comps[comp]["shadow"]
            assert sh["every"] == 1 and sh["compared"] == comps[comp]["calls"] == 30, (comp, sh)
            assert sh["mismatched"] == sh["cand_errors"] == sh["saved"] == 0
            # the candidate's first call is compared, not timed (a cold start)
            assert sh["pairs"] == 29 and len(sh["ring"]) == 29
            assert [p[0] for p in sh["ring"]] == list(range(29))
            assert all(s > 0 and c > 0 for _, s, c in sh["ring"])
            assert sh["stock_s"] == pytest.approx(sum(s for _, s, _ in sh["ring"]) / 1e9)
            assert sh["overhead_s"] > sh["cand_s"] > 0
        tb = comps["tree_build"]
        # both timed (which is faster is the bench's business, not a unit test's: a loaded
        # runner made a >2x claim fail)
        assert tb["shadow"]["stock_s"] > 0 and tb["shadow"]["cand_s"] > 0, tb
        # f's numerator stays the stock's own time, every call's (the shadow's is apart from it)
        assert tb["seconds"] > tb["shadow"]["stock_s"] > 0
    finally:
        err = svc.end()
    st = _status(current)
    assert st["active"] and st["replaced"] == {}
    assert st["shadowed"] == {BUILD: "shadow:tree_build=cpp", ACCEPT: "shadow:accept=cpp"}
    assert st["in_use"][BUILD] == (
        "stock builder in use, shadowed (shadow:tree_build=cpp: compared, never serving)"
    )
    assert "shadowed build_ddtree_tree_from_topk (shadow:tree_build=cpp)" in err


def test_one_call_in_n_is_compared(current: Path) -> None:
    svc = Live(current, "shadow:tree_build=cpp/4", fs.V1, budget=16, n=40)
    try:
        _, doc = svc.counters()
        tb = doc["processes"][0]["components"]["tree_build"]
        assert tb["calls"] == 40 and tb["shadow"]["every"] == 4
        assert tb["shadow"]["compared"] == 10 and tb["shadow"]["mismatched"] == 0
        assert doc["processes"][0]["components"]["accept"]["shadow"] is None
    finally:
        svc.end()


def test_a_builder_that_breaks_ties_the_other_way_is_caught(current: Path) -> None:
    spec = "shadow:tree_build=ddtree_test_candidates:tie_flipped"
    svc = Live(current, spec, fs.V2, budget=16, n=60, bf16=True, workspace=True)
    try:
        assert svc.out["not_stock"] == 0 and svc.out["views"] == 60  # the service: the stock's
        rc, doc = svc.counters()
        sh = doc["processes"][0]["components"]["tree_build"]["shadow"]
        assert rc == 1 and not doc["ok"], doc
        assert sh["compared"] == 60 and 0 < sh["mismatched"] < 60 and sh["cand_errors"] == 0
        assert sh["saved"] == min(3, sh["mismatched"]) == len(doc["mismatch_files"])
        pid = svc.out["pid"]
        assert doc["mismatch_files"][0] == f"hook-mismatch-{pid}-tree_build-1.json"
    finally:
        svc.end()
    case = current / "run" / doc["mismatch_files"][0]
    saved = json.loads(case.read_text())
    assert saved["candidate"] == "ddtree_test_candidates:tie_flipped"
    assert saved["difference"].startswith("answer[") and "stock" in saved["difference"]
    assert set(saved["inputs"]) == {"top_log_probs", "top_token_ids", "budget"}
    # replayed without the hook: the same difference, from the same inputs; the compiled
    # drop-in on them gives the stock's answer
    env = {**os.environ, "PYTHONPATH": f"{REPO}:{fs.V2}:{fs.CANDIDATES}"}
    env.pop("DDTREE_OPS_SGLANG", None)
    for cand, rc_want in ((None, 1), ("cpp", 0)):
        argv = ["--replay", str(case), *(["--candidate", cand] if cand else [])]
        res = subprocess.run(
            [sys.executable, "-m", "integration.shadow", *argv],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        got = json.loads(res.stdout)
        assert res.returncode == rc_want and got["stock_as_saved"], (res.stderr, got)
        if cand is None:
            assert got["difference"] == saved["difference"]


def test_a_candidate_that_raises_is_a_mismatch_never_the_services(current: Path) -> None:
    svc = Live(current, "shadow:tree_build=ddtree_test_candidates:raises", fs.V1, budget=16, n=8)
    try:
        assert svc.out["not_stock"] == 0 and svc.out["builds"] == 8
        _, doc = svc.counters()
        sh = doc["processes"][0]["components"]["tree_build"]["shadow"]
        assert sh["compared"] == sh["mismatched"] == sh["cand_errors"] == 8
        assert sh["pairs"] == 0 and sh["saved"] == 3
    finally:
        svc.end()
    saved = json.loads((current / "run" / doc["mismatch_files"][0]).read_text())
    assert saved["difference"] == "the candidate raised RuntimeError: this candidate always fails"


def test_a_wrong_walk_is_caught_too(current: Path) -> None:
    spec = "shadow:accept=ddtree_test_candidates:follow_first_child"
    svc = Live(current, spec, fs.V1, budget=16, n=30)
    try:
        _, doc = svc.counters()
        sh = doc["processes"][0]["components"]["accept"]["shadow"]
        assert sh["compared"] == 30 and sh["mismatched"] > 0
    finally:
        svc.end()


def test_a_candidate_that_cannot_load_is_refused_and_the_stock_counted(current: Path) -> None:
    svc = Live(current, "shadow:tree_build=no_such_module:build", fs.V1, budget=16, n=4)
    try:
        _, doc = svc.counters()
        tb = doc["processes"][0]["components"]["tree_build"]
        assert tb["calls"] == 4 and tb["shadow"] is None
    finally:
        err = svc.end()
    st = _status(current)
    assert st["active"] is False and st["asked"] == {
        BUILD: "shadow:tree_build=no_such_module:build"
    }
    assert "shadow candidate tree_build=no_such_module:build cannot run here" in st["reason"]
    assert st["summary"].startswith("stock builder in use because ")
    assert "nothing replaced: shadow candidate" in err


# ----------------------------------------------------------------------------- the setting


@pytest.mark.parametrize(
    "text,replace,shadow",
    [
        ("measure", {}, {}),
        ("tree_build=cpp, measure", {"tree_build": "cpp"}, {}),
        ("accept=cpp,shadow:tree_build=cuda/16", {"accept": "cpp"}, {"tree_build": ("cuda", 16)}),
        ("shadow:tree_build=a.b:c", {}, {"tree_build": ("a.b:c", 1)}),
        ("shadow:tree_build=a.b:c/3", {}, {"tree_build": ("a.b:c", 3)}),
    ],
)
def test_the_setting(text: str, replace: dict, shadow: dict) -> None:
    got = hook.parse_setting(text)
    assert (got.replace, got.shadow) == (replace, shadow)


def test_the_counters_layout_is_read_as_written(tmp_path: Path) -> None:
    from integration import counters

    c = counters.Counters(tmp_path)
    c.set("accept", "calls", 7)
    c.set("accept", "ns", 3_000_000_000)
    c.set("tree_build", "shadow_every", 2)
    doc = hc.read_run(tmp_path)
    (p,) = doc["processes"]
    assert p["pid"] == os.getpid() and p["components"]["accept"]["calls"] == 7
    assert p["components"]["accept"]["seconds"] == 3.0
    assert p["components"]["tree_build"]["shadow"]["every"] == 2
    (tmp_path / hc.COUNTERS_DIR / "12.bin").write_bytes(b"short")
    doc = hc.read_run(tmp_path)
    assert doc["unreadable"] == [{"file": "12.bin", "why": f"5 bytes, not {hc.SIZE}"}]


def test_fifos_in_run_hang_no_reading_of_the_counters(tmp_path: Path) -> None:
    """A FIFO at the hook's status file, at a counters file and at a saved case (made by hand)
    is never waited on: each is unreadable, named, and the reading ends (before: it blocked)."""
    run = tmp_path / "current" / "run"
    (run / "hook-counters").mkdir(parents=True)
    os.mkfifo(run / "hook-status.json")
    os.mkfifo(run / "hook-counters" / "123.bin")
    os.mkfifo(run / "hook-mismatch-1.json")
    code, doc = read_counters(tmp_path / "current")
    assert code == 1 and doc["status"] is None, doc
    assert doc["unreadable"] == [{"file": "123.bin", "why": "123.bin is not a regular file"}]
    assert doc["mismatch_cases"][0]["component"] is None
