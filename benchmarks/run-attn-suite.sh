#!/usr/bin/env bash
# Tree-verify attention, the release run (v7 as run-attn-v7.sh at 275e047; v8 with this), one
# GPU, one device call: build for sm_90 (+ sm_90a); every attention GPU test; the variants in
# $VARIANTS interleaved, twice, at $SIZES (default: the two target sizes, B=64 also with 1, 2
# and 3 KV splits forced; 0 = the planner's pick); the `attn` suite with the default (all
# sizes, TFLOP/s and TB/s against the ceilings) and `python -m kernels.bench --suite attn --quick`.
# Usage: OUT=dir bash benchmarks/run-attn-suite.sh   (results: $OUT/attn-suite.tgz + summary.txt)
set -u
OUT=${OUT:-/tmp/attn-suite}; W=/tmp/attn-suite-work; rm -rf "$W"; mkdir -p "$OUT" "$W"
VARIANTS=${VARIANTS:-mma8 mma18 mma19 mma21}
SIZES=${SIZES:-"{(64, 4096, 65, 8): [0, 1, 2, 3], (8, 32768, 65, 8): [0]}"}  # {(B, prefix, T, heads): [splits]}
export PYTHONUNBUFFERED=1 CUDA_DEVICE_ORDER=PCI_BUS_ID
nvidia-smi --query-gpu=name,uuid,driver_version,clocks.sm,clocks.mem --format=csv > "$W/env.txt" 2>&1
timeout 120 python3 -m kernels.build --arch sm_90 --out /tmp/ddtree-k > "$W/build.txt" 2>&1
cp /tmp/ddtree-k/manifest.json "$W/" 2>/dev/null
export DDTREE_KERNELS_LIB=/tmp/ddtree-k/libddtree_kernels.so
timeout 280 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_attention_cuda.py \
  > "$W/pytest.txt" 2>&1
timeout 200 python3 -c "
import ast, json, sys
import kernels.bench_attention as ba
ba.SWEEP = ast.literal_eval(sys.argv[1])
print(json.dumps(ba.sweep(tuple(sys.argv[2:]) * 2)))" "$SIZES" $VARIANTS > "$W/sweep.json" 2> "$W/sweep.err"
timeout 90 python3 -m kernels.bench_attention --json "$W/h200-attn.json" > "$W/bench.txt" 2>&1
timeout 60 python3 -m kernels.bench --suite attn --quick --json > "$W/bench-cli.json" \
  2> "$W/bench-cli.err"
{ tail -3 "$W/pytest.txt"; python3 - "$W/sweep.json" <<'PY'
import json, sys
for r in json.load(open(sys.argv[1])):
    print(r["algo"], r["batch"], r["prefix"], r["num_splits"], round(r["median_ms"], 4),
          round(r["iqr_ms"], 4), round(r["tflops"], 1),
          f"{r['rel_err_vs_sdpa_fp32']:.2e}")
PY
tail -8 "$W/bench.txt"; tail -2 "$W/bench-cli.err"; } > "$W/summary.txt" 2>&1
tar czf "$OUT/attn-suite.tgz" -C "$W" .
cp "$W/summary.txt" "$OUT/"
cat "$W/summary.txt"
