"""Properties of the exact CPU references in kernels/reference.py (tree build, accept, top-k)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from kernels.reference import (
    BatchedTrees,
    Tree,
    build_tree,
    build_trees,
    greedy_accept,
    greedy_accept_batch,
    topk_logprobs,
)


def random_topk(
    rng: np.random.Generator, shape: tuple[int, ...], quantise: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """Rows sorted best first, log-probs <= 0, distinct ids per row; quantised: exact ties."""
    *lead, k = shape
    lp = -rng.exponential(2.0, size=shape)
    if quantise:
        lp = np.round(lp * 4) / 4
    lp = -np.sort(-lp, axis=-1).astype(np.float32)
    ids = np.argsort(rng.random((*lead, max(k, 1) * 3)), axis=-1)[..., :k].astype(np.int64)
    return lp, ids


def available(h: int, k: int) -> int:
    return sum(k**d for d in range(1, h + 1))


def check_tree(tree: Tree, lp: np.ndarray, ids: np.ndarray, budget: int) -> None:
    h, k = lp.shape
    n = tree.num_nodes
    assert n == min(budget, available(h, k))
    assert tree.token_ids.shape == tree.depths.shape == (n,)
    assert tree.parents.shape == tree.first_child.shape == tree.next_sibling.shape == (n + 1,)
    assert tree.visibility.shape == (n + 1, n + 1) and tree.visibility.dtype == np.bool_
    assert tree.parents[0] == -1
    depth = np.zeros(n + 1, dtype=np.int64)
    vis = np.zeros((n + 1, n + 1), dtype=bool)
    vis[0, 0] = True
    for i in range(1, n + 1):
        p = tree.parents[i]
        assert 0 <= p < i
        depth[i] = depth[p] + 1
        assert tree.depths[i - 1] == depth[i] <= h
        assert tree.token_ids[i - 1] in ids[depth[i] - 1]
        vis[i] = vis[p]
        vis[i, i] = True
    np.testing.assert_array_equal(tree.visibility, vis)
    for p in range(n + 1):
        children = [i for i in range(1, n + 1) if tree.parents[i] == p]
        linked = []
        c = tree.first_child[p]
        while c >= 0:
            linked.append(int(c))
            c = tree.next_sibling[c]
        assert linked == children  # pop order = increasing index
        toks = [int(tree.token_ids[c - 1]) for c in children]
        assert len(set(toks)) == len(toks)
    assert tree.next_sibling[0] == -1


def brute_force_order(lp: np.ndarray, budget: int) -> list[tuple[int, ...]]:
    """All rank paths sorted by (score desc, path asc); exact when lp are multiples of 1/4."""
    h, k = lp.shape
    paths = [p for d in range(1, h + 1) for p in itertools.product(range(k), repeat=d)]
    score = {p: sum(float(lp[d, r]) for d, r in enumerate(p)) for p in paths}
    return sorted(paths, key=lambda p: (-score[p], p))[:budget]


def rank_paths(tree: Tree, ids: np.ndarray) -> list[tuple[int, ...]]:
    paths: list[tuple[int, ...]] = [()]
    for i in range(1, tree.num_nodes + 1):
        d = int(tree.depths[i - 1])
        r = int(np.flatnonzero(ids[d - 1] == tree.token_ids[i - 1])[0])
        paths.append(paths[tree.parents[i]] + (r,))
    return paths[1:]


def test_hand_worked_example_with_tie() -> None:
    lp = np.array([[-0.5, -1.0], [-0.5, -1.5]], dtype=np.float32)
    ids = np.array([[10, 11], [20, 21]])
    t = build_tree(lp, ids, 10)
    # (0)=-0.5; then (0,0)=-1.0 ties (1)=-1.0 and wins as the smaller rank path; then (1),
    # (1,0)=-1.5, (0,1)=-2.0, (1,1)=-2.5.
    assert t.token_ids.tolist() == [10, 20, 11, 20, 21, 21]
    assert t.depths.tolist() == [1, 2, 1, 2, 2, 2]
    assert t.parents.tolist() == [-1, 0, 1, 0, 3, 1, 3]
    assert t.first_child.tolist() == [1, 2, -1, 4, -1, -1, -1]
    assert t.next_sibling.tolist() == [-1, 3, 5, -1, 6, -1, -1]
    check_tree(t, lp, ids, 10)
    t3 = build_tree(lp, ids, 3)
    assert t3.token_ids.tolist() == [10, 20, 11] and t3.parents.tolist() == [-1, 0, 1, 0]


@pytest.mark.parametrize("quantise", [False, True])
def test_random_tree_properties(quantise: bool) -> None:
    rng = np.random.default_rng(1 + quantise)
    for _ in range(150):
        h, k, budget = int(rng.integers(1, 9)), int(rng.integers(1, 9)), int(rng.integers(0, 80))
        lp, ids = random_topk(rng, (h, k), quantise)
        check_tree(build_tree(lp, ids, budget), lp, ids, budget)


def test_pop_order_matches_brute_force_sort() -> None:
    rng = np.random.default_rng(3)
    for _ in range(200):
        h, k = int(rng.integers(1, 5)), int(rng.integers(1, 5))
        budget = int(rng.integers(0, available(h, k) + 3))
        lp, ids = random_topk(rng, (h, k), quantise=True)
        lp[rng.random(lp.shape) < 0.2] = 0.0  # zero log-probs: children tie their parent
        lp = -np.sort(-lp, axis=-1)
        assert rank_paths(build_tree(lp, ids, budget), ids) == brute_force_order(lp, budget)


@pytest.mark.parametrize("budget", [0, 1, 2])
def test_small_budgets(budget: int) -> None:
    lp = np.array([[-0.1, -0.2], [-0.05, -3.0]], dtype=np.float32)
    ids = np.array([[5, 6], [7, 8]])
    t = build_tree(lp, ids, budget)
    assert t.token_ids.tolist() == [5, 7][:budget]
    assert t.parents.tolist() == [-1, 0, 1][: budget + 1]
    check_tree(t, lp, ids, budget)


def test_edge_shapes() -> None:
    root_only = build_tree(np.zeros((0, 4), np.float32), np.zeros((0, 4), np.int64), 8)
    assert root_only.num_nodes == 0 and root_only.visibility.tolist() == [[True]]
    assert root_only.first_child.tolist() == [-1] and root_only.parents.tolist() == [-1]
    rng = np.random.default_rng(4)
    lp, ids = random_topk(rng, (6, 1))
    chain = build_tree(lp, ids, 4)  # K=1: a chain of min(budget, H) nodes
    assert chain.token_ids.tolist() == ids[:4, 0].tolist()
    assert chain.parents.tolist() == [-1, 0, 1, 2, 3]
    assert build_tree(lp, ids, 100).num_nodes == 6


def test_batched_equals_per_request_and_padding() -> None:
    rng = np.random.default_rng(5)
    for h, k, budget in [(4, 3, 20), (15, 8, 64), (2, 2, 9), (3, 1, 2), (5, 4, 0)]:
        lp, ids = random_topk(rng, (6, h, k), quantise=True)
        bt = build_trees(lp, ids, budget)
        assert isinstance(bt, BatchedTrees) and bt.visibility.shape == (6, budget + 1, budget + 1)
        for b in range(6):
            one = build_tree(lp[b], ids[b], budget)
            n = one.num_nodes
            assert bt.num_nodes[b] == n
            got = bt.tree(b)
            for name in ("token_ids", "depths", "parents", "visibility", "first_child"):
                np.testing.assert_array_equal(getattr(got, name), getattr(one, name))
            np.testing.assert_array_equal(got.next_sibling, one.next_sibling)
            assert (bt.token_ids[b, n:] == -1).all() and (bt.depths[b, n:] == -1).all()
            assert (bt.parents[b, n + 1 :] == -1).all() and (bt.first_child[b, n + 1 :] == -1).all()
            assert (bt.next_sibling[b, n + 1 :] == -1).all()
            assert not bt.visibility[b, n + 1 :].any() and not bt.visibility[b, :, n + 1 :].any()


def independent_walk(tree: Tree, target: np.ndarray) -> tuple[list[int], int]:
    cur, path = 0, [0]
    while True:
        kids = [i for i in range(1, tree.num_nodes + 1) if tree.parents[i] == cur]
        match = [c for c in kids if tree.token_ids[c - 1] == target[cur]]
        if not match:
            return path, int(target[cur])
        cur = match[0]
        path.append(cur)


def test_greedy_accept_walks() -> None:
    rng = np.random.default_rng(6)
    lp, ids = random_topk(rng, (5, 3))
    t = build_tree(lp, ids, 40)
    n = t.num_nodes
    # immediate reject: no child of the root carries target[0]
    target = np.full(n + 1, 10**6, dtype=np.int64)
    acc, bonus = greedy_accept(t, target)
    assert acc.tolist() == [0] and bonus == 10**6
    # full-depth accept: follow the deepest node's path, then a bonus from it
    deep = int(np.argmax(t.depths)) + 1
    chain = [deep]
    while t.parents[chain[-1]] != 0:
        chain.append(int(t.parents[chain[-1]]))
    chain = [0] + chain[::-1]
    for a, c in zip(chain, chain[1:], strict=False):
        target[a] = t.token_ids[c - 1]
    target[deep] = 77
    acc, bonus = greedy_accept(t, target)
    assert acc.tolist() == chain and len(chain) == t.depths.max() + 1 and bonus == 77
    # random targets drawn from the tree's tokens, against an independent walk
    for _ in range(200):
        target = rng.choice(ids.ravel(), size=n + 1)
        acc, bonus = greedy_accept(t, target)
        assert (acc.tolist(), bonus) == independent_walk(t, target)


def test_greedy_accept_batch_matches_single() -> None:
    rng = np.random.default_rng(7)
    h, budget = 6, 30
    lp, ids = random_topk(rng, (8, h, 2))
    bt = build_trees(lp, ids, budget)
    target = rng.choice(ids.ravel(), size=(8, budget + 1))
    acc, acc_len, bonus = greedy_accept_batch(bt, target, max_depth=h)
    assert acc.shape == (8, h + 1)
    for b in range(8):
        n = int(bt.num_nodes[b])
        one, one_bonus = greedy_accept(bt.tree(b), target[b, : n + 1])
        assert acc_len[b] == len(one) and bonus[b] == one_bonus
        assert acc[b, : len(one)].tolist() == one.tolist() and (acc[b, len(one) :] == -1).all()
    with pytest.raises(ValueError, match="target_ids"):
        greedy_accept_batch(bt, target[:, :-1], max_depth=h)


def test_topk_ties_by_smaller_id_and_float64_logprobs() -> None:
    x = np.array([[1.0, 3.0, 2.0, 3.0, 3.0, -1.0, 2.0]], dtype=np.float32)
    lp, ids = topk_logprobs(x, 4)
    assert ids.tolist() == [[1, 3, 4, 2]]
    assert lp.dtype == np.float32 and ids.dtype == np.int64
    rng = np.random.default_rng(8)
    logits = (rng.standard_normal((3, 5, 4000)) * 4).astype(np.float32)
    logits[..., 17] = logits[..., 900]  # exact ties in the top region
    lp, ids = topk_logprobs(logits, 64)
    x64 = logits.astype(np.float64)
    lse = np.log(np.exp(x64 - x64.max(-1, keepdims=True)).sum(-1, keepdims=True)) + x64.max(
        -1, keepdims=True
    )
    want_ids = np.lexsort((np.broadcast_to(np.arange(4000), x64.shape), -x64), axis=-1)[..., :64]
    np.testing.assert_array_equal(ids, want_ids)
    want = np.take_along_axis(x64, want_ids, -1) - lse
    np.testing.assert_allclose(lp, want, rtol=0, atol=4e-6 * np.abs(want).max())


def test_topk_accepts_torch_bf16() -> None:
    torch = pytest.importorskip("torch")
    x = torch.randn(2, 3, 500).to(torch.bfloat16)
    lp, ids = topk_logprobs(x, 8)
    lp2, ids2 = topk_logprobs(x.float().numpy(), 8)
    np.testing.assert_array_equal(ids, ids2)
    np.testing.assert_array_equal(lp, lp2)


def test_bad_arguments_raise() -> None:
    lp = np.zeros((2, 3), np.float32)
    ids = np.zeros((2, 3), np.int64)
    with pytest.raises(ValueError, match="top_token_ids"):
        build_tree(lp, ids[:, :2], 4)
    with pytest.raises(ValueError, match="top_token_ids"):
        build_tree(lp, ids.astype(np.float32), 4)
    with pytest.raises(ValueError, match="top_log_probs"):
        build_tree(ids, ids, 4)
    with pytest.raises(ValueError, match="top_log_probs"):
        build_trees(lp, ids, 4)
    with pytest.raises(ValueError, match="budget"):
        build_tree(lp, ids, -1)
    with pytest.raises(ValueError, match="k"):
        topk_logprobs(lp, 4)
    with pytest.raises(ValueError, match="target_ids"):
        greedy_accept(build_tree(lp, ids, 2), np.zeros(2, np.int64))
