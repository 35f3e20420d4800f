#!/usr/bin/env bash
# ops deploy on a GPU machine: a target on this machine (process manager, the reference engine
# on the GPU), deployed from a git checkout of the data plane: nvcc build for the GPU's arch,
# the GPU self-test, switch, restart, post-flight; then a second release that switches the
# tree builder and the accept walk to the release's own CUDA library (token identity must hold).
# Usage on the GPU host, from the project root: OUT=dir ARCH=sm_90 bash benchmarks/deploy-gpu.sh
set -u
ARCH=${ARCH:-sm_90}
OUT=${OUT:-/tmp/deploy-gpu-out}; mkdir -p "$OUT"
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 9
  export PYTHONPATH=/tmp/site:$PWD
fi
export PYTHONUNBUFFERED=1 OPS_RUNS_DIR=/tmp/deploy-runs CUDA_DEVICE_ORDER=PCI_BUS_ID
LOG=$OUT/deploy-log.txt
say() { echo "=== $*" | tee -a "$LOG"; }
src=/tmp/deploy-src; rm -rf "$src" /tmp/deploy-root; mkdir -p "$src"
cp -r kernels checks engine pyproject.toml "$src"/; [ -d integration ] && cp -r integration "$src"/
find "$src" -name __pycache__ -prune -exec rm -rf {} + ; rm -rf "$src"/kernels/_build
git -C "$src" init -q -b main && git -C "$src" add -A &&
  git -C "$src" -c user.email=ops@gpu -c user.name=ops commit -q -m "release under test" || exit 8
inv=/tmp/deploy-ops.toml
write_inv() {
cat > "$inv" <<TOML
[targets.gpu]
address = "127.0.0.1"
python = "$(command -v python3)"
remote_root = "/tmp/deploy-root"
gpus = 1
cuda_arch = "$ARCH"
bench_gpu = 0
[targets.gpu.service]
url = "http://127.0.0.1:30188"
command = "{python} -m engine --host {host} --port {port} --preset small --mode ddtree --device cuda"
components = { $1 }
TOML
}
# the target is this machine through ops's local transport (no sshd on the device)
sed_local() { sed -i 's/^\[targets.gpu\]/[targets.local]/; s/^\[targets.gpu.service\]/[targets.local.service]/; /^address/d' "$inv"; }
O="python3 -m ops"
say "nvidia-smi"; nvidia-smi --query-gpu=index,name,uuid,driver_version,memory.used,memory.total --format=csv >> "$LOG" 2>&1
write_inv ""; sed_local
say "deploy 1: bootstrap, reference components"
timeout 560 $O deploy local -i "$inv" --source "$src" --bootstrap --json > "$OUT/deploy1.json" 2>> "$LOG"; echo "rc=$?" | tee -a "$LOG"
write_inv 'tree_build = "cuda", accept = "cuda", topk = "cuda"'; sed_local
echo "# switch components" >> "$src/engine/golden.py"; git -C "$src" -c user.email=ops@gpu -c user.name=ops commit -qam "components to cuda"
say "deploy 2: tree_build, accept, topk on the release's CUDA library"
timeout 560 $O deploy local -i "$inv" --source "$src" --json > "$OUT/deploy2.json" 2>> "$LOG"; echo "rc=$?" | tee -a "$LOG"
$O releases local -i "$inv" --json > "$OUT/releases.json" 2>> "$LOG"
cat /tmp/deploy-root/current/service.env >> "$LOG" 2>&1
$O service stop local -i "$inv" >> "$LOG" 2>&1
tail -n 40 /tmp/deploy-root/logs/*.log >> "$LOG" 2>&1
