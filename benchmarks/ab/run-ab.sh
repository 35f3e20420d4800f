#!/usr/bin/env bash
# A/B on one GPU: the kernels at 686fa5c (old) against the working tree (new), interleaved.
# The old tree first: git archive 686fa5c kernels/csrc | tar x -C benchmarks/ab/old686
set -u
OUT=${OUT:-/tmp/ab}; W=/tmp/ab-work; rm -rf "$W"; mkdir -p "$OUT" "$W"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,uuid,clocks.sm --format=csv > "$W/env.txt" 2>&1
bld() {  # $1 dir with csrc, $2 out dir
  mkdir -p "$2" && nvcc -O3 -std=c++17 -shared -Xcompiler -fPIC --threads 0 \
    -gencode arch=compute_90a,code=sm_90a -o "$2/libddtree_kernels.so" \
    "$1"/tree_verify_attention.cu "$1"/kv_compact.cu "$1"/ddtree_abi.cu > "$2/build.txt" 2>&1
}
bld kernels/csrc /tmp/lib-new & bld benchmarks/ab/old686/kernels/csrc /tmp/lib-old & wait
sweep() {  # $1 label, $2 lib, rest: variants
  DDTREE_KERNELS_LIB=$2/libddtree_kernels.so timeout 100 python3 -c "
import json, sys
import kernels.bench_attention as ba
ba.SWEEP = {(64, 4096, 65, 8): [0], (8, 32768, 65, 8): [0]}
rows = ba.sweep(tuple(sys.argv[2:]))
for r in rows: r['run'] = sys.argv[1]
print(json.dumps(rows))" "$1" "${@:3}" >> "$W/sweep.jsonl" 2>> "$W/sweep.err"
}
sweep new1 /tmp/lib-new mma8 mma14 mma17 mma22
sweep old1 /tmp/lib-old mma8 mma14 mma17
sweep new2 /tmp/lib-new mma8 mma14 mma17 mma22
sweep old2 /tmp/lib-old mma8 mma14 mma17
DDTREE_ATTN_TAIL=0 sweep new-tail0 /tmp/lib-new mma8 mma14
DDTREE_ATTN_TAIL=0 sweep old-tail0 /tmp/lib-old mma8 mma14
python3 - "$W/sweep.jsonl" <<'PY' > "$W/summary.txt"
import json, sys
for line in open(sys.argv[1]):
    for r in json.loads(line):
        print(r["run"], r["algo"], r["batch"], round(r["median_ms"], 4), f"{r['rel_err_vs_sdpa_fp32']:.2e}")
PY
tail -3 "$W/sweep.err" >> "$W/summary.txt"
tar czf "$OUT/ab.tgz" -C "$W" .
cat "$W/summary.txt"
