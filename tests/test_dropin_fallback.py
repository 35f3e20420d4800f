"""The stock function is the drop-ins' fallback: inputs the fast path does not take get the
fork's own answer, or the fork's own exception.

Input classes: a float64 tensor (the fork rounds it to float32 before summing), K = 0 (the
fork raises), a budget over the compiled limit, a budget that is not an int, a tensor that
requires grad, a workspace that is not the fork's, inputs that are not tensors; for the walk,
a posterior that is not a contiguous 1-D int64 CPU tensor. In-process tests hand the drop-ins
the stand-in's real functions wrapped in a recorder (the answer must be the very object the
stock returned, the exception the one it raised); the end-to-end test starts Python as the
service does, with the hook installing the drop-ins over the stand-in module of each version.
"""

from __future__ import annotations

import heapq
import json
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import fork_standin as fs

from integration import sglang_dropins as dropins


class Recorder:
    """The stock function, called through: counts the calls and keeps the last answer."""

    def __init__(self, fn):
        self.fn, self.calls, self.last = fn, 0, None

    def __call__(self, *args, **kwargs):
        self.calls += 1
        self.last = self.fn(*args, **kwargs)
        return self.last


@pytest.fixture(params=["6d9866b3", "807ab0e4"])
def fork(request):
    """(stock module copy, drop-in builder, its recorder, drop-in walk, its recorder)."""
    mod = fs.load_copy(fs.VERSIONS[request.param], f"fallback_{request.param}")
    build, walk = Recorder(mod.build_ddtree_tree_from_topk), Recorder(mod.follow_verified_tree)
    ws = getattr(mod, "DFlashDDTreeBuildWorkspace", None)
    passive = (("workspace", None, ws),) if ws else ()
    return (
        mod,
        dropins.make_build("cpp", build, passive),
        build,
        dropins.make_accept("cpp", walk),
        walk,
    )


def _same(a, b) -> bool:
    if isinstance(b, torch.Tensor):
        return type(a) is torch.Tensor and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(b, list | tuple):
        return type(a) is type(b) and len(a) == len(b) and all(map(_same, a, b))
    return type(a) is type(b) and a == b


def _topk(g: torch.Generator, h: int, k: int, dtype=torch.float32, scale: float = 3.0):
    lp = torch.log_softmax(torch.randn(h, 512, generator=g, dtype=torch.float64) * scale, -1)
    vals, ids = lp.topk(k, dim=-1)
    return vals.to(dtype).contiguous(), ids.contiguous()


