"""CUDA kernels vs. kernels.reference: ids and trees bit-exact, log-probs to float32 rounding.

Fresh random inputs, forced ties (quantised values), poisoned output buffers, bad arguments.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from kernels import reference as ref  # noqa: E402

pytestmark = pytest.mark.gpu

DEV = "cuda"
TREE_FIELDS = (
    "token_ids",
    "depths",
    "parents",
    "visibility",
    "first_child",
    "next_sibling",
    "num_nodes",
)


@pytest.fixture(scope="module")
def kc():
    from kernels import cuda

    return cuda


def _gen(seed: int) -> torch.Generator:
    return torch.Generator(device="cpu").manual_seed(seed)


def _logits(rows: int, vocab: int, dtype: torch.dtype, ties: bool, seed: int) -> torch.Tensor:
    g = _gen(seed)
    if ties:  # few distinct values: many equal logits, ties broken by token id
        x = torch.randint(-4, 4, (rows, vocab), generator=g).float() * 0.5
    else:
        x = torch.randn(rows, vocab, generator=g) * 3.0
    return x.to(dtype)


def _check_topk(kc, x: torch.Tensor, k: int) -> None:
    lp, ids = kc.topk_logprobs(x.to(DEV), k)
    rlp, rids = ref.topk_logprobs(x.float().numpy(), k)
    np.testing.assert_array_equal(ids.cpu().numpy(), rids)
    # log-probs to float32 rounding: a few ulps of the row's log-sum-exp
    top = np.take_along_axis(x.float().numpy(), rids, axis=-1)
    lse = (top - rlp).astype(np.float64)
    tol = 4 * np.spacing(np.abs(lse).astype(np.float32)) + 2 * np.spacing(np.abs(rlp))
    np.testing.assert_array_less(np.abs(lp.cpu().numpy().astype(np.float64) - rlp), tol + 1e-30)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize(
    "rows,vocab,k",
    [
        (1, 1, 1),
        (3, 7, 7),
        (5, 100, 1),
        (4, 1000, 8),
        (64, 1000, 64),
        (7, 1001, 13),
        (2, 4096, 512),
        (9, 32000, 64),
        (3, 163840, 64),
        (2, 163840, 8),
    ],
)
def test_topk_matches_reference(kc, dtype, ties, rows, vocab, k):
    _check_topk(kc, _logits(rows, vocab, dtype, ties, seed=rows * 7919 + vocab + k), k)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_topk_heavy_ties_fallback(kc, dtype):
    # More than the kernel's candidate buffer ties at the threshold: the exact fallback path.
    x = torch.zeros(3, 20000)
    x[1] = torch.randint(0, 2, (20000,), generator=_gen(1)).float()
    x[2, 12345] = 1.0
    _check_topk(kc, x.to(dtype), 64)
    _check_topk(kc, x.to(dtype), 512)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_topk_masked_vocab(kc, dtype):
    # -inf logits (masked tokens) add nothing to the log-sum-exp and never make a NaN.
    x = _logits(6, 8192, torch.float32, False, seed=11)
    x[torch.rand(6, 8192, generator=_gen(12)) < 0.7] = float("-inf")
    x[3, :4096] = float("-inf")
    _check_topk(kc, x.to(dtype), 64)


def test_topk_leading_dims_and_poisoned_out(kc):
    x = _logits(2 * 3, 5000, torch.bfloat16, False, seed=5).reshape(2, 3, 5000).to(DEV)
    lp = torch.full((2, 3, 16), float("nan"), device=DEV)
    ids = torch.full((2, 3, 16), -777, dtype=torch.int64, device=DEV)
    kc.topk_logprobs(x, 16, out=(lp, ids))
    rlp, rids = ref.topk_logprobs(x.float().cpu().numpy(), 16)
    np.testing.assert_array_equal(ids.cpu().numpy(), rids)
    np.testing.assert_allclose(lp.cpu().numpy(), rlp, rtol=0, atol=1e-5)


def _top(b: int, h: int, k: int, ties: bool, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = _gen(seed)
    if ties:  # quantised log-probs: equal scores everywhere, rank-path tie-break decides;
        # steps like 0.1 are inexact in binary, so float64 sums tie only up to 1 ulp
        step = (0.25, 0.1, 0.3, 0.0)[seed % 4]
        lp = -torch.randint(0, 6, (b, h, k), generator=g).float() * step
    else:
        lp = torch.log_softmax(torch.randn(b, h, max(k, 1) * 4, generator=g) * 2, -1)[..., :k]
    lp = lp.sort(dim=-1, descending=True).values.contiguous()
    ids = torch.randint(0, 163840, (b, h, k), generator=g)
    return lp, ids


def _tiny_ties(b: int, h: int, k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Tied log-probs far below the score's ulp: float64 `s - a + a` need not give back s."""
    g = _gen(seed)
    lp = torch.full((b, h, k), -1e-9)
    lp[:, 0, :] = -3.0 - torch.arange(k) * 1e-9 - torch.rand(b, 1) * 4
    lp[:, :, ::3] -= 2e-9
    lp = lp.sort(dim=-1, descending=True).values.contiguous()
    return lp, torch.randint(0, 163840, (b, h, k), generator=g)


