"""`python -m engine.attn_bench`: the engine's own attention stage per backend, as its clock counts.

    python -m engine.attn_bench --preset small --device cuda [--impls torch cuda]
        [--batch 1 8 32] [--prompt-len 1024] [--prefix-span 64] [--same-prompt] [--steps 32]
        [--warm 4] [--mode ddtree] [--graphs on] [--matmul tf32] [--json OUT.json]

Builds the real engine once per attention backend (`--impls`; the other components on the `cuda`
set of engine.bench on a GPU, CUDA graphs on by default) and, for each batch B: prefills B
prompts of `--prompt-len` tokens (the golden prompts repeated; each prefill's attention seconds
as `Decoder.prefill` returns them: the forward's blocks of its row capacity, the plan on the
host clock and CUDA events around every call, exactly what a service's stage clock charges),
then decodes those B sequences for `--warm` + `--steps` steps and keeps each timed step's
`stages["attention"]`. For decode, sequence i's prompt is re-prefilled (untimed) longer by i *
span // B tokens, so the rows' prefixes spread over [L - 1, L - 1 + span) and fall into
different length buckets, as in a service whose requests arrived at different times; they spread
further as they decode. `--same-prompt --prefix-span 0` is the layout of a load of one prompt
(checks.loadtest, and so the rollout's measure): every request the same prompt, so with greedy
decoding and a batch-invariant engine they commit the same tokens at the same steps and the
batch stays at one prefix (measured: benchmarks/NOTES-attention.md at abb2881); `kernels.bench
--suite engine_attn` runs it so. On a CPU (the torch path only), e.g. `--device cpu --preset
tiny --prompt-len 64 --same-prompt --prefix-span 0` (the tiny preset's context is 512 tokens).
The impls' work is interleaved (prefill by prefill, step by step), so a drift of the host falls
on all of them alike. Rows follow kernels.bench's schema (`row_attention` /
`row_attention_prefill`, impls `<impl>_engine`, mode `engine_stage`); one prefill row per impl
pools every batch's prefills (each one prompt: shape B = 1, as the kernel bench's prefill rows).
refcheck: whether every impl decoded the same tokens for the same prompts (recorded, not
required: torch attention's bmm runs TF32 under `--matmul tf32` while the CUDA kernel computes
fp32, so a near tie may break differently; exit 0 either way). One JSON document on stdout; exit
0 when it ran, 2 for bad input.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, NoReturn

import numpy as np
import torch

from engine.bench import BACKEND_SETS
from engine.config import MATMUL, MAX_BUDGET, PRESETS, SEED_RANGE, preset, tokens_reached
from engine.decode import Decoder, Sequence
from engine.device import DeviceError, check_device
from engine.golden import GOLDEN_PROMPTS
from engine.runtime import EngineSpec, build_decoder
from engine.tokenizer import ByteTokenizer

IMPLS = ("torch", "cuda")


class UsageError(Exception):
    """A user mistake: one line on stderr, exit 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, not argparse's usage block
        raise UsageError(message)


