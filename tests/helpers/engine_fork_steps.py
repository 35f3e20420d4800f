"""The reference engine with a tree build and an accept that call the fork module's functions
the fork's way: the hook's clock and the engine's stage clock on the same steps (tests).

    python tests/helpers/engine_fork_steps.py '{"requests": 12, "max_tokens": 24}'

Start it the way a release starts the service (`current/`, the release's `service.env`, its
`site/` first on PYTHONPATH so the import hook installs, the stand-in fork package and this
checkout's root after it). It builds the real engine (`engine.runtime.build_decoder`, preset
`tiny`, CPU) and puts in its `Backends` two stages written here (the engine has no such
backend, and gets none: this is a test's service, not a product option):

- tree_build: per request of the step, `build_ddtree_tree_from_topk(top_log_probs [H, K],
  top_token_ids [H, K], budget)` of `sglang.srt.speculative.dflash_ddtree_utils`, one request
  per call as the fork's worker calls it (float32 / int64 CPU tensors: the engine's top-k,
  viewed, not copied), its 7-tuple packed into the engine's `BatchedTrees`;
- accept: per request, `follow_verified_tree(child_maps, posterior)` on the target's row,
  packed into the engine's (accepted, accept_len, bonus).

The engine's own scheduler (`engine.scheduler.Scheduler`) runs the requests, and its stage
clock (`engine.stage_clock.StageClock` laps around each stage, summed per batch size by
`engine.stats.StepStats`, what `/metrics` exposes) times each stage around the whole call of
these functions, the packing included; the hook (any setting but `off`) times each call of the
fork's function inside it. It prints one JSON line, {pid, steps, rows (requests x steps: the
fork's calls the steps made), stage_s {tree_build, accept}, tokens}, then waits on stdin (the
test reads the hook's counters of the live process) and exits.
"""

from __future__ import annotations

import json
import os
import sys
import threading

import numpy as np
import sglang.srt.speculative.dflash_ddtree_utils as fork  # the hook acts here
import torch

from engine.runtime import EngineSpec, build_decoder
from engine.scheduler import GenRequest, Scheduler, Update
from engine.stats import StepStats
from kernels.reference import BatchedTrees

BUILD = fork.build_ddtree_tree_from_topk  # by name, once, as the fork's worker holds them
FOLLOW = fork.follow_verified_tree


def fork_tree_build(top_log_probs, top_token_ids, budget: int) -> BatchedTrees:
    """The engine's tree-build stage, one fork call per request."""
    lp, ids = (
        torch.from_numpy(np.asarray(top_log_probs)),
        torch.from_numpy(np.asarray(top_token_ids)),
    )
    b = lp.shape[0]
    out = BatchedTrees(
        token_ids=np.full((b, budget), -1, dtype=np.int64),
        depths=np.full((b, budget), -1, dtype=np.int64),
        parents=np.full((b, budget + 1), -1, dtype=np.int64),
        visibility=np.zeros((b, budget + 1, budget + 1), dtype=np.bool_),
        first_child=np.full((b, budget + 1), -1, dtype=np.int64),
        next_sibling=np.full((b, budget + 1), -1, dtype=np.int64),
        num_nodes=np.zeros(b, dtype=np.int64),
    )
    maps = []
    for i in range(b):
        tokens, depths, parents, child_maps, vis, first, after = BUILD(lp[i], ids[i], budget)
        n = int(tokens.shape[0])
        out.num_nodes[i] = n
        out.token_ids[i, :n] = tokens.numpy()
        out.depths[i, :n] = depths.numpy()
        out.parents[i, : n + 1] = parents
        out.visibility[i, : n + 1, : n + 1] = vis.numpy()
        out.first_child[i, : n + 1] = first.numpy()
        out.next_sibling[i, : n + 1] = after.numpy()
        maps.append(child_maps)
    out.child_maps = maps  # type: ignore[attr-defined]  # the accept walks the fork's maps
    return out


def fork_accept(trees: BatchedTrees, target, max_depth: int):
    """The engine's accept stage, one fork call per request."""
    tgt = torch.as_tensor(target).cpu()
    b = tgt.shape[0]
    accepted = np.full((b, max_depth + 1), -1, dtype=np.int64)
    accept_len = np.zeros(b, dtype=np.int64)
    bonus = np.zeros(b, dtype=np.int64)
    for i in range(b):
        path, bonus[i] = FOLLOW(trees.child_maps[i], tgt[i])  # type: ignore[attr-defined]
        accepted[i, : len(path)] = path
        accept_len[i] = len(path)
    return accepted, accept_len, bonus


def main() -> None:
    a = json.loads(sys.argv[1])
    torch.set_num_threads(1)
    _, decoder = build_decoder(EngineSpec(preset="tiny", max_batch_size=a.get("max_batch", 4)))
    decoder.backends.tree_build = fork_tree_build
    decoder.backends.accept = fork_accept
    stats = StepStats()
    sched = Scheduler(decoder, stats)
    sched.start()
    left = threading.Semaphore(0)
    tokens = []

    def sink(update: Update) -> None:
        tokens.extend(update.token_ids)
        if update.finished:
            left.release()

    n = a["requests"]
    for r in range(n):
        prompt = list(f"request {r}: the fork's way, step by step".encode())
        sched.submit(GenRequest(prompt, a["max_tokens"], sink, ignore_eos=True))
    for _ in range(n):
        if not left.acquire(timeout=300):
            raise SystemExit("the engine did not finish its requests in 300 s")
    sched.shutdown()
    steps = rows = 0
    stage = {"tree_build": 0.0, "accept": 0.0}
    for b, row in stats.breakdown().items():
        steps += row["steps"]
        rows += int(b) * row["steps"]
        for s in stage:
            stage[s] += row["total_s"][s]
    doc = {
        "pid": os.getpid(),
        "steps": steps,
        "rows": rows,
        "stage_s": stage,
        "tokens": len(tokens),
    }
    print(json.dumps(doc), flush=True)
    sys.stdin.readline()


if __name__ == "__main__":
    main()
