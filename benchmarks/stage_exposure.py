"""Does the bench's attention stage hide host time the engine pays? (GPU diagnosis, one call.)

The kernel bench's stage rows enqueued a forward's layer calls behind a GPU sleep
(`kernels.timing.stage_sampler`; since 2026-12-03 they take `forward_sampler`, this script's
`piece` sampler with each layer over its own pool), so their span was the GPU's time alone.
The engine's stage clock (`engine.forward.AttentionTimer`) puts events around each layer's
call right after that layer's graph piece, and every forward starts with the GPU idle (its
input upload waits for the stream), so a host-heavy path (the torch one: ~9 launches per
64-row group) can starve the GPU inside the span. For the torch and CUDA paths at the
rollout's shapes (a 1024-token prefill in the engine's blocks of 576 rows; decode steps of
B x 17 rows over 1024 keys), each stage is sampled three ways, in turn
(`kernels.timing.interleave`):
- `hidden`: the bench's stage row as it was (host plan, then the layers behind a GPU sleep);
- `exposed`: the host plan, then per layer events around the call, the GPU idle at the start;
- `piece<N>`: as exposed, with a GPU sleep of N us before each layer's call (a stand-in for the
  engine's graph piece, the head start the CPU gets on the call's launches).
`exposed` and `piece<N>` are `kernels.timing.forward_sampler` (piece 0 and N) over one pool
for every layer; the bench's stage rows give each layer its own.
Each sample's two parts are kept too, the plan on the host clock and the calls' GPU time (the
medians of each printed as `parts`), so a change of host speed shows apart from the GPU's.
Usage on a GPU host, project root:
    python3 benchmarks/stage_exposure.py [--reps 20] [--sets 4] [--json F]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

import torch

from kernels import row_attention as ra
from kernels.bench_attention import (
    ROW_BUCKET,
    ROW_LATENT,
    ROW_PER_CALL,
    ROW_SCALE,
    row_prefill_blocks,
    row_step_blocks,
)  # fmt: skip
from kernels.timing import forward_sampler, interleave, stage_sampler

LAYERS = 4
BLOCK = 576  # the small preset's forward capacity (engine.decode.prefill's block)
SETS = 4  # input sets each shape's samples rotate over (--sets)


def samplers(pool: torch.Tensor, cases: list, impl: str, pieces: list[int], parts: dict) -> dict:
    """name -> sampler of `impl` ("torch" or "cuda") over `cases`; each sampler's (host us,
    GPU us) per sample land in `parts[name]`."""
    dev = pool.device
    if impl == "torch":

        def plan(tab, lens):
            return ra.torch_rows_plan(tab, lens, dev, ROW_BUCKET, ROW_PER_CALL)

        call = ra.torch_rows
    else:
        plan, call = (lambda tab, lens: ra.rowwise_plan(tab, lens, dev)), ra.cuda_rows
    n = len(cases)

    def prepare(i: int) -> list:
        return [plan(tab, lens) for tab, lens, _ in cases[i % n]]

    def run(i: int, plans: list) -> None:
        for (_, _, q), p in zip(cases[i % n], plans, strict=True):
            for _ in range(LAYERS):
                call(q, pool, p, ROW_SCALE, ROW_LATENT)

    parts[f"{impl}/hidden"] = []
    out = {f"{impl}/hidden": stage_sampler(prepare, run, n, parts=parts[f"{impl}/hidden"])}

    def forwards(i: int) -> list:  # each forward's plan, and its call per layer
        return [(lambda tab=tab, lens=lens: plan(tab, lens),
                 lambda p, layer, q=q: call(q, pool, p, ROW_SCALE, ROW_LATENT))
                for tab, lens, q in cases[i % n]]  # fmt: skip

    for piece in [0, *pieces]:
        name = f"{impl}/{'exposed' if not piece else f'piece{piece}'}"
        parts[name] = []
        out[name] = forward_sampler(forwards, n, LAYERS, piece, parts=parts[name])
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--pieces", default="100,300")
    ap.add_argument("--sets", type=int, default=SETS, help="input sets the samples rotate over")
    ap.add_argument("--json")
    args = ap.parse_args()
    try:
        pieces = [int(x) for x in args.pieces.split(",") if x]
    except ValueError:
        pieces = [-1]
    if args.reps < 2 or min(pieces, default=0) < 0 or args.sets < 1:  # quartiles: 2 samples
        print(f"error: --reps takes >= 2, --sets >= 1 and --pieces us >= 0 like 100,300: "
              f"{args.reps}, {args.sets}, {args.pieces!r}", file=sys.stderr)  # fmt: skip
        return 2
    if not torch.cuda.is_available():
        print("error: needs a CUDA GPU", file=sys.stderr)
        return 2
    torch.backends.cuda.matmul.allow_tf32 = True  # the engine's --matmul tf32 default
    sets = args.sets
    shapes = [("prefill L=1024", lambda: row_prefill_blocks(1024, sets, BLOCK))]
    for b in (1, 8, 32):
        shapes.append((f"decode B={b} L=1024 T=17", lambda b=b: row_step_blocks(b, 17, 1024, sets)))
    doc = {"command": " ".join(sys.argv), "reps": args.reps, "sets": sets, "layers": LAYERS,
           "rows": []}  # fmt: skip
    for name, make in shapes:
        pool, cases = make()
        parts: dict[str, list] = {}
        smp = {**samplers(pool, cases, "torch", pieces, parts),
               **samplers(pool, cases, "cuda", pieces, parts)}  # fmt: skip
        got = interleave(smp, args.reps)
        med = {k: statistics.median(v) for k, v in got.items()}
        split = {k: [statistics.median(x) for x in zip(*parts[k], strict=True)] for k in got}
        for k, v in got.items():
            q = statistics.quantiles(v, n=4)
            doc["rows"].append({"shape": name, "sampler": k, "median_us": med[k],
                                "p25_us": q[0], "p75_us": q[2], "host_us": split[k][0],
                                "gpu_us": split[k][1]})  # fmt: skip
        ways = [k.split("/")[1] for k in med if k.startswith("torch/")]
        line = "  ".join(f"{w} {med['torch/' + w]:.0f}/{med['cuda/' + w]:.0f}="
                         f"{med['torch/' + w] / med['cuda/' + w]:.2f}x" for w in ways)  # fmt: skip
        print(f"{name:24s} torch/cuda us: {line}", flush=True)
        line = "  ".join(f"{w} {split['torch/' + w][0]:.0f}+{split['torch/' + w][1]:.0f}/"
                         f"{split['cuda/' + w][0]:.0f}+{split['cuda/' + w][1]:.0f}"
                         for w in ways)  # fmt: skip
        print(f"{'':24s} parts host+GPU us: {line}", flush=True)
        del pool, cases
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
