#!/usr/bin/env bash
# `ops bench --allow-shared` beside a GPU-bound service on the same GPU (#41): what each kernel
# suite costs the service, that a heavy bench trips the interference probe and is stopped at
# once, that a bench over the free memory is refused before it starts, and that the service
# stays token-identical after each.
#
# The service: the reference engine, preset small, DDTree with every component on CUDA, batch
# up to 32, holding MEM_FRACTION of the GPU from the start (--mem-fraction, as SGLang reserves its
# KV cache), kept busy by a closed-loop load at LOAD_C concurrent requests for the whole run (its
# GPU busy share is sampled with nvidia-smi: busy.csv). Then, each with the probe watching:
#   ops bench --suite topk,tree,accept (the default), then topk, tree and accept alone;
#   the heavy bench: --suite attn --batch HEAVY_BATCH (the largest attention shapes);
#   the memory refusals: --max-mem-gib over half of what is free, and a suite whose estimate is;
#   oom: a bench capped far below its need (--max-mem-gib 1): its CUDA out-of-memory is its own;
# and `ops healthcheck` (token identity against the golden set recorded at the start) after each.
# Files in $OUT: summary.json (one line per bench: outcome, cost to the service, trip and stop
# times, guard message), benches.jsonl and healthchecks.jsonl (the raw documents, appended as
# each finishes), busy.csv, log.txt, command.txt, commit.txt, gpu.txt.
# Usage on the GPU host, project root:
#   OUT=dir [ARCH=sm_90] [MEM_FRACTION=0.75] [LOAD_C=16] [HEAVY_BATCH=64,256] [BENCHES="default heavy
#   over-cap over-estimate topk tree accept oom"] bash benchmarks/bench-beside-service.sh
. "$(dirname "$0")/preamble.sh" /tmp/bench-beside
MEM_FRACTION=${MEM_FRACTION:-0.75}
LOAD_C=${LOAD_C:-16}
HEAVY_BATCH=${HEAVY_BATCH:-64,256}
record "ARCH=$ARCH MEM_FRACTION=$MEM_FRACTION LOAD_C=$LOAD_C HEAVY_BATCH=$HEAVY_BATCH"
export OPS_RUNS_DIR=$OUT/runs
LOG=$OUT/log.txt
say() { echo "=== $(date +%T) $*" | tee -a "$LOG"; }
say "build kernels ($ARCH)"
attempt python3 -m kernels.build --arch "$ARCH" --out /tmp/ddtree-k --json > "$OUT/build.json" 2>> "$LOG"
if [ "$rc" -ne 0 ]; then cat "$OUT/build.json" >> "$LOG"; exit "$rc"; fi
export DDTREE_KERNELS_LIB=/tmp/ddtree-k/libddtree_kernels.so
port=30241
url=http://127.0.0.1:$port
inv=/tmp/bench-beside.toml
cat > "$inv" <<TOML
[targets.local]
python = "$(command -v python3)"
remote_root = "/tmp/bench-beside-root"
gpus = 1
cuda_arch = "$ARCH"
bench_gpu = 0
[targets.local.service]
url = "$url"
stop_timeout = 20
command = "{python} -m engine --host {host} --port {port} --preset small --mode ddtree --device cuda:0 --max-batch-size 32 --backend topk=cuda --backend tree_build=cuda --backend accept=cuda --backend attention=cuda --mem-fraction $MEM_FRACTION"
TOML
O="python3 -m ops"
say "service start"
attempt timeout 300 $O service start local -i "$inv" --wait 240 >> "$LOG" 2>&1
if [ "$rc" -ne 0 ]; then say "the service did not start"; exit 1; fi
say "golden set"
attempt timeout 200 $O healthcheck local -i "$inv" --record-golden --max-tokens 8 --json > "$OUT/hc-golden.json" 2>> "$LOG"
say "load: c=$LOAD_C, for the whole run"
python3 -m checks.loadtest --json --url "$url" --concurrency "$LOAD_C" --requests 10000000 \
  --output-len 128 --input-len 128 > /tmp/bench-beside-load.json 2>> "$LOG" &
