"""The SGLang integration: drop-ins bit-exact with the stand-in's stock code, and the import hook.

The stand-in (`tests/fixtures/sglang_stub`) holds a plain Python implementation of issue 18's
contract under the fork's module path. In-process tests install the hook with an explicit
environment; the end-to-end tests start Python the way the service is started (PYTHONPATH to a
temporary release's `site/` and root, the environment from its `service.env`).
"""

from __future__ import annotations

import importlib
import json
import os
import pickle
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from integration import hook
from integration import sglang_dropins as dropins

REPO = Path(__file__).resolve().parent.parent
STUB = REPO / "tests" / "fixtures" / "sglang_stub"
BUILD, ACCEPT = "build_ddtree_tree_from_topk", "follow_verified_tree"


@pytest.fixture
def fresh(monkeypatch: pytest.MonkeyPatch):
    """No sglang module and no hook before and after the test; returns an env builder."""

    def drop() -> None:
        for f in [f for f in sys.meta_path if isinstance(f, hook.Hook)]:
            sys.meta_path.remove(f)
        for name in [n for n in sys.modules if n == "sglang" or n.startswith("sglang.")]:
            del sys.modules[name]
        importlib.invalidate_caches()

    drop()
    yield
    drop()


def _env(tmp_path: Path, spec: str | None, **extra: str) -> dict[str, str]:
    env = {hook.ENV_STATUS: str(tmp_path / "hook-status.json"), hook.ENV_RELEASE: "rel-test"}
    if spec is not None:
        env[hook.ENV_SPEC] = spec
    return {**env, **extra}


def _status(tmp_path: Path) -> dict:
    return json.loads((tmp_path / "hook-status.json").read_text())


# ----------------------------------------------------------------------------- random cases


def random_case(g: torch.Generator, i: int):
    """(top_log_probs, top_token_ids, budget): ties (quantised, tiny), odd shapes and dtypes."""
    h = [15, 15, 15, 1, 4, 0, 32][i % 7]
    k = int(torch.randint(1, 65, (1,), generator=g))
    budget = [16, 64, 128, 1, 2, 0, -3, 300, 7][i % 9]
    kind = i % 4
    if kind in (0, 1):  # quantised: scores tie everywhere (0.1 is inexact: 1-ulp near-ties)
        lp = -torch.randint(0, 6, (h, k), generator=g).float() * (0.25, 0.1)[kind]
    elif kind == 2:  # ties far below a score's ulp
        lp = torch.full((h, k), -1e-9)
        if h:
            lp[0] = -3.0 - torch.arange(k) * 1e-9 - float(torch.rand(1, generator=g)) * 4
        lp[:, ::3] -= 2e-9
    else:
        lp = torch.log_softmax(torch.randn(h, 4 * k, generator=g) * 2.5, -1)[:, :k]
    lp = lp.sort(dim=-1, descending=True).values
    if i % 11 == 5:  # other float dtypes the service might hand over
        lp = lp.to((torch.bfloat16, torch.float64)[i % 2])
    # distinct tokens in a row, as a top-k gives them
    perm = torch.rand(h, k, generator=g).argsort(dim=-1)
    ids = (torch.randint(0, 163840, (h, 1), generator=g) + perm * 37) % 163840
    if i % 13 == 6:  # repeated tokens in a row (never from a real top-k): dict order decides
        ids = ids % 3
    return lp.contiguous(), ids.contiguous(), budget


def posterior_for(child_maps: list, g: torch.Generator) -> torch.Tensor:
    """Target tokens per node that follow a child 85% of the time."""
    post = torch.randint(0, 163840, (len(child_maps),), generator=g)
    for node, kids in enumerate(child_maps):
        if kids and float(torch.rand(1, generator=g)) < 0.85:
            toks = list(kids)
            post[node] = toks[int(torch.randint(0, len(toks), (1,), generator=g))]
    return post


def assert_same(got: tuple, want: tuple, where: str) -> None:
    assert len(got) == len(want) == 7, where
    for idx, (a, b) in enumerate(zip(got, want, strict=True)):
        if isinstance(b, torch.Tensor):
            assert isinstance(a, torch.Tensor), (where, idx)
            assert (a.dtype, a.shape, a.device) == (b.dtype, b.shape, b.device), (where, idx)
            assert a.is_contiguous() and torch.equal(a, b), (where, idx)
        else:
            assert type(a) is type(b) or isinstance(a, type(b)), (where, idx)
            assert a == b, (where, idx)
            assert all(type(x) is type(y) for x, y in zip(a, b, strict=True)), (where, idx)


