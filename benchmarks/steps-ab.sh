#!/usr/bin/env bash
# A batch-1 step A/B of the reference engine on one GPU, in one call: this tree ("new") against
# a snapshot of an earlier commit ("base", a `git archive` unpacked at BASE_DIR), each with its
# own kernel build, `benchmarks/engine_steps.py` alternating base, new, base, new, ... ROUNDS
# times (a host whose speed drifts within the call falls on both), then the summary: each
# round's median step per mode and the medians of the rounds, and every round that gave no
# result (its log is steps-VERSION-ROUND.txt). A bad OUT / BASE_DIR / number is one line, exit 2;
# a failed build is exit 1; a failed round is named in the summary, which is always written
# (exit 1 when a round is missing).
# Usage (from anywhere; relative paths are taken from the current directory):
#   OUT=dir BASE_DIR=.snap/base [ROUNDS=3] [STEPS=300] [BATCH=1] bash benchmarks/steps-ab.sh
set -u
die() { echo "steps-ab.sh: $*" >&2; exit 2; }
[ -n "${OUT:-}" ] || die "OUT is not set (OUT=DIR BASE_DIR=DIR bash benchmarks/steps-ab.sh)"
[ -n "${BASE_DIR:-}" ] || die "BASE_DIR is not set (a snapshot of the base commit: git archive)"
ROUNDS=${ROUNDS:-3}; STEPS=${STEPS:-300}; BATCH=${BATCH:-1}; ARCH=${ARCH:-sm_90}
for n in ROUNDS STEPS BATCH; do
  [[ ${!n} =~ ^[1-9][0-9]*$ ]] || die "$n must be a whole number >= 1, got '${!n}'"
done
[ -f "$BASE_DIR/benchmarks/engine_steps.py" ] \
  || die "BASE_DIR=$BASE_DIR has no benchmarks/engine_steps.py (not a snapshot of this repo)"
BASE_DIR=$(cd "$BASE_DIR" && pwd) || die "BASE_DIR=$BASE_DIR: cannot enter it"
mkdir -p -- "$OUT" 2>/dev/null || die "OUT=$OUT: cannot create that directory"
OUT=$(cd "$OUT" && pwd) || die "OUT=$OUT: cannot enter it"
[ -w "$OUT" ] || die "OUT=$OUT: not writable"
cd "$(dirname "$0")/.." || die "cannot enter the project root"
NEW_DIR=$PWD
[ "$NEW_DIR" != "$BASE_DIR" ] || die "BASE_DIR is this tree itself; unpack the base commit elsewhere"
printf 'OUT=%q BASE_DIR=%q ROUNDS=%s STEPS=%s BATCH=%s ARCH=%q bash benchmarks/steps-ab.sh\n' \
  "$OUT" "$BASE_DIR" "$ROUNDS" "$STEPS" "$BATCH" "$ARCH" > "$OUT/command.txt"
LIBS=$(mktemp -d /tmp/steps-ab.XXXXXX) || die "cannot make a temporary directory"
trap 'rm -rf -- "$LIBS"' EXIT
for v in new base; do
  dir=$NEW_DIR; [ "$v" = base ] && dir=$BASE_DIR
  (cd "$dir" && python3 -m kernels.build --arch "$ARCH" --out "$LIBS/$v" --json) \
    > "$OUT/build-$v.json" || { echo "steps-ab.sh: build $v failed (see $OUT/build-$v.json)" >&2; exit 1; }
done
for i in $(seq "$ROUNDS"); do
  for v in base new; do
    dir=$NEW_DIR; [ "$v" = base ] && dir=$BASE_DIR
    (cd "$dir" && PYTHONPATH="$dir${PYTHONPATH:+:$PYTHONPATH}" \
      DDTREE_KERNELS_LIB="$LIBS/$v/libddtree_kernels.so" \
      timeout 200 python3 benchmarks/engine_steps.py --device cuda --batch "$BATCH" \
      --modes ar ddtree --steps "$STEPS" --warm 20 --json "$OUT/steps-$v-$i.json") \
      > "$OUT/steps-$v-$i.txt" 2>&1 || echo "steps $v round $i rc=$?" >&2
  done
done
python3 - "$OUT" "$ROUNDS" > "$OUT/summary.txt" <<'PY'
import json, statistics, sys
from pathlib import Path

out, rounds = Path(sys.argv[1]), int(sys.argv[2])
missing = []
for v in ("base", "new"):
    per: dict = {}
    for i in range(1, rounds + 1):
        f = out / f"steps-{v}-{i}.json"
        try:
            runs = json.loads(f.read_text())["runs"]
            got = {r["mode"]: float(r["wall_ms_median"]) for r in runs}
        except (OSError, ValueError, KeyError, TypeError) as exc:
            why = "no file" if isinstance(exc, FileNotFoundError) else f"unreadable: {exc!r}"
            missing.append(f"{v} round {i} ({why}; log {f.with_suffix('.txt').name})")
            continue
        for mode, x in got.items():
            per.setdefault(mode, []).append(x)
    for mode, xs in per.items():
        print(f"{v:4s} {mode:6s} rounds {' / '.join(f'{x:.3f}' for x in xs)} ms, "
              f"median {statistics.median(xs):.3f} ms ({len(xs)} of {rounds} rounds)")
for m in missing:
    print(f"missing: {m}")
sys.exit(1 if missing else 0)
PY
rc=$?
cat "$OUT/summary.txt"
exit $rc
