#!/usr/bin/env bash
# The attention stage inside the serving process against the same stage in process, on one GPU:
# why the rollout's s(c) from the bench differs from the service's (benchmarks/NOTES-attention.md).
# For each variant the engine serves (preset small, fixed budget, the rollout's components) and
# benchmarks/service_stages.py drives it at c = 1 and 8 with 1024-token prompts, reading the
# engine's own per-prefill and per-step attention; then `engine.attn_bench` times the same stage
# in process, with torch's default CPU threads and with one (the server's --threads default).
# The torch variants run again with the allocator's expandable segments
# (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True; /get_server_info counts the allocator's
# device allocations and frees).
# Usage on the GPU host, project root:
#   OUT=dir [ARCH=sm_90] [THREADS16=0] [ATTN_BENCH=0] [SERVE_EXTRA="--frontend thread"]
#   [FRONTENDS="thread process" [ROUNDS="a b c"]] bash benchmarks/service-vs-bench.sh
# FRONTENDS: the front-end A/B instead: rounds a and b each serve torch under every listed
# front end in turn, round a cuda too (no allocator variants); then engine.attn_bench once.
set -u
OUT=${OUT:-/tmp/svc}; ARCH=${ARCH:-sm_90}; mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 9
  export PYTHONPATH=/tmp/site:$PWD
fi
export PYTHONUNBUFFERED=1 CUDA_DEVICE_ORDER=PCI_BUS_ID
echo "OUT=$OUT ARCH=$ARCH THREADS16=${THREADS16:-1} ATTN_BENCH=${ATTN_BENCH:-1}" \
  "SERVE_EXTRA=${SERVE_EXTRA:-} FRONTENDS=${FRONTENDS:-} ROUNDS=${ROUNDS:-} bash benchmarks/service-vs-bench.sh" \
  > "$OUT/command.txt"
# DDTREE_GIT_SHA first (as kernels.envinfo): a git-archive snapshot has no .git, and git would
# answer for whatever checkout encloses it
echo "${DDTREE_GIT_SHA:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}" > "$OUT/commit.txt"
nvidia-smi --query-gpu=name,uuid,driver_version --format=csv,noheader > "$OUT/gpu.txt"
python3 -m kernels.build --arch "$ARCH" --out /tmp/ddtree-k --json > "$OUT/build.json" || exit 1
export DDTREE_KERNELS_LIB=/tmp/ddtree-k/libddtree_kernels.so
P=30190; URL=http://127.0.0.1:$P
serve() {  # serve NAME ENGINE-ARGS...: start, drive at c = 1 and 8, stop ($ALLOC: the allocator)
  local name=$1; shift
  env ${ALLOC:+PYTORCH_CUDA_ALLOC_CONF=$ALLOC} python3 -m engine --host 127.0.0.1 --port $P \
    --preset small --mode ddtree --device cuda:0 --max-budget 0 "$@" ${SERVE_EXTRA:-} \
    > "$OUT/serve-$name.log" 2>&1 &
  local pid=$!
  for _ in $(seq 120); do curl -sf "$URL/health" > /dev/null && break; sleep 1; done
  python3 benchmarks/service_stages.py --url $URL --requests 12 --concurrency 1 \
    --json "$OUT/svc-$name-c1.json"
  python3 benchmarks/service_stages.py --url $URL --requests 32 --concurrency 8 \
    --json "$OUT/svc-$name-c8.json"
  kill $pid; wait $pid 2> /dev/null
}
K="topk=cuda tree_build=cuda accept=cuda"
AB=(--preset small --max-budget 0 --device cuda --batch 1 8 --prompt-len 1024 --mode ddtree)
if [ -n "${FRONTENDS:-}" ]; then
  for round in ${ROUNDS:-a b}; do
    for fe in $FRONTENDS; do serve "torch-$fe-$round" --backend $K attention=torch --frontend "$fe"; done
    [ $round = a ] && for fe in $FRONTENDS; do
      serve "cuda-$fe-$round" --backend $K attention=cuda --frontend "$fe"
    done
  done
  python3 - "$OUT" <<'PY' | tee "$OUT/table.txt"
import glob, json, re, sys
print("serve              c  tok/s   prefill ms  prefill attn ms  step ms  step attn ms")
for f in sorted(glob.glob(f"{sys.argv[1]}/svc-*.json")):
    name, c = re.match(r".*/svc-(.+)-c(\d+)\.json", f).groups()
    d = json.load(open(f))
    print(f"{name:18s} {c:>2s} {d['tokens_per_s']:6.0f} {d['prefill_ms']:10.2f} "
          f"{d['prefill_attention_ms']:15.2f} {d['step_ms']:8.3f} {d['step_attention_ms']:12.3f}")
PY
  [ "${ATTN_BENCH:-1}" = 0 ] && exit 0  # the table above either way
  timeout 200 python3 -m engine.attn_bench "${AB[@]}" --json "$OUT/attn-bench.json" \
    > "$OUT/attn-bench.txt" 2>&1; echo "attn_bench rc=$?"
  head -2 "$OUT/attn-bench.txt"
  exit 0
fi
for round in a b; do
  serve "torch-$round" --backend $K attention=torch
  serve "cuda-$round" --backend $K attention=cuda
done
[ "${THREADS16:-1}" = 1 ] && serve torch-threads16 --backend $K attention=torch --threads 16
for round in a b; do
  ALLOC=expandable_segments:True serve "torch-expandable-$round" --backend $K attention=torch
done
ALLOC=expandable_segments:True serve cuda-expandable --backend $K attention=cuda
[ "${ATTN_BENCH:-1}" = 0 ] && exit 0
timeout 200 python3 -m engine.attn_bench "${AB[@]}" --json "$OUT/attn-bench.json" \
  > "$OUT/attn-bench.txt" 2>&1; echo "attn_bench rc=$?"
OMP_NUM_THREADS=1 timeout 200 python3 -m engine.attn_bench "${AB[@]}" \
  --json "$OUT/attn-bench-threads1.json" > "$OUT/attn-bench-threads1.txt" 2>&1
echo "attn_bench threads 1 rc=$?"
