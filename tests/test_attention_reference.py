"""CPU tests: the float64 tree-verify attention / KV compaction references against plain loops."""

from __future__ import annotations

import math

import numpy as np
import pytest

from kernels.reference_attention import compact_kv, qo_offsets, tree_verify_attention


def random_tree_visibility(rng: np.random.Generator, t: int) -> np.ndarray:
    """Ancestor visibility of a random tree with t rows (row i = row parent(i) plus i)."""
    vis = np.zeros((t, t), dtype=bool)
    vis[0, 0] = True
    for i in range(1, t):
        vis[i] = vis[int(rng.integers(0, i))]
        vis[i, i] = True
    return vis


def make_case(rng, prefix_lens, tree_lens, heads, page_size, pad_pages=1):
    """Random ragged inputs with a shuffled block table (pages of requests interleaved)."""
    batch = len(prefix_lens)
    need = [-(-(p + t) // page_size) for p, t in zip(prefix_lens, tree_lens, strict=True)]
    max_pages = max(need) + pad_pages
    num_pages = batch * max_pages + 3
    perm = rng.permutation(num_pages)[: batch * max_pages].reshape(batch, max_pages)
    kv = rng.standard_normal((num_pages, page_size, 576))
    q = rng.standard_normal((sum(tree_lens), heads, 576))
    t_max = max(tree_lens) + 1
    vis = np.zeros((batch, t_max, t_max), dtype=bool)
    for b, t in enumerate(tree_lens):
        vis[b, :t, :t] = random_tree_visibility(rng, t)
    return q, kv, perm.astype(np.int32), np.array(prefix_lens), np.array(tree_lens), vis


def plain_attention(q, kv, bt, prefix_lens, tree_lens, vis, scale):
    """One (request, tree row, head) at a time, with explicit visible-key lists."""
    page_size = kv.shape[1]
    out = np.zeros((q.shape[0], q.shape[1], 512))
    offs = qo_offsets(tree_lens)
    for b in range(len(prefix_lens)):
        lb, tb = int(prefix_lens[b]), int(tree_lens[b])
        rows = [kv[bt[b, p // page_size], p % page_size] for p in range(lb + tb)]
        for i in range(tb):
            visible = list(range(lb)) + [lb + j for j in range(tb) if vis[b, i, j]]
            for h in range(q.shape[1]):
                qv = q[offs[b] + i, h]
                logits = [scale * float(np.dot(qv, rows[k])) for k in visible]
                top = max(logits)
                weights = [math.exp(x - top) for x in logits]
                total = sum(weights)
                acc = np.zeros(512)
                for w, k in zip(weights, visible, strict=True):
                    acc += (w / total) * rows[k][:512]
                out[offs[b] + i, h] = acc
    return out


@pytest.mark.parametrize("page_size", [1, 16, 64])
def test_ragged_batch_matches_plain_loops(page_size: int) -> None:
    rng = np.random.default_rng(page_size)
    case = make_case(
        rng, prefix_lens=[0, 37, 5, 70], tree_lens=[6, 1, 9, 3], heads=3, page_size=page_size
    )
    got = tree_verify_attention(*case, scale=0.05)
    want = plain_attention(*case, scale=0.05)
    assert got.shape == (19, 3, 512)
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)


def test_prefix_zero_and_root_only() -> None:
    rng = np.random.default_rng(1)
    case = make_case(rng, prefix_lens=[0, 0, 3], tree_lens=[1, 4, 1], heads=2, page_size=16)
    got = tree_verify_attention(*case, scale=0.1)
    np.testing.assert_allclose(got, plain_attention(*case, scale=0.1), rtol=1e-10, atol=1e-12)
    q, kv, bt = case[0], case[1], case[2]
    # Root only with an empty prefix sees just its own row: the output is that row's value.
    np.testing.assert_allclose(got[0], np.broadcast_to(kv[bt[0, 0], 0, :512], (2, 512)))
    assert np.isfinite(got).all() and q.shape[0] == 6


def test_per_request_visibility_list_and_tree_mask_matters() -> None:
    rng = np.random.default_rng(2)
    q, kv, bt, pl, tl, vis = make_case(rng, [4, 2], [5, 3], heads=2, page_size=1)
    padded = tree_verify_attention(q, kv, bt, pl, tl, vis, scale=0.2)
    listed = [vis[0, :5, :5], vis[1, :3, :3]]
    np.testing.assert_array_equal(tree_verify_attention(q, kv, bt, pl, tl, listed, 0.2), padded)
    full = np.ones_like(vis)
    assert not np.allclose(tree_verify_attention(q, kv, bt, pl, tl, full, 0.2), padded)


def test_attention_rejects_bad_arguments() -> None:
    rng = np.random.default_rng(3)
    q, kv, bt, pl, tl, vis = make_case(rng, [3], [2], heads=1, page_size=16)
    with pytest.raises(ValueError, match="q must be"):
        tree_verify_attention(q[:1], kv, bt, pl, tl, vis, 1.0)
    with pytest.raises(ValueError, match="kv_cache must be"):
        tree_verify_attention(q, kv[..., :512], bt, pl, tl, vis, 1.0)
    with pytest.raises(ValueError, match="tree_lens"):
        tree_verify_attention(q, kv, bt, pl, np.array([0]), vis, 1.0)
    with pytest.raises(ValueError, match="capacity"):
        tree_verify_attention(q, kv, bt, np.array([10_000]), tl, vis, 1.0)
    with pytest.raises(ValueError, match="visibility"):
        tree_verify_attention(q, kv, bt, pl, tl, vis.astype(np.int8), 1.0)


@pytest.mark.parametrize("page_size", [1, 16, 64])
def test_compact_kv_moves_accepted_rows(page_size: int) -> None:
    rng = np.random.default_rng(10 + page_size)
    _, kv, bt, pl, _, _ = make_case(rng, [0, 33, 7], [9, 9, 9], heads=1, page_size=page_size)
    accepted = np.array([[0, 2, 3, 7], [0, -1, -1, -1], [0, 1, 5, -1]])
    before = kv.copy()
    got = compact_kv(kv, bt, pl, accepted)
    want = kv.copy()
    for b, acc in enumerate(accepted):
        old = [kv[bt[b, (pl[b] + a) // page_size], (pl[b] + a) % page_size].copy() for a in acc]
        for k, a in enumerate(acc):
            if a >= 0:
                p = pl[b] + k
                want[bt[b, p // page_size], p % page_size] = old[k]
    np.testing.assert_array_equal(got, want)
    assert not np.array_equal(got, kv)
    np.testing.assert_array_equal(kv, before)  # the reference does not modify its input


def test_compact_kv_rejects_bad_accepted() -> None:
    rng = np.random.default_rng(4)
    _, kv, bt, pl, _, _ = make_case(rng, [2], [5], heads=1, page_size=16)
    for bad in ([[1, 2]], [[0, 2, 2]], [[0, -1, 3]], [[-1]]):
        with pytest.raises(ValueError, match="accepted"):
            compact_kv(kv, bt, pl, np.array(bad))
