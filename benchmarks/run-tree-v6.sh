#!/usr/bin/env bash
# Tree build v6 (level selection, the default for budget <= 64) on one GPU, one device call:
# build for sm_90; GPU kernel tests with the default (v6), the v6 path alone (DDTREE_TREE_ALGO=
# v6only, in the tests that set it) and the v4 loop; the engine GPU test; then the tree
# benchmark for v6 and v4, on the benchmark's drafter inputs (logit scale 2.5) and on peaked
# ones (scale 6: deeper trees).
# Usage: OUT=dir [SKIP_PROFILE=1] [PROFILE_ONLY=1] bash benchmarks/run-tree-v6.sh
set -u
OUT=${OUT:-/tmp/tree-v6}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 CUDA_DEVICE_ORDER=PCI_BUS_ID
nvidia-smi --query-gpu=name,uuid,driver_version,clocks.sm --format=csv,noheader
timeout 150 python3 -m kernels.build --arch sm_90 --out /tmp/ddtree-k > "$OUT/build.txt" 2>&1
tail -1 "$OUT/build.txt"
cp /tmp/ddtree-k/manifest.json "$OUT/manifest.json" 2>/dev/null  # sha256 of the sources that ran
export DDTREE_KERNELS_LIB=/tmp/ddtree-k/libddtree_kernels.so
t() { timeout 150 python3 -m pytest -m gpu "$@" -q -p no:cacheprovider 2>&1; }
echo "== default (v6)"; t tests/test_cuda_kernels.py ${TESTS_K:+-k "$TESTS_K"} | tee "$OUT/pytest-v6.txt" | tail -4
echo "== v4"; DDTREE_TREE_ALGO=v4 t tests/test_cuda_kernels.py -k build_trees \
  | tee "$OUT/pytest-v4.txt" | tail -2
echo "== engine (v6)"; t tests/test_engine_gpu.py | tee "$OUT/pytest-engine.txt" | tail -2
bench() {  # name algo args...
  local name=$1 algo=$2; shift 2
  echo "== bench $name" | tee -a "$OUT/bench.err"
  DDTREE_TREE_ALGO=$algo timeout 120 python3 -m kernels.bench --json --suite tree --quick "$@" \
    > "$OUT/bench-$name.json" 2>> "$OUT/bench.err"
  echo "bench $name rc=$?"
}
# Phase profile (clock64, benchmarks/tree_levels_profile.cu) of v6 and v4 at the target shape.
if [ "${SKIP_PROFILE:-0}" = 1 ]; then
  echo "profile skipped"
elif nvcc -arch=sm_90a -O3 -std=c++17 -DDDTREE_LV_PROFILE -Ikernels/csrc \
    benchmarks/tree_levels_profile.cu -o /tmp/tree_prof > "$OUT/profile-build.txt" 2>&1; then
  for a in v6 v4; do
    for shape in "64 15 8 64 2.5" "64 15 64 64 2.5" "1 15 8 64 2.5" "64 15 8 16 2.5" \
                 "64 15 8 64 6" "64 15 64 64 6"; do
      DDTREE_TREE_ALGO=$a /tmp/tree_prof $shape | sed "s/^{/{\"algo\": \"$a\", /"
    done
  done | tee "$OUT/profile.jsonl"
else
  tail -5 "$OUT/profile-build.txt"
fi
[ "${PROFILE_ONLY:-0}" = 1 ] && exit 0
bench v6 v6 --batch 1,64 --budget 16,64 --k 8,64
bench v4 v4 --batch 64 --budget 64 --k 8,64
bench v6-peaked v6 --batch 64 --budget 64 --k 8,64 --tree-scale 6
bench v4-peaked v4 --batch 64 --budget 64 --k 8,64 --tree-scale 6
tail -c 8000 "$OUT/bench.err"