def _near_ties(g: torch.Generator, h: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 log-probs on a coarse grid plus offsets below float32's resolution: float32
    rounding makes them tie (rank paths decide), their float64 sums do not."""
    grid = -torch.randint(1, 8, (h, k), generator=g).double() * 0.5
    lp = grid - torch.rand(h, k, generator=g, dtype=torch.float64) * 1e-9
    lp = lp.sort(dim=-1, descending=True).values.contiguous()
    ids = (torch.randint(0, 9000, (h, 1), generator=g) + torch.arange(k) * 7) % 9000
    return lp, ids.contiguous()


def _float64_tree(lp: torch.Tensor, ids: torch.Tensor, budget: int) -> list[int]:
    """Token ids in pop order if the float64 values were summed as given (no rounding)."""
    w, t = lp.tolist(), ids.tolist()
    h, k = len(w), min(budget, len(w[0]))
    heap, out = [(-w[0][0], (0,), 1, 0, w[0][0])], []
    while heap and len(out) < budget:
        _, path, d, r, s = heapq.heappop(heap)
        out.append(t[d - 1][r])
        if r + 1 < k:
            x = s - w[d - 1][r] + w[d - 1][r + 1]
            heapq.heappush(heap, (-x, path[:-1] + (r + 1,), d, r + 1, x))
        if d < h:
            x = s + w[d][0]
            heapq.heappush(heap, (-x, path + (0,), d + 1, 0, x))
    return out


# ----------------------------------------------------------------------------- the builder


def test_the_fast_path_takes_the_services_inputs(fork) -> None:
    mod, build, rec, _, _ = fork
    g = torch.Generator().manual_seed(1)
    ws = mod.DFlashDDTreeBuildWorkspace() if hasattr(mod, "DFlashDDTreeBuildWorkspace") else None
    for i in range(60):
        b = (16, 64, 128, 7)[i % 4]
        lp, ids = _topk(g, b if b > 7 else 15, b if b > 7 else 5)
        if i % 5 == 1:
            lp = lp.to(torch.bfloat16)  # converts to float32 exactly, as the fork's .to() does
        if i % 5 == 2:
            lp, ids = lp.t().contiguous().t(), ids.t().contiguous().t()  # not contiguous
        extra = {"workspace": ws} if ws is not None and i % 2 else {}
        want = mod.build_ddtree_tree_from_topk(lp, ids, b, **extra)
        assert _same(build(lp, ids, b, **extra), want), i
    for budget, h in ((0, 3), (-2, 3), (5, 0)):  # the root-only tree
        lp, ids = _topk(g, 3, 4)
        want = mod.build_ddtree_tree_from_topk(lp[:h], ids[:h], budget)
        assert _same(build(lp[:h], ids[:h], budget), want)
    assert rec.calls == 0  # never the stock


def test_float64_inputs_get_the_forks_rounded_answer(fork) -> None:
    mod, build, rec, _, _ = fork
    g = torch.Generator().manual_seed(2)
    differ = 0
    for i in range(300):
        h, k, budget = [(15, 8, 64), (6, 6, 16), (16, 16, 16), (4, 3, 30)][i % 4]
        lp, ids = _near_ties(g, h, k) if i % 2 else _topk(g, h, k, torch.float64)
        calls = rec.calls
        got = build(lp, ids, budget)
        assert rec.calls == calls + 1 and got is rec.last, i  # the stock's own answer
        assert _same(got, mod.build_ddtree_tree_from_topk(lp, ids, budget)), i
        # and it is the float32 tree (the fork rounds), which summing float64 often is not
        assert _same(got, build(lp.float(), ids, budget)), i
        differ += got[0].tolist() != _float64_tree(lp, ids, budget)
    assert differ > 50, differ  # these inputs are the ones where rounding decides


def _raised(fn, *args, **kwargs) -> BaseException:
    try:
        fn(*args, **kwargs)
    except Exception as exc:
        return exc
    raise AssertionError("no exception")


@pytest.mark.parametrize("case", ["k0", "grad", "list_input", "bad_workspace"])
def test_what_the_fork_raises_is_raised_by_the_fork(fork, case: str) -> None:
    mod, build, rec, _, _ = fork
    lp, ids = _topk(torch.Generator().manual_seed(3), 5, 4)
    if case == "bad_workspace" and not hasattr(mod, "DFlashDDTreeBuildWorkspace"):
        pytest.skip("the older builder has no workspace (a 4th argument is a TypeError)")
    args = {
        "k0": (torch.empty(5, 0), torch.empty(5, 0, dtype=torch.long), 8),
        "grad": (lp.clone().requires_grad_(), ids, 8),
        "list_input": (lp.tolist(), ids.tolist(), 8),
        "bad_workspace": (lp, ids, 8, object()),
    }[case]
    got = _raised(build, *args)
    want = _raised(mod.build_ddtree_tree_from_topk, *args)
    assert type(got) is type(want) and str(got) == str(want), (got, want)
    assert rec.calls == 1  # raised inside the stock function, not by us
    tb = got.__traceback__
    while tb.tb_next is not None:
        tb = tb.tb_next
    assert Path(tb.tb_frame.f_code.co_filename) == fs.VERSIONS[fork_version(mod)] / fs.MODULE_FILE


def fork_version(mod) -> str:
    return mod.__name__.rsplit("_", 1)[-1]


def test_calls_of_the_wrong_shape_raise_the_same_type_error(fork) -> None:
    mod, build, _, _, _ = fork
    lp, ids = _topk(torch.Generator().manual_seed(3), 5, 4)
    calls = [
        ((lp, ids), {}),
        ((lp, ids, 8, None, None), {}),
        ((lp, ids, 8), {"scratch": None}),
        ((lp, ids), {"top_log_probs": lp}),
    ]
    for args, kwargs in calls:
        got = _raised(build, *args, **kwargs)
        want = _raised(mod.build_ddtree_tree_from_topk, *args, **kwargs)
        assert type(got) is type(want) is TypeError and str(got) == str(want), (got, want)


@pytest.mark.parametrize(
    "case", ["over_limit", "numpy_budget", "float_budget", "int32_ids", "int_log_probs"]
)
def test_other_inputs_get_the_stocks_answer(fork, case: str) -> None:
    mod, build, rec, _, _ = fork
    lp, ids = _topk(torch.Generator().manual_seed(4), 3, 4)
    budget = {
        "over_limit": dropins.MAX_BUDGET + 1,
        "numpy_budget": np.int64(9),
        "float_budget": 9.0,
        "int32_ids": 9,
        "int_log_probs": 9,
    }[case]
    if case == "int32_ids":
        ids = ids.int()
    if case == "int_log_probs":  # the fork's .to(float32) takes any dtype
        lp = (lp * 4).round().int()
    got = build(lp, ids, budget)
    assert rec.calls == 1 and got is rec.last
    assert _same(got, mod.build_ddtree_tree_from_topk(lp, ids, budget))


def test_a_workspace_call_the_fast_path_does_not_take_reaches_the_forks_buffers() -> None:
    mod = fs.load_copy(fs.V2, "fallback_ws")
    rec = Recorder(mod.build_ddtree_tree_from_topk)
    build = dropins.make_build("cpp", rec, (("workspace", None, mod.DFlashDDTreeBuildWorkspace),))
    ws = mod.DFlashDDTreeBuildWorkspace()
    lp, ids = _near_ties(torch.Generator().manual_seed(5), 16, 16)
    out = build(lp, ids, 16, workspace=ws)  # float64: the fork's, into its workspace
    assert rec.calls == 1 and ws.allocations == 1
    assert out[0].data_ptr() == ws.node_token_ids_np.ctypes.data
    fresh = build(lp.float(), ids, 16, workspace=ws)  # taken: fresh tensors, same values
    assert rec.calls == 1 and ws.allocations == 1 and _same(fresh, out)
    assert fresh[0].data_ptr() != ws.node_token_ids_np.ctypes.data


# ----------------------------------------------------------------------------- the walk


def test_the_walk_falls_back_for_posteriors_it_does_not_take(fork) -> None:
    mod, build, _, walk, rec = fork
    g = torch.Generator().manual_seed(6)
    lp, ids = _topk(g, 16, 16)
    tree = build(lp, ids, 16)
    post = torch.full((17,), -5, dtype=torch.long)
    node = 0
    while tree[3][node]:  # the path through every first child
        tok = next(iter(tree[3][node]))
        post[node], node = tok, tree[3][node][tok]
    want = mod.follow_verified_tree(tree[3], post)
    assert len(want[0]) > 2
    assert walk(tree[3], post) == want and walk(tree[3], post[None][0]) == want
    assert rec.calls == 0  # contiguous int64 CPU: ours
    wide = torch.stack([post, post], 1)[:, 0]  # a strided view
    for other in (wide, post.int(), post.double(), post[None], post.tolist(), post[:0]):
        calls = rec.calls
        try:
            got = walk(tree[3], other)
        except Exception as exc:
            err = _raised(mod.follow_verified_tree, tree[3], other)
            assert type(exc) is type(err) and str(exc) == str(err)
        else:
            assert got is rec.last and _same(got, mod.follow_verified_tree(tree[3], other))
        assert rec.calls == calls + 1, other
    # child maps the fast walk does not read: a dict subclass, a value out of range
    odd = list(tree[3])
    odd[0] = type("Maps", (dict,), {})(odd[0])
    assert walk(odd, post) is rec.last and _same(walk(odd, post), want)
    broken = [dict(m) for m in tree[3]]
    broken[0][next(iter(broken[0]))] = 99
    assert type(_raised(walk, broken, post)) is IndexError  # the stock's, from its own list


# ----------------------------------------------------------------------------- end to end

SERVICE = textwrap.dedent(
    """
    import importlib.util, json, sys, numpy as np, torch
    from sglang.srt.speculative.dflash_ddtree_utils import (
        build_ddtree_tree_from_topk as build, follow_verified_tree as follow)
    spec = importlib.util.spec_from_file_location("stock_copy", sys.argv[1])
    stock = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(stock)

    def same(a, b):
        if isinstance(b, torch.Tensor):
            return type(a) is torch.Tensor and a.dtype == b.dtype and torch.equal(a, b)
        if isinstance(b, (list, tuple)):
            return type(a) is type(b) and len(a) == len(b) and all(map(same, a, b))
        return type(a) is type(b) and a == b

    def outcome(fn, *args):
        try:
            return "ok", fn(*args)
        except Exception as exc:
            tb = exc.__traceback__
            while tb.tb_next:
                tb = tb.tb_next
            return "raised", (type(exc).__name__, str(exc), tb.tb_frame.f_code.co_filename)

    g = torch.Generator().manual_seed(9)
    lp = torch.log_softmax(torch.randn(6, 300, generator=g, dtype=torch.float64) * 3, -1)
    lp64, ids = lp.topk(6, dim=-1)
    lp32 = lp64.float()
    cases = {
        "float64": (lp64, ids, 6), "k0": (lp32[:, :0], ids[:, :0], 6),
        "over_limit": (lp32[:2], ids[:2], 5000), "grad": (lp32.clone().requires_grad_(), ids, 6),
        "ordinary": (lp32, ids, 6),
    }
    out = {"backend": getattr(build, "ddtree_ops_backend", None),
           "fallbacks": [f.ddtree_ops_stock.__module__ for f in (build, follow)]}
    for name, args in cases.items():
        kind, got = outcome(build, *args)
        want = outcome(stock.build_ddtree_tree_from_topk, *args)[1]
        out[name] = [kind, same(got, want) if kind == "ok" else got[:2] == want[:2],
                     got[2] if kind == "raised" else None]
    tree = build(lp32, ids, 6)
    post = torch.tensor([next(iter(m), 0) for m in tree[3]])
    for name, p in (("post_strided", torch.stack([post, post], 1)[:, 0]),
                    ("post_int32", post.int()), ("post_ok", post)):
        out[name] = same(follow(tree[3], p), stock.follow_verified_tree(tree[3], p))
    print(json.dumps(out))
    """
)


@pytest.mark.parametrize("version", ["6d9866b3", "807ab0e4"])
def test_fallbacks_in_a_service_started_with_the_hook(tmp_path: Path, version: str) -> None:
    current = fs.release(tmp_path)
    standin = fs.VERSIONS[version]
    stock_file = standin / fs.MODULE_FILE
    proc = fs.start(current, "tree_build=cpp,accept=cpp", standin, SERVICE, str(stock_file))
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out.pop("backend") == "cpp"
    assert out.pop("fallbacks") == ["sglang.srt.speculative.dflash_ddtree_utils"] * 2  # the fork's
    for name in ("float64", "over_limit", "ordinary"):
        assert out[name] == ["ok", True, None], (name, out[name])
    for name in ("k0", "grad"):  # raised by the stand-in's (the fork's) own code or below it
        kind, same, where = out[name]
        assert kind == "raised" and same, (name, out[name])
        assert where == str(stock_file) or "site-packages" in where, (name, where)
    assert out["post_strided"] and out["post_int32"] and out["post_ok"]
