#!/usr/bin/env bash
# Tree build v5 on one GPU (one device call): build for sm_90, GPU kernel tests with the default
# algo and with DDTREE_TREE_ALGO=v5, the engine GPU test (default; again with v5 if < 150 s
# have passed), then the tree benchmark with v5 and with v4.
# Usage: OUT=dir [FALLBACK_LIB=lib.so] bash benchmarks/run-tree-v5.sh
set -u
OUT=${OUT:-/tmp/tree-v5}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 CUDA_DEVICE_ORDER=PCI_BUS_ID
nvidia-smi --query-gpu=name,uuid,driver_version,clocks.sm --format=csv,noheader
if ! timeout 120 python3 -m kernels.build --arch sm_90 --out /tmp/ddtree-k > "$OUT/build.txt" 2>&1
then
  tail -20 "$OUT/build.txt"
  if [ -n "${FALLBACK_LIB:-}" ]; then
    mkdir -p /tmp/ddtree-k && cp "$FALLBACK_LIB" /tmp/ddtree-k/libddtree_kernels.so
    echo "build failed: using the carried library $FALLBACK_LIB" | tee -a "$OUT/build.txt"
  fi
fi
tail -1 "$OUT/build.txt"
export DDTREE_KERNELS_LIB=/tmp/ddtree-k/libddtree_kernels.so
t() { timeout 100 python3 -m pytest -m gpu "$@" -q -p no:cacheprovider 2>&1; }
echo "== default algo"; t tests/test_cuda_kernels.py | tee "$OUT/pytest-default.txt" | tail -4
echo "== v5"; DDTREE_TREE_ALGO=v5 t tests/test_cuda_kernels.py | tee "$OUT/pytest-v5.txt" | tail -4
echo "== engine (default)"; t tests/test_engine_gpu.py | tee "$OUT/pytest-engine.txt" | tail -2
if [ $SECONDS -lt 150 ]; then  # time allowing
  echo "== engine (v5)"; DDTREE_TREE_ALGO=v5 t tests/test_engine_gpu.py | tee -a "$OUT/pytest-engine.txt" | tail -2
fi
B="--json --suite tree --batch 1,64 --budget 16,64 --k 8,64 --quick"
for a in v5 v4; do
  echo "== bench $a" | tee -a "$OUT/bench.err"
  DDTREE_TREE_ALGO=$a timeout 90 python3 -m kernels.bench $B > "$OUT/bench-$a.json" \
    2>> "$OUT/bench.err"
  echo "bench $a rc=$?"
done
tail -c 6000 "$OUT/bench.err"