def _prompt(i: int, n: int) -> list[int]:
    """Golden prompt i (cyclic), repeated up to n tokens."""
    p = ByteTokenizer().encode(GOLDEN_PROMPTS[i % len(GOLDEN_PROMPTS)]) or [0]
    return (p * (n // len(p) + 1))[:n]


def _offsets(batch: int, span: int) -> list[int]:
    """Extra prompt tokens of each of a batch's sequences: spread evenly over [0, span)."""
    return [i * span // batch for i in range(batch)]


def _stats(us: list[float]) -> dict[str, Any]:
    p25, med, p75 = (float(x) for x in np.percentile(us, [25, 50, 75]))
    return {"median_us": med, "p25_us": p25, "p75_us": p75, "iqr_us": p75 - p25, "reps": len(us)}


def _check(args: argparse.Namespace) -> None:
    """UsageError for input that could only crash a run or time nothing."""
    for flag, values, low in (
        ("--batch", args.batch, 1),
        ("--steps", [args.steps], 1),
        ("--warm", [args.warm], 0),
        ("--prompt-len", [args.prompt_len], 2),
        ("--prefix-span", [args.prefix_span], 0),
        ("--max-budget", [args.max_budget] if args.max_budget is not None else [], 0),
    ):
        bad = [v for v in values if v < low]
        if bad:
            raise UsageError(f"{flag} must be >= {low}, got {bad[0]}")
    if not SEED_RANGE[0] <= args.seed <= SEED_RANGE[1]:  # torch's generator overflowed
        raise UsageError(f"--seed must be in [-2**63, 2**64), got {args.seed}")
    if args.max_budget is not None and args.max_budget > MAX_BUDGET:  # overflowed the KV cache
        raise UsageError(f"--max-budget must be <= {MAX_BUDGET}, got {args.max_budget}")
    try:
        check_device(args.device)
    except DeviceError as exc:
        raise UsageError(str(exc)) from None
    if not args.device.startswith("cuda") and "cuda" in args.impls:
        raise UsageError("--impls cuda needs --device cuda (a CPU has the torch attention only)")
    p = preset(args.preset)
    if args.prompt_len >= p.model.max_seq_len:
        raise UsageError(
            f"--prompt-len {args.prompt_len}: past this model's context ({p.model.max_seq_len})"
        )
    top = max(args.batch)
    if top > max(p.engine.max_batch_size, 64):
        raise UsageError(f"--batch {top}: at most {max(p.engine.max_batch_size, 64)} here")
    # taken before anything runs and for the worst case (every step commits draft_len + 1
    # tokens): a step starts only while the longest sequence has room for one more, as the
    # service does
    longest = args.prompt_len + max(_offsets(top, args.prefix_span))
    need = tokens_reached(p, args.mode, longest, args.warm + args.steps)
    if need > p.model.max_seq_len:
        raise UsageError(
            f"{args.warm} + {args.steps} {args.mode} steps from a {longest}-token prompt could "
            f"reach {need} tokens, past this model's context ({p.model.max_seq_len}); ask for "
            "fewer --steps / --warm or a shorter --prompt-len / --prefix-span"
        )
    if args.json is not None:  # an unwritable path fails now, not after the run
        why = _unwritable(args.json)
        if why:
            raise UsageError(f"--json {args.json!r}: {why}")


def _unwritable(path: str) -> str | None:
    """Why `path` cannot take the document (None when it can); an existing file is left as is
    until the run has its document (a bad run does not empty an earlier result)."""
    if not path:
        return "needs a file path"
    if os.path.isdir(path):
        return "is a directory"
    if os.path.exists(path):
        return None if os.access(path, os.W_OK) else "not writable"
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        return "no such directory"
    return None if os.access(parent, os.W_OK) else "its directory is not writable"


def _decoders(args: argparse.Namespace) -> dict[str, Decoder]:
    on_gpu = args.device.startswith("cuda")
    top = max(max(args.batch), preset(args.preset).engine.max_batch_size)
    decs = {}
    for impl in args.impls:
        others = [b for b in BACKEND_SETS["cuda"] if not b.startswith("attention=")]
        spec = EngineSpec(
            args.preset,
            args.mode,
            args.device,
            (*(others if on_gpu else ()), f"attention={impl}"),
            seed=args.seed,
            max_batch_size=top,
            cuda_graphs=on_gpu and args.graphs == "on",
            matmul=args.matmul,
            max_budget=args.max_budget,
        )
        decs[impl] = build_decoder(spec)[1]
        warm = decs[impl].new_sequence(_prompt(0, args.prompt_len))
        decs[impl].prefill(warm)  # a first prefill's one-time costs are not timed
        warm.blocks.free()
    return decs


def _batch(args, decs: dict[str, Decoder], b: int, prefill: dict, out: dict) -> dict[str, Any]:
    """Prefill b prompts and decode them on every decoder, interleaved; this batch's rows."""
    L = args.prompt_len
    seqs: dict[str, list[Sequence]] = {impl: [] for impl in decs}
    for i, off in enumerate(_offsets(b, args.prefix_span)):
        k = 0 if args.same_prompt else i
        for impl, dec in decs.items():
            s = dec.new_sequence(_prompt(k, L))
            prefill[impl].append(dec.prefill(s) * 1e6)
            if off:  # the decode's staggered prefix (not timed: its prompt is not L long)
                s.blocks.free()
                s = dec.new_sequence(_prompt(k, L + off))
                dec.prefill(s)
            seqs[impl].append(s)
    first = next(iter(seqs.values()))
    kv0 = [s.kv_len for s in first]
    attn: dict[str, list[float]] = {impl: [] for impl in decs}
    verify: dict[str, list[float]] = {impl: [] for impl in decs}
    try:
        for k in range(args.warm + args.steps):
            for impl, dec in decs.items():
                st = dec.step(seqs[impl]).stages
                if k >= args.warm:
                    attn[impl].append(st["attention"] * 1e6)
                    verify[impl].append(st["verify"] * 1e6)
        tokens = {impl: [s.tokens for s in ss] for impl, ss in seqs.items()}
        kv1 = [s.kv_len for s in first]
    finally:
        for ss in seqs.values():
            for s in ss:
                s.blocks.free()
    same = all(t == tokens[args.impls[0]] for t in tokens.values())
    out[b] = same
    dec = next(iter(decs.values()))
    shape = {
        **_shape(args, dec, b),
        "T": dec.cfg.budget_at(b) + 1 if args.mode == "ddtree" else 1,
        "prefix_span": args.prefix_span,
    }
    if args.same_prompt:
        shape["same_prompt"] = True
    extra = {"kv_len_first": [min(kv0), max(kv0)], "kv_len_last": [min(kv1), max(kv1)]}
    rows = {}
    for impl in decs:
        rows[impl] = {
            "suite": "attn",
            "kernel": "row_attention",
            "impl": f"{impl}_engine",
            "shape": shape,
            **_stats(attn[impl]),
            "mode": "engine_stage",
            "samples_us": attn[impl],
            "verify_median_us": float(np.median(verify[impl])),
            **extra,
        }
    return rows


def _shape(args, dec: Decoder, b: int) -> dict[str, Any]:
    mc = dec.model.cfg
    return {
        "B": b,
        "L": args.prompt_len,
        "heads": mc.heads,
        "kv_dim": mc.kv_dim,
        "dtype": "fp32",
        "layers": mc.layers,
        "preset": args.preset,
    }


def _speedups(rows: dict[str, dict]) -> list[dict]:
    """The rows of one kernel and shape: cuda's carries median torch / median cuda."""
    if "torch" in rows and "cuda" in rows and rows["cuda"]["median_us"] > 0:
        rows["cuda"]["speedup"] = {
            "torch_engine": rows["torch"]["median_us"] / rows["cuda"]["median_us"]
        }
    return list(rows.values())


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(argv)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def _main(argv: list[str] | None) -> int:
    ap = _Parser(prog="python -m engine.attn_bench")
    ap.add_argument("--preset", default="small", choices=sorted(PRESETS))
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--impls", nargs="+", choices=IMPLS, help="default: torch cuda on a GPU")
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--prompt-len", type=int, default=1024)
    ap.add_argument("--prefix-span", type=int, default=64)
    ap.add_argument(
        "--same-prompt",
        action="store_true",
        help="every request the same prompt (a load of one prompt: the batch stays together)",
    )
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--warm", type=int, default=4)
    ap.add_argument("--mode", choices=("ar", "ddtree"), default="ddtree")
    ap.add_argument("--graphs", choices=("on", "off"), default="on", help="CUDA graphs (GPU)")
    ap.add_argument("--matmul", choices=MATMUL, default=MATMUL[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--max-budget", type=int, help="the preset's largest tree by batch (0: a fixed budget)"
    )
    ap.add_argument("--json", help="also write the document here")
    args = ap.parse_args(argv)
    if args.impls is None:
        args.impls = list(IMPLS) if args.device.startswith("cuda") else ["torch"]
    args.impls = list(dict.fromkeys(args.impls))
    args.batch = list(dict.fromkeys(args.batch))  # `--batch 2 2`: one row per shape, not two
    _check(args)
    if not args.device.startswith("cuda"):
        torch.set_num_threads(1)
    cmd = "python -m engine.attn_bench " + " ".join(sys.argv[1:] if argv is None else argv)
    doc: dict[str, Any] = {"suite": "attn", "command": cmd, "config": vars(args)}
    from kernels.bench.memory import apply_memory_cap

    cap = apply_memory_cap()  # ops bench --allow-shared's cap, inherited through kernels.bench
    if cap is not None:
        doc["memory_cap"] = cap
    try:
        from kernels.envinfo import environment

        doc["environment"] = environment()
    except Exception as exc:  # the bench still runs without it
        doc["environment"] = {"error": repr(exc), "torch": torch.__version__}
    decs = _decoders(args)
    prefill: dict[str, list[float]] = {impl: [] for impl in decs}
    same: dict[int, bool] = {}
    results: list[dict] = []
    for b in args.batch:
        rows = _batch(args, decs, b, prefill, same)
        if len(decs) > 1:
            for r in rows.values():
                r["refcheck"] = same[b]
        results += _speedups(rows)
        print(
            f"batch {b}: "
            + "  ".join(f"{r['impl']} {r['median_us']:.1f} us" for r in rows.values()),
            file=sys.stderr,
        )
    dec = next(iter(decs.values()))
    pre = {}
    for impl in decs:
        pre[impl] = {
            "suite": "attn",
            "kernel": "row_attention_prefill",
            "impl": f"{impl}_engine",
            "shape": _shape(args, dec, 1),
            **_stats(prefill[impl]),
            "mode": "engine_stage",
            "samples_us": prefill[impl],
            "prefill_block_rows": dec.forward.max_rows,
        }
        if len(decs) > 1:
            pre[impl]["refcheck"] = all(same.values())
    results += _speedups(pre)
    doc["results"] = results
    # what the guard's estimate (ops.measure.gpu_guard) stands for
    if args.device.startswith("cuda"):
        doc["peak_reserved_mib"] = round(torch.cuda.max_memory_reserved() / 2**20, 1)
    doc["refcheck"] = {str(b): s for b, s in same.items()} if len(decs) > 1 else None
    if len(decs) > 1 and not all(same.values()):
        print(
            "note: the impls decoded different tokens (refcheck false; see the docstring)",
            file=sys.stderr,
        )
    text = json.dumps(doc, indent=1)
    print(text)
    if args.json is not None:
        try:
            with open(args.json, "w") as f:
                f.write(text + "\n")
        except OSError as exc:
            raise UsageError(f"--json {args.json!r}: {exc.strerror or exc}") from None
    return 0


if __name__ == "__main__":
    sys.exit(main())
