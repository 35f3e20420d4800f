#!/usr/bin/env bash
# Tree-verify attention, the wgmma kernel's tail path (swap-AB for CTAs with <= 8 live rows), on
# one GPU, one device call: build for sm_90 (+ sm_90a); the attention GPU tests; the two target
# sizes with mma8 under DDTREE_ATTN_TAIL = default (tail path, tails scheduled last), 1 (tail
# path, natural block order) and 0 (neither: the previous kernel), interleaved, twice; then the
# full `attn` suite with the default.
# Usage: OUT=dir bash benchmarks/run-attn-tail.sh   (results: $OUT/attn-tail.tgz + summary.txt)
set -u
OUT=${OUT:-/tmp/attn-tail}; W=/tmp/attn-tail-work; rm -rf "$W"; mkdir -p "$OUT" "$W"
export PYTHONUNBUFFERED=1 CUDA_DEVICE_ORDER=PCI_BUS_ID
nvidia-smi --query-gpu=name,uuid,driver_version,clocks.sm,clocks.mem --format=csv > "$W/env.txt" 2>&1
timeout 200 python3 -m kernels.build --arch sm_90 --out /tmp/ddtree-k > "$W/build.txt" 2>&1
cp /tmp/ddtree-k/manifest.json "$W/" 2>/dev/null
export DDTREE_KERNELS_LIB=/tmp/ddtree-k/libddtree_kernels.so
timeout 300 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_attention_cuda.py \
  > "$W/pytest.txt" 2>&1
for mode in default 0 1 default 0 1; do
  env=""; [ "$mode" != default ] && env=$mode
  DDTREE_ATTN_TAIL=$env timeout 120 python3 -c "
import json, sys
import kernels.bench_attention as ba
ba.SWEEP = {(64, 4096, 65, 8): [0], (8, 32768, 65, 8): [0]}
rows = ba.sweep(('mma8',))
for r in rows: r['tail_mode'] = sys.argv[1]
print(json.dumps(rows))" "$mode" >> "$W/tail-sweep.jsonl" 2>> "$W/sweep.err"
done
timeout 300 python3 -m kernels.bench_attention --json "$W/h200-attn.json" > "$W/bench.txt" 2>&1
{ tail -3 "$W/pytest.txt"; python3 - "$W/tail-sweep.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    for r in json.loads(line):
        print(r["tail_mode"], r["batch"], r["prefix"], round(r["median_ms"], 4), round(r["tflops"], 1),
              f"{r['rel_err_vs_sdpa_fp32']:.2e}")
PY
tail -15 "$W/bench.txt"; } > "$W/summary.txt" 2>&1
tar czf "$OUT/attn-tail.tgz" -C "$W" .
cp "$W/summary.txt" "$OUT/"
cat "$W/summary.txt"
