#!/usr/bin/env bash
# Where the rollout's measure noise comes from: the same release served by fresh processes, one
# after another, each loaded twice at c = 1 and 32 (the attention rollout's load: 1024-token
# prompts, 64 tokens, the measure's request counts). Within-process spread (run a vs b) against
# between-process spread tells whether a longer run or more restarts would narrow the measure.
# Variants alternate, so drift over the call spreads over all of them:
#   old:    the engine at $OLD (git archive into old/, the commit before the batched dispatch)
#   plain:  this tree's engine
#   pinned: this tree's engine under `taskset` on the first half of the CPUs, the load generator
#           on the second half
#   process: this tree's engine serving HTTP from a child process (--frontend process)
# (VARIANTS="plain process" picks some; the default is "old plain pinned")
# Each process's threads (ps -L: which CPU each ran on last) and the GPU's clocks are recorded.
# Usage on the GPU host, project root:  OUT=dir [N=4] [ARCH=sm_90] bash benchmarks/process-spread.sh
set -u
OUT=${OUT:-/tmp/spread}; ARCH=${ARCH:-sm_90}; N=${N:-4}; mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
export PYTHONUNBUFFERED=1 CUDA_DEVICE_ORDER=PCI_BUS_ID
echo "OUT=$OUT N=$N ARCH=$ARCH bash benchmarks/process-spread.sh" > "$OUT/command.txt"
(lscpu; nproc; nvidia-smi) > "$OUT/host.txt" 2>&1
[ -d old ] || [[ " ${VARIANTS:-old} " != *" old "* ]] || { echo "old/: git archive \$OLD engine kernels | tar -x -C old" >&2; exit 2; }
python3 -m kernels.build --arch "$ARCH" --out /tmp/ddtree-k --json > "$OUT/build.json" || exit 1
export DDTREE_KERNELS_LIB=/tmp/ddtree-k/libddtree_kernels.so
NC=$(nproc); HALF=$((NC / 2))
SERVE_CPUS="0-$((HALF - 1))"; LOAD_CPUS="$HALF-$((NC - 1))"
P=30191; URL=http://127.0.0.1:$P
# a CPU dry run: DEVICE=cpu PRESET=tiny BACKENDS="attention=torch" REQ_1=2 REQ_32=8 LEN=32
# shellcheck disable=SC2206
ENGINE_ARGS=(--host 127.0.0.1 --port $P --preset "${PRESET:-small}" --mode ddtree
  --device "${DEVICE:-cuda:0}" --max-budget 0
  --backend ${BACKENDS:-topk=cuda tree_build=cuda accept=cuda attention=torch})
REQ_1=${REQ_1:-53}; REQ_32=${REQ_32:-187}; LEN=${LEN:-1024}
one() {  # one VARIANT INDEX: serve, load twice at c=1 and 32, stop
  local v=$1 i=$2 dir=$PWD pin_s=() pin_l=() extra=()
  [ "$v" = process ] && extra=(--frontend process)
  [ "$v" = old ] && dir=$PWD/old
  if [ "$v" = pinned ]; then pin_s=(taskset -c "$SERVE_CPUS"); pin_l=(taskset -c "$LOAD_CPUS"); fi
  (cd "$dir" && PYTHONPATH=$dir:${SITE:-} exec "${pin_s[@]}" python3 -m engine "${ENGINE_ARGS[@]}" "${extra[@]}") \
    > "$OUT/serve-$v-$i.log" 2>&1 &
  local pid=$!
  for _ in $(seq 120); do curl -sf "$URL/health" > /dev/null && break; sleep 0.5; done
  for run in a b; do
    for c in 1 32; do
      local n=$([ $c = 1 ] && echo $REQ_1 || echo $REQ_32)
      "${pin_l[@]}" python3 -m checks.loadtest --url $URL --concurrency $c --requests "$n" \
        --input-len "$LEN" --output-len 64 --json > "$OUT/load-$v-$i-$run-c$c.json" 2>&1
      [ $c = 32 ] && [ $run = a ] && ps -L -o tid,psr,pcpu,comm -p "$pid" > "$OUT/threads-$v-$i.txt"
      nvidia-smi --query-gpu=clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv,noheader \
        >> "$OUT/clocks-$v-$i.txt"
    done
  done
  curl -sf "$URL/get_server_info" > "$OUT/info-$v-$i.json"
  kill "$pid"; wait "$pid" 2> /dev/null
}
VARIANTS=${VARIANTS:-old plain pinned}
for i in $(seq "$N"); do
  for v in $VARIANTS; do echo "$(date +%T) $v $i"; one "$v" "$i"; done
done
python3 - "$OUT" <<'PY'
import glob, json, os, re, statistics as st, sys
out = sys.argv[1]
rows = {}
for f in sorted(glob.glob(f"{out}/load-*.json")):
    v, i, run, c = re.match(r".*/load-(\w+)-(\d+)-(\w)-c(\d+)\.json", f).groups()
    try:
        tps = json.load(open(f))["level"]["output_tok_per_s"]
    except Exception:
        tps = None
    rows.setdefault((v, int(c)), {}).setdefault(int(i), {})[run] = tps
summary = {}
for (v, c), procs in sorted(rows.items()):
    means = [(p["a"] + p["b"]) / 2 for p in procs.values() if p.get("a") and p.get("b")]
    within = [abs(p["a"] - p["b"]) / ((p["a"] + p["b"]) / 2) for p in procs.values()
              if p.get("a") and p.get("b")]
    s = {
        "processes": {k: p for k, p in procs.items()},
        "mean_tok_per_s": st.mean(means) if means else None,
        "between_cv": st.stdev(means) / st.mean(means) if len(means) > 1 else None,
        "within_abs_diff_mean": st.mean(within) if within else None,
    }
    summary[f"{v} c={c}"] = s
    print(f"{v:7s} c={c:<3d} mean {s['mean_tok_per_s'] or 0:8.1f} tok/s  between-process CV "
          f"{100 * (s['between_cv'] or 0):5.1f}%  within |a-b| {100 * (s['within_abs_diff_mean'] or 0):5.1f}%"
          f"  per process: " + " ".join(f"{p.get('a') or 0:.0f}/{p.get('b') or 0:.0f}" for p in procs.values()))
json.dump(summary, open(f"{out}/summary.json", "w"), indent=1)
PY