# ----------------------------------------------------------------------------- the hook on


def test_hook_on_makes_the_functions_ours_and_identical(fresh, monkeypatch, tmp_path, capsys):
    monkeypatch.syspath_prepend(str(STUB))
    installed = hook.install(_env(tmp_path, "tree_build=cpp,accept=cpp"))
    assert installed is not None and installed in sys.meta_path
    assert capsys.readouterr().err == ""  # armed: nothing to say until the module comes
    mod = importlib.import_module(hook.MODULE)
    from sglang.srt.speculative.dflash_ddtree_utils import build_ddtree_tree_from_topk as b

    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "release rel-test: replaced build_ddtree_tree_from_topk" in err[0]
    assert "follow_verified_tree (accept=cpp)" in err[0]
    assert b is mod.build_ddtree_tree_from_topk and b.ddtree_ops_backend == "cpp"
    assert mod.follow_verified_tree.ddtree_ops_backend == "cpp"
    stock_build, stock_follow = installed.stock[BUILD], installed.stock[ACCEPT]
    assert stock_build.__module__ == hook.MODULE and mod.STUB_MARKER  # the rest stays
    st = _status(tmp_path)
    assert st["active"] and st["release_id"] == "rel-test" and st["pid"] == os.getpid()
    assert st["replaced"] == {BUILD: "tree_build=cpp", ACCEPT: "accept=cpp"}

    g = torch.Generator().manual_seed(18)
    walks = deep = 0
    for i in range(2000):
        lp, ids, budget = random_case(g, i)
        want = stock_build(lp, ids, budget)
        got = mod.build_ddtree_tree_from_topk(lp, ids, budget)
        assert_same(got, want, f"case {i}: H,K={tuple(lp.shape)} budget={budget} {lp.dtype}")
        post = posterior_for(want[3], g)
        want_walk = stock_follow(want[3], post)
        for maps in (got[3], want[3]):  # our ChildMaps (C++ walk) and a plain list
            got_walk = mod.follow_verified_tree(maps, post)
            assert got_walk == want_walk and type(got_walk[1]) is type(want_walk[1]), i
        walks += 1
        deep += len(want_walk[0]) > 3
    assert walks == 2000 and deep > 250  # the walks went deep, not just root misses


def test_dropins_agree_with_stock_on_every_cpu_backend(fresh, monkeypatch):
    monkeypatch.syspath_prepend(str(STUB))
    stock = importlib.import_module(hook.MODULE)
    g = torch.Generator().manual_seed(7)
    for i in range(400):
        lp, ids, budget = random_case(g, i)
        want = stock.build_ddtree_tree_from_topk(lp, ids, budget)
        for backend in ("cpp", "python"):
            assert_same(dropins.build_tree(lp, ids, budget, backend=backend), want, f"{i}")
    # the batched entry point on the C++ builder: one call, B answers
    lp = torch.log_softmax(torch.randn(6, 15, 256, generator=g) * 3, -1).topk(8, -1)
    batch = dropins.build_ddtree_trees(lp.values, lp.indices, 64, backend="cpp")
    for b, got in enumerate(batch):
        assert_same(got, stock.build_ddtree_tree_from_topk(lp.values[b], lp.indices[b], 64), "")


def test_child_maps_are_a_plain_list_of_dicts():
    lp = torch.tensor([[-0.25, -0.5], [-0.25, -1.0]])
    maps = dropins.build_tree(lp, torch.tensor([[5, 6], [7, 8]]), 8, backend="cpp")[3]
    # pop order: 5 (-.25), 7 under 5 (-.5), 6 (-.5), 7 under 6 (-.75), 8 under 5, 8 under 6
    assert type(maps) is list and all(type(m) is dict for m in maps)  # the fork's own types
    assert maps == [{5: 1, 6: 3}, {7: 2, 8: 5}, {}, {7: 4, 8: 6}, {}, {}, {}]
    back = pickle.loads(pickle.dumps(maps))
    assert type(back) is list and back == maps
    post = torch.tensor([6, 9, 9, 8, 9, 9, 42])
    for m in (maps, back):  # the C walk reads the dicts themselves
        assert dropins.follow_tree(m, post, backend="cpp") == ([0, 3, 6], 42)


