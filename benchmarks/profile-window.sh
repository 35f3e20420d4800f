#!/usr/bin/env bash
# Does the profile's window size move f? `ops profile` at one level against the reference
# engine on the GPU (the tree rollout's service: tree_build reference, the rest cuda), its f
# taken over the default window (4 x c requests) and over a sized one (`--run-seconds`, after an
# uncounted pilot), alternating, in one service process, so the two differ only in the window.
# Usage on the GPU host, project root:
#   OUT=dir [C=32] [SECONDS_=6] [ROUNDS=2] [ARCH=sm_90] bash benchmarks/profile-window.sh
# A CPU dry run: DEVICE=cpu PRESET=tiny C=2 SECONDS_=1 ROUNDS=1 (no kernels built)
set -u
OUT=${OUT:-/tmp/profile-window}; mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
C=${C:-32}; SECS=${SECONDS_:-6}; ROUNDS=${ROUNDS:-2}; ARCH=${ARCH:-sm_90}
DEVICE=${DEVICE:-cuda:0}
export PYTHONUNBUFFERED=1 OPS_RUNS_DIR=$OUT/runs CUDA_DEVICE_ORDER=PCI_BUS_ID
echo "OUT=$OUT C=$C SECONDS_=$SECS ROUNDS=$ROUNDS ARCH=$ARCH DEVICE=$DEVICE bash benchmarks/profile-window.sh" \
  > "$OUT/command.txt"
echo "commit: ${DDTREE_GIT_SHA:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}" >> "$OUT/command.txt"
backends="tree_build=reference"
if [ "$DEVICE" != cpu ]; then
  python3 -m kernels.build --arch "$ARCH" --out /tmp/ddtree-k --json > "$OUT/build.json" || exit 1
  export DDTREE_KERNELS_LIB=/tmp/ddtree-k/libddtree_kernels.so
  backends="tree_build=reference topk=cuda accept=cuda attention=cuda"
fi
inv=$OUT/ops.toml; P=30189
cat > "$inv" <<TOML
[targets.local]
python = "$(command -v python3)"
remote_root = "/tmp/profile-window-root"
[targets.local.service]
url = "http://127.0.0.1:$P"
command = "{python} -m engine --host {host} --port {port} --preset ${PRESET:-small} --mode ddtree --device $DEVICE --max-budget 0 --backend $backends"
TOML
O="python3 -m ops"
$O service start local -i "$inv" --json > "$OUT/start.json" || { cat "$OUT/start.json"; exit 1; }
for r in $(seq "$ROUNDS"); do
  for kind in short sized; do
    extra=(); [ $kind = sized ] && extra=(--run-seconds "$SECS")
    $O profile local -i "$inv" -c "$C" "${extra[@]}" --json > "$OUT/profile-$kind-$r.json"
    echo "$(date +%T) $kind $r rc=$?"
  done
done
$O service stop local -i "$inv" > /dev/null 2>&1
python3 - "$OUT" <<'PY'
import glob, json, sys
out = sys.argv[1]
for f in sorted(glob.glob(f"{out}/profile-*.json")):
    lv = json.load(open(f))["levels"][0]
    w, load = lv["window"], lv["load"]
    f_tree = lv["wall_share"]["tree_build"]["value"]
    print(f"{f.rsplit('/', 1)[-1]:22} f(tree_build) {f_tree:.3f}  requests {load['requests']:4}"
          f"  window {w['duration_s']:.2f} s  steps {w['steps']}  prefills {w['prefills']}"
          f"  idle {w['idle_s'] / w['duration_s']:.1%}  batch sizes {sorted(lv['steps_by_batch'], key=int)}")
PY
