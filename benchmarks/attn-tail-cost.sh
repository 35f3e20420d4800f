#!/usr/bin/env bash
# What one tail CTA costs against a full 64-row wgmma CTA: sizes whose every CTA is a tail
# (T=1 x 8 heads = 8 rows a request), timed with the tail path (default) and without it
# (DDTREE_ATTN_TAIL=0: a 64-row tile with 8 live rows), interleaved, and B=64/4096/T=65 again.
# Usage: OUT=dir bash benchmarks/attn-tail-cost.sh   (results: $OUT/tail-cost.jsonl)
set -u
export PYTHONUNBUFFERED=1 CUDA_DEVICE_ORDER=PCI_BUS_ID
timeout 200 python3 -m kernels.build --arch sm_90 --out /tmp/ddtree-k > "$OUT/build.txt" 2>&1
export DDTREE_KERNELS_LIB=/tmp/ddtree-k/libddtree_kernels.so
for mode in default 0 default 0; do
  env=""; [ "$mode" != default ] && env=$mode
  DDTREE_ATTN_TAIL=$env timeout 120 python3 -c "
import json, sys
import kernels.bench_attention as ba
ba.SWEEP = {(64, 4096, 1, 8): [1, 0], (132, 4096, 1, 8): [1], (64, 4096, 65, 8): [0]}
rows = ba.sweep(('mma8',))
for r in rows: r['tail_mode'] = sys.argv[1]
print(json.dumps(rows))" "$mode" >> "$OUT/tail-cost.jsonl" 2>> "$OUT/tail-cost.err"
done
python3 - "$OUT/tail-cost.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    for r in json.loads(line):
        print(r["tail_mode"], r["batch"], r["prefix"], r["tree_rows"], "splits", r["num_splits"],
              round(r["median_ms"], 4), f"{r['rel_err_vs_sdpa_fp32']:.2e}")
PY