def test_dropin_signatures_are_the_contract():
    from integration import gpu_accept

    makers = {
        "tree_build": lambda kind, passive: dropins.make_build(kind, None, passive),
        "accept": lambda kind, passive: dropins.make_accept(kind),
        "gpu_accept": lambda kind, passive: gpu_accept.make_gpu_accept(kind),  # no GPU needed
    }
    assert set(makers) == set(hook.COMPONENTS)
    made_for = set()
    for contract in hook.CONTRACTS:
        comp = contract.component
        for kind in hook.COMPONENTS[comp].kinds:
            passive = tuple((n, None, object) for n, _ in contract.passive)
            made = makers[comp](kind, passive)
            assert hook.describe(made) == contract.params, (contract, kind)
            made_for.add(comp)
    assert made_for == set(hook.COMPONENTS)  # every component has a contract


# ----------------------------------------------------------------------------- the hook refusing


def _assert_untouched(mod, err: str, tmp_path: Path, reason: str) -> None:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ddtree-ops hook: release rel-test: "), err
    assert "nothing replaced" in lines[0] and reason in lines[0], lines[0]
    if mod is not None:
        for name in (BUILD, ACCEPT, "walk_verified_tree"):
            fn = getattr(mod, name, None)
            assert fn is None or fn.__module__ == hook.MODULE, name
            assert not hasattr(fn, "ddtree_ops_backend"), name
    st = _status(tmp_path)
    assert st["active"] is False and st["replaced"] == {} and reason in st["reason"]


def test_hook_off_does_nothing(fresh, monkeypatch, tmp_path, capsys):
    monkeypatch.syspath_prepend(str(STUB))
    assert hook.install(_env(tmp_path, None)) is None
    assert hook.install(_env(tmp_path, "  ")) is None
    mod = importlib.import_module(hook.MODULE)
    assert capsys.readouterr().err == "" and not (tmp_path / "hook-status.json").exists()
    assert mod.build_ddtree_tree_from_topk.__module__ == hook.MODULE
    assert not any(isinstance(f, hook.Hook) for f in sys.meta_path)


@pytest.mark.parametrize(
    "spec,reason",
    [
        ("off", "DDTREE_OPS_SGLANG=off"),
        ("tree_build=cpp,shadow:tree_build=cpp", "tree_build is named twice"),
        ("shadow:tree_build=cpp/0", "bad item 'shadow:tree_build=cpp/0'"),
        ("shadow:accept=reference", "bad item 'shadow:accept=reference'"),
        ("shadow:tree_build=not a path", "bad item"),
        ("tree_build=gpu", "bad item 'tree_build=gpu'"),
        ("tree_build=cpp,draft=cpp", "bad item 'draft=cpp'"),
        ("accept=cuda", "bad item 'accept=cuda'"),
    ],
)
def test_hook_switched_off_or_misconfigured(fresh, monkeypatch, tmp_path, capsys, spec, reason):
    monkeypatch.syspath_prepend(str(STUB))
    assert hook.install(_env(tmp_path, spec)) is None
    err = capsys.readouterr().err
    _assert_untouched(importlib.import_module(hook.MODULE), err, tmp_path, reason)


