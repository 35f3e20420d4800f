#!/usr/bin/env bash
# The attention stage kernel by kernel (engine.trace, CUPTI through torch.profiler) inside the
# serving process and in the engine's own bench, on one GPU, with the GPU's clocks and the host's
# CPU MHz sampled throughout: where the service's torch attention pays more than the benches
# read (benchmarks/NOTES-attention.md, "The kernel timeline").
# For each backend in IMPLS the engine serves the attention rollout's release (preset small,
# fixed budget, topk / tree_build / accept on cuda) and checks.loadtest drives it as the
# rollout's measure does (one 1024-token prompt, 64 tokens) at c = 1, 8 and 32; then
# engine.attn_bench runs the same batches (--same-prompt --prefix-span 0, the load's layout).
# Every process traces one window per row count in ROWS (decode steps at B = 1 / 8 / 32 are
# 17 / 136 / 544 rows, a prefill block 576), and benchmarks/attn_trace.py takes each apart.
# Usage on the GPU host, project root (OUT gets results.tgz and traces.tgz besides the files;
# copy those two to a lent machine's $OUT):
#   OUT=dir [ARCH=sm_90] [IMPLS="torch cuda"] [ROWS=17,136,544,576] [SKIP=4] [FORWARDS=12]
#   bash benchmarks/trace-service-vs-bench.sh
set -u
OUT=${OUT:-/tmp/trace-svc}; ARCH=${ARCH:-sm_90}; IMPLS=${IMPLS:-torch cuda}
ROWS=${ROWS:-17,136,544,576}; mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
if [ -d .whl ] && [ -z "${NO_WHEELS:-}" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 9
  export PYTHONPATH=/tmp/site:$PWD
fi
export PYTHONUNBUFFERED=1 CUDA_DEVICE_ORDER=PCI_BUS_ID
export DDTREE_ENGINE_TRACE_ROWS=$ROWS DDTREE_ENGINE_TRACE_SKIP=${SKIP:-4}
export DDTREE_ENGINE_TRACE_FORWARDS=${FORWARDS:-12}
echo "OUT=$OUT ARCH=$ARCH IMPLS=\"$IMPLS\" ROWS=$ROWS SKIP=${SKIP:-4} FORWARDS=${FORWARDS:-12}" \
  "bash benchmarks/trace-service-vs-bench.sh" > "$OUT/command.txt"
echo "${DDTREE_GIT_SHA:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}" > "$OUT/commit.txt"
nvidia-smi --query-gpu=name,uuid,driver_version --format=csv,noheader > "$OUT/gpu.txt"
python3 -m kernels.build --arch "$ARCH" --out /tmp/ddtree-k --json > "$OUT/build.json" || exit 1
export DDTREE_KERNELS_LIB=/tmp/ddtree-k/libddtree_kernels.so
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,utilization.gpu \
  --format=csv,noheader,nounits -lms 250 > "$OUT/gpu-clocks.csv" 2>&1 &
smi=$!
( while :; do
    echo "$(date +%s.%N) $(awk '/^cpu MHz/{s+=$4;n++} END{printf "%.0f", n?s/n:0}' /proc/cpuinfo)" \
      "$(cut -d' ' -f1 /proc/loadavg)"
    sleep 0.5
  done ) > "$OUT/cpu-mhz.txt" &
cpus=$!
phase() { echo "$(date +%s.%N) $*" >> "$OUT/phases.txt"; }
P=30191; URL=http://127.0.0.1:$P; K="topk=cuda tree_build=cuda accept=cuda"
for impl in $IMPLS; do
  DDTREE_ENGINE_TRACE=$OUT/tr/svc-$impl python3 -m engine --host 127.0.0.1 --port $P \
    --preset small --mode ddtree --device cuda:0 --max-budget 0 --backend $K attention=$impl \
    > "$OUT/serve-$impl.log" 2>&1 &
  pid=$!
  for _ in $(seq 120); do curl -sf "$URL/health" > /dev/null && break; sleep 1; done
  for c in 1 8 32; do
    n=$((c == 1 ? 12 : (c == 8 ? 32 : 96)))
    curl -sf "$URL/get_server_info" > "$OUT/info-$impl-c$c-before.json"
    phase "svc-$impl-c$c"
    timeout 200 python3 -m checks.loadtest --json --url "$URL" --concurrency $c --requests $n \
      --input-len 1024 --output-len 64 > "$OUT/load-$impl-c$c.json"
    echo "serve $impl c=$c rc=$?"
    phase "idle"
    curl -sf "$URL/get_server_info" > "$OUT/info-$impl-c$c-after.json"
  done
  kill $pid; wait $pid 2> /dev/null
done
phase "attn_bench"
DDTREE_ENGINE_TRACE=$OUT/tr/bench timeout 300 python3 -m engine.attn_bench --preset small \
  --max-budget 0 --device cuda --batch 1 8 32 --prompt-len 1024 --mode ddtree --same-prompt \
  --prefix-span 0 --steps 16 --warm 4 --json "$OUT/attn-bench.json" > "$OUT/attn-bench.txt" 2>&1
echo "attn_bench rc=$?"
phase "end"
kill $smi $cpus 2> /dev/null
ls -la "$OUT"/tr/* 2>&1
for f in "$OUT"/tr/*/*.json.gz; do
  [ -f "$f" ] || continue
  tag=$(basename "$(dirname "$f")")-$(basename "$f" .json.gz | sed 's/^trace-[0-9]*-//')
  python3 benchmarks/attn_trace.py "$f" --json "$OUT/sum-$tag.json" | tee -a "$OUT/traces.txt"
done
python3 - "$OUT" <<'PY' | tee "$OUT/table.txt"
import glob, json, os, statistics, sys
out = sys.argv[1]
print("the engine's own stage clock per level (ms; checks.loadtest's window, /get_server_info)")
for f in sorted(glob.glob(f"{out}/info-*-before.json")):
    tag = os.path.basename(f)[5:-12]
    try:
        a, b = (json.load(open(x))["internal_states"][0] for x in (f, f.replace("before", "after")))
    except (OSError, ValueError, KeyError):
        print(f"  {tag}: no info"); continue
    def tot(st, key):
        return sum(v["total_s"].get(key, 0.0) for v in st["step_time_breakdown"].values())
    steps = sum(v["steps"] for v in b["step_time_breakdown"].values()) - sum(
        v["steps"] for v in a["step_time_breakdown"].values())
    pa, pb = a["prefill_time_breakdown"], b["prefill_time_breakdown"]
    npre = pb["prefills"] - pa["prefills"]
    pre = pb["total_s"]["attention"] - pa["total_s"]["attention"]
    att, step = (tot(b, k) - tot(a, k) for k in ("attention", "step"))
    print(f"  {tag:12s} steps {steps:4d}  step {1e3*step/max(steps,1):7.3f}  attention "
          f"{1e3*att/max(steps,1):7.3f}  prefills {npre:3d}  prefill attention "
          f"{1e3*pre/max(npre,1):7.3f}")
phases = [ln.split(None, 1) for ln in open(f"{out}/phases.txt")]
def stats(path, cols, parse):
    rows = []
    for ln in open(path):
        try:
            rows.append(parse(ln))
        except (ValueError, IndexError):
            pass
    return rows
import datetime
def smi(ln):
    p = [x.strip() for x in ln.split(",")]
    t = datetime.datetime.strptime(p[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
    return (t, float(p[1]), float(p[2]), float(p[3]), float(p[5]))
gpu = stats(f"{out}/gpu-clocks.csv", 6, smi)
cpu = stats(f"{out}/cpu-mhz.txt", 3, lambda ln: tuple(float(x) for x in ln.split()[:3]))
print("clocks per phase: GPU SM MHz / memory MHz / power W / util % (median), CPU MHz (median)")
for (t0, name), (t1, _) in zip(phases, phases[1:]):
    t0, t1 = float(t0), float(t1)
    g = [r for r in gpu if t0 <= r[0] < t1]
    c = [r for r in cpu if t0 <= r[0] < t1]
    if not g:
        print(f"  {name.strip():14s} no GPU samples"); continue
    med = lambda i, rs: statistics.median(r[i] for r in rs)
    print(f"  {name.strip():14s} {len(g):4d} samples  SM {med(1,g):6.0f} (min {min(r[1] for r in g):.0f})"
          f"  mem {med(2,g):6.0f}  {med(3,g):6.1f} W  util {med(4,g):4.0f}%  CPU "
          f"{med(1,c) if c else float('nan'):6.0f} MHz")
PY
# two tarballs (a lent machine returns few files): every summary and record, and the raw traces
# when they are small enough to come back (16 MB a file)
tar -czf /tmp/results.tgz -C "$OUT" --exclude=tr . && mv /tmp/results.tgz "$OUT/"
tar -czf /tmp/traces.tgz -C "$OUT" tr && mv /tmp/traces.tgz "$OUT/"
[ "$(stat -c %s "$OUT/traces.tgz")" -gt 15000000 ] && rm -f "$OUT/traces.tgz"
ls -la "$OUT"
