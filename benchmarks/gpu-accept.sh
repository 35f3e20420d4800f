#!/usr/bin/env bash
# The GPU accept drop-in (integration/gpu_accept.py) on one GPU: build the kernels for $ARCH
# (default sm_90), run its gpu-marked tests and the existing greedy-accept kernel tests (bit-exact
# against the oracle on 8,080 random rows, ties across siblings included; the existing kernels
# unchanged), then time per call the project's CUDA drop-in against the Triton kernel of the same
# contract (tests/helpers/triton_accept.py) at the fork's shapes: batch 1, 8, 32, 64 x budget
# 16, 64, 128 (rows of S = budget + 1). Writes $OUT/gpu-accept.json (every number) and prints a
# table last. Name $OUT benchmarks/results/<date>-<commit>-<card>-gpu-accept/.
#
# Per call, for each implementation, interleaved (ours, triton, ours, triton, ...), medians of 15
# repeats over 4 rotating input sets, CUDA events throughout:
#   stream_us    50 calls back to back between two events, / 50: what a stream pays per call
#                (the host's launch cost included where it is the longer)
#   isolated_us  one call between two events after a synchronize
#   device_us    50 calls captured in a CUDA graph, replayed between two events, / 50: the
#                kernel's own time, no host cost
#   host_us      the host's wall time per call over the 50 (perf_counter, no synchronize inside)
# Usage, project root: OUT=dir [ARCH=sm_90] bash benchmarks/gpu-accept.sh
. "$(dirname "$0")/preamble.sh" /tmp/gpu-accept
record "OUT=$OUT ARCH=$ARCH"
cat "$OUT/gpu.txt"
attempt python3 -m kernels.build --arch "$ARCH" --out /tmp/ddtree-k --json > "$OUT/build.json"
if [ "$rc" -ne 0 ]; then cat "$OUT/build.json"; exit "$rc"; fi
export DDTREE_KERNELS_LIB=/tmp/ddtree-k/libddtree_kernels.so
attempt timeout "${TEST_TIMEOUT:-300}" python3 -m pytest -m gpu -k accept -q -p no:cacheprovider \
  tests/test_gpu_accept.py tests/test_cuda_kernels.py > "$OUT/pytest-gpu.txt" 2>&1
test_rc=$rc
echo "pytest rc=$test_rc"
grep -E "passed|failed|error" "$OUT/pytest-gpu.txt" | tail -8 || true
attempt timeout "${BENCH_TIMEOUT:-240}" python3 - "$OUT/gpu-accept.json" "$test_rc" <<'PY'
import json
import statistics
import sys
import time

import torch
import triton

sys.path.insert(0, "tests")
from helpers.triton_accept import random_rows, triton_accept  # noqa: E402

from integration import gpu_accept as ga  # noqa: E402

out_path, test_rc = sys.argv[1], int(sys.argv[2])
N, REPS, SETS = 50, 15, 4
dev = torch.device("cuda")


def no_fallback(*args):
    raise AssertionError("the drop-in fell back to its stock function")


ours = ga.make_gpu_accept("cuda", no_fallback)
impls = {"cuda": ours, "triton": triton_accept}


def ev():
    return torch.cuda.Event(enable_timing=True)


def stream_us(fn, sets):
    s0, s1 = ev(), ev()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    s0.record()
    for i in range(N):
        fn(*sets[i % SETS])
    s1.record()
    host = (time.perf_counter() - t0) / N * 1e6
    s1.synchronize()
    return s0.elapsed_time(s1) * 1e3 / N, host


def isolated_us(fn, sets):
    s0, s1 = ev(), ev()
    torch.cuda.synchronize()
    s0.record()
    fn(*sets[0])
    s1.record()
    s1.synchronize()
    return s0.elapsed_time(s1) * 1e3


def graph_of(fn, sets):
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(N):
            fn(*sets[i % SETS])
    torch.cuda.synchronize()
    return g


def device_us(g):
    s0, s1 = ev(), ev()
    torch.cuda.synchronize()
    s0.record()
    g.replay()
    s1.record()
    s1.synchronize()
    return s0.elapsed_time(s1) * 1e3 / N