def _assert_trees_equal(got, want: ref.BatchedTrees) -> None:
    for f in TREE_FIELDS:
        np.testing.assert_array_equal(getattr(got, f).cpu().numpy(), getattr(want, f), err_msg=f)


CASES = [
    (b, h, k, budget)
    for b, h, k, budget in [
        (1, 15, 8, 0),
        (1, 15, 8, 1),
        (2, 15, 8, 2),
        (3, 15, 8, 15),
        (64, 15, 8, 64),
        (64, 15, 64, 64),
        (8, 15, 64, 128),
        (4, 15, 64, 512),
        (5, 32, 16, 512),
        (3, 1, 1, 15),
        (6, 4, 2, 64),
        (2, 0, 8, 16),
        (2, 15, 0, 16),
        (17, 2, 512, 300),
        (33, 15, 3, 100),
    ]
]


ALGOS = ("auto", "heap", "heap_lowmem")  # every algorithm that always builds the tree


@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("b,h,k,budget", CASES)
def test_build_trees_matches_reference(kc, algo, ties, b, h, k, budget):
    lp, ids = _top(b, h, k, ties, seed=b * 1000 + h * 100 + k + budget)
    got = kc.build_trees(lp.to(DEV), ids.to(DEV), budget, algo=algo)
    _assert_trees_equal(got, ref.build_trees(lp.numpy(), ids.numpy(), budget))


@pytest.mark.parametrize("b", [1, 2, 5, 16, 31, 64])
@pytest.mark.parametrize("budget", [2, 15, 64, 128])
def test_build_trees_ties_every_batch(kc, b, budget):
    for k in (1, 2, 8, 64):
        lp, ids = _top(b, 15, k, True, seed=b + 17 * budget + k)
        got = kc.build_trees(lp.to(DEV), ids.to(DEV), budget)
        _assert_trees_equal(got, ref.build_trees(lp.numpy(), ids.numpy(), budget))


@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize(
    "b,h,k,budget", [(5, 15, 8, 64), (3, 15, 64, 128), (2, 32, 16, 512), (4, 3, 4, 40)]
)
def test_build_trees_tiny_ties_every_algo(kc, algo, b, h, k, budget):
    # 1-ulp ties make the level selection decline (auto falls back to the heap loop); every
    # algorithm must give the reference's tree.
    for lp, ids in (
        _tiny_ties(b, h, k, seed=budget),
        _top(b, h, k, True, seed=budget + 1),
        _top(b, h, k, False, seed=budget + 2),
    ):
        got = kc.build_trees(lp.to(DEV), ids.to(DEV), budget, algo=algo)
        _assert_trees_equal(got, ref.build_trees(lp.numpy(), ids.numpy(), budget))


def test_build_trees_poisoned_out(kc):
    lp, ids = _top(9, 15, 8, True, seed=3)
    out = kc.CudaTrees.empty(9, 64, DEV)
    for t in out:
        t.fill_(True) if t.dtype == torch.bool else t.fill_(0x5A5A5A5A)
    kc.build_trees(lp.to(DEV), ids.to(DEV), 64, out=out)
    _assert_trees_equal(out, ref.build_trees(lp.numpy(), ids.numpy(), 64))


