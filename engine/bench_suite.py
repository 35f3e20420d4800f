"""The `engine_attn` suite: the reference engine's own attention stage, per backend, in a child.

`python -m kernels.bench --suite engine_attn` runs `python -m engine.attn_bench` once per
`--prefix-len` L, as a child process (this module imports no torch: it checks the settings with
the torch-free engine.config; the child's engines and their memory are gone when it exits),
and returns its rows: `row_attention` (a decode step of each `--batch` requests) and
`row_attention_prefill` (one prompt of L tokens), impls `torch_engine` and `cuda_engine`, mode
`engine_stage`. Each is the time the engine's stage clock charges to attention inside the
engine's real forward (its graph pieces, its KV pool, its plan), the same number a service's
profile reads, benched in isolation on the bench GPU. The suite lives beside the engine it
measures; `kernels.bench.registry` names it (`engine_attn_suite`, settings `check_settings`).

What it showed (benchmarks/NOTES-attention.md at abb2881, measured at 0abddba): on the H200 the
torch path costs 1-1.7 ms more in the service than in the attn suite's stage rows, and these rows,
the engine's real forward benched in isolation, read it no closer: 1.97 / 1.33 / 1.08x at B = 1 / 8
/ 32 and prefill 1.50x, against the service's 2.07 / 1.43 / 1.17x and 1.54-1.58x (the stage rows of
the same bench: 2.20 / 1.40 / 1.11x and 1.50x). What the service pays on top is in the serving
process, not in the forward, so this is a diagnostic beside the stage rows, not the rollout's s.

The engine is built as the service runs it: `--engine-preset`, `--engine-mode`,
`--engine-max-budget`, `--engine-graphs` and `--matmul` (`ops bench` reads them from the
service's /get_server_info). The batch is laid out as a load of one prompt keeps it
(`--same-prompt`, every request at one prefix), or spread over `--decode-spread` tokens.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

from engine.config import MAX_BUDGET, PRESETS, tokens_reached
from kernels.bench.config import BenchConfig, Row, SuiteError

__all__ = ["SuiteError", "check_settings", "engine_argv", "engine_attn_suite", "prompt_lens"]

ENGINE_STEPS = 24  # timed decode steps per batch (after 4 untimed)
ENGINE_WARM = 4
CHILD_TIMEOUT_S = 900.0


def engine_argv(cfg: BenchConfig, prompt_len: int) -> list[str]:
    """The child's command line for one prompt length (its JSON document goes to stdout)."""
    argv = [
        sys.executable,
        "-m",
        "engine.attn_bench",
        "--device",
        "cuda",
        "--preset",
        cfg.engine_preset,
        "--mode",
        cfg.engine_mode,
        "--batch",
        *map(str, cfg.batches),
        "--prompt-len",
        str(prompt_len),
        "--prefix-span",
        str(cfg.decode_spread),
        "--steps",
        str(ENGINE_STEPS),
        "--warm",
        str(ENGINE_WARM),
        "--graphs",
        cfg.engine_graphs,
        "--matmul",
        cfg.matmul,
    ]
    if cfg.decode_spread == 0:
        argv.append("--same-prompt")
    if cfg.engine_max_budget is not None:
        argv += ["--max-budget", str(cfg.engine_max_budget)]
    return argv


def prompt_lens(cfg: BenchConfig) -> tuple[list[int], list[str]]:
    """The `--prefix-len` values the engine's context holds (with the decode steps the child
    runs after each prompt, as engine.attn_bench's own check counts them), and a note for each
    one left out. ValueError (exit 2, before anything runs) for an unknown preset, a max budget
    past the engine's limit, a batch past the engine's, or no length that fits. engine.config
    is torch-free: checked here, on any host, not only once a child runs on a GPU."""
    p = PRESETS.get(cfg.engine_preset)
    if p is None:
        raise ValueError(
            f"--engine-preset {cfg.engine_preset!r}: unknown; known: {', '.join(sorted(PRESETS))}"
        )
    if cfg.engine_max_budget is not None and cfg.engine_max_budget > MAX_BUDGET:
        raise ValueError(
            f"--engine-max-budget must be <= {MAX_BUDGET}, got {cfg.engine_max_budget}"
        )
    top = max(cfg.batches)
    limit = max(p.engine.max_batch_size, 64)
    if top > limit:
        raise ValueError(
            f"engine_attn: --batch {top} is past the {cfg.engine_preset} engine's {limit}"
        )
    # engine.attn_bench's own check: the batch's longest prompt (its offsets i * span // B)
    spread = (top - 1) * cfg.decode_spread // top
    fit, notes = [], []
    for n in cfg.prefix_lens:
        need = tokens_reached(p, cfg.engine_mode, n + spread, ENGINE_WARM + ENGINE_STEPS)
        if n < p.model.max_seq_len and need <= p.model.max_seq_len:
            fit.append(n)
        else:
            notes.append(
                f"engine_attn: --prefix-len {n} left out: with {ENGINE_WARM + ENGINE_STEPS} "
                f"decode steps it could reach {need} tokens, past the {cfg.engine_preset} "
                f"engine's context ({p.model.max_seq_len})"
            )
    if not fit:
        raise ValueError(notes[0] + "; give a shorter --prefix-len")
    return fit, notes


def check_settings(cfg: BenchConfig) -> list[str]:
    """The suite's settings check (`kernels.bench.registry`): run by `python -m kernels.bench`
    before any suite, on any host; the notes go into its document, a ValueError is exit 2."""
    return prompt_lens(cfg)[1]


def engine_attn_suite(cfg: BenchConfig) -> list[Row]:
    import torch

    lens, notes = prompt_lens(cfg)  # the notes are in kernels.bench's document
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    torch.cuda.empty_cache()  # what earlier suites left cached goes back before the child runs
    rows: list[Row] = []
    for prompt_len in lens:
        argv = engine_argv(cfg, prompt_len)
        print(f"engine_attn: {' '.join(argv[1:])}", file=sys.stderr)
        try:
            res = subprocess.run(
                argv, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S, check=False
            )
        except subprocess.TimeoutExpired:
            raise SuiteError(
                f"engine_attn: engine.attn_bench ran past {CHILD_TIMEOUT_S:.0f} s"
            ) from None
        if res.stderr:
            sys.stderr.write(res.stderr)
        if res.returncode != 0:
            last = (res.stderr.strip().splitlines() or ["(no output)"])[-1]
            # the child's exit 2 is bad input (e.g. CUDA asked of a torch without it); the
            # settings prompt_lens checks never get this far
            raise SuiteError(
                f"engine_attn (L={prompt_len}): engine.attn_bench exited {res.returncode}: {last}",
                2 if res.returncode == 2 else 1,
            )
        try:
            doc: dict[str, Any] = json.loads(res.stdout)
        except json.JSONDecodeError as exc:
            raise SuiteError(f"engine_attn (L={prompt_len}): no JSON document: {exc}") from None
        for r in doc.get("results") or []:
            r["engine_command"] = doc.get("command")
            r["engine_peak_reserved_mib"] = doc.get("peak_reserved_mib")  # the guard's check
            # tokens may differ across attention backends (TF32 bmm against the fp32 kernel):
            # recorded as engine_refcheck, not a failed reference check (engine.attn_bench)
            if "refcheck" in r:
                r["engine_refcheck"] = r.pop("refcheck")
            rows.append(r)
    return rows
