"""Why a level's runs are bimodal: one decoder's c=1 runs in a row, against fresh decoders.

    PYTHONPATH=. python benchmarks/engine_aging.py --device cuda --runs 12 --fresh 3 \
        [--mode ddtree] [--max-tokens 64] --json OUT.json

On the H200 host, `engine.bench`'s DDTree runs at c=1 were often 750 tokens/s once and ~565
after, every stage slower, AR's not. This runs one decoder's runs back to back (the scheduler
on its thread, as engine.bench), then `--fresh` runs each on a newly built decoder, then
`--fresh` runs of the same decoder driven from this thread (`generate`, no scheduler thread).
Every run records tokens/s, wall and process CPU seconds, each stage's mean, and the host's
clocks around it (the mean CPU MHz from /proc/cpuinfo; the GPU's SM clock from nvidia-smi
where present), so a slow run can be told apart: an older decoder, the scheduler's thread, or
a slower host. A diagnosis tool; its JSON goes under benchmarks/results/.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

from engine.bench import BACKEND_SETS, _load_once, _prompts
from engine.config import PRESETS, preset
from engine.device import DeviceError, check_device
from engine.runtime import EngineSpec, build_decoder, generate
from kernels.cli import OneLineParser


def _bad_input(args: argparse.Namespace) -> str | None:
    """Why these arguments could only crash or time nothing (None when they can run)."""
    for flag in ("runs", "fresh", "max_tokens"):
        if getattr(args, flag) < 1:
            return f"--{flag.replace('_', '-')} must be at least 1, got {getattr(args, flag)}"
    try:
        check_device(args.device)
    except DeviceError as exc:
        return str(exc)
    # a step starts while the sequence has room, and may commit draft_len + 1 tokens: the
    # longest golden prompt plus --max-tokens plus one step's worth must fit the context
    p = preset(args.preset)
    per = p.engine.draft_len + 1 if args.mode == "ddtree" else 1
    longest = max(len(x) for x in _prompts(0))
    if longest + args.max_tokens + per > p.model.max_seq_len:
        top = p.model.max_seq_len - longest - per
        return (
            f"--max-tokens {args.max_tokens}: a {longest}-token prompt would decode past this "
            f"model's context ({p.model.max_seq_len}); at most {top} with --preset {args.preset}"
        )
    if not args.json:
        return "--json needs a file path"
    if os.path.isdir(args.json):
        return f"--json {args.json}: is a directory"
    parent = os.path.dirname(os.path.abspath(args.json))
    exists = os.path.exists(args.json)
    if not os.path.isdir(parent) or not os.access(args.json if exists else parent, os.W_OK):
        return f"--json {args.json}: cannot write there"
    return None


def _cpu_mhz() -> float | None:
    try:
        with open("/proc/cpuinfo") as f:
            mhz = [float(ln.split(":")[1]) for ln in f if ln.startswith("cpu MHz")]
    except OSError:
        return None
    return sum(mhz) / len(mhz) if mhz else None


def _sm_clock() -> int | None:
    if not shutil.which("nvidia-smi"):
        return None
    out = subprocess.run(
        ["nvidia-smi", "--query-gpu=clocks.sm", "--format=csv,noheader,nounits", "-i", "0"],
        capture_output=True,
        text=True,
        check=False,
    )
    try:
        return int(out.stdout.split()[0])
    except (IndexError, ValueError):
        return None


def _clocked(kind: str, fn) -> dict:
    before = {"cpu_mhz": _cpu_mhz(), "sm_mhz": _sm_clock()}
    run = fn()
    after = {"cpu_mhz": _cpu_mhz(), "sm_mhz": _sm_clock()}
    keep = ("tokens_per_s", "wall_s", "cpu_s", "mean_accept_length", "stage_mean_ms",
            "completed", "finish_reasons")  # fmt: skip
    return {"kind": kind, **{k: run[k] for k in keep if k in run}, "before": before, "after": after}


def _direct(dec, prompts, max_tokens: int) -> dict:
    """One c=1 run from this thread: generate() over the first prompt, no scheduler."""
    t0, c0 = time.perf_counter(), time.process_time()
    outs, acc = generate(dec, prompts[:1], max_tokens, stop_at_eos=False)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    n = len(outs[0])
    return {"tokens_per_s": n / wall, "wall_s": wall, "cpu_s": cpu,
            "mean_accept_length": sum(acc) / len(acc)}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = OneLineParser(prog="engine_aging.py")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--preset", default="small", choices=sorted(PRESETS))
    ap.add_argument("--mode", default="ddtree", choices=("ar", "ddtree"))
    ap.add_argument("--runs", type=int, default=12)
    ap.add_argument("--fresh", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--json", required=True)
    args = ap.parse_args(argv)
    why = _bad_input(args)
    if why:
        print(f"error: {why}", file=sys.stderr)
        return 2
    sets = BACKEND_SETS["cuda" if args.device.startswith("cuda") else "cpu-kernels"]
    spec = EngineSpec(args.preset, args.mode, args.device, sets, max_batch_size=32)
    prompts = _prompts(0)

    def warm_decoder():
        _, dec = build_decoder(spec)
        generate(dec, prompts[:1], 4, stop_at_eos=False)
        return dec

    def sched_run(dec) -> dict:
        r = _load_once(dec, prompts, 1, args.max_tokens)
        r.pop("outputs")
        return r

    runs = []
    dec = warm_decoder()
    for _ in range(args.runs):
        runs.append(_clocked("same decoder", lambda: sched_run(dec)))
    for _ in range(args.fresh):
        fresh = warm_decoder()
        runs.append(_clocked("fresh decoder", lambda f=fresh: sched_run(f)))
        del fresh
    for _ in range(args.fresh):
        direct = lambda: _direct(dec, prompts, args.max_tokens)  # noqa: E731
        runs.append(_clocked("same decoder, this thread", direct))
    for i, r in enumerate(runs):
        stages = " ".join(f"{k}={v:.3f}" for k, v in sorted(r.get("stage_mean_ms", {}).items()))
        print(f"{i:2d} {r['kind']:28s} {r['tokens_per_s']:8.1f} tok/s cpu/wall "
              f"{r['cpu_s'] / r['wall_s']:.2f} cpu {r['before']['cpu_mhz']} MHz "
              f"sm {r['before']['sm_mhz']} {stages}")  # fmt: skip
    cmd = "engine_aging.py " + " ".join(sys.argv[1:] if argv is None else argv)
    doc = {"command": cmd, "mode": args.mode, "preset": args.preset, "runs": runs}
    try:
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
    except OSError as exc:
        print(f"error: --json {args.json}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    failed = [
        i
        for i, r in enumerate(runs)
        if r.get("completed") is False or r.get("finish_reasons", ["length"]) != ["length"]
    ]
    if failed:
        print(f"error: runs {failed} did not finish cleanly (see finish_reasons)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
