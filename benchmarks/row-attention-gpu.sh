#!/usr/bin/env bash
# The engine's attention call on one GPU: build the kernel library, the row attention GPU tests
# (cuda_rows == torch_rows, the bench rows' schema), then the attn suite whose `row_attention`
# rows (torch_rows vs cuda_rows, fp32, B = 1/8/32 requests x T = 17 rows over L = 64 and 1024
# prefix keys) give `ops report` its s(c) for attention torch -> cuda (playbooks/rollout-attention).
# Usage: OUT=dir [ARCH=sm_90] [BENCH_ARGS="--prefix-len 1024"] bash benchmarks/row-attention-gpu.sh
set -u
OUT=${OUT:-/tmp/row-attention-gpu}; ARCH=${ARCH:-sm_90}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 CUDA_DEVICE_ORDER=PCI_BUS_ID
nvidia-smi --query-gpu=name,uuid,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -m kernels.build --arch "$ARCH" --out /tmp/ddtree-k --json > "$OUT/build.json"
rc=$?; if [ $rc -ne 0 ]; then cat "$OUT/build.json"; exit $rc; fi
export DDTREE_KERNELS_LIB=/tmp/ddtree-k/libddtree_kernels.so
timeout "${TEST_TIMEOUT:-240}" python3 -m pytest -m gpu tests/test_row_attention.py -q \
  -p no:cacheprovider > "$OUT/pytest-row-attention.txt" 2>&1
echo "pytest rc=$?"; tail -15 "$OUT/pytest-row-attention.txt"
timeout "${BENCH_TIMEOUT:-400}" python3 -m kernels.bench --suite attn --batch 1,8,32 --json \
  ${BENCH_ARGS:-} > "$OUT/attn.json" 2> "$OUT/attn-table.txt"
echo "kernels.bench rc=$?"; grep -E "row_attention|kernel" "$OUT/attn-table.txt"
