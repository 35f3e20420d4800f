"""`python -m engine.bench`: AR == DDTree identity and throughput of the engine on one device.

    python -m engine.bench --preset small --device cuda --json OUT.json \
        [--concurrency 1 8 32] [--max-tokens 64] [--repeats 5] [--graphs both]
        [--prompt-len N] [--matmul tf32|fp32] [--time-budget 200] [--rounds R]
        [--max-budget N]

For each backend set (`cuda`: every component on the GPU; `cpu-kernels`: the model on the device,
top-k / tree build / accept on the CPU references, torch attention) it checks that DDTree output
equals AR output on the golden prompts (batched), then for each mode and concurrency c submits c
requests at once to the continuous-batching scheduler (each generating exactly max-tokens tokens,
EOS ignored; with `--rounds R`, R x c requests, each finished one replaced by the next, so c stay
in flight as under a closed-loop client, and the steady tokens/s of the window until the last
submission is recorded beside the whole run's) and records wall time, tokens/s (the median of
`--repeats` runs over one decoder per mode, AR's and DDTree's runs interleaved, every run's kept),
mean accept length and the per-stage step breakdown, and whether every request's DDTree output
equals its AR output under that load. With `--graphs both` (the default on a GPU) every set runs
with the forward's CUDA graphs and again eagerly (`SET:eager`). In-process: no HTTP server
involved.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import sys
import threading
import time
from typing import Any

import torch

from engine.config import MATMUL, MAX_BUDGET, PRESETS, preset
from engine.device import DeviceError, check_device
from engine.golden import GOLDEN_PROMPTS
from engine.runtime import EngineSpec, build_decoder, generate
from engine.scheduler import GenRequest, Scheduler, Update
from engine.tokenizer import ByteTokenizer
from kernels.cli import OneLineParser

MAX_ROUNDS = 1000  # also the most --repeats
MAX_CONCURRENCY = 1024
MAX_ROW_CHUNK = 1 << 16
BACKEND_SETS = {
    "cuda": ("topk=cuda", "tree_build=cuda", "accept=cuda", "attention=cuda"),
    "cpu-kernels": ("topk=reference", "tree_build=cpp", "accept=reference", "attention=torch"),
}


def load(
    spec: EngineSpec,
    prompts: list[list[int]],
    concurrency: int,
    max_tokens: int,
    repeats: int = 1,
    rounds: int = 1,
) -> dict:
    """c requests submitted at once; wall time until the last finishes, `repeats` times over one
    decoder (tokens/s: the median run's). A warm-up of the same batch (4 tokens) runs first, so
    CUDA-graph capture is not timed."""
    level = load_interleaved({spec.mode: spec}, prompts, concurrency, max_tokens, repeats, rounds)
    return level[spec.mode]


def load_interleaved(
    specs: dict[str, EngineSpec],
    prompts: list[list[int]],
    concurrency: int,
    max_tokens: int,
    repeats: int,
    rounds: int = 1,
) -> dict[str, dict]:
    """`load` for several engines at one level, their runs interleaved (ar, ddtree, ar,
    ddtree, ...): every decoder is built and warmed first, then each repeat runs every engine
    once, so a slow spell of the host (a c=1 run lasts ~0.1 s; on the H200 host, runs of one
    engine varied by 25% within a call) falls on all of them alike instead of on one engine's
    block of runs."""
    decs = {}
    for mode, spec in specs.items():
        _, dec = build_decoder(spec)
        warm = [prompts[i % len(prompts)] for i in range(concurrency)]
        generate(dec, warm, 4, stop_at_eos=False)
        decs[mode] = dec
    runs: dict[str, list[dict]] = {mode: [] for mode in specs}
    for _ in range(repeats):
        for mode, dec in decs.items():
            runs[mode].append(_load_once(dec, prompts, concurrency, max_tokens, rounds))
    return {mode: _summary(decs[mode], runs[mode]) for mode in specs}


def _stage_means(breakdown: dict[str, dict]) -> dict[str, float]:
    """Each stage's mean milliseconds per step over every batch size of a run."""
    n = sum(r["steps"] for r in breakdown.values())
    stages = {k for r in breakdown.values() for k in r["total_s"]}
    return (
        {
            k: 1000 * sum(r["total_s"].get(k, 0.0) for r in breakdown.values()) / n
            for k in sorted(stages)
        }
        if n
        else {}
    )


def _summary(dec, runs: list[dict]) -> dict:
    # the median run (for an even count the lower middle one: never the faster of two)
    mid = sorted(runs, key=lambda r: r["tokens_per_s"])[(len(runs) - 1) // 2]
    outputs = runs[0].pop("outputs")
    same = all(r.pop("outputs") == outputs for r in runs[1:])
    steady = sorted(r["steady_tokens_per_s"] for r in runs if r["steady_tokens_per_s"])
    return {
        **mid,
        # the median of the runs' steady tokens/s (lower middle), apart from the median run's
        "steady_tokens_per_s": steady[(len(steady) - 1) // 2] if steady else None,
        "tokens_per_s_runs": [r["tokens_per_s"] for r in runs],
        "steady_tokens_per_s_runs": [r["steady_tokens_per_s"] for r in runs],
        "runs": [
            {
                k: r[k]
                for k in (
                    "tokens_per_s",
                    "steady_tokens_per_s",
                    "wall_s",
                    "cpu_s",
                    "gc_collections",
                    "stage_mean_ms",
                )
            }
            for r in runs
        ],
        "same_outputs_every_run": same,
        "cuda_graphs": dec.forward.graphs,
        "captured_graphs": dec.forward.captured_graphs,
        "outputs": outputs,
    }


def _load_once(
    dec, prompts: list[list[int]], concurrency: int, max_tokens: int, rounds: int = 1
) -> dict:
    """One run: `rounds` x c requests through the scheduler, c in flight at any time (the first
    c submitted at once; each one that finishes is replaced by the next, as a closed-loop client
    keeps a service at concurrency c). tokens/s: every token over the wall time to the last one
    (ramp-up and the drain at the end included: with rounds = 1, the c requests as one batch
    job). steady tokens/s (rounds > 1): the tokens committed from the start until the last
    request was submitted, over that window, in which c requests were always in flight."""
    sched = Scheduler(dec)
    n_req = concurrency * rounds
    done = threading.Event()
    counts: dict[int, int] = {}
    outputs: dict[int, list[int]] = {}
    finished: list[str | None] = []
    lock = threading.Lock()
    steady: dict[str, float] = {}  # the window's end and the tokens committed before it

    def submit(i: int) -> None:
        p = prompts[i % len(prompts)]
        sched.submit(GenRequest(p, max_tokens, sink(i), ignore_eos=True))

    def sink(i: int):
        def put(u: Update) -> None:
            with lock:
                counts[i] = counts.get(i, 0) + len(u.token_ids)
                outputs.setdefault(i, []).extend(u.token_ids)
                if not u.finished:
                    return
                finished.append(u.finish_reason)
                nxt = len(finished) - 1 + concurrency  # the request replacing this one
                if nxt < n_req:
                    submit(nxt)
                    if nxt == n_req - 1:
                        steady["t"] = time.perf_counter()
                        steady["tokens"] = sum(counts.values())
                if len(finished) == n_req:
                    done.set()

        return put

    # the first c are queued before the scheduler starts, so its first step admits them all
    # (submitting to a running scheduler raced its loop: the first steps ran at batch 3, 6, ...)
    gc0 = [g["collections"] for g in gc.get_stats()]
    t0, cpu0 = time.perf_counter(), time.process_time()
    for i in range(concurrency):
        submit(i)
    sched.start()
    ok = done.wait(600)
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    sched.shutdown()
    gcs = [g["collections"] - c for g, c in zip(gc.get_stats(), gc0, strict=True)]
    tokens = sum(counts.values())
    window = steady["t"] - t0 if steady else 0.0
    return {
        "concurrency": concurrency,
        "requests": n_req,
        "completed": ok,
        "finish_reasons": sorted({str(r) for r in finished}),
        "tokens": tokens,
        "wall_s": wall,
        "tokens_per_s": tokens / wall,
        "steady_tokens_per_s": steady["tokens"] / window if window > 0 else None,
        "steady_window_s": window if window > 0 else None,
        "mean_accept_length": sched.stats.avg_accept_length(),
        "steps_by_batch": {str(k): v for k, v in sorted(sched.stats.steps_by_batch.items())},
        "step_breakdown": sched.stats.breakdown(),
        # why one run is slower than another: the process's CPU seconds over the run (about
        # the wall time: the host worked; well below: it waited), the garbage collections per
        # generation, each stage's mean over all the run's steps
        "cpu_s": cpu,
        "gc_collections": gcs,
        "stage_mean_ms": _stage_means(sched.stats.breakdown()),
        "outputs": [outputs.get(i, []) for i in range(n_req)],
    }


def _prompts(prompt_len: int) -> list[list[int]]:
    """The golden prompts; with prompt_len > 0 each is repeated up to that many tokens
    (long prompts make attention a large share of the step)."""
    tok = ByteTokenizer()
    base = [tok.encode(t) for t in GOLDEN_PROMPTS]
    if prompt_len <= 0:
        return base
    return [((p or [0]) * (prompt_len // max(len(p), 1) + 1))[:prompt_len] for p in base]


def _bad_input(args: argparse.Namespace) -> str | None:
    """Why these arguments could only hang, crash or measure nothing (None when they can run)."""
    for flag, values, low in (
        ("--concurrency", args.concurrency, 1),
        ("--repeats", [args.repeats], 1),
        ("--rounds", [args.rounds], 1),
        ("--max-tokens", [args.max_tokens], 1),
        ("--identity-tokens", [args.identity_tokens], 1),
        ("--prompt-len", [args.prompt_len], 0),
        ("--row-chunk", [args.row_chunk] if args.row_chunk is not None else [], 1),
        ("--max-budget", [args.max_budget] if args.max_budget is not None else [], 0),
    ):
        bad = [v for v in values if v < low]
        if bad:
            return f"{flag} must be at least {low}, got {bad[0]}"
    # a huge value overflowed the KV cache's or the chunk's allocation (exit 1, torch's
    # message) or ran for hours (each run waits up to 600 s for its rounds x c requests)
    for flag, value, high in (
        ("--max-budget", args.max_budget, MAX_BUDGET),
        ("--rounds", args.rounds, MAX_ROUNDS),
        ("--repeats", args.repeats, MAX_ROUNDS),
        ("--concurrency", max(args.concurrency), MAX_CONCURRENCY),
        ("--row-chunk", args.row_chunk, MAX_ROW_CHUNK),
    ):
        if value is not None and value > high:
            return f"{flag} must be at most {high}, got {value}"
    # as the server's 400: past the model's context the KV cache ran out (CacheFull tracebacks)
    ctx = preset(args.preset).model.max_seq_len
    longest = max(len(p) for p in _prompts(args.prompt_len))
    for flag, n in (("--max-tokens", args.max_tokens), ("--identity-tokens", args.identity_tokens)):
        if longest + n > ctx:
            return (
                f"{flag} {n}: with the {longest}-token prompts past the {args.preset} "
                f"preset's context ({ctx} tokens)"
            )
    if not (math.isfinite(args.time_budget) and args.time_budget >= 0):
        return f"--time-budget must be a number of seconds >= 0, got {args.time_budget}"
    if not args.device.startswith("cuda") and set(args.sets) == {"cuda"}:
        return "--sets cuda needs --device cuda (a CPU runs the cpu-kernels set)"
    return None


def _parser() -> OneLineParser:
    ap = OneLineParser(prog="python -m engine.bench")
    ap.add_argument("--preset", default="small", choices=sorted(PRESETS))
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--sets", nargs="+", default=list(BACKEND_SETS), choices=list(BACKEND_SETS))
    ap.add_argument(
        "--graphs",
        choices=("on", "off", "both"),
        default="both",
        help="CUDA graphs for the forward's segments (on a GPU); both: each set twice",
    )
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--row-chunk", type=int, help="override the preset's forward chunk rows")
    ap.add_argument(
        "--max-budget",
        type=int,
        help="override the preset's largest tree by batch size (EngineConfig.max_budget; "
        "0: every step at the preset's budget)",
    )
    ap.add_argument(
        "--matmul", choices=MATMUL, default=MATMUL[0], help="float32 matmuls on the GPU"
    )
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="requests per level = rounds x c, c in flight (each finished one replaced); > 1 "
        "adds the steady tokens/s, while c were always in flight (1: the c as one batch job)",
    )
    ap.add_argument(
        "--repeats",
        type=int,
        default=5,
        help="timed runs per mode and level over one decoder, the modes' runs interleaved; "
        "tokens/s is the median run's (the lower middle one for an even count)",
    )
    ap.add_argument("--prompt-len", type=int, default=0, help="pad prompts to this many tokens")
    ap.add_argument("--identity-tokens", type=int, default=32)
    ap.add_argument("--time-budget", type=float, default=200.0)
    ap.add_argument("--json", required=True)
    return ap


def _header(args: argparse.Namespace, argv: list[str] | None) -> dict[str, Any]:
    """The result document before any set has run: the run's settings and its command."""
    return {
        "git_sha": os.environ.get("ENGINE_GIT_SHA"),
        "kernels_lib": os.environ.get("DDTREE_KERNELS_LIB"),
        "suite": "engine",
        "preset": args.preset,
        "device": args.device,
        "max_tokens": args.max_tokens,
        "prompt_len": args.prompt_len,
        "row_chunk": args.row_chunk,
        "max_budget": args.max_budget,
        "matmul": args.matmul,
        "repeats": args.repeats,
        "rounds": args.rounds,
        "command": "python -m engine.bench " + " ".join(sys.argv[1:] if argv is None else argv),
        "sets": {},
    }


def _add_environment(result: dict[str, Any]) -> None:
    """The host's environment (kernels.envinfo), and the git sha from it when none was given."""
    try:
        from kernels.envinfo import environment

        result["environment"] = environment()
        result["git_sha"] = result["git_sha"] or result["environment"].get("git_sha")
    except Exception as exc:  # the bench still runs without it
        result["environment"] = {"error": repr(exc), "torch": torch.__version__}


def _plan(args: argparse.Namespace, result: dict[str, Any]) -> tuple[list[str], list[bool]]:
    """The backend sets to run and the graph modes of each (a CPU: eager, no `cuda` set)."""
    graph_modes = {"on": [True], "off": [False], "both": [True, False]}[args.graphs]
    sets = list(args.sets)
    if not args.device.startswith("cuda"):
        graph_modes = [False]
        # the `cuda` set needs a GPU; `cpu-kernels` is what a CPU host can run as named
        if "cuda" in sets:
            sets.remove("cuda")
            print("note: the cuda backend set needs --device cuda; skipped", file=sys.stderr)
            result["skipped_sets"] = {"cuda": "needs --device cuda"}
    return sets, graph_modes


def _run_sets(
    args: argparse.Namespace, result: dict[str, Any], start: float
) -> list[tuple[Any, ...]]:
    """Each set in each graph mode (a set that fails records its error and the next runs),
    the document saved after each; returns the table's rows."""
    prompts = _prompts(args.prompt_len)
    on_gpu = args.device.startswith("cuda")
    sets, graph_modes = _plan(args, result)

    def save() -> None:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)

    rows: list[tuple[Any, ...]] = []
    for name in sets:
        for graphs in graph_modes:
            label = name if graphs or not on_gpu else f"{name}:eager"
            backends = BACKEND_SETS[name]
            entry: dict[str, Any] = {"backends": list(backends), "cuda_graphs": graphs}
            result["sets"][label] = entry
            try:
                _run_set(args, entry, backends, graphs, prompts, start, rows, label, save)
            except Exception as exc:
                entry["error"] = f"{type(exc).__name__}: {exc}"
                print(f"[{label}] failed: {entry['error']}", file=sys.stderr)
            save()
    return rows


def _print_summary(rows: list[tuple[Any, ...]], result: dict[str, Any]) -> None:
    print(f"{'set':18s} {'mode':7s} {'c':>3s} {'tok/s':>9s} {'accept':>7s} {'steady':>9s}")
    for label, mode, c, tps, acc, st in rows:
        if tps is None:  # a level the --time-budget left out
            print(f"{label:18s} {mode:7s} {c:3d} {'skipped (--time-budget)':>17s}")
            continue
        steady = f"{st:9.1f}" if st else f"{'-':>9s}"
        print(f"{label:18s} {mode:7s} {c:3d} {tps:9.1f} {acc:7.2f} {steady}")
    for label, e in result["sets"].items():
        print(
            f"{label}: ddtree_equals_ar={e.get('ddtree_equals_ar')} "
            f"under_load={e.get('identical_under_load')} error={e.get('error')}"
        )


def _usage_error(args: argparse.Namespace) -> str | None:
    """Bad input, an unwritable --json (now, not after a set has run) or an unusable device."""
    why = _bad_input(args)
    if why:
        return why
    try:
        open(args.json, "w").close()
    except OSError as exc:
        return f"--json {args.json}: {exc.strerror or exc}"
    try:
        check_device(args.device)
    except DeviceError as exc:
        return str(exc)
    return None


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    why = _usage_error(args)
    if why:
        print(f"error: {why}", file=sys.stderr)
        return 2
    start = time.monotonic()
    if args.device == "cpu":
        torch.set_num_threads(1)
    result = _header(args, argv)
    _add_environment(result)
    rows = _run_sets(args, result, start)
    _print_summary(rows, result)
    ok = all(
        e.get("ddtree_equals_ar") and e.get("identical_under_load") is not False
        for e in result["sets"].values()
    )
    return 0 if ok else 1


def _run_set(args, entry, backends, graphs, prompts, start, rows, label, save) -> None:
    outs = {}
    for mode in ("ar", "ddtree"):
        spec = EngineSpec(
            args.preset,
            mode,
            args.device,
            backends,
            cuda_graphs=graphs,
            row_chunk=args.row_chunk,
            max_budget=args.max_budget,
            matmul=args.matmul,
        )
        _, dec = build_decoder(spec)
        t0 = time.perf_counter()
        outs[mode], acc = generate(dec, prompts, args.identity_tokens)
        entry[f"identity_{mode}_s"] = time.perf_counter() - t0
    entry["ddtree_equals_ar"] = outs["ar"] == outs["ddtree"]
    entry["identity_prompts"] = len(prompts)
    entry["identity_accept_length"] = sum(acc) / len(acc)
    entry["mismatched_prompts"] = [
        i for i, (a, d) in enumerate(zip(outs["ar"], outs["ddtree"], strict=True)) if a != d
    ]
    save()
    entry["load"] = []
    for c in args.concurrency:
        got = {}
        if time.monotonic() - start > args.time_budget:
            for mode in ("ar", "ddtree"):
                entry["load"].append({"mode": mode, "concurrency": c, "skipped": "time"})
                rows.append((label, mode, c, None, None, None))
            continue
        specs = {
            mode: EngineSpec(
                args.preset,
                mode,
                args.device,
                backends,
                max_batch_size=max(args.concurrency),
                cuda_graphs=graphs,
                row_chunk=args.row_chunk,
                max_budget=args.max_budget,
                matmul=args.matmul,
            )
            for mode in ("ar", "ddtree")
        }
        level = load_interleaved(specs, prompts, c, args.max_tokens, args.repeats, args.rounds)
        for mode, r in level.items():
            got[mode] = r.pop("outputs")
            entry["load"].append({"mode": mode, **r})
            rows.append(
                (
                    label,
                    mode,
                    c,
                    r["tokens_per_s"],
                    r["mean_accept_length"],
                    r["steady_tokens_per_s"],
                )
            )
        save()
        if len(got) == 2:
            repeat_same = all(r.get("same_outputs_every_run", True) for r in entry["load"][-2:])
            same = got["ar"] == got["ddtree"] and repeat_same
            entry.setdefault("load_identity", {})[str(c)] = same
            entry["identical_under_load"] = entry.get("identical_under_load", True) and same


if __name__ == "__main__":
    sys.exit(main())
