#!/usr/bin/env bash
# Tree-verify attention, wgmma main-loop variants against mma8 (mma11: loads after the QK issue
# + unit-rescale skip; mma12: PV in flight across the loop top + skip; mma13: loads after the QK
# issue alone; mma14: KV by TMA + loads after the QK issue + skip; mma15: mma14 without the
# skip; mma16: mma14 + L2 prefetch of the tile after next; mma17: mma16 with the next tile's
# boxes issued before the QK), on one GPU, one device call: build for sm_90 (+ sm_90a); the attention GPU tests
# (every forced case on mma7..mma15); the two target sizes, the variants in $VARIANTS
# interleaved (list a variant twice to time it twice); then a diagnostic build
# (-DTVA_DIAG_NOLOAD: KV tiles past the first two not loaded, wrong results) timed once, which
# gives each variant's compute-only time (NOLOAD=0 skips it). TESTS_K: a pytest -k filter;
# TAIL0_VARIANTS: variants also timed with DDTREE_ATTN_TAIL=0 (no tail path); SIZES: the sweep's
# sizes as a Python dict literal {(B, prefix, T, heads): [splits]}; SMALL_VARIANTS: variants
# also timed at small batches (SMALL_SIZES, default B=1/2/4 x 4096 and B=16 x 1024 x T33).
# Usage: OUT=dir bash benchmarks/run-attn-overlap.sh   (results: $OUT/attn-overlap.tgz + summary.txt)
set -u
OUT=${OUT:-/tmp/attn-overlap}; W=/tmp/attn-overlap-work; rm -rf "$W"; mkdir -p "$OUT" "$W"
export PYTHONUNBUFFERED=1 CUDA_DEVICE_ORDER=PCI_BUS_ID
VARIANTS=${VARIANTS:-mma8 mma13 mma14 mma15 mma8 mma13 mma14 mma15}
nvidia-smi --query-gpu=name,uuid,driver_version,clocks.sm,clocks.mem --format=csv > "$W/env.txt" 2>&1
timeout 150 python3 -m kernels.build --arch sm_90 --out /tmp/ddtree-k > "$W/build.txt" 2>&1
cp /tmp/ddtree-k/manifest.json "$W/" 2>/dev/null
export DDTREE_KERNELS_LIB=/tmp/ddtree-k/libddtree_kernels.so
SIZES=${SIZES:-"{(64, 4096, 65, 8): [0], (8, 32768, 65, 8): [0]}"}
sweep() {  # $1: label, $2: time limit (s); variants timed on $SIZES (default: both target sizes, split 0 = the planner's pick)
  timeout "$2" python3 -c "
import ast, json, sys
import kernels.bench_attention as ba
ba.SWEEP = ast.literal_eval(sys.argv[2])
rows = ba.sweep(tuple(sys.argv[3:]))
for r in rows: r['run'] = sys.argv[1]
print(json.dumps(rows))" "$1" "$SIZES" $VARIANTS >> "$W/sweep.jsonl" 2>> "$W/sweep.err"
}
timeout 280 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_attention_cuda.py \
  ${TESTS_K:+-k "$TESTS_K"} > "$W/pytest.txt" 2>&1
sweep a 120
[ -n "${SMALL_VARIANTS:-}" ] && VARIANTS=$SMALL_VARIANTS SIZES=${SMALL_SIZES:-"{(1, 4096, 65, 8): [0], (2, 4096, 65, 8): [0], (4, 4096, 65, 8): [0], (16, 1024, 33, 8): [0]}"} sweep small 120
[ -n "${TAIL0_VARIANTS:-}" ] && VARIANTS=$TAIL0_VARIANTS DDTREE_ATTN_TAIL=0 sweep tail0 90
[ "${NOLOAD:-1}" = 1 ] && mkdir -p /tmp/ddtree-diag && timeout 90 nvcc -O3 -std=c++17 -shared -Xcompiler -fPIC --threads 0 -DTVA_DIAG_NOLOAD \
  -gencode arch=compute_90a,code=sm_90a -o /tmp/ddtree-diag/libddtree_kernels.so \
  kernels/csrc/tree_verify_attention.cu kernels/csrc/kv_compact.cu kernels/csrc/ddtree_abi.cu \
  > "$W/build-diag.txt" 2>&1
[ "${NOLOAD:-1}" = 1 ] && DDTREE_KERNELS_LIB=/tmp/ddtree-diag/libddtree_kernels.so sweep noload 90
{ tail -3 "$W/pytest.txt"; python3 - "$W/sweep.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    for r in json.loads(line):
        print(r["run"], r["algo"], r["batch"], r["prefix"], round(r["median_ms"], 4), round(r["iqr_ms"], 4),
              round(r["tflops"], 1), f"{r['rel_err_vs_sdpa_fp32']:.2e}")
PY
tail -5 "$W/sweep.err"; } > "$W/summary.txt" 2>&1
tar czf "$OUT/attn-overlap.tgz" -C "$W" .
cp "$W/summary.txt" "$OUT/"
cat "$W/summary.txt"
