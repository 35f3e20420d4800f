"""Attention's time where the engine spends it, per backend, beside the kernel bench's rows.

On one GPU, in one process: the reference engine (preset small, every other component on CUDA)
with attention `torch`, then `cuda`; per backend the attention seconds of a prefill of one
PROMPT-token prompt (`Decoder.prefill`'s timer) and of a DDTree decode step at each
concurrency c (the step's `attention` stage), medians. Then `kernels.bench_attention`'s
`row_attention_prefill` and `row_attention` stage rows at the same shapes (the plan and one call
per layer). The question it answers: does the bench's s (what `ops report` projects with)
equal the engine's own s at each site?

Usage on the GPU host, project root: python benchmarks/attention_sites.py [--prompt 1024]
    [--concurrency 1 8 32] --json out.json
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

from engine.runtime import EngineSpec, build_decoder


def engine_sites(attention: str, prompt: int, levels: list[int], steps: int) -> dict:
    spec = EngineSpec(preset="small", device="cuda", mode="ddtree",
                      backends=(f"attention={attention}",))  # fmt: skip
    p, dec = build_decoder(spec)
    gen = torch.Generator().manual_seed(0)

    def prompt_ids() -> list[int]:
        return torch.randint(0, 256, (prompt,), generator=gen).tolist()

    pre = []
    for _ in range(6):
        seq = dec.new_sequence(prompt_ids())
        pre.append(dec.prefill(seq))
        seq.blocks.free()
    out: dict = {"prefill_s": statistics.median(pre[1:]), "layers": p.model.layers, "steps": {}}
    for c in levels:
        seqs = [dec.new_sequence(prompt_ids()) for _ in range(c)]
        for s in seqs:
            dec.prefill(s)
        att, step = [], []
        for i in range(steps):
            res = dec.step(seqs)
            if i >= 2:
                att.append(res.stages["attention"])
                step.append(sum(v for k, v in res.stages.items() if k != "attention"))
        for s in seqs:
            s.blocks.free()
        out["steps"][str(c)] = {"attention_s": statistics.median(att),
                                "step_s": statistics.median(step)}  # fmt: skip
    del dec
    torch.cuda.empty_cache()
    return out


def bench_rows(prompt: int, levels: list[int]) -> list[dict]:
    from kernels.bench_attention import row_attention_rows, row_prefill_rows

    rows = row_prefill_rows(prompt, reps=20, refcheck=False)
    for c in levels:
        rows += row_attention_rows(c, 17, prompt, reps=20, refcheck=False)
    return [{k: r[k] for k in ("kernel", "impl", "shape", "median_us", "iqr_us")} for r in rows]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompt", type=int, default=1024)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--json", required=True)
    a = ap.parse_args()
    doc = {
        "engine": {b: engine_sites(b, a.prompt, a.concurrency, a.steps) for b in ("torch", "cuda")},
        "bench": bench_rows(a.prompt, a.concurrency),
        "prompt": a.prompt,
    }
    eng = doc["engine"]

    def bench_us(kernel: str, impl: str, b: int) -> float:
        found = [r for r in doc["bench"] if (r["kernel"], r["impl"]) == (kernel, impl)]
        return next(r["median_us"] for r in found if r["shape"]["B"] == b)

    lines = ["site        engine torch ms  engine cuda ms  engine s | bench torch ms  cuda ms  s "
             "(stage: plan + layers calls)"]  # fmt: skip
    sites = [
        ("prefill", eng["torch"]["prefill_s"], eng["cuda"]["prefill_s"], "row_attention_prefill", 1)
    ]
    for c in a.concurrency:
        sites.append((f"step c={c}", eng["torch"]["steps"][str(c)]["attention_s"],
                      eng["cuda"]["steps"][str(c)]["attention_s"], "row_attention", c))  # fmt: skip
    for name, t, cu, kernel, b in sites:
        bt = bench_us(kernel, "torch_rows_stage", b) / 1e3
        bc = bench_us(kernel, "cuda_rows_stage", b) / 1e3
        lines.append(f"{name:<11} {t * 1e3:15.3f} {cu * 1e3:15.3f} {t / cu:9.2f} | "
                     f"{bt:14.3f} {bc:8.3f} {bt / bc:5.2f}")  # fmt: skip
    doc["table"] = lines
    print("\n".join(lines))
    with open(a.json, "w") as f:
        json.dump(doc, f, indent=1)


if __name__ == "__main__":
    main()
