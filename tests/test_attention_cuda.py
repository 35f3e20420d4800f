"""GPU tests: tree-verify attention and KV compaction kernels against the float64 references."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kernels import reference_attention as ref

pytestmark = pytest.mark.gpu

TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2}


def tree_visibility(gen: torch.Generator, t: int) -> torch.Tensor:
    vis = torch.zeros((t, t), dtype=torch.bool)
    vis[0, 0] = True
    for i in range(1, t):
        vis[i] = vis[int(torch.randint(0, i, (1,), generator=gen))]
        vis[i, i] = True
    return vis


def make_case(seed, prefix_lens, tree_lens, heads, page_size, dtype, t_pad=1):
    """Fresh random ragged inputs on the GPU; pages of the requests are shuffled together."""
    gen = torch.Generator().manual_seed(seed)
    batch = len(prefix_lens)
    need = [-(-(p + t) // page_size) for p, t in zip(prefix_lens, tree_lens, strict=True)]
    max_pages = max(need) + 1
    num_pages = batch * max_pages + 5
    table = torch.randperm(num_pages, generator=gen)[: batch * max_pages].view(batch, max_pages)
    kv = torch.randn((num_pages, page_size, 576), generator=gen).to(dtype)
    q = torch.randn((sum(tree_lens), heads, 576), generator=gen).to(dtype)
    t_max = max(tree_lens) + t_pad
    vis = torch.zeros((batch, t_max, t_max), dtype=torch.bool)
    for b, t in enumerate(tree_lens):
        vis[b, :t, :t] = tree_visibility(gen, t)
    cuda = [x.cuda() for x in (q, kv, table.to(torch.int32))]
    lens = [torch.tensor(x, dtype=torch.int32, device="cuda") for x in (prefix_lens, tree_lens)]
    return (*cuda, *lens, vis.cuda())


def rel_err(out: torch.Tensor, want: np.ndarray) -> float:
    got = out.double().cpu().numpy()
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


def check(case, dtype, scale=576**-0.5, **kw) -> float:
    from kernels.cuda_attention import tree_verify_attention

    q = case[0]
    poisoned = torch.full((q.shape[0], q.shape[1], 512), float("nan"), dtype=dtype, device="cuda")
    out = tree_verify_attention(*case, scale, out=poisoned, **kw)
    torch.cuda.synchronize()
    assert out.data_ptr() == poisoned.data_ptr()
    assert torch.isfinite(out).all(), "some output element was not written"
    want = ref.tree_verify_attention(*[x.cpu() for x in case], scale)
    err = rel_err(out, want)
    assert err < TOL[dtype], f"relative error {err:.3g}"
    return err


RAGGED = dict(prefix_lens=[0, 37, 130, 5], tree_lens=[1, 9, 17, 4])
_HOPPER = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
    reason="wgmma_tma and mma_sync_64 need an sm_90 device",
)
BF16_MMA = [  # every tensor-core kernel
    (torch.bfloat16, "mma_sync_32"),
    pytest.param(torch.bfloat16, "mma_sync_64", marks=_HOPPER),
    pytest.param(torch.bfloat16, "wgmma_tma", marks=_HOPPER),
]
ALL_ALGOS = [(torch.float32, "simt"), (torch.bfloat16, "simt"), *BF16_MMA]


@pytest.mark.parametrize("heads", [1, 8, 128])
@pytest.mark.parametrize("page_size", [1, 16, 64])
@pytest.mark.parametrize("dtype,algo", ALL_ALGOS)
def test_ragged_batch_matches_reference(heads, page_size, dtype, algo) -> None:
    case = make_case(
        heads * 100 + page_size, **RAGGED, heads=heads, page_size=page_size, dtype=dtype
    )
    check(case, dtype, algo=algo)


@pytest.mark.parametrize("splits", [1, 3, 7])
@pytest.mark.parametrize(
    "dtype,algo", [(torch.float32, "auto"), (torch.bfloat16, "auto"), *BF16_MMA]
)
def test_kv_splits_and_combine(splits, dtype, algo) -> None:
    case = make_case(splits, [700, 1500, 0], [33, 65, 2], heads=8, page_size=16, dtype=dtype)
    check(case, dtype, num_splits=splits, algo=algo)
    # A wrong (too small) planning hint must not change the result: the last split takes the rest.
    check(case, dtype, num_splits=splits, max_kv_len=1, algo=algo)


def test_root_only_prefix_zero_sees_itself() -> None:
    case = make_case(5, [0, 0], [1, 1], heads=4, page_size=64, dtype=torch.float32)
    err = check(case, torch.float32)
    assert err < 1e-6


def test_long_prefix_auto_split_bf16() -> None:
    case = make_case(9, [5000, 3071], [65, 40], heads=8, page_size=64, dtype=torch.bfloat16)
    check(case, torch.bfloat16)


@_HOPPER
@pytest.mark.parametrize("algo", ["wgmma_tma", "auto"])
def test_long_prefix_wgmma(algo) -> None:
    # 520 M rows a request (9 CTAs, the last with 8 live rows), splits planned and forced.
    case = make_case(
        13, [5000, 3071, 64], [65, 40, 65], heads=8, page_size=64, dtype=torch.bfloat16
    )
    check(case, torch.bfloat16, algo=algo)
    check(case, torch.bfloat16, algo=algo, num_splits=1)


@_HOPPER
@pytest.mark.parametrize("page_size", [16, 32, 64, 128])
@pytest.mark.parametrize("algo", ["wgmma_tma", "mma_sync_64"])
def test_wgmma_ignores_kv_slots_past_the_end(page_size, algo) -> None:
    # NaN in every slot a request does not own up to (the rest of its last page, its unused
    # pages): a TMA box carries the rest of the last page into shared memory, and 0 x NaN in the
    # PV would poison O unless those rows are zeroed first.
    prefix_lens, tree_lens = [100, 0, 4000, 63], [65, 3, 30, 1]
    case = make_case(
        23 + page_size, prefix_lens, tree_lens, heads=8, page_size=page_size, dtype=torch.bfloat16
    )
    kv, table = case[1], case[2]
    for b, (p, t) in enumerate(zip(prefix_lens, tree_lens, strict=True)):
        n = p + t
        kv[table[b, (n - 1) // page_size].long(), (n - 1) % page_size + 1 :] = float("nan")
        kv[table[b, -(-n // page_size) :].long()] = float("nan")
    for splits in (0, 1, 3):
        check(case, torch.bfloat16, algo=algo, num_splits=splits)


@_HOPPER
@pytest.mark.parametrize("page_size", [16, 48])  # TMA loads; cp.async loads (48: no TMA box)
@pytest.mark.parametrize("num_splits", [1, 3])
def test_wgmma_tail_path(page_size, num_splits) -> None:
    # CTAs with <= 8 live rows take the swap-AB tail path, scheduled after the others. Rows a
    # request: 65 x 8 = 520 (tail of 8), 7 x 8 = 56 (one CTA of 56), 1 x 8 = 8 (the tail is
    # the whole request), 9 x 8 = 72 (tail of 8); prefix 0 included.
    case = make_case(
        17, [4000, 0, 129, 63], [65, 7, 1, 9], heads=8, page_size=page_size, dtype=torch.bfloat16
    )
    check(case, torch.bfloat16, algo="wgmma_tma", num_splits=num_splits)


def test_planned_splits() -> None:
    from kernels.cuda_attention import planned_splits

    assert planned_splits(8, 8, 65, 32833, num_splits=3) == 3  # a forced count is kept
    for size in ((64, 8, 65, 4161), (8, 8, 65, 32833), (1, 128, 1, 1)):
        assert 1 <= planned_splits(*size) <= 128
    assert planned_splits(1, 8, 65, 64) == 1  # one KV tile: nothing to split
    with pytest.raises(ValueError, match="planned_splits: algo must be one of"):
        planned_splits(1, 8, 65, 64, algo="mma21")  # a tuning-step name, retired


def test_bench_size_rows_in_the_bench_schema() -> None:
    from kernels.bench.attn import bench_size

    rows = bench_size(2, 256, 9, 8, reps=5, variants=("auto", "mma_sync_32"))
    impls = [r["impl"] for r in rows]
    assert impls == [
        "cuda",
        "cuda_graph",
        "cuda:mma_sync_32",
        "cuda_graph:mma_sync_32",
        "torch_sdpa",
    ]
    for r in rows:
        assert r["suite"] == "attn" and r["kernel"] == "tree_verify_attention", r
        assert r["median_us"] > 0 and r["tflops"] > 0 and "samples_us" not in r, r
        assert r["rel_err_vs_sdpa_fp32"] < TOL[torch.bfloat16], r
    assert rows[1]["mode"] == "graph" and rows[0]["mode"] == "events"


def test_scale_matters() -> None:
    case = make_case(11, [20], [5], heads=2, page_size=16, dtype=torch.float32)
    check(case, torch.float32, scale=0.3)


@pytest.mark.parametrize("page_size", [1, 16, 64])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_compact_kv_exact(page_size, dtype) -> None:
    from kernels.cuda_attention import compact_kv

    q, kv, table, prefix, _, _ = make_case(
        page_size, [0, 33, 7, 64], [9, 9, 9, 12], heads=1, page_size=page_size, dtype=dtype
    )
    accepted = torch.tensor(
        [[0, 2, 3, 7, -1], [0, -1, -1, -1, -1], [0, 1, 5, 6, 8], [0, 4, 9, 10, 11]],
        dtype=torch.int64,
        device="cuda",
    )
    want = ref.compact_kv(kv.float().cpu(), table.cpu(), prefix.cpu(), accepted.cpu())
    got = compact_kv(kv, table, prefix, accepted)
    torch.cuda.synchronize()
    assert got.data_ptr() == kv.data_ptr()
    np.testing.assert_array_equal(got.float().cpu().numpy(), want)


def test_bad_arguments_raise() -> None:
    from kernels.cuda_attention import compact_kv, tree_verify_attention

    q, kv, table, pl, tl, vis = make_case(3, [4, 2], [3, 2], 2, 16, torch.bfloat16)
    args = (q, kv, table, pl, tl, vis, 0.1)
    with pytest.raises(ValueError, match="tree_verify_attention: kv_cache: expected dtype"):
        tree_verify_attention(q, kv.float(), *args[2:])
    with pytest.raises(ValueError, match="tree_verify_attention: q: expected a CUDA tensor"):
        tree_verify_attention(q.cpu(), *args[1:])
    with pytest.raises(ValueError, match="tree_verify_attention: q: expected a contiguous"):
        tree_verify_attention(q.transpose(0, 1).contiguous().transpose(0, 1), *args[1:])
    with pytest.raises(ValueError, match="tree_verify_attention: block_table: expected dtype"):
        tree_verify_attention(q, kv, table.long(), *args[3:])
    with pytest.raises(ValueError, match="tree_verify_attention: tree_lens must sum"):
        tree_verify_attention(q, kv, table, pl, tl + 1, vis, 0.1)
    with pytest.raises(ValueError, match="tree_verify_attention: visibility: expected shape"):
        tree_verify_attention(q, kv, table, pl, tl, vis[:, :2].contiguous(), 0.1)
    with pytest.raises(ValueError, match="tree_verify_attention: prefix_lens: expected a CUDA"):
        tree_verify_attention(q, kv, table, pl.cpu(), tl, vis, 0.1)
    with pytest.raises(ValueError, match="prefix_lens \\+ tree_lens"):
        tree_verify_attention(q, kv, table, pl + 10_000, tl, vis, 0.1)
    with pytest.raises(ValueError, match="algo 'wgmma_tma' needs bfloat16"):
        tree_verify_attention(q.float(), kv.float(), *args[2:], algo="wgmma_tma")
    with pytest.raises(ValueError, match="algo must be one of"):  # a retired tuning-step name
        tree_verify_attention(q, kv, *args[2:], algo="mma8")
    with pytest.raises(ValueError, match="tree_verify_attention: q: expected a torch.Tensor"):
        tree_verify_attention(q.tolist(), *args[1:])  # ValueError, as in kernels.cuda
    with pytest.raises(ValueError, match="compact_kv: accepted rows"):
        compact_kv(kv, table, pl, torch.tensor([[0, 2, 1], [0, -1, -1]], device="cuda"))
    with pytest.raises(ValueError, match="compact_kv: accepted: expected shape"):
        compact_kv(kv, table, pl, torch.zeros((3, 2), dtype=torch.int32, device="cuda"))
