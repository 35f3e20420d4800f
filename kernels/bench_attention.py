"""Benchmark suite `attn`: tree-verify MLA attention vs torch SDPA with the same boolean mask.

Run on the GPU host: `python -m kernels.bench_attention --json` (or via `python -m kernels.bench`
once registered there). For every size: our kernel (bf16, tensor cores, auto KV split) and the
best plain-torch way (K/V gathered from the pages once, untimed; SDPA on q viewed as one head
of T*heads rows against the shared latent rows, boolean mask [B, 1, T*heads, L+T]); median and
IQR over CUDA-event timings after warm-up, input sets rotated when they would fit in L2 (each
sample is one call from Python, so at small sizes it holds the binding's host time too); ours
also replayed from a CUDA graph (`ours_graph`: the GPU time alone, as under SGLang's graphs);
achieved TFLOP/s (dense count: masked tree columns included) and bytes/s against the measured
ceilings (790 TFLOP/s bf16, 4.3 TB/s).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable

import torch

from kernels.bench import BenchConfig, Row, register_suite, row
from kernels.timing import summarize, time_cuda, time_graph

PEAK_TFLOPS, PEAK_TBS = 790.0, 4.3
SIZES = [  # (batch, prefix, tree rows T, heads)
    (64, 4096, 65, 8),
    (8, 32768, 65, 8),
    (16, 1024, 33, 8),
    (1, 4096, 65, 8),
    (4, 8192, 65, 16),
]


def timeit(fn: Callable[[int], object], sets: int, warmup: int = 5, reps: int = 30) -> dict:
    """Median / IQR (ms) of per-call CUDA-event timings; call i uses input set i % sets."""
    return _ms(time_cuda(fn, sets, warmup=warmup, reps=reps))


def _ms(t) -> dict:
    return {"median_ms": t.median_us / 1e3, "iqr_ms": t.iqr_us / 1e3,
            "samples_ms": [x / 1e3 for x in t.samples_us]}  # fmt: skip


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


def bench_size(
    batch: int, prefix: int, t: int, heads: int, page_size: int = 64, reps: int = 30
) -> dict:
    from kernels.cuda_attention import planned_splits, tree_verify_attention

    length = prefix + t
    flops = 2.0 * batch * t * heads * length * (576 + 512)
    kv_bytes = batch * length * 576 * 2
    io_bytes = kv_bytes + batch * t * heads * (576 + 512) * 2
    sets = max(1, min(48, -(-200_000_000 // io_bytes)))  # > 4x the 50 MB L2
    gen = torch.Generator().manual_seed(batch * 1000 + prefix)
    inputs = [make_inputs(batch, prefix, t, heads, page_size, gen) for _ in range(sets)]
    scale = 576**-0.5

    def ours(i: int):
        d = inputs[i]
        return tree_verify_attention(d["q"], d["kv"], d["table"], d["prefix"], d["tree"],
                                     d["vis"], scale, max_kv_len=length, check=False)  # fmt: skip

    # Correctness of this very launch against SDPA in fp32 on the first set (cheap refcheck).
    prepared = [sdpa_inputs(d, batch, prefix, t, heads, page_size) for d in inputs]
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def baseline(i: int):
        q, k, v, m = prepared[i]
        return sdpa(q, k, v, attn_mask=m, scale=scale)

    got = ours(0).float().view(batch, t * heads, 512)
    q, k, v, m = prepared[0]
    want = sdpa(q.float(), k.float(), v.float(), attn_mask=m, scale=scale).view_as(got)
    rel = float((got - want).norm() / want.norm())
    res = {"batch": batch, "prefix": prefix, "tree_rows": t, "heads": heads,
           "page_size": page_size, "flops": flops, "bytes": io_bytes, "input_sets": sets,
           "num_splits": planned_splits(batch, heads, t, length),
           "rel_err_vs_sdpa_fp32": rel}  # fmt: skip
    launches = max(sets, 8)  # the graph's calls a replay
    timers = (("ours", lambda: timeit(ours, sets, reps=reps)),
              ("torch_sdpa", lambda: timeit(baseline, sets, reps=reps)),
              ("ours_graph", lambda: {**_ms(time_graph(ours, sets, launches=launches,
                                                       reps=max(reps // 3, 5))),
                                      "launches": launches}))  # fmt: skip
    for name, timer in timers:
        try:
            s = timer()
        except torch.OutOfMemoryError as exc:  # recorded, not hidden: the baseline's limit
            res[name] = {"error": f"out of memory: {exc}"}
            continue
        sec = s["median_ms"] / 1e3
        s["tflops"] = flops / sec / 1e12
        s["tbs"] = io_bytes / sec / 1e12
        s["frac_peak_flops"] = s["tflops"] / PEAK_TFLOPS
        s["frac_peak_bw"] = s["tbs"] / PEAK_TBS
        res[name] = s
        torch.cuda.empty_cache()
    if "median_ms" in res["ours"] and "median_ms" in res["torch_sdpa"]:
        res["speedup_vs_sdpa"] = res["torch_sdpa"]["median_ms"] / res["ours"]["median_ms"]
    return res


SWEEP = {(64, 4096, 65, 8): [0, 1, 2, 3], (8, 32768, 65, 8): [0, 8, 11, 16]}


def sweep(algos: tuple[str, ...] = ("mma5", "mma8", "mma19", "mma21")) -> list[dict]:
    """Tuning: time each tensor-core variant and KV split count (0 = auto) on the target sizes."""
    from kernels.cuda_attention import planned_splits, tree_verify_attention

    rows = []
    for (batch, prefix, t, heads), split_list in SWEEP.items():
        gen = torch.Generator().manual_seed(7)
        d = make_inputs(batch, prefix, t, heads, 64, gen)
        q, k, v, m = sdpa_inputs(d, batch, prefix, t, heads, 64)
        sdpa = torch.nn.functional.scaled_dot_product_attention
        want = sdpa(q.float(), k.float(), v.float(), attn_mask=m, scale=576**-0.5)
        want = want.view(batch * t, heads, 512)
        del q, k, v, m
        flops = 2.0 * batch * t * heads * (prefix + t) * (576 + 512)
        for algo in algos:
            for splits in split_list:

                def fn(_i: int, d=d, algo=algo, splits=splits, length=prefix + t):
                    return tree_verify_attention(d["q"], d["kv"], d["table"], d["prefix"],
                                                 d["tree"], d["vis"], 576**-0.5, algo=algo,
                                                 num_splits=splits, max_kv_len=length,
                                                 check=False)  # fmt: skip

                rel = float((fn(0).float() - want).norm() / want.norm())
                s = timeit(fn, 1, warmup=3, reps=20)
                rows.append({"batch": batch, "prefix": prefix, "tree_rows": t, "heads": heads,
                             "algo": algo, "num_splits": splits,
                             "splits_run": planned_splits(batch, heads, t, prefix + t, algo=algo,
                                                          num_splits=splits),
                             "median_ms": s["median_ms"],
                             "iqr_ms": s["iqr_ms"], "tflops": flops / s["median_ms"] / 1e9,
                             "rel_err_vs_sdpa_fp32": rel})  # fmt: skip
                print(f"sweep B={batch} L={prefix} {algo} splits={splits}: "
                      f"{s['median_ms']:.3f} ms rel {rel:.1e}", file=sys.stderr)  # fmt: skip
        torch.cuda.empty_cache()
    return rows


def environment() -> dict:
    props = torch.cuda.get_device_properties(0)
    return {"gpu": props.name, "uuid": str(getattr(props, "uuid", "")),
            "sms": props.multi_processor_count, "torch": torch.__version__,
            "cuda": torch.version.cuda}  # fmt: skip


def run_suite(sizes: list[tuple[int, int, int, int]] | None = None) -> dict:
    """Run the `attn` suite; returns a JSON-able dict."""
    results = [bench_size(*s) for s in (sizes or SIZES)]
    return {"suite": "attn", "environment": environment(), "ceilings":
            {"tflops_bf16": PEAK_TFLOPS, "tb_per_s": PEAK_TBS}, "results": results}  # fmt: skip


def table(doc: dict) -> str:
    lines = ["B  prefix   T heads | ours ms (IQR)  TFLOP/s  TB/s | graph ms | sdpa ms  TFLOP/s | "
             "x  relerr"]  # fmt: skip
    for r in doc["results"]:
        o, s = r["ours"], r["torch_sdpa"]
        sd = f"{s['median_ms']:8.3f} {s['tflops']:7.1f}" if "median_ms" in s else "   error        "
        g = r.get("ours_graph", {})
        gr = f"{g['median_ms']:8.3f}" if "median_ms" in g else "       -"
        lines.append(
            f"{r['batch']:<3}{r['prefix']:>6} {r['tree_rows']:>3} {r['heads']:>5} | "
            f"{o['median_ms']:7.3f} ({o['iqr_ms']:.3f}) {o['tflops']:7.1f} {o['tbs']:5.2f} | "
            f"{gr} | {sd} | {r.get('speedup_vs_sdpa', float('nan')):4.2f} "
            f"{r['rel_err_vs_sdpa_fp32']:.1e}"
        )
    return "\n".join(lines)


@register_suite("attn")
def attn_suite(cfg: BenchConfig) -> list[Row]:
    """`python -m kernels.bench --suite attn`: cuda, cuda_graph and torch_sdpa rows per size."""
    rows = []
    for size in SIZES[:2] if cfg.quick else SIZES:
        r = bench_size(*size, reps=cfg.reps)
        shape = {k: r[k] for k in ("batch", "prefix", "tree_rows", "heads", "page_size")}
        for impl, key in (("cuda", "ours"), ("cuda_graph", "ours_graph"),
                          ("torch_sdpa", "torch_sdpa")):  # fmt: skip
            res = r[key]
            if "samples_ms" not in res:
                continue
            method = "graph" if key == "ours_graph" else "events"
            timing = summarize([x * 1e3 for x in res["samples_ms"]], method, res.get("launches", 1))
            rows.append(row("attn", "tree_verify_attention", impl, shape, timing,
                            tflops=res["tflops"], tb_per_s=res["tbs"],
                            frac_peak_flops=res["frac_peak_flops"],
                            frac_peak_bw=res["frac_peak_bw"],
                            rel_err_vs_sdpa_fp32=r["rel_err_vs_sdpa_fp32"]))  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", metavar="PATH", nargs="?", const="-", help="write JSON here")
    parser.add_argument("--sweep", metavar="PATH", help="also time every variant/split here")
    args = parser.parse_args(argv)
    if args.sweep:
        with open(args.sweep, "w") as fh:
            json.dump({"suite": "attn-sweep", "environment": environment(), "rows": sweep()}, fh)
    doc = run_suite()
    if args.json == "-":
        print(json.dumps(doc))
    elif args.json:
        with open(args.json, "w") as fh:
            json.dump(doc, fh, indent=1)
    print(table(doc), file=sys.stderr if args.json == "-" else sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
