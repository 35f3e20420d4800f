#!/usr/bin/env bash
# Final verification on one GPU: build for its arch, EVERY gpu-marked test (kernels, attention,
# engine), then the kernel benchmarks with their defaults. Results under $OUT.
# Usage: OUT=dir DDTREE_GIT_SHA=$(git rev-parse HEAD) [ARCH=sm_90] bash benchmarks/verify-all.sh
set -u
OUT=${OUT:-/tmp/verify}; ARCH=${ARCH:-sm_90}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 CUDA_DEVICE_ORDER=PCI_BUS_ID
nvidia-smi --query-gpu=name,uuid,driver_version,clocks.sm,clocks.mem --format=csv,noheader \
  | tee "$OUT/gpu.txt"
python3 -m kernels.build --arch "$ARCH" --out /tmp/ddtree-k --json > "$OUT/build.json"
rc=$?; if [ $rc -ne 0 ]; then cat "$OUT/build.json"; exit $rc; fi
export DDTREE_KERNELS_LIB=/tmp/ddtree-k/libddtree_kernels.so
# the GPU test files by name: the CPU-only test modules import packages a GPU box may lack
timeout "${TEST_TIMEOUT:-240}" python3 -m pytest -m gpu tests/test_cuda_kernels.py \
  tests/test_attention_cuda.py tests/test_engine_gpu.py -q -p no:cacheprovider \
  > "$OUT/pytest-gpu.txt" 2>&1
echo "pytest rc=$?"; grep -E "passed|failed|error" "$OUT/pytest-gpu.txt" | tail -15
timeout "${BENCH_TIMEOUT:-200}" python3 -m kernels.bench --json --quick \
  --suite topk,tree,accept,attn --batch 1,64 --budget 64 --k 8,64 \
  > "$OUT/bench.json" 2> "$OUT/bench.err"
echo "bench rc=$?"; tail -c 6000 "$OUT/bench.err"
