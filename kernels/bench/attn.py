"""Benchmark suite `attn` of `python -m kernels.bench`: tree-verify MLA attention vs torch SDPA.

For every size: our kernel (bf16, each `--variants` algorithm, auto KV split) timed per call
with CUDA events (`cuda`: the binding's host time included at small sizes) and replayed from a
CUDA graph (`cuda_graph`: the GPU time alone, as under SGLang's graphs), and the best
plain-torch way with the same boolean mask (`torch_sdpa`: K/V gathered from the pages once,
untimed; SDPA on q viewed as one head of T*heads rows against the shared latent rows, mask
[B, 1, T*heads, L+T]). Input sets rotate when they would fit in L2. Each row carries the
achieved TFLOP/s (dense count: masked tree columns included) and TB/s against the measured
ceilings (790 TFLOP/s bf16, 4.3 TB/s) and the relative error against SDPA in fp32. `--sweep`
adds rows (kernel `tree_verify_attention_splits`) for each forced KV split count at the two
target sizes.

Kernel `row_attention` is the reference engine's attention call as it runs (fp32, the `small`
preset's 8 heads over 576-wide KV rows, 512 latent): one decode step of `B` requests (the
`--batch` list), each `T` = `--row-budget` + 1 rows (root + tree nodes, random trees) over a
prefix of `L` keys (each of `--prefix-len`; with `--decode-spread N`, a diagnostic, the B
requests' prefixes spread evenly over L .. L + N - 1: shape key `spread`) in 64-slot pages,
every row seeing its prefix, its ancestors and itself (`kernels.row_attention.step_rows`).
`torch_rows` is the engine's `torch` backend (`TorchAttention` on a GPU: length bucket 64, 64
rows per call), `cuda_rows` its `cuda` backend (the tree-verify kernel with every row its own
request, fp32 SIMT, KV splits of `kernels.row_attention.SPLIT_KEYS`). These rows give `ops
report` its s(c) for the change `attention: torch -> cuda` (ops.sections.change.BENCH_MAP; pin
T and L with `change.shape`). Kernel `row_attention_prefill` is the same two calls over the
engine's prefill of one prompt of `L` tokens (each of `--prefix-len`): its L - 1 rows, row p
seeing positions 0 .. p, cut as `engine.decode.prefill` cuts them, into forwards of at most
`--prefill-block` rows (the forward's row capacity; the `small` preset's 576), each block its
own plan and calls (shape key `block`), the prefill part of the attention's time. Each impl is
timed twice: one call per CUDA-event sample, its plan built beforehand (`torch_rows`,
`cuda_rows`: the kernel-level comparison), and as the engine's attention STAGE
(`torch_rows_stage`, `cuda_rows_stage`, shape key `layers`, `kernels.timing.forward_sampler`),
shaped as engine.forward runs it: per forward, the GPU idle, the plan on the host clock, then
per layer a GPU piece of `--stage-piece-us` (the stand-in for the graph piece before that
layer's call) and the call between CUDA events, each layer over its own pool. So a path whose
launches take longer on the CPU than the GPU's head start (the torch one: about 9 launches per
64-row group) pays that wait as the engine's clock does. (The rows before this sampler enqueued
the layers behind one long GPU sleep; on the H200 both read the same s, and both read the torch
path's s low against the service's: prefill about 1.5x against 1.63-1.65x, the decode step at
B=32 1.11x against 1.17x. A batch spread over 64 tokens reads it far higher, 1.58x, where a load
of one prompt keeps the service's requests together; docs/performance.md.) The two impls' stage
samples are taken in turn (`kernels.timing.interleave`, rows marked `interleaved`), so a slow
spell on a shared host or GPU weighs on both alike; each stage row also carries its two parts,
`host_us` (the plans, host clock) and `gpu_us` (the layers' calls, GPU time), medians over the
samples, and its `piece_us`. The stage rows are what `ops report` projects with
(playbooks/rollout-attention.yaml): the torch plan's host work (grouping by length, one gather
of every group's table) is part of what the switch removes. As in the engine, a decode step's
plans and a prefill's start from a slot table already on the device (engine.decode builds both
there). Without a CUDA device the suite prints a note and yields no rows.
"""

from __future__ import annotations

import numpy as np
import torch

