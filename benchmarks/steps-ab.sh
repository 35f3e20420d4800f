#!/usr/bin/env bash
# A batch-1 step A/B of the reference engine on one GPU, in one call: this tree ("new") against
# a snapshot of an earlier commit ("base", a `git archive` unpacked at BASE_DIR), each with its
# own kernel build, `benchmarks/engine_steps.py` alternating base, new, base, new, ... ROUNDS
# times (a host whose speed drifts within the call falls on both), then the summary: each
# round's median step per mode and the medians of the rounds.
# Usage (project root, on the GPU host):
#   OUT=dir BASE_DIR=.snap/base [ROUNDS=3] [STEPS=300] [BATCH=1] bash benchmarks/steps-ab.sh
set -u
OUT=${OUT:?OUT=dir}; BASE_DIR=${BASE_DIR:?BASE_DIR=a checkout of the base commit}
ROUNDS=${ROUNDS:-3}; STEPS=${STEPS:-300}; BATCH=${BATCH:-1}; ARCH=${ARCH:-sm_90}
mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
echo "OUT=$OUT BASE_DIR=$BASE_DIR ROUNDS=$ROUNDS STEPS=$STEPS BATCH=$BATCH bash benchmarks/steps-ab.sh" \
  > "$OUT/command.txt"
for v in new base; do
  dir=.; [ "$v" = base ] && dir=$BASE_DIR
  (cd "$dir" && python3 -m kernels.build --arch "$ARCH" --out "/tmp/ab-$v" --json) \
    > "$OUT/build-$v.json" || { echo "build $v failed"; exit 1; }
done
for i in $(seq "$ROUNDS"); do
  for v in base new; do
    dir=.; [ "$v" = base ] && dir=$BASE_DIR
    (cd "$dir" && PYTHONPATH=$PWD:${PYTHONPATH:-} DDTREE_KERNELS_LIB=/tmp/ab-$v/libddtree_kernels.so \
      timeout 200 python3 benchmarks/engine_steps.py --device cuda --batch "$BATCH" \
      --modes ar ddtree --steps "$STEPS" --warm 20 --json "$OUT/steps-$v-$i.json") \
      > "$OUT/steps-$v-$i.txt" 2>&1 || echo "steps $v round $i rc=$?"
  done
done
python3 - "$OUT" "$ROUNDS" <<'PY' | tee "$OUT/summary.txt"
import json, statistics, sys
from pathlib import Path

out, rounds = Path(sys.argv[1]), int(sys.argv[2])
for v in ("base", "new"):
    per = {}
    for i in range(1, rounds + 1):
        f = out / f"steps-{v}-{i}.json"
        if not f.is_file():
            continue
        for run in json.loads(f.read_text()).get("runs", []):
            per.setdefault(run["mode"], []).append(run["wall_ms_median"])
    for mode, xs in per.items():
        print(f"{v:4s} {mode:6s} rounds {' / '.join(f'{x:.3f}' for x in xs)} ms, "
              f"median {statistics.median(xs):.3f} ms")
PY