def _drafter_top(b: int, h: int, k: int, scale: float, seed: int):
    """Top-k of log_softmax over 4096 random logits (the benchmark's inputs), in float32."""
    g = _gen(seed)
    x = torch.randn(b, h, max(4096, k), generator=g) * scale
    lp, _ = torch.log_softmax(x, -1).topk(k, dim=-1)
    return lp.contiguous(), torch.randint(0, 163840, (b, h, k), generator=g)


@pytest.mark.parametrize("scale", [2.5, 6.0, 12.0])
@pytest.mark.parametrize(
    "b,h,k,budget",
    [
        (64, 15, 8, 64),
        (64, 15, 64, 64),
        (7, 32, 16, 40),
        (5, 1, 8, 15),
        (3, 15, 1, 9),
        (9, 4, 64, 1),
        (2, 15, 3, 2),
        (33, 15, 64, 33),
    ],
)
def test_build_trees_level_path_alone(kc, scale, b, h, k, budget):
    # algo="levels": the level selection without its fallback. It must take exactly the
    # requests the Python model of it takes (num_nodes -1 elsewhere), and give the reference's
    # tree for each of them.
    import helpers.tree_levels_model as model

    lp, ids = _drafter_top(b, h, k, scale, seed=int(scale * 10) + b + 100 * k + budget)
    got = kc.build_trees(lp.to(DEV), ids.to(DEV), budget, algo="levels")
    want = ref.build_trees(lp.numpy(), ids.numpy(), budget)
    taken = 0
    for i in range(b):
        takes = model.build(lp[i].numpy(), budget) is not None
        assert int(got.num_nodes[i]) == (int(want.num_nodes[i]) if takes else -1), i
        if takes:
            taken += 1
            for f in TREE_FIELDS[:-1]:
                np.testing.assert_array_equal(
                    getattr(got, f)[i].cpu().numpy(), getattr(want, f)[i], err_msg=f"{f} [{i}]"
                )
    assert taken >= (b + 1) // 2  # the path under test did run


def _targets(trees: ref.BatchedTrees, seed: int) -> np.ndarray:
    """Target ids that follow a random child most of the time (deep walks), else a miss."""
    rng = np.random.default_rng(seed)
    b, budget = trees.token_ids.shape
    tg = rng.integers(0, 163840, size=(b, budget + 1))
    for i in range(b):
        for node in range(int(trees.num_nodes[i]) + 1):
            kids = []
            c = int(trees.first_child[i, node])
            while c >= 0:
                kids.append(c)
                c = int(trees.next_sibling[i, c])
            if kids and rng.random() < 0.85:
                tg[i, node] = trees.token_ids[i, rng.choice(kids) - 1]
    return tg


@pytest.mark.parametrize(
    "b,h,k,budget",
    [
        (1, 15, 8, 0),
        (3, 15, 8, 1),
        (64, 15, 8, 64),
        (64, 15, 64, 64),
        (4, 15, 64, 512),
        (7, 32, 4, 128),
    ],
)
def test_greedy_accept_matches_reference(kc, b, h, k, budget):
    lp, ids = _top(b, h, k, False, seed=b + h + k + budget)
    rt = ref.build_trees(lp.numpy(), ids.numpy(), budget)
    tg = _targets(rt, seed=budget)
    trees = kc.build_trees(lp.to(DEV), ids.to(DEV), budget)
    out = tuple(torch.full(s, 999, dtype=torch.int64, device=DEV) for s in [(b, h + 1), (b,), (b,)])
    kc.greedy_accept(trees, torch.from_numpy(tg).to(DEV), h, out=out)
    want = ref.greedy_accept_batch(rt, tg, h)
    for g, w in zip(out, want, strict=True):
        np.testing.assert_array_equal(g.cpu().numpy(), w)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "b,budget,vocab,ties",
    [
        (1, 0, 50, False),
        (5, 15, 1000, False),
        (8, 64, 4097, True),
        (64, 64, 2048, False),
        (2, 512, 300, True),
    ],
)
def test_greedy_accept_from_logits_matches_reference(kc, dtype, b, budget, vocab, ties):
    h = 15
    lp, _ = _top(b, h, 8, False, seed=vocab + budget)
    ids = torch.randint(0, vocab, (b, h, 8), generator=_gen(vocab))
    rt = ref.build_trees(lp.numpy(), ids.numpy(), budget)
    tg = _targets(rt, seed=vocab) % vocab
    x = _logits(b * (budget + 1), vocab, torch.float32, ties, seed=budget).reshape(
        b, budget + 1, -1
    )
    x.scatter_(2, torch.from_numpy(tg)[..., None], 100.0)  # plant the walk's argmax
    x = x.to(dtype)
    argmax = np.argmax(x.float().numpy(), axis=-1)  # first index on ties
    trees = kc.build_trees(lp.to(DEV), ids.to(DEV), budget)
    got = kc.greedy_accept_from_logits(trees, x.to(DEV), h)
    want = ref.greedy_accept_batch(rt, argmax, h)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g.cpu().numpy(), w)