rows, exact_rows, seed = [], 0, 1000
for budget in (16, 64, 128):
    for batch in (1, 8, 32, 64):
        s = budget + 1
        sets, cpu_sets = [], []
        for _ in range(SETS):
            seed += 1
            ins = random_rows(batch, s, seed=seed, p_match=0.8, p_full=1.0)
            cpu_sets.append(ins)
            outs = (torch.empty((batch, s), dtype=torch.int64),
                    torch.empty(batch, dtype=torch.int32),
                    torch.empty((batch, s), dtype=torch.int64))
            sets.append([x.to(dev) for x in (*ins, *outs)])
        exact = {}
        for name, fn in impls.items():  # warm-up, then check every set bit for bit
            for _ in range(3):
                for args in sets:
                    fn(*args)
            torch.cuda.synchronize()
            ok = True
            for args, ins in zip(sets, cpu_sets, strict=True):
                for x in args[4:]:
                    x.fill_(0x5A5A)
                fn(*args)
                torch.cuda.synchronize()
                want = ga.reference(*ins)
                ok &= all(torch.equal(a.cpu(), b) for a, b in zip(args[4:], want, strict=True))
            exact[name] = ok
        exact_rows += batch * SETS
        lens = [float(ga.reference(*ins)[1].float().mean()) for ins in cpu_sets]
        graphs = {name: graph_of(fn, sets) for name, fn in impls.items()}
        samples = {name: {"stream_us": [], "host_us": [], "isolated_us": [], "device_us": []}
                   for name in impls}
        for _ in range(REPS):
            for name, fn in impls.items():
                st, host = stream_us(fn, sets)
                samples[name]["stream_us"].append(st)
                samples[name]["host_us"].append(host)
                samples[name]["isolated_us"].append(isolated_us(fn, sets))
                samples[name]["device_us"].append(device_us(graphs[name]))
        row = {"batch": batch, "budget": budget, "stride": s, "bit_exact": exact,
               "mean_commit_len": round(statistics.mean(lens), 2)}
        for name in impls:
            row[name] = {k: round(statistics.median(v), 2) for k, v in samples[name].items()}
            row[name]["spread_stream_us"] = [round(min(samples[name]["stream_us"]), 2),
                                             round(max(samples[name]["stream_us"]), 2)]
        row["speedup_stream"] = round(row["triton"]["stream_us"] / row["cuda"]["stream_us"], 3)
        row["speedup_device"] = round(row["triton"]["device_us"] / row["cuda"]["device_us"], 3)
        rows.append(row)
        del graphs

doc = {
    "what": "per-call time of the GPU accept walk, the fork's contract: ours (CUDA drop-in "
            "integration.gpu_accept, through ctypes, with its input checks) vs a Triton kernel of "
            "the same contract (tests/helpers/triton_accept.py, launched bare)",
    "method": f"medians of {REPS} repeats, each {N} calls over {SETS} rotating input sets; CUDA "
              "events; stream_us = back-to-back calls / N; device_us = CUDA-graph replay / N; "
              "isolated_us = one call after a sync; host_us = host wall per call",
    "trees": "random_rows(batch, S, p_match=0.8, p_full=1.0): full trees, ties across siblings",
    "device": torch.cuda.get_device_name(),
    "torch": torch.__version__, "triton": triton.__version__,
    "gpu_tests_rc": test_rc, "bench_rows_checked_bit_exact": exact_rows,
    "all_bit_exact": all(all(r["bit_exact"].values()) for r in rows),
    "rows": rows,
}
with open(out_path, "w") as f:
    json.dump(doc, f, indent=1)
print(f"{doc['device']}  torch {doc['torch']}  triton {doc['triton']}  "
      f"bit-exact: {doc['all_bit_exact']}  gpu tests rc={test_rc}")
print(f"{'batch':>5} {'budget':>6} | {'cuda stream':>11} {'triton':>7} {'x':>5} | "
      f"{'cuda dev':>8} {'triton':>7} {'x':>5} | {'cuda host':>9} {'triton':>7} | len")
for r in rows:
    c, t = r["cuda"], r["triton"]
    print(f"{r['batch']:>5} {r['budget']:>6} | {c['stream_us']:>11.2f} {t['stream_us']:>7.2f} "
          f"{r['speedup_stream']:>5.2f} | {c['device_us']:>8.2f} {t['device_us']:>7.2f} "
          f"{r['speedup_device']:>5.2f} | {c['host_us']:>9.2f} {t['host_us']:>7.2f} | "
          f"{r['mean_commit_len']}")
PY
echo "bench rc=$rc"
exit $(( test_rc != 0 || rc != 0 ))