def test_missing_module(fresh, monkeypatch, tmp_path, capsys):
    # no sglang at all
    assert hook.install(_env(tmp_path, "tree_build=cpp")) is None
    _assert_untouched(None, capsys.readouterr().err, tmp_path, "no module named 'sglang'")
    # sglang there, but a fork without the DDTree module
    pkg = tmp_path / "site" / "sglang" / "srt" / "speculative"
    pkg.mkdir(parents=True)
    for d in (pkg, pkg.parent, pkg.parent.parent):
        (d / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    assert hook.install(_env(tmp_path, "tree_build=cpp,accept=cpp")) is None
    _assert_untouched(
        None, capsys.readouterr().err, tmp_path, "no module named " + repr(hook.MODULE)
    )
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(hook.MODULE)


@pytest.mark.parametrize(
    "old,new,reason",
    [
        (
            "def build_ddtree_tree_from_topk(top_log_probs, top_token_ids, budget):",
            "def build_ddtree_tree_from_topk(top_log_probs, top_token_ids, budget, depth=None):",
            "(top_log_probs, top_token_ids, budget, depth=None) is not the expected",
        ),
        (
            "def follow_verified_tree(child_maps, posterior):",
            "def follow_verified_tree(child_maps, posterior_ids):",
            "follow_verified_tree(child_maps, posterior_ids) is not the expected",
        ),
        (
            "def follow_verified_tree(child_maps, posterior):",
            "def walk_verified_tree(child_maps, posterior):",
            "has no function follow_verified_tree",
        ),
    ],
)
def test_changed_signature_leaves_module_untouched(
    fresh, monkeypatch, tmp_path, capsys, old, new, reason
):
    fork = tmp_path / "fork"
    shutil.copytree(STUB, fork)
    src = fork / "sglang" / "srt" / "speculative" / "dflash_ddtree_utils.py"
    text = src.read_text()
    assert old in text
    src.write_text(text.replace(old, new))
    monkeypatch.syspath_prepend(str(fork))
    assert hook.install(_env(tmp_path, "tree_build=cpp,accept=cpp")) is not None
    mod = importlib.import_module(hook.MODULE)
    err = capsys.readouterr().err
    assert "is not the expected" in err or "has no function" in err
    _assert_untouched(mod, err, tmp_path, reason)


def test_backend_that_cannot_run_leaves_module_untouched(fresh, monkeypatch, tmp_path, capsys):
    monkeypatch.syspath_prepend(str(STUB))
    monkeypatch.setenv("DDTREE_KERNELS_LIB", str(tmp_path / "nowhere.so"))
    assert hook.install(_env(tmp_path, "tree_build=cuda,accept=cpp")) is not None
    mod = importlib.import_module(hook.MODULE)
    _assert_untouched(mod, capsys.readouterr().err, tmp_path, "tree_build=cuda cannot run here")


def test_status_reader(tmp_path, capsys):
    path = tmp_path / "s.json"
    assert hook.main(["--json", "--status", str(path)]) == 0
    assert json.loads(capsys.readouterr().out)["present"] is False
    hook.write_status(path, {"active": True, "replaced": {BUILD: "tree_build=cpp"}})
    assert hook.main(["--json", "--status", str(path)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["present"] and doc["status"]["replaced"] == {BUILD: "tree_build=cpp"}


# ----------------------------------------------------------------------------- end to end

SERVICE = textwrap.dedent(
    """
    import importlib.util, json, sys, torch
    # how a worker would use them: imported by name from the fork's module
    from sglang.srt.speculative.dflash_ddtree_utils import (
        build_ddtree_tree_from_topk, follow_verified_tree)
    spec = importlib.util.spec_from_file_location("stock_copy", sys.argv[1])
    stock = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(stock)
    g = torch.Generator().manual_seed(3)
    bad = 0
    for i in range(150):
        lp = -torch.randint(0, 6, (15, 8), generator=g).float() * 0.25
        lp = lp.sort(-1, descending=True).values
        ids = torch.randint(0, 1000, (15, 8), generator=g)
        a = build_ddtree_tree_from_topk(lp, ids, (16, 64, 128)[i % 3])
        b = stock.build_ddtree_tree_from_topk(lp, ids, (16, 64, 128)[i % 3])
        same = all(torch.equal(x, y) if isinstance(x, torch.Tensor) else x == y
                   for x, y in zip(a, b))
        post = torch.tensor([next(iter(m), 0) for m in b[3]])
        walk = follow_verified_tree(a[3], post)
        bad += not same or walk != stock.follow_verified_tree(b[3], post)
    print(json.dumps({"backend": getattr(build_ddtree_tree_from_topk, "ddtree_ops_backend", None),
                      "accept": getattr(follow_verified_tree, "ddtree_ops_backend", None),
                      "mismatches": bad}))
    """
)


def _release(tmp_path: Path) -> Path:
    """A release laid out as the deploy makes it: code at the root, site/ beside it."""
    rel = tmp_path / "releases" / "20261201T000000Z-abc1234"
    for pkg in ("integration", "kernels", "checks"):
        shutil.copytree(REPO / pkg, rel / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(REPO / "integration" / "site", rel / "site")
    (tmp_path / "current").symlink_to(rel)
    return tmp_path / "current"


def _start_service(current: Path, spec: str) -> tuple[subprocess.CompletedProcess, Path]:
    """Start Python as the process manager does: cwd current/, env from current/service.env."""
    rel = current.resolve()
    (rel / "service.env").write_text(
        f"DDTREE_OPS_SGLANG={spec}\nDDTREE_RELEASE_ID={rel.name}\n"
        f"PYTHONPATH={current}/site:{current}:{STUB}\n"
    )
    env = {k: os.environ[k] for k in ("PATH", "HOME", "DDTREE_CACHE") if k in os.environ}
    for line in (current / "service.env").read_text().splitlines():
        key, _, value = line.partition("=")
        env[key] = value
    stock = STUB / "sglang" / "srt" / "speculative" / "dflash_ddtree_utils.py"
    proc = subprocess.run(
        [sys.executable, "-c", SERVICE, str(stock)],
        cwd=current,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return proc, rel / "run" / "hook-status.json"


def test_service_started_with_release_env_swaps_end_to_end(tmp_path):
    current = _release(tmp_path)
    proc, status_file = _start_service(current, "tree_build=cpp,accept=cpp")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out == {"backend": "cpp", "accept": "cpp", "mismatches": 0}
    rel = current.resolve().name
    assert proc.stderr.strip().splitlines() == [
        f"ddtree-ops hook: release {rel}: replaced build_ddtree_tree_from_topk (tree_build=cpp), "
        f"follow_verified_tree (accept=cpp) in {hook.MODULE}"
    ]
    st = json.loads(status_file.read_text())
    assert st["active"] and st["release_id"] == rel and len(st["replaced"]) == 2
    assert st["hook"] == str(current.resolve() / "integration" / "hook.py")
    # switched off in service.env: the same code runs the stock functions again
    proc, status_file = _start_service(current, "off")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {"backend": None, "accept": None, "mismatches": 0}
    assert proc.stderr.strip() == f"ddtree-ops hook: release {rel}: nothing replaced: " + (
        "DDTREE_OPS_SGLANG=off"
    )
    assert json.loads(status_file.read_text())["active"] is False


# ----------------------------------------------------------------------------- GPU


@pytest.mark.gpu
def test_cuda_dropin_matches_stock(fresh, monkeypatch):
    monkeypatch.syspath_prepend(str(STUB))
    stock = importlib.import_module(hook.MODULE)
    dropins.check_backend("tree_build", "cuda")
    g = torch.Generator().manual_seed(90)
    for i in range(1500):
        lp, ids, budget = random_case(g, i)
        want = stock.build_ddtree_tree_from_topk(lp, ids, budget)
        assert_same(dropins.build_tree(lp, ids, budget, backend="cuda"), want, f"case {i}")
    for budget in (16, 64, 128):
        lp = torch.log_softmax(torch.randn(64, 15, 1024, generator=g) * 2.5, -1).topk(64, -1)
        vals = -(lp.values * -4).round() / 4  # quantised: ties
        vals = vals.sort(-1, descending=True).values.contiguous()
        batch = dropins.build_ddtree_trees(vals.cuda(), lp.indices.cuda(), budget)
        for b, got in enumerate(batch):
            want = stock.build_ddtree_tree_from_topk(vals[b], lp.indices[b], budget)
            assert_same(got, want, f"batch {budget} request {b}")


# ----------------------------------------------------------------------------- bench suite


def test_integration_bench_suite_on_the_cpu():
    from kernels import bench

    assert set(bench.suites()) == {"topk", "tree", "accept", "attn", "engine_attn", "integration"}
    cfg = bench.BenchConfig(batches=[1, 4], budgets=[16], ks=[8], quick=True)
    rows = bench.suites()["integration"](cfg)
    got = {(r["kernel"], r["impl"], r["shape"]["B"]) for r in rows}
    assert {
        ("build_ddtree_tree_from_topk", "cpu_python", 1),
        ("build_ddtree_tree_from_topk", "cpu_cpp", 1),
        ("follow_verified_tree", "cpu_cpp", 1),
        ("build_ddtree_trees", "cpu_cpp", 4),
    } <= got
    for r in rows:
        assert r["suite"] == "integration" and r["refcheck"] is True, r
        assert r["median_us"] > 0 and r["reps"] >= 3 and "samples_us" not in r