def test_bad_arguments_raise_with_op_name(kc):
    x = torch.randn(4, 100, device=DEV)
    with pytest.raises(ValueError, match=r"topk_logprobs: k"):
        kc.topk_logprobs(x, 101)
    with pytest.raises(ValueError, match=r"topk_logprobs: logits: expected dtype"):
        kc.topk_logprobs(x.double(), 4)
    with pytest.raises(ValueError, match=r"topk_logprobs: logits: expected a CUDA tensor"):
        kc.topk_logprobs(x.cpu(), 4)
    with pytest.raises(ValueError, match=r"topk_logprobs: logits: expected a contiguous"):
        kc.topk_logprobs(x.t(), 2)
    lp, ids = _top(2, 15, 8, False, seed=0)
    lp, ids = lp.to(DEV), ids.to(DEV)
    with pytest.raises(ValueError, match=r"build_trees: budget"):
        kc.build_trees(lp, ids, 513)
    with pytest.raises(ValueError, match=r"build_trees: top_token_ids: expected dtype"):
        kc.build_trees(lp, ids.int(), 8)
    with pytest.raises(ValueError, match=r"build_trees: top_token_ids: expected shape"):
        kc.build_trees(lp, ids[:, :3].contiguous(), 8)
    with pytest.raises(ValueError, match=r"build_trees: top_log_probs: H = 33"):
        kc.build_trees(lp.new_zeros(2, 33, 8), ids.new_zeros(2, 33, 8), 8)
    with pytest.raises(ValueError, match=r"build_trees: algo must be one of"):
        kc.build_trees(lp, ids, 8, algo="v6")
    trees = kc.build_trees(lp, ids, 8)
    with pytest.raises(ValueError, match=r"greedy_accept: target_ids: expected shape"):
        kc.greedy_accept(trees, torch.zeros(2, 8, dtype=torch.int64, device=DEV), 15)
    with pytest.raises(ValueError, match=r"greedy_accept_from_logits: logits: expected shape"):
        kc.greedy_accept_from_logits(trees, torch.zeros(2, 8, 10, device=DEV), 15)
    with pytest.raises(ValueError, match=r"greedy_accept: max_depth"):
        kc.greedy_accept(trees, torch.zeros(2, 9, dtype=torch.int64, device=DEV), 33)


def test_launcher_error_becomes_kernel_error(kc):
    from kernels import cuda_core as core

    argtypes = (core.c_ptr, core.c_ptr) + (core.c_i32,) * 4 + (core.c_ptr,) * 7
    fn = core.declare("ddtree_build_trees", argtypes + (core.c_i32, core.c_ptr))
    with pytest.raises(kc.KernelError, match=r"build_trees: CUDA error 1: invalid argument") as e:
        core.launch("build_trees", fn, None, None, 1, 15, 8, -1, *([None] * 7), 0, None)
    assert e.value.op == "build_trees" and e.value.code == 1
    with pytest.raises(kc.KernelError, match=r"CUDA error 1: invalid argument"):  # unknown algo
        core.launch("build_trees", fn, None, None, 1, 15, 8, 8, *([None] * 7), 4, None)
