#!/usr/bin/env bash
# ops deploy on a GPU machine: a target on this machine (process manager, the reference engine
# on the GPU), deployed from a git checkout of the data plane: nvcc build for the GPU's arch,
# the GPU self-test, switch, restart, post-flight; then a second release that switches the
# tree builder and the accept walk to the release's own CUDA library (token identity must hold).
# Each deploy's exit status is in deploy-log.txt; the script goes on to stop the service.
# Usage on the GPU host, project root: OUT=dir [ARCH=sm_90] bash benchmarks/deploy-gpu.sh
. "$(dirname "$0")/preamble.sh" /tmp/deploy-gpu-out
export OPS_RUNS_DIR=/tmp/deploy-runs
record "OUT=$OUT ARCH=$ARCH"
LOG=$OUT/deploy-log.txt
say() { echo "=== $*" | tee -a "$LOG"; }
src=/tmp/deploy-src
root=/tmp/deploy-root
rm -rf "$root"
release_source "$src"
inv=/tmp/deploy-ops.toml
write_inv() {  # write_inv COMPONENTS: the target is this machine, through ops's local transport
  cat > "$inv" <<TOML
[targets.local]
python = "$(command -v python3)"
remote_root = "$root"
gpus = 1
cuda_arch = "$ARCH"
bench_gpu = 0
[targets.local.service]
url = "http://127.0.0.1:30188"
command = "{python} -m engine --host {host} --port {port} --preset small --mode ddtree --device cuda"
components = { $1 }
TOML
}
O="python3 -m ops"
say "nvidia-smi"
nvidia-smi --query-gpu=index,name,uuid,driver_version,memory.used,memory.total --format=csv \
  >> "$LOG" 2>&1 || true
write_inv ""
say "deploy 1: bootstrap, reference components"
attempt timeout 560 $O deploy local -i "$inv" --source "$src" --bootstrap --json \
  > "$OUT/deploy1.json" 2>> "$LOG"
echo "rc=$rc" | tee -a "$LOG"
write_inv 'tree_build = "cuda", accept = "cuda", topk = "cuda"'
echo "# switch components" >> "$src/engine/golden.py"
git -C "$src" -c user.email=ops@gpu -c user.name=ops commit -qam "components to cuda"
say "deploy 2: tree_build, accept, topk on the release's CUDA library"
attempt timeout 560 $O deploy local -i "$inv" --source "$src" --json \
  > "$OUT/deploy2.json" 2>> "$LOG"
echo "rc=$rc" | tee -a "$LOG"
$O releases local -i "$inv" --json > "$OUT/releases.json" 2>> "$LOG" || true
cat "$root/current/service.env" >> "$LOG" 2>&1 || true
$O service stop local -i "$inv" >> "$LOG" 2>&1 || true
tail -n 40 "$root"/logs/*.log >> "$LOG" 2>&1 || true
