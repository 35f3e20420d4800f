#!/usr/bin/env bash
# The reference engine on one GPU: build the kernel library, the engine's GPU tests (AR == DDTree,
# batches 1/7/32/64 with joining requests, graphs on and off), then `python -m engine.bench`.
# Usage: OUT=dir [ARCH=sm_90] [BENCH_ARGS="--prompt-len 0"] bash benchmarks/engine-gpu.sh
set -u
OUT=${OUT:-/tmp/engine-gpu}; ARCH=${ARCH:-sm_90}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 CUDA_DEVICE_ORDER=PCI_BUS_ID
nvidia-smi --query-gpu=name,uuid,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -m kernels.build --arch "$ARCH" --out /tmp/ddtree-k --json > "$OUT/build.json"
rc=$?; if [ $rc -ne 0 ]; then cat "$OUT/build.json"; exit $rc; fi
export DDTREE_KERNELS_LIB=/tmp/ddtree-k/libddtree_kernels.so
timeout "${TEST_TIMEOUT:-240}" python3 -m pytest -m gpu tests/test_engine_gpu.py -q \
  -p no:cacheprovider --durations=10 > "$OUT/pytest-engine-gpu.txt" 2>&1
echo "pytest rc=$?"; tail -25 "$OUT/pytest-engine-gpu.txt"
timeout "${BENCH_TIMEOUT:-300}" python3 -m engine.bench --preset small --device cuda \
  --json "$OUT/engine.json" ${BENCH_ARGS:-} > "$OUT/engine-bench.txt" 2>&1
echo "engine.bench rc=$?"; cat "$OUT/engine-bench.txt"
