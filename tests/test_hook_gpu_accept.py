"""The hook's `gpu_accept` component: the newer fork's GPU accept walk,
`sglang.srt.speculative.triton_ops.ddtree._compute_ddtree_accept_triton_unchecked`, which
`dflash_ddtree_info` imports by name and calls with keywords in its verify step.

Each test starts Python the way the service starts (a release's `current/`, its `service.env`,
`site/` on PYTHONPATH so the hook installs, the stand-in fork package after it:
tests/helpers/fork_standin/v2_807ab0e4, whose `triton_ops/ddtree.py` and `dflash_ddtree_info.py`
were written here from the contract). The script imports `dflash_ddtree_info` as the fork's
worker does, calls its verify accept on random trees (ties of token ids across siblings
common), compares every output with a private copy of the stand-in's stock walk, prints what it
did and waits on stdin, so the test reads the counters of the live process.

On this CPU-only machine `gpu_accept=cuda` cannot serve (torch sees no CUDA device): the hook
says so in one line and the stock walk serves, counted. The `gpu`-marked tests (run on the
device with `python3 -m pytest -m gpu tests/test_hook_gpu_accept.py`) install the CUDA drop-in
and hold it bit for bit to the stand-in's stock on thousands of rows, batch 1-64, budget
16-128, CPU tensors going to the stock.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from helpers import REPO, TESTS
from helpers import fork_standin as fs

from integration import hook

GPU_FN = "_compute_ddtree_accept_triton_unchecked"
GPU_FILE = Path("sglang", "srt", "speculative", "triton_ops", "ddtree.py")
REL = "20270101T000000Z-f0rk5ta"

SERVICE = textwrap.dedent(
    """
    import importlib.util, json, os, sys, torch
    from sglang.srt.speculative import dflash_ddtree_info as info
    from sglang.srt.speculative.triton_ops import ddtree
    a = json.loads(sys.argv[1])
    spec = importlib.util.spec_from_file_location("stock_copy", sys.argv[2])
    stock = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(stock)
    sys.path.insert(0, a["tests"])
    from helpers.triton_accept import random_rows

    dev = a.get("device", "cpu")
    fn = info._compute_ddtree_accept_triton_unchecked
    out = {"pid": os.getpid(), "calls": 0, "rows": 0, "not_stock": 0, "follow": 0,
           "same_object": fn is ddtree._compute_ddtree_accept_triton_unchecked,
           "backend": getattr(fn, "ddtree_ops_backend", None),
           "counted": getattr(fn, "ddtree_ops_counted", None), "deep": 0, "cpu_calls": 0}
    bufs = info.AcceptBuffers()
    seed = 0
    for budget in a["budgets"]:
        for batch in a["batches"]:
            for links in (torch.int32, torch.int64):
                for rep in range(a["reps"]):
                    seed += 1
                    c, t, nt, ns = random_rows(batch, budget + 1, seed=seed, links=links,
                                               p_tie=(0.3, 0.6)[rep % 2],
                                               high_bits=rep == 3)
                    want = [torch.full((batch, budget + 1), 7, dtype=torch.int64),
                            torch.full((batch,), 9, dtype=torch.int32),
                            torch.full((batch, budget + 1), 7, dtype=torch.int64)]
                    stock._compute_ddtree_accept_triton_unchecked(c, t, nt, ns, *want)
                    on = dev if rep % 4 != 2 else "cpu"  # CPU tensors on a GPU host too
                    out["cpu_calls"] += on == "cpu"
                    ids, lens, acc, how = info.accept(
                        c.view(-1).to(on), t.to(on), nt.to(on), ns.to(on), None, bufs)
                    got = [ids.cpu(), lens.cpu(), acc.cpu()]
                    out["not_stock"] += not all(
                        x.dtype == y.dtype and torch.equal(x, y) for x, y in zip(got, want))
                    out["follow"] += how != "gpu"
                    out["calls"] += 1
                    out["rows"] += batch
                    out["deep"] += int((want[1] > 3).sum())
    print(json.dumps(out), flush=True)
    sys.stdin.readline()
    """
)


class Live:
    """A service process started as the release starts one, read while it runs."""

    def __init__(self, current: Path, spec: str, standin: Path = fs.V2, **args) -> None:
        self.current = current
        args = {"budgets": [16, 64], "batches": [1, 3, 8], "reps": 4, **args, "tests": str(TESTS)}
        stock = str(standin / GPU_FILE)
        self.proc = fs.popen(
            current, spec, (standin, fs.CANDIDATES), SERVICE, json.dumps(args), stock
        )
        line = self.proc.stdout.readline()
        assert line, self.proc.communicate(timeout=60)[1]
        self.out = json.loads(line)

    def counters(self) -> dict:
        res = subprocess.run(
            [
                sys.executable,
                "-m",
                "checks.hook_counters",
                "--json",
                "--run",
                str(self.current / "run"),
            ],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
        )
        doc = json.loads(res.stdout)
        (proc,) = [p for p in doc["processes"] if p["pid"] == self.out["pid"]]
        return {"rc": res.returncode, "doc": doc, **proc["components"]}

    def status(self) -> dict:
        return json.loads(fs.status_file(self.current).read_text())

    def end(self) -> list[str]:
        _, err = self.proc.communicate("\n", timeout=60)
        assert self.proc.returncode == 0, err
        return err.strip().splitlines()


@pytest.fixture
def current(tmp_path: Path) -> Path:
    return fs.release(tmp_path / "host")


CALLS = 2 * 2 * 3 * 4  # budgets x link dtypes x batches x reps: Live's defaults


# ----------------------------------------------------------------------------- CPU


def test_measure_counts_the_gpu_walk_under_both_names(current: Path) -> None:
    svc = Live(current, "measure")
    try:
        out = svc.out
        assert out["calls"] == CALLS and out["not_stock"] == 0 and out["follow"] == 0
        assert out["deep"] > 50  # the walks went deep, not just root misses
        # the caller's imported name is the defining module's, counted, the stock serving
        assert out["same_object"] and out["counted"] == "gpu_accept" and out["backend"] is None
        c = svc.counters()
        assert c["rc"] == 0 and c["gpu_accept"]["calls"] == out["calls"], c
        assert c["gpu_accept"]["errors"] == 0 and c["gpu_accept"]["seconds"] > 0
        assert c["gpu_accept"]["shadow"] is None and c["tree_build"]["calls"] == 0
        st = svc.status()
        assert st["active"] and st["reason"] is None and st["replaced"] == {}
        assert st["modules"][GPU_FN] == hook.GPU_MODULE
        assert st["in_use"][GPU_FN] == (
            "stock GPU accept walk in use because DDTREE_OPS_SGLANG keeps it "
            "(gpu_accept not replaced)"
        )
    finally:
        err = svc.end()
    assert err == [
        f"ddtree-ops hook: release {REL}: nothing replaced, calls counted in {m} (measure)"
        for m in (hook.MODULE, hook.GPU_MODULE)
    ]


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU host the drop-in serves")
def test_gpu_accept_cuda_without_a_gpu_is_one_line_and_the_stock_serves_counted(
    current: Path,
) -> None:
    svc = Live(current, "gpu_accept=cuda")
    try:
        out = svc.out
        # the answers are the stock's, every one, through the caller's name
        assert out["calls"] == CALLS and out["not_stock"] == 0 and out["follow"] == 0
        assert out["backend"] is None and out["same_object"] and out["counted"] == "gpu_accept"
        c = svc.counters()
        assert c["gpu_accept"]["calls"] == out["calls"] and c["gpu_accept"]["errors"] == 0
        st = svc.status()
        assert not st["active"] and st["replaced"] == {} and st["module_found"]
        assert st["asked"] == {GPU_FN: "gpu_accept=cuda"}
        why = "gpu_accept=cuda cannot run here: gpu_accept: no CUDA device visible to torch"
        assert st["reason"] == why
        assert st["in_use"][GPU_FN] == f"stock GPU accept walk in use because {why}"
    finally:
        err = svc.end()
    assert err == [
        f"ddtree-ops hook: release {REL}: nothing replaced, calls counted in {hook.MODULE} "
        "(gpu_accept=cuda)",
        f"ddtree-ops hook: release {REL}: nothing replaced: {why}",
    ]


def _standin_with(tmp_path: Path, old: str, new: str) -> Path:
    """A copy of the newer stand-in whose GPU walk has another signature."""
    root = tmp_path / "v_other"
    shutil.copytree(fs.V2, root, ignore=shutil.ignore_patterns("__pycache__"))
    path = root / GPU_FILE
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))
    return root


def test_an_unknown_signature_is_refused_with_one_line(current: Path, tmp_path: Path) -> None:
    other = _standin_with(
        tmp_path,
        "    accept_index_out: torch.Tensor,\n) -> None:",
        "    accept_index_out: torch.Tensor,\n    num_warps: int = 4,\n) -> None:",
    )
    svc = Live(current, "gpu_accept=cuda", other)
    try:
        assert svc.out["not_stock"] == 0 and svc.out["backend"] is None
        assert svc.counters()["gpu_accept"]["calls"] == svc.out["calls"]  # still counted
        st = svc.status()
        assert not st["active"] and st["contracts"] == {}
    finally:
        err = svc.end()
    assert len(err) == 2, err
    line = err[1]
    assert line.startswith(f"ddtree-ops hook: release {REL}: nothing replaced: {hook.GPU_MODULE}")
    assert f"{GPU_FN}(candidates, " in line and "num_warps=4) is not the expected " in line
    assert "(fork 4b08d3cc)" in line and st["in_use"][GPU_FN].startswith(
        "stock GPU accept walk in use because "
    )


def test_the_shadow_catches_a_walk_that_breaks_sibling_ties_the_other_way(current: Path) -> None:
    spec = "shadow:gpu_accept=ddtree_test_candidates:gpu_walk_last_tie"
    svc = Live(current, spec)
    try:
        out = svc.out
        assert out["not_stock"] == 0 and out["backend"] is None  # the stock answered, always
        c = svc.counters()
        sh = c["gpu_accept"]["shadow"]
        assert c["rc"] == 1 and sh["compared"] == out["calls"] == c["gpu_accept"]["calls"]
        assert 0 < sh["mismatched"] < out["calls"] and sh["cand_errors"] == 0
        assert sh["saved"] == 3 and sh["pairs"] == sh["compared"] - 1  # all but the cold first
        st = svc.status()
        assert st["active"] and st["contracts"] == {GPU_FN: "fork 4b08d3cc"}  # recognised
        assert st["shadowed"] == {GPU_FN: spec}
        cases = sorted((current / "run").glob(f"hook-mismatch-{out['pid']}-gpu_accept-*.json"))
        assert len(cases) == 3
        case = json.loads(cases[0].read_text())
        assert case["function"] == GPU_FN and "answer[" in case["difference"]
        assert list(case["inputs"]) == list(hook.CONTRACTS[-1].core)
    finally:
        svc.end()
    env = fs.service_env(current, "off", fs.V2, fs.CANDIDATES)
    del env[hook.ENV_SPEC]
    res = subprocess.run(
        [sys.executable, "-m", "integration.shadow", "--replay", str(cases[0])],
        cwd=current,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    doc = json.loads(res.stdout)
    assert res.returncode == 1 and not doc["same"] and doc["stock_as_saved"], doc
    assert doc["difference"] == case["difference"]


def test_the_shadow_of_a_correct_walk_finds_nothing(current: Path) -> None:
    svc = Live(current, "shadow:gpu_accept=integration.gpu_accept:reference_into/2")
    try:
        c = svc.counters()
        sh = c["gpu_accept"]["shadow"]
        assert c["rc"] == 0 and sh["every"] == 2 and sh["compared"] == svc.out["calls"] // 2
        assert sh["mismatched"] == 0 and sh["pairs"] == sh["compared"] - 1  # the first: cold
        assert sh["stock_s"] > 0 and sh["cand_s"] > 0 and svc.out["not_stock"] == 0
    finally:
        svc.end()


# ----------------------------------------------------------------------------- GPU


@pytest.mark.gpu
def test_the_cuda_dropin_serves_bit_exact_with_the_stock_walk(current: Path) -> None:
    """Installed by the hook over the stand-in: both names are the drop-in, every output of
    thousands of rows (batch 1-64, budget 16-128, int32 and int64 links, ties across siblings,
    tokens that agree in their low 32 bits) equal to the stand-in's stock walk, CPU tensors
    going to the stock, every call counted."""
    args = {
        "budgets": [16, 32, 64, 128],
        "batches": [1, 2, 8, 17, 32, 64],
        "reps": 8,
        "device": "cuda",
    }
    svc = Live(current, "gpu_accept=cuda", **args)
    try:
        out = svc.out
        assert out["backend"] == "cuda" and out["same_object"] and out["counted"] == "gpu_accept"
        assert out["calls"] == 4 * 6 * 2 * 8 and out["rows"] >= 4 * 124 * 2 * 8  # 7936 rows
        assert out["not_stock"] == 0 and out["follow"] == 0 and out["cpu_calls"] == 4 * 6 * 2 * 2
        c = svc.counters()
        assert c["gpu_accept"]["calls"] == out["calls"] and c["gpu_accept"]["errors"] == 0
        st = svc.status()
        assert st["active"] and st["replaced"] == {GPU_FN: "gpu_accept=cuda"}
        assert st["contracts"] == {GPU_FN: "fork 4b08d3cc"}
    finally:
        err = svc.end()
    assert err[-1] == (
        f"ddtree-ops hook: release {REL}: replaced {GPU_FN} (gpu_accept=cuda) in {hook.GPU_MODULE}"
    )


@pytest.mark.gpu
def test_the_cuda_dropin_in_a_shadow_finds_no_mismatch(current: Path) -> None:
    args = {"budgets": [16, 128], "batches": [1, 64], "reps": 4, "device": "cuda"}
    svc = Live(current, "shadow:gpu_accept=cuda", **args)
    try:
        c = svc.counters()
        sh = c["gpu_accept"]["shadow"]
        assert c["rc"] == 0 and sh["compared"] == svc.out["calls"] == 2 * 2 * 2 * 4
        assert sh["mismatched"] == 0 and sh["cand_errors"] == 0 and svc.out["not_stock"] == 0
        assert sh["pairs"] == sh["compared"] - 1 and sh["cand_s"] > 0
    finally:
        svc.end()
