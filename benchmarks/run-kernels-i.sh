#!/usr/bin/env bash
# Kernels I on one GPU: build for this GPU's arch, GPU tests, then the benchmark.
# Usage: OUT=dir [ARCH=sm_90] [BENCH_ARGS=...] bash benchmarks/run-kernels-i.sh
set -u
OUT=${OUT:-/tmp/kernels-i}; ARCH=${ARCH:-sm_90}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 CUDA_DEVICE_ORDER=PCI_BUS_ID
nvidia-smi --query-gpu=name,uuid,driver_version,clocks.sm,clocks.mem --format=csv,noheader
python3 -m kernels.build --arch "$ARCH" --out /tmp/ddtree-k --json > "$OUT/build.json"
rc=$?; if [ $rc -ne 0 ]; then cat "$OUT/build.json"; exit $rc; fi
export DDTREE_KERNELS_LIB=/tmp/ddtree-k/libddtree_kernels.so
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  timeout "${TEST_TIMEOUT:-240}" python3 -m pytest -m gpu tests/test_cuda_kernels.py -q \
    --maxfail=8 -p no:cacheprovider > "$OUT/pytest.txt" 2>&1
  echo "pytest rc=$?"; grep -E "passed|failed|Error|error|assert" "$OUT/pytest.txt" | tail -25
fi
timeout "${BENCH_TIMEOUT:-300}" python3 -m kernels.bench --json ${BENCH_ARGS:-} \
  > "$OUT/bench.json" 2> "$OUT/bench.err"
echo "bench rc=$?"; tail -c 9000 "$OUT/bench.err"
