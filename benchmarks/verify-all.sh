#!/usr/bin/env bash
# The one device script: on one GPU, build the kernels for its arch, run EVERY gpu-marked test,
# then the quick kernel benchmarks (the default rows, the attn suite's engine-shaped
# row_attention rows among them; then the kernel variants and the attention split sweep), then
# the reference engine's own bench. With BASE_DIR (a checkout of an earlier commit, e.g.
# `git worktree add /tmp/base HEAD~1`), the same quick bench also runs from there, its own
# build, interleaved with ours (base, new, base, new), for a same-run comparison
# (`compare.txt`: `python -m kernels.bench --compare`). Everything lands under $OUT, with the
# command, the commit and the GPU; name $OUT benchmarks/results/<date>-<commit>-<what>/.
# A narrower run for one change: TESTS="tests/test_a.py ..." runs those gpu tests only (the
# guard file still first, alone, when listed), KERNEL_BENCH=0 skips the kernel benchmarks, and
# ENGINE_TOKENS="64 128" runs the engine bench once per --max-tokens (default 128; 0: none),
# with ENGINE_ARGS (e.g. "--graphs on") added. A step that fails is reported with its exit
# status and the run goes on; a failed build stops it.
# Usage, project root: OUT=dir [ARCH=sm_90] [BASE_DIR=dir] [TESTS=...] [KERNEL_BENCH=0]
#        [ENGINE_TOKENS=...] bash benchmarks/verify-all.sh
. "$(dirname "$0")/preamble.sh" /tmp/verify
record "OUT=$OUT ARCH=$ARCH BASE_DIR=${BASE_DIR:-} TESTS=${TESTS:-}" \
  "KERNEL_BENCH=${KERNEL_BENCH:-1} ENGINE_TOKENS=${ENGINE_TOKENS:-128} ENGINE_ARGS=${ENGINE_ARGS:-}"
cat "$OUT/gpu.txt"
build() {  # build DIR LIBDIR: the kernels of checkout DIR into LIBDIR
  (cd "$1" && python3 -m kernels.build --arch "$ARCH" --out "$2" --json)
}
attempt build . /tmp/ddtree-k > "$OUT/build.json"
if [ "$rc" -ne 0 ]; then cat "$OUT/build.json"; exit "$rc"; fi
export DDTREE_KERNELS_LIB=/tmp/ddtree-k/libddtree_kernels.so
# Every test file with a gpu mark (CPU-only modules may import packages a GPU box lacks).
# The bench guard refuses a GPU another process uses, and a pytest process that has run CUDA
# tests holds GPU memory: the guard/probe tests run first, in a process of their own.
GUARDED=tests/test_bench_probe.py
if [ -z "${TESTS:-}" ] || [[ " $TESTS " == *" $GUARDED "* ]]; then
  attempt timeout 300 python3 -m pytest -m gpu "$GUARDED" -q -p no:cacheprovider -s \
    > "$OUT/pytest-gpu-guard.txt" 2>&1
  echo "pytest (guard) rc=$rc"
  grep -E "passed|failed|error|tripped" "$OUT/pytest-gpu-guard.txt" | tail -5 || true
fi
if [ -n "${TESTS:-}" ]; then
  read -r -a GPU_TESTS <<< "${TESTS//$GUARDED/}"
else
  mapfile -t GPU_TESTS < <(grep -l "mark.gpu" tests/test_*.py | grep -v "$GUARDED")
fi
if [ ${#GPU_TESTS[@]} -gt 0 ]; then
  attempt timeout "${TEST_TIMEOUT:-420}" python3 -m pytest -m gpu "${GPU_TESTS[@]}" -q \
    -p no:cacheprovider > "$OUT/pytest-gpu.txt" 2>&1
  echo "pytest rc=$rc"
  grep -E "passed|failed|error" "$OUT/pytest-gpu.txt" | tail -15 || true
fi
if [ "${KERNEL_BENCH:-1}" != 0 ]; then
  QUICK=(--json --quick --suite topk,tree,accept,attn --batch 1,64 --budget 64 --k 8,64)
  bench() {  # bench DIR LIB NAME: the quick bench of checkout DIR with library LIB
    rc=0
    (cd "$1" && DDTREE_KERNELS_LIB=$2 timeout "${BENCH_TIMEOUT:-240}" \
      python3 -m kernels.bench "${QUICK[@]}") > "$OUT/$3.json" 2> "$OUT/$3.err" || rc=$?
    echo "bench $3 rc=$rc"
  }
  if [ -n "${BASE_DIR:-}" ]; then
    build "$BASE_DIR" /tmp/ddtree-base > "$OUT/build-base.json"
    for round in 1 2; do
      bench "$BASE_DIR" /tmp/ddtree-base/libddtree_kernels.so "bench-base-$round"
      bench . "$DDTREE_KERNELS_LIB" "bench-$round"
    done
    attempt python3 -m kernels.bench --compare "$OUT/bench-base-1.json,$OUT/bench-base-2.json" \
      "$OUT/bench-1.json,$OUT/bench-2.json" > "$OUT/compare.txt"
    cat "$OUT/compare.txt"
  else
    bench . "$DDTREE_KERNELS_LIB" bench
    tail -c 6000 "$OUT/bench.err"
  fi
  attempt timeout "${BENCH_TIMEOUT:-240}" python3 -m kernels.bench --json --quick \
    --suite tree,attn --batch 64 --budget 64 --k 8,64 \
    --variants auto,heap,heap_lowmem,wgmma_tma,mma_sync_64 --sweep \
    > "$OUT/bench-variants.json" 2> "$OUT/bench-variants.err"
  echo "bench variants rc=$rc"
fi
# The reference engine on this GPU: AR against DDTree, CUDA graphs on and off, identity checked
# on the golden prompts and under load (docs/performance.md).
for n in ${ENGINE_TOKENS:-128}; do
  [ "$n" = 0 ] && continue
  # shellcheck disable=SC2086  # ENGINE_ARGS: words for the engine bench
  attempt timeout "${ENGINE_TIMEOUT:-300}" python3 -m engine.bench --preset small --device cuda \
    --max-tokens "$n" ${ENGINE_ARGS:-} --json "$OUT/engine-$n.json" > "$OUT/engine-$n.txt" 2>&1
  echo "engine.bench $n rc=$rc"
  tail -n 16 "$OUT/engine-$n.txt"
done
