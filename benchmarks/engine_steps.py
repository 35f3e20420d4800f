"""Where one engine step's time goes, at a fixed batch: stage means, wall and GPU busy time.

    PYTHONPATH=. python benchmarks/engine_steps.py --device cuda --batch 1 32 \
        --modes ar ddtree [--row-chunk 128] [--matmul tf32] [--steps 30] [--profile 12] \
        [--host-profile 25] \
        --json OUT.json

For each mode and batch size: build the decoder (all-CUDA backends on a GPU), prefill `batch`
golden prompts, run warm-up steps, then time `--steps` steps (the scheduler's own stage laps:
`StepResult.stages`). With `--profile N`, a further run of steps under torch.profiler gives the
GPU's busy time per step (the sum of its kernels) and the N kernels and host calls that cost
most. With `--host-profile N`, the N Python functions with the most own time under cProfile. A
diagnosis tool (engine.bench is the throughput benchmark); its JSON goes under
benchmarks/results/ with the command that made it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import NoReturn

from engine.bench import BACKEND_SETS
from engine.config import MATMUL, PRESETS
from engine.device import DeviceError, check_device
from engine.golden import GOLDEN_PROMPTS
from engine.runtime import EngineSpec, build_decoder
from engine.tokenizer import ByteTokenizer


class UsageError(Exception):
    """A user mistake: one line on stderr, exit 2."""


def _steps(dec, seqs, n: int) -> list[dict[str, float]]:
    # a step commits at most draft_len + 1 tokens a sequence: stop before one would pass the
    # model's context, as the service does (a little past it the KV pool and the rotary table
    # end: an IndexError deep in the forward, exit 1, an empty --json)
    room = dec.model.cfg.max_seq_len - (dec.cfg.draft_len + 1 if dec.mode == "ddtree" else 1)
    out = []
    for _ in range(n):
        longest = max(len(s.tokens) for s in seqs)
        if longest > room:
            raise UsageError(
                f"a sequence has {longest} tokens: one more {dec.mode} step could pass this "
                f"model's context ({dec.model.cfg.max_seq_len}); ask for fewer steps (--warm, "
                "--steps, --profile's up to 10 and --host-profile's --steps all grow them)"
            )
        t0 = time.perf_counter()
        res = dec.step(seqs)
        out.append({**res.stages, "wall": time.perf_counter() - t0})
    return out


def _profile(dec, seqs, n: int, top: int) -> dict:
    from torch.profiler import ProfilerActivity, profile

    on_gpu = dec.model.device.type == "cuda"  # on a CPU: host calls only (busy time None)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
    with profile(activities=acts) as prof:
        _steps(dec, seqs, n)
    events = prof.key_averages()
    busy = sum(e.self_device_time_total for e in events) / 1000.0 / n if on_gpu else None
    by_gpu = sorted(events, key=lambda e: -e.self_device_time_total)[:top] if on_gpu else []
    by_cpu = sorted(events, key=lambda e: -e.self_cpu_time_total)[:top]
    return {
        "gpu_busy_ms_per_step": busy,
        "kernels": [
            {
                "name": e.key[:90],
                "ms_per_step": e.self_device_time_total / 1000.0 / n,
                "calls_per_step": e.count / n,
            }
            for e in by_gpu
        ],  # fmt: skip
        "host": [
            {
                "name": e.key[:90],
                "ms_per_step": e.self_cpu_time_total / 1000.0 / n,
                "calls_per_step": e.count / n,
            }
            for e in by_cpu
        ],  # fmt: skip
    }


def _host_profile(dec, seqs, n: int, top: int) -> list[dict]:
    """The `top` Python functions by own time over n steps under cProfile (host work only;
    cProfile's own overhead inflates every entry alike, so read them as shares)."""
    import cProfile
    import pstats

    prof = cProfile.Profile()
    prof.runcall(_steps, dec, seqs, n)
    st = pstats.Stats(prof).stats  # {(file, line, fn): (cc, nc, tottime, cumtime, callers)}
    rows = sorted(st.items(), key=lambda kv: -kv[1][2])[:top]
    return [
        {
            "function": f"{Path(f).name}:{line}:{fn}",
            "own_ms_per_step": 1000 * tt / n,
            "cum_ms_per_step": 1000 * ct / n,
            "calls_per_step": nc / n,
        }
        for (f, line, fn), (_cc, nc, tt, ct, _callers) in rows
    ]


def run(args, mode: str, batch: int) -> dict:
    backends = BACKEND_SETS["cuda"] if args.device.startswith("cuda") else ()
    spec = EngineSpec(
        args.preset, mode, args.device, backends, max_batch_size=max(args.batch),
        row_chunk=args.row_chunk, cuda_graphs=not args.eager, matmul=args.matmul,
    )  # fmt: skip
    _, dec = build_decoder(spec)
    tok = ByteTokenizer()
    prompts = [tok.encode(GOLDEN_PROMPTS[i % len(GOLDEN_PROMPTS)]) for i in range(batch)]
    seqs = [dec.new_sequence(p) for p in prompts]
    for s in seqs:
        dec.prefill(s)
    _steps(dec, seqs, args.warm)
    tokens = sum(len(s.tokens) for s in seqs)
    laps = _steps(dec, seqs, args.steps)
    timed_tokens = sum(len(s.tokens) for s in seqs) - tokens
    keys = sorted({k for lap in laps for k in lap})
    out = {
        "mode": mode,
        "batch": batch,
        "forward_rows_max": dec.forward.max_rows,
        "chunk": dec.forward.chunk,
        "stages_ms": {k: 1000 * statistics.mean(lap.get(k, 0.0) for lap in laps) for k in keys},
        "wall_ms_median": 1000 * statistics.median(lap["wall"] for lap in laps),
    }
    if args.profile:
        out["profile"] = _profile(dec, seqs, min(args.steps, 10), args.profile)
    if args.host_profile:
        out["host_profile"] = _host_profile(dec, seqs, args.steps, args.host_profile)
    out["tokens_after"] = timed_tokens  # generated by the timed steps
    for s in seqs:
        s.blocks.free()
    return out


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, not argparse's usage block
        raise UsageError(message)


def _check(args: argparse.Namespace) -> None:
    """UsageError for input that could only crash a run or time nothing."""
    for flag, values, low in (
        ("--batch", args.batch, 1),
        ("--steps", [args.steps], 1),
        ("--warm", [args.warm], 0),
        ("--profile", [args.profile], 0),
        ("--host-profile", [args.host_profile], 0),
        ("--row-chunk", [args.row_chunk] if args.row_chunk is not None else [], 1),
    ):
        bad = [v for v in values if v < low]
        if bad:
            raise UsageError(f"{flag} must be >= {low}, got {bad[0]}")
    try:
        check_device(args.device)
    except DeviceError as exc:
        raise UsageError(str(exc)) from None
    try:
        open(args.json, "w").close()  # an unwritable path fails now, not after the first run
    except OSError as exc:
        raise UsageError(f"--json {args.json}: {exc.strerror or exc}") from None


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(argv)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def _main(argv: list[str] | None) -> int:
    ap = _Parser(prog="benchmarks/engine_steps.py")
    ap.add_argument("--preset", default="small", choices=sorted(PRESETS))
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--modes", nargs="+", default=["ar", "ddtree"], choices=["ar", "ddtree"])
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 32])
    ap.add_argument("--row-chunk", type=int)
    ap.add_argument("--matmul", choices=MATMUL, default=MATMUL[0])
    ap.add_argument("--eager", action="store_true")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warm", type=int, default=5)
    ap.add_argument("--profile", type=int, default=0, help="top N kernels / host calls")
    ap.add_argument("--host-profile", type=int, default=0, help="top N Python functions")
    ap.add_argument("--json", required=True)
    args = ap.parse_args(argv)
    _check(args)
    cmd = "benchmarks/engine_steps.py " + " ".join(sys.argv[1:] if argv is None else argv)
    result: dict = {"command": cmd, "runs": []}
    for batch in args.batch:
        for mode in args.modes:
            r = run(args, mode, batch)
            result["runs"].append(r)
            st = r["stages_ms"]
            busy = r.get("profile", {}).get("gpu_busy_ms_per_step")
            print(
                f"{mode:6s} b={batch:3d} wall {r['wall_ms_median']:7.2f} ms  gpu "
                f"{busy if busy is None else round(busy, 2)}  "
                + " ".join(f"{k}={v:.2f}" for k, v in st.items() if k != "wall"),
                flush=True,
            )
            with open(args.json, "w") as f:
                json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