load_pid=$!
sleep 8
say "GPU busy share (nvidia-smi, 6 s)"
nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used,memory.total --format=csv -lms 200 \
  > "$OUT/busy.csv" 2>&1 &
smi_pid=$!
sleep 6
kill "$smi_pid" 2>/dev/null || true
bench() {  # bench NAME ARGS...: one ops bench, its document, then a healthcheck; each appended
  # at once to $OUT/benches.jsonl and $OUT/healthchecks.jsonl (a run cut short keeps what ran)
  local name=$1; shift
  say "bench $name: $*"
  attempt timeout 600 $O bench local -i "$inv" --gpu 0 --allow-shared --json "$@" \
    > "/tmp/bench-$name.json" 2>> "$LOG"
  python3 - "$name" "$rc" "$*" "/tmp/bench-$name.json" >> "$OUT/benches.jsonl" <<'PY'
import json, sys
name, rc, args, path = sys.argv[1:]
try:
    doc = json.load(open(path))
except (OSError, ValueError):
    doc = None
print(json.dumps({"name": name, "exit": int(rc), "args": args, "doc": doc}))
PY
  attempt timeout 200 $O healthcheck local -i "$inv" --json --max-tokens 8 > "/tmp/hc-$name.json" 2>> "$LOG"
  python3 - "$name" "$rc" "/tmp/hc-$name.json" >> "$OUT/healthchecks.jsonl" <<'PY'
import json, sys
name, rc, path = sys.argv[1:]
try:
    doc = json.load(open(path))
except (OSError, ValueError):
    doc = None
print(json.dumps({"after": name, "exit": int(rc), "doc": doc}))
PY
}
free_gib=$(nvidia-smi --query-gpu=memory.free --format=csv,noheader,nounits -i 0 | awk '{printf "%d", $1/1024*0.75}')
for b in ${BENCHES:-default heavy over-cap over-estimate topk tree accept oom}; do
  case $b in
    default) bench default ;;
    heavy) bench heavy --suite attn --batch "$HEAVY_BATCH" --probe-interval 0.05 ;;
    over-cap) bench over-cap --max-mem-gib "$free_gib" ;;
    over-estimate) bench over-estimate --suite attn --batch 4096 ;;
    topk|tree|accept) bench "$b" --suite "$b" ;;
    # a bench whose cap is far below what it needs: its own CUDA out-of-memory, one line
    oom) bench oom --suite topk --batch 64 --max-mem-gib 1 --probe-threshold 100 ;;
  esac
done
kill "$load_pid" 2>/dev/null || true
wait "$load_pid" 2>/dev/null || true
attempt timeout 120 $O service stop local -i "$inv" >> "$LOG" 2>&1
python3 - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
benches = [json.loads(x) for x in open(f"{out}/benches.jsonl")]
hcs = [json.loads(x) for x in open(f"{out}/healthchecks.jsonl")]
rows = []
for b in benches:
    d = b["doc"] or {}
    probe = d.get("probe") or {}
    trip = probe.get("trip") or {}
    run = d.get("bench_run") or {}
    row = {"bench": b["name"], "args": b["args"], "exit": b["exit"],
           "outcome": d.get("outcome"), "message": d.get("message"),
           "service_cost": d.get("service_cost"), "tripped": probe.get("tripped"),
           "trip_at_s": trip.get("at_s"),
           "bench_duration_s": run.get("duration_s"), "killed": run.get("killed"),
           "guard": (d.get("guard") or {}).get("message"),
           "memory_free_mib": (d.get("guard") or {}).get("memory_free_mib")}
    if trip.get("at_s") is not None and run.get("duration_s") is not None:
        row["stop_after_trip_s"] = round(run["duration_s"] - trip["at_s"], 3)
    rows.append(row)
ident = [{"after": h["after"], "exit": h["exit"],
          "identity_pct": ((h["doc"] or {}).get("modules") or {}).get("identity", {}).get("identity_pct"),
          "failed": (h["doc"] or {}).get("failed")} for h in hcs]
json.dump({"benches": rows, "healthchecks": ident}, open(f"{out}/summary.json", "w"), indent=1)
PY
say "done"
