"""Both versions of the fork's builder contract, recognised by signature; a third one refused.

The stand-ins (tests/helpers/fork_standin/, written from the contract) are the fork's module at
6d9866b3 (three parameters) and at 807ab0e4 (`workspace: DFlashDDTreeBuildWorkspace | None =
None`). Each test here starts Python the way the service starts: from a release's `current/`,
PYTHONPATH = its `site/` (the sitecustomize that installs the hook), its root, then the
stand-in; `DDTREE_OPS_SGLANG` from its `service.env`. The script imports the module by name as
the fork's worker does and compares every answer with a private copy of the stock module.
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
from helpers import REPO
from helpers import fork_standin as fs

from integration import fork_style, hook

BUILD, ACCEPT = "build_ddtree_tree_from_topk", "follow_verified_tree"
REL = "20270101T000000Z-f0rk5ta"

# The worker's way (SyJarvis/sglang dflash_ddtree_worker.py): H = K = budget rows of float32
# log-probs and int64 ids, the builder by name (with the worker's workspace, keyword or not,
# where the module has one), the accept walk on a row of the target's argmax [1 + budget].
SERVICE = textwrap.dedent(
    """
    import importlib.util, inspect, json, sys, torch
    from sglang.srt.speculative import dflash_ddtree_utils as mod
    from sglang.srt.speculative.dflash_ddtree_utils import (
        build_ddtree_tree_from_topk as build, follow_verified_tree as follow)
    spec = importlib.util.spec_from_file_location("stock_copy", sys.argv[1])
    stock = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(stock)
    ws_cls = getattr(mod, "DFlashDDTreeBuildWorkspace", None)
    ours_ws, stock_ws = (ws_cls(), stock.DFlashDDTreeBuildWorkspace()) if ws_cls else (None, None)
    extra = [*inspect.signature(stock.build_ddtree_tree_from_topk).parameters.values(), None][3]

    def same(a, b):
        if isinstance(b, torch.Tensor):
            return (type(a) is torch.Tensor and a.dtype == b.dtype and a.shape == b.shape
                    and torch.equal(a, b))
        if isinstance(b, (list, tuple)):
            return (type(a) is type(b) and len(a) == len(b)
                    and all(same(x, y) for x, y in zip(a, b)))
        return type(a) is type(b) and a == b

    def plain(fn):  # the signature without annotations
        sig = inspect.signature(fn)
        params = [p.replace(annotation=p.empty) for p in sig.parameters.values()]
        return str(sig.replace(parameters=params, return_annotation=sig.empty))

    g = torch.Generator().manual_seed(int(sys.argv[2]))
    bad = walks = deep = 0
    for i in range(int(sys.argv[3])):
        b = (16, 64, 128)[i % 3]
        x = torch.randn(b, 2048, generator=g) * (3.0, 5.0, 8.0)[i % 3]
        lp, ids = torch.log_softmax(x, -1).topk(b, dim=-1)
        if i % 4 == 1:  # quantised log-probs: ties everywhere
            lp = (lp * 4).round() / 4
        if ws_cls is None:
            got, want = build(lp, ids, b), stock.build_ddtree_tree_from_topk(lp, ids, b)
        elif i % 2 or extra.kind == extra.KEYWORD_ONLY:  # as the worker calls it
            got = build(lp, ids, b, **{extra.name: ours_ws})
            want = stock.build_ddtree_tree_from_topk(lp, ids, b, **{extra.name: stock_ws})
        else:
            got = build(lp, ids, b, ours_ws if i % 3 else None)
            want = stock.build_ddtree_tree_from_topk(lp, ids, b, stock_ws if i % 3 else None)
        bad += not same(got, want)
        target = torch.randint(0, 50000, (1, 1 + b), generator=g)
        for node, kids in enumerate(want[3]):
            u = float(torch.rand(1, generator=g))
            if kids and u < 0.85:  # the best child mostly, as a good drafter's target agrees
                pick = 0 if u < 0.6 else int(torch.randint(0, len(kids), (1,), generator=g))
                target[0, node] = list(kids)[pick]
        w = follow(got[3], target[0])
        bad += not same(w, stock.follow_verified_tree(want[3], target[0]))
        walks += 1
        deep += len(w[0]) > 3
    print(json.dumps({"build": getattr(build, "ddtree_ops_backend", None),
                      "accept": getattr(follow, "ddtree_ops_backend", None),
                      "signature": plain(build),
                      "stock_signature": plain(stock.build_ddtree_tree_from_topk),
                      "mismatches": bad, "walks": walks, "deep": deep}))
    """
)


@pytest.fixture(scope="module")
def current(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return fs.release(tmp_path_factory.mktemp("host"))


def _run(current: Path, spec: str, standin: Path, n: int = 90, seed: int = 5):
    stock_file = standin / fs.MODULE_FILE
    proc = fs.start(current, spec, standin, SERVICE, str(stock_file), str(seed), str(n))
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout), proc.stderr.strip().splitlines()


@pytest.mark.parametrize("version", ["6d9866b3", "807ab0e4"])
def test_hook_replaces_the_builder_on_both_versions(current: Path, version: str) -> None:
    out, err = _run(current, "tree_build=cpp,accept=cpp", fs.VERSIONS[version])
    assert out["build"] == "cpp" and out["accept"] == "cpp", out
    assert out["mismatches"] == 0 and out["walks"] == 90 and out["deep"] > 20, out
    assert out["signature"] == out["stock_signature"]  # the drop-in has the fork's signature
    assert err == [
        f"ddtree-ops hook: release {REL}: replaced {BUILD} (tree_build=cpp), "
        f"{ACCEPT} (accept=cpp) in {hook.MODULE}"
    ]
    st = json.loads(fs.status_file(current).read_text())
    assert st["active"] and st["replaced"] == {BUILD: "tree_build=cpp", ACCEPT: "accept=cpp"}
    assert st["contracts"] == {BUILD: f"fork {version}", ACCEPT: "fork 6d9866b3"}
    in_use = f"drop-in builder in use (tree_build=cpp, fork {version} contract)"
    assert st["in_use"][BUILD] == in_use
    assert st["reason"] is None and "stock" not in st["summary"]


def test_one_component_replaced_says_the_other_is_stock(current: Path) -> None:
    out, err = _run(current, "tree_build=cpp", fs.V2, n=12)
    assert out["build"] == "cpp" and out["accept"] is None and out["mismatches"] == 0
    st = json.loads(fs.status_file(current).read_text())
    assert st["in_use"][ACCEPT] == (
        "stock accept walk in use because DDTREE_OPS_SGLANG keeps it (accept not replaced)"
    )


def _variant(tmp_path: Path, *edits: tuple[str, str]) -> Path:
    """The 807ab0e4 stand-in with lines of its module changed (a fork version we do not know)."""
    root = tmp_path / "fork"
    shutil.copytree(fs.V2, root, ignore=shutil.ignore_patterns("__pycache__"))
    src = root / fs.MODULE_FILE
    text = src.read_text()
    for old, new in edits:
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    src.write_text(text)
    return root


WS = "    workspace: DFlashDDTreeBuildWorkspace | None = None,\n"
RENAMED = [(WS, WS.replace("workspace:", "scratch:")), ("ws = workspace\n", "ws = scratch\n")]


@pytest.mark.parametrize(
    "edits,why",
    [
        ([(WS, WS + "    chain_len: int = 0,\n")], "budget, workspace=None, chain_len=0) is not"),
        ([(WS, "    *,\n" + WS)], "budget, kw:workspace=None) is not"),  # a kind changed
        ([(WS, WS.replace("= None", "= False"))], "budget, workspace=False) is not"),  # a default
        (RENAMED, "budget, scratch=None) is not"),  # a name
    ],
)
def test_a_third_signature_is_refused_and_the_stock_kept(
    current: Path, tmp_path: Path, edits: list, why: str
) -> None:
    fork = _variant(tmp_path, *edits)
    out, err = _run(current, "tree_build=cpp,accept=cpp", fork, n=1)
    assert out["build"] is None and out["accept"] is None and out["mismatches"] == 0, out
    assert len(err) == 1, err
    assert err[0].startswith(f"ddtree-ops hook: release {REL}: nothing replaced: {hook.MODULE}.")
    assert why in err[0] and "(fork 6d9866b3) or" in err[0] and "(fork 807ab0e4)" in err[0]
    st = json.loads(fs.status_file(current).read_text())
    assert st["active"] is False and st["replaced"] == {} and why in st["reason"]
    assert st["in_use"][BUILD] == f"stock builder in use because {st['reason']}"
    assert st["summary"].startswith("stock builder in use because ")


def test_workspace_class_missing_is_refused(current: Path, tmp_path: Path) -> None:
    fork = _variant(tmp_path, ("class DFlashDDTreeBuildWorkspace:", "class BuildWorkspace:"))
    proc = fs.start(
        current,
        "tree_build=cpp",
        fork,
        "import sglang.srt.speculative."
        "dflash_ddtree_utils as m; print(hasattr(m.build_ddtree_tree_from_topk, "
        "'ddtree_ops_backend'))",
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "False", proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.endswith(
        f"nothing replaced: {hook.MODULE} has no class "
        "DFlashDDTreeBuildWorkspace (the type of workspace)"
    )
    st = json.loads(fs.status_file(current).read_text())
    assert st["summary"].startswith("stock builder in use because ") and not st["active"]


# ----------------------------------------------------------------------------- the stand-ins


def test_standins_and_the_fork_style_baseline_agree() -> None:
    """The two stand-ins (with and without a workspace) and integration.fork_style (the per-call
    baseline and the bench's reference) give the same answers, float64 inputs included."""
    v1, v2 = fs.load_copy(fs.V1, "standin_v1"), fs.load_copy(fs.V2, "standin_v2")
    ws = v2.DFlashDDTreeBuildWorkspace()
    g = torch.Generator().manual_seed(11)
    for i in range(120):
        h, k, budget = [(16, 16, 16), (15, 8, 64), (3, 2, 40), (5, 64, 9)][i % 4]
        lp = torch.log_softmax(torch.randn(h, 256, generator=g, dtype=torch.float64) * 2, -1)
        vals, ids = lp.topk(k, dim=-1)
        if i % 3 == 0:
            vals = vals.float()
        want = v1.build_ddtree_tree_from_topk(vals, ids, budget)
        for got in (
            fork_style.build_ddtree_tree_from_topk(vals, ids, budget),
            v2.build_ddtree_tree_from_topk(vals, ids, budget),
            v2.build_ddtree_tree_from_topk(vals, ids, budget, workspace=ws),
        ):
            for a, b in zip(got, want, strict=True):
                if isinstance(b, torch.Tensor):
                    assert a.dtype == b.dtype and torch.equal(a, b), i
                else:
                    assert a == b, i
    # with a workspace the tensors are views of its buffers (the caller copies out)
    out = v2.build_ddtree_tree_from_topk(vals, ids, budget, workspace=ws)
    assert out[0].data_ptr() == ws.node_token_ids_np.ctypes.data
    small = v2.build_ddtree_tree_from_topk(vals[:1, :2], ids[:1, :2], 9, workspace=ws)
    assert small[4].shape == (3, 3) and not small[4].is_contiguous()
    no_column = torch.empty(3, 0), torch.empty(3, 0, dtype=torch.long)
    for mod in (v1, v2, fork_style):
        with pytest.raises(IndexError, match="index 0 is out of bounds for axis 1 with size 0"):
            mod.build_ddtree_tree_from_topk(*no_column, 4)


# ----------------------------------------------------------------------------- per-call cost


def test_percall_measures_the_fork_style_builder_beside_the_dropin() -> None:
    """integration.percall (what a bench suite calls): same answers, both timed, the targets
    named; the speedups themselves are recorded runs, not asserted here (a shared CPU)."""
    argv = [sys.executable, "-m", "integration.percall", "--budgets", "16,24", "--reps", "12"]
    proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode in (0, 1), proc.stderr
    doc = json.loads(proc.stdout)
    kinds = [(r["kernel"], r["shape"]["budget"]) for r in doc["rows"]]
    assert kinds == [(BUILD, 16), (ACCEPT, 16), (BUILD, 24), (ACCEPT, 24)]
    for r in doc["rows"]:
        assert r["refcheck"] is True and r["shape"]["H"] == r["shape"]["K"] == r["shape"]["budget"]
        assert set(r["impls"]) >= {"fork_style", "dropin_cpp"} and r["speedup"] > 0
        assert all(v["median_us"] > 0 for v in r["impls"].values())
    assert [r["target"] for r in doc["rows"] if r["kernel"] == BUILD] == [4.0, 4.0]
    assert doc["env"]["cores"] and "load_avg" in doc["env"]