from kernels.bench.config import STAGE_PIECE_US, BenchConfig, Row, impl_name, row
from kernels.timing import Timing, forward_sampler, interleave, summarize, time_cuda, time_graph

PEAK_TFLOPS, PEAK_TBS = 790.0, 4.3
SIZES = [  # (batch, prefix, tree rows T, heads); the first two are the target sizes
    (64, 4096, 65, 8),
    (8, 32768, 65, 8),
    (16, 1024, 33, 8),
    (1, 4096, 65, 8),
    (4, 8192, 65, 16),
]
SWEEP = {(64, 4096, 65, 8): [0, 1, 2, 3], (8, 32768, 65, 8): [0, 8, 11, 16]}  # split counts
SCALE = 576**-0.5


def make_inputs(batch: int, prefix: int, t: int, heads: int, page_size: int, gen) -> dict:
    pages_per = -(-(prefix + t) // page_size)
    table = torch.randperm(batch * pages_per, generator=gen).view(batch, pages_per)
    kv = torch.randn((batch * pages_per, page_size, 576), generator=gen, dtype=torch.bfloat16)
    q = torch.randn((batch * t, heads, 576), generator=gen, dtype=torch.bfloat16)
    vis = torch.zeros((batch, t, t), dtype=torch.bool)
    parents = torch.randint(0, 1 << 30, (batch, t), generator=gen)
    for i in range(t):  # random trees: parent of i is a random earlier node
        vis[:, i] = vis[torch.arange(batch), parents[:, i] % max(i, 1)] if i else vis[:, 0]
        vis[:, i, i] = True
    d = {"q": q, "kv": kv, "table": table.to(torch.int32), "vis": vis}
    d = {k: v.cuda() for k, v in d.items()}
    d["prefix"] = torch.full((batch,), prefix, dtype=torch.int32, device="cuda")
    d["tree"] = torch.full((batch,), t, dtype=torch.int32, device="cuda")
    return d


def sdpa_inputs(d: dict, batch: int, prefix: int, t: int, heads: int, page_size: int) -> tuple:
    """Gather K/V rows per request and build the boolean mask (untimed preparation)."""
    length = prefix + t
    pos = torch.arange(length, device="cuda")
    slots = d["table"][:, pos // page_size].long() * page_size + pos % page_size
    keys = d["kv"].view(-1, 576)[slots].unsqueeze(1)  # [B, 1, L, 576]
    mask = torch.ones((batch, t, length), dtype=torch.bool, device="cuda")
    mask[:, :, prefix:] = d["vis"]
    mask = mask.repeat_interleave(heads, dim=1).unsqueeze(1)  # [B, 1, T*heads, L]
    q = d["q"].view(batch, 1, t * heads, 576)
    return q, keys, keys[..., :512], mask


def _ours(d: dict, length: int, algo: str, num_splits: int = 0):
    from kernels.cuda_attention import tree_verify_attention

    def fn(i: int):
        x = d[i] if isinstance(d, list) else d
        return tree_verify_attention(
            x["q"],
            x["kv"],
            x["table"],
            x["prefix"],
            x["tree"],
            x["vis"],
            SCALE,
            max_kv_len=length,
            num_splits=num_splits,
            algo=algo,
            check=False,
        )

    return fn


def _rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    got = got.float().reshape(want.shape)
    return float((got - want).norm() / want.norm())


def _rates(t: Timing, flops: float, io_bytes: float) -> dict:
    sec = t.median_us / 1e6
    tflops, tbs = flops / sec / 1e12, io_bytes / sec / 1e12
    return {
        "tflops": tflops,
        "tb_per_s": tbs,
        "frac_peak_flops": tflops / PEAK_TFLOPS,
        "frac_peak_bw": tbs / PEAK_TBS,
    }


def bench_size(
    batch: int,
    prefix: int,
    t: int,
    heads: int,
    page_size: int = 64,
    reps: int = 30,
    variants: tuple[str, ...] = ("auto",),
) -> list[Row]:
    """The rows of one size: `cuda` and `cuda_graph` per variant, and `torch_sdpa`."""
    from kernels.cuda_attention import planned_splits

    length = prefix + t
    flops = 2.0 * batch * t * heads * length * (576 + 512)
    io_bytes = batch * length * 576 * 2 + batch * t * heads * (576 + 512) * 2
    sets = max(1, min(48, -(-200_000_000 // io_bytes)))  # > 4x the 50 MB L2
    gen = torch.Generator().manual_seed(batch * 1000 + prefix)
    inputs = [make_inputs(batch, prefix, t, heads, page_size, gen) for _ in range(sets)]
    prepared = [sdpa_inputs(d, batch, prefix, t, heads, page_size) for d in inputs]
    sdpa = torch.nn.functional.scaled_dot_product_attention
    q, k, v, m = prepared[0]
    want = sdpa(q.float(), k.float(), v.float(), attn_mask=m, scale=SCALE)
    shape = {
        "batch": batch,
        "prefix": prefix,
        "tree_rows": t,
        "heads": heads,
        "page_size": page_size,
    }
    rows: list[Row] = []

    def add(impl: str, timer, rel: float, **extra) -> None:
        try:
            timing = timer()
        except torch.OutOfMemoryError as exc:  # recorded, not hidden: the baseline's limit
            rows.append(
                {
                    "suite": "attn",
                    "kernel": "tree_verify_attention",
                    "impl": impl,
                    "shape": shape,
                    "error": f"out of memory: {exc}",
                }
            )
            return
        rates = _rates(timing, flops, io_bytes)
        rows.append(
            row(
                "attn",
                "tree_verify_attention",
                impl,
                shape,
                timing,
                **rates,
                rel_err_vs_sdpa_fp32=rel,
                **extra,
            )
        )
        torch.cuda.empty_cache()

    launches = max(sets, 8)  # the graph's calls a replay
    for algo in variants:
        ours = _ours(inputs, length, algo)
        rel = _rel_err(ours(0), want)
        splits = planned_splits(batch, heads, t, length, algo=algo)
        add(
            impl_name("cuda", algo),
            lambda fn=ours: time_cuda(fn, sets, reps=reps),
            rel,
            num_splits=splits,
            input_sets=sets,
        )
        add(
            impl_name("cuda_graph", algo),
            lambda fn=ours: time_graph(fn, sets, launches=launches, reps=max(reps // 3, 5)),
            rel,
            num_splits=splits,
            input_sets=sets,
        )

    def baseline(i: int):
        q, k, v, m = prepared[i]
        return sdpa(q, k, v, attn_mask=m, scale=SCALE)

    add(
        "torch_sdpa",
        lambda: time_cuda(baseline, sets, reps=reps),
        _rel_err(baseline(0), want),
        input_sets=sets,
    )
    return rows


def sweep_rows(variants: tuple[str, ...], reps: int = 20) -> list[Row]:
    """Each variant at each KV split count of SWEEP (0 = the planner's), one input set."""
    from kernels.cuda_attention import planned_splits

    rows: list[Row] = []
    sdpa = torch.nn.functional.scaled_dot_product_attention
    for (batch, prefix, t, heads), split_list in SWEEP.items():
        d = make_inputs(batch, prefix, t, heads, 64, torch.Generator().manual_seed(7))
        q, k, v, m = sdpa_inputs(d, batch, prefix, t, heads, 64)
        want = sdpa(q.float(), k.float(), v.float(), attn_mask=m, scale=SCALE)
        del q, k, v, m
        length = prefix + t
        flops = 2.0 * batch * t * heads * length * (576 + 512)
        io_bytes = batch * length * 576 * 2 + batch * t * heads * (576 + 512) * 2
        for algo in variants:
            for splits in split_list:
                fn = _ours(d, length, algo, splits)
                rel = _rel_err(fn(0), want)
                timing = time_cuda(fn, 1, warmup=3, reps=reps)
                shape = {
                    "batch": batch,
                    "prefix": prefix,
                    "tree_rows": t,
                    "heads": heads,
                    "page_size": 64,
                    "num_splits": splits,
                }
                run = planned_splits(batch, heads, t, length, algo=algo, num_splits=splits)
                rows.append(
                    row(
                        "attn",
                        "tree_verify_attention_splits",
                        impl_name("cuda", algo),
                        shape,
                        timing,
                        **_rates(timing, flops, io_bytes),
                        splits_run=run,
                        rel_err_vs_sdpa_fp32=rel,
                    )
                )
        torch.cuda.empty_cache()
    return rows


ROW_HEADS, ROW_KV, ROW_LATENT = 8, 576, 512  # the engine's `small` preset
ROW_SCALE = 128**-0.5  # its softmax scale: (qk_nope_dim 64 + qk_rope_dim 64) ** -0.5
ROW_PAGE, ROW_BUCKET, ROW_PER_CALL = 64, 64, 64  # its page size; TorchAttention on a GPU
ROW_ROTATE = 200_000_000  # bytes of KV over the input sets (> 4x the 50 MB L2)
ROW_TOL = 1e-5  # relative error (norm) of an fp32 row result against float64
# ... of a torch row whose matmuls ran in TF32 (10-bit mantissa inputs; `--matmul tf32`, the
# engine's default on a GPU): the tolerance the precision gives, not a looser check of fp32
ROW_TOL_TF32 = 5e-3


def _input_sets(per_set: int) -> int:
    """Input sets rotated so their KV (`per_set` bytes each) exceeds ROW_ROTATE (2 to 64)."""
    return max(2, min(64, -(-ROW_ROTATE // per_set)))


def decode_prefixes(prefix: int, spread: int, b: int, sets: int) -> list[list[int]]:
    """Per input set, the prefix lengths of a decode step's `b` requests over prefix ..
    prefix + spread - 1 (0: all `prefix`): evenly within every set, interleaved so each set
    spans the range (a batch whose requests stand at different points of their output)."""
    n = sets * b
    return [[prefix + (i * sets + s) * spread // n for i in range(b)] for s in range(sets)]


def row_step_inputs(b: int, t: int, prefix: int, sets: int, seed: int, spread: int = 0) -> tuple:
    """One pool (fp32, on the GPU) for every input set, each set's B requests in pages of
    their own (shuffled over the pool), and per set the step's rows (table, lens) and q; the
    requests' prefixes per `decode_prefixes`."""
    from kernels.row_attention import random_parents, step_rows

    rng = np.random.default_rng(seed)
    per_req = -(-(prefix + max(spread - 1, 0) + t) // ROW_PAGE)
    order = rng.permutation(sets * b * per_req).reshape(sets, b, per_req)
    gen = torch.Generator(device="cuda").manual_seed(seed)
    pool = torch.randn(sets * b * per_req * ROW_PAGE, ROW_KV, device="cuda", generator=gen)
    steps = []
    for s, prefixes in enumerate(decode_prefixes(prefix, spread, b, sets)):
        parents = [random_parents(rng, t) for _ in range(b)]
        table, lens = step_rows(prefixes, parents, order[s], ROW_PAGE)
        q = torch.randn(b * t, ROW_HEADS, ROW_KV, device="cuda", generator=gen)
        steps.append((table, lens, q))
    return pool, steps


def row_step_blocks(b: int, t: int, prefix: int, sets: int, spread: int = 0) -> tuple:
    """(pool, per input set: its one forward [(table, lens, q)]) of a decode step, as
    `_row_impls` takes them."""
    seed = b * 100_000 + prefix * 100 + t
    pool, steps = row_step_inputs(b, t, prefix, sets, seed, spread)
    # a decode step's slot table is built on the device (engine.decode: visible_rows_device),
    # outside the attention stage: its plans start from a device table
    return pool, [[(torch.from_numpy(tab).to(pool.device), lens, q)] for tab, lens, q in steps]


def row_prefill_blocks(prompt: int, sets: int, block: int) -> tuple:
    """(pool, per input set: the engine's forwards [(table, lens, q), ...]) of one prompt's
    prefill: rows 0 .. prompt - 2 over the request's shuffled pages, cut as engine.decode's
    `prefill` cuts them, each block's table built on the GPU as there
    (`kernels.row_attention.prefill_blocks`)."""
    from kernels import row_attention as ra

    n = max(prompt - 1, 1)
    pages = -(-n // ROW_PAGE)
    rng = np.random.default_rng(prompt)
    order = rng.permutation(sets * pages).reshape(sets, 1, pages)
    gen = torch.Generator(device="cuda").manual_seed(prompt)
    pool = torch.randn(sets * pages * ROW_PAGE, ROW_KV, device="cuda", generator=gen)
    blocks = []
    for s in range(sets):
        slots = ra.paged_slots(order[s], n, ROW_PAGE)[0]
        blocks.append(
            [
                (table, lens, torch.randn(b - a, ROW_HEADS, ROW_KV, device="cuda", generator=gen))
                for a, b, table, lens in ra.prefill_blocks(slots, n, block, pool.device)
            ]
        )
    return pool, blocks


def row_attention_rows(
    b: int,
    t: int,
    prefix: int,
    reps: int = 50,
    refcheck: bool = True,
    layers: int = 4,
    spread: int = 0,
    piece_us: float = STAGE_PIECE_US,
) -> list[Row]:
    """`torch_rows` and `cuda_rows` for one decode step of b requests x t rows over prefix keys
    (the requests' prefixes over prefix .. prefix + spread - 1: `decode_prefixes`)."""

    per_set = b * -(-(prefix + max(spread - 1, 0) + t) // ROW_PAGE) * ROW_PAGE * ROW_KV * 4
    sets = _input_sets(per_set)
    pool, blocks = row_step_blocks(b, t, prefix, sets, spread)
    shape = {
        "B": b,
        "T": t,
        "L": prefix,
        "spread": spread,
        "heads": ROW_HEADS,
        "kv_dim": ROW_KV,
        "dtype": "fp32",
    }
    return _row_impls(
        "row_attention", shape, pool, blocks, b * t, sets, reps, refcheck, layers, piece_us
    )


def _row_impls(
    kernel: str,
    shape: dict,
    pool: torch.Tensor,
    blocks: list[list[tuple]],
    n_rows: int,
    sets: int,
    reps: int,
    refcheck: bool,
    layers: int,
    piece_us: float,
) -> list[Row]:
    """Per impl: one call per block (plans built beforehand) per CUDA-event sample (`torch_rows`,
    `cuda_rows`), and the forward's whole attention stage (`*_stage`: per block its plan on the
    host, then `layers` calls, each over its own layer's pool, after a `piece_us` GPU piece:
    `kernels.timing.forward_sampler`, the two impls' samples interleaved). `blocks[i]`: input
    set i's forwards, each (table, lens, q): a decode step is one, a prefill the engine's
    blocks of its forward's row capacity."""
    from kernels import row_attention as ra

    dev = pool.device
    plan_one = {
        "torch_rows": lambda tab, lens: ra.torch_rows_plan(
            tab, lens, dev, ROW_BUCKET, ROW_PER_CALL
        ),
        "cuda_rows": lambda tab, lens: ra.rowwise_plan(tab, lens, dev),
    }
    call_of = {"torch_rows": ra.torch_rows, "cuda_rows": ra.cuda_rows}
    extra = {
        "torch_rows": {"bucket": ROW_BUCKET, "rows_per_call": ROW_PER_CALL},
        "cuda_rows": {"algo": "simt", "split_keys": ra.SPLIT_KEYS},
    }
    # the engine's layers each read their own pool (same slots, other memory): layer 0 is
    # `pool`, the others copies of its shape, so a layer's call never finds the last one's
    # keys in L2
    gen = torch.Generator(device=dev).manual_seed(n_rows)
    pools = [pool] + [torch.randn(pool.shape, device=dev, generator=gen) for _ in range(layers - 1)]
    want = None
    if refcheck:
        want = torch.cat(
            [
                ra.reference_rows(
                    q,
                    pool,
                    tab.cpu().numpy() if isinstance(tab, torch.Tensor) else tab,
                    lens,
                    ROW_SCALE,
                    ROW_LATENT,
                )
                for tab, lens, q in blocks[0]
            ]
        )
    by_impl: dict[str, list[Row]] = {}
    samplers, common_of, parts_of = {}, {}, {}
    for impl in ("torch_rows", "cuda_rows"):
        plan, call = plan_one[impl], call_of[impl]
        plans = [[plan(tab, lens) for tab, lens, _ in blocks[i]] for i in range(sets)]

        def fn(i: int, call=call, plans=plans) -> list[torch.Tensor]:
            return [
                call(q, pool, p, ROW_SCALE, ROW_LATENT)
                for (_, _, q), p in zip(blocks[i], plans[i], strict=True)
            ]

        def forwards(i: int, plan=plan, call=call) -> list[tuple]:
            return [
                (
                    lambda tab=tab, lens=lens: plan(tab, lens),
                    lambda p, layer, q=q: call(q, pools[layer], p, ROW_SCALE, ROW_LATENT),
                )
                for tab, lens, q in blocks[i]
            ]

        check: dict = {}
        if want is not None:
            rel = float((torch.cat(fn(0)).double() - want).norm() / want.norm())
            tf32 = impl == "torch_rows" and torch.backends.cuda.matmul.allow_tf32
            tol = ROW_TOL_TF32 if tf32 else ROW_TOL
            check = {"rel_err_vs_fp64": rel, "refcheck": rel < tol, "tolerance": tol}
        common_of[impl] = {"rows": n_rows, "input_sets": sets, **extra[impl], **check}
        timing = time_cuda(fn, sets, reps=reps)
        by_impl[impl] = [row("attn", kernel, impl, shape, timing, **common_of[impl])]
        parts_of[impl] = []
        samplers[impl] = forward_sampler(forwards, sets, layers, piece_us, parts=parts_of[impl])
        del plans
    # the stage rows (what the rollout projects with) sample both impls in turn (A B B A ...)
    stage = interleave(samplers, reps=max(10, reps // 2))
    rows: list[Row] = []
    for impl in ("torch_rows", "cuda_rows"):
        timing = summarize(stage[impl], "stage")
        # the stage's two parts, each its median over the samples: the plans on the host clock
        # (the part a busy host stretches) and the layers' calls on the GPU's
        host_us, gpu_us = (float(np.median(p)) for p in zip(*parts_of[impl], strict=True))
        rows += by_impl[impl]
        rows.append(
            row(
                "attn",
                kernel,
                impl + "_stage",
                {**shape, "layers": layers},
                timing,
                interleaved=True,
                host_us=host_us,
                gpu_us=gpu_us,
                piece_us=piece_us,
                **common_of[impl],
            )
        )
    return rows


def row_prefill_rows(
    prompt: int,
    reps: int = 50,
    refcheck: bool = True,
    layers: int = 4,
    block: int = 576,
    piece_us: float = STAGE_PIECE_US,
) -> list[Row]:
    """`torch_rows` and `cuda_rows` over the engine's prefill of one prompt of `prompt` tokens:
    rows 0 .. prompt - 2, row p seeing slots 0 .. p of the request's pages, in forwards of at
    most `block` rows (engine.decode's `prefill`: rows a .. b - 1 over the table of slots
    0 .. b - 1)."""
    n = max(prompt - 1, 1)
    sets = _input_sets(-(-n // ROW_PAGE) * ROW_PAGE * ROW_KV * 4)
    pool, blocks = row_prefill_blocks(prompt, sets, block)
    shape = {
        "B": 1,
        "L": prompt,
        "block": block,
        "heads": ROW_HEADS,
        "kv_dim": ROW_KV,
        "dtype": "fp32",
    }
    return _row_impls(
        "row_attention_prefill", shape, pool, blocks, n, sets, reps, refcheck, layers, piece_us
    )


def attn_suite(cfg: BenchConfig) -> list[Row]:
    """`python -m kernels.bench --suite attn`: cuda, cuda_graph and torch_sdpa rows per size,
    then the engine's call (`row_attention`: torch_rows, cuda_rows) per batch and prefix, and
    over a prefill of each prefix length (`row_attention_prefill`)."""
    from kernels.cuda_attention import ALGOS

    variants = tuple(v for v in cfg.variants if v in ALGOS) or ("auto",)
    rows: list[Row] = []
    for size in SIZES[:2] if cfg.quick else SIZES:
        rows += bench_size(*size, reps=cfg.reps, variants=variants)
    if cfg.sweep:
        rows += sweep_rows(variants)
    for prefix in cfg.prefix_lens:
        for b in cfg.batches:
            rows += row_attention_rows(
                b,
                cfg.row_budget + 1,
                prefix,
                cfg.reps,
                cfg.refcheck,
                spread=cfg.decode_spread,
                piece_us=cfg.stage_piece_us,
            )
            torch.cuda.empty_cache()  # the step's pool and plans are gone with the call
        rows += row_prefill_rows(
            prefix, cfg.reps, cfg.refcheck, block=cfg.prefill_block, piece_us=cfg.stage_piece_us
        )
        torch.cuda.empty_cache()
    return rows
