# The device scripts' shared start (verify-all.sh, deploy-gpu.sh, rollout-gpu.sh), sourced as
#   . "$(dirname "$0")/preamble.sh" DEFAULT_OUT
# from the project root (the scripts name paths inside it). It sets strict mode, takes OUT (made
# absolute, created), ARCH (default sm_90), installs ./.whl into /tmp/site when it is there
# (bash benchmarks/device-wheels.sh makes it; NO_WHEELS=1 skips it) and exports what every run
# needs. Then it offers:
#   attempt CMD...          run CMD, never stopping the script; its exit status lands in $rc
#   record SETTINGS         $OUT/command.txt (SETTINGS and the script), commit.txt, gpu.txt
#   release_source DIR      the data plane of this tree as a one-commit git checkout in DIR
#                           (what `ops deploy --source DIR` packages)
set -euo pipefail
if [ ! -f benchmarks/preamble.sh ] || [ ! -d kernels ]; then
  echo "$(basename "$0"): run it from the project root (bash benchmarks/$(basename "$0"))" >&2
  exit 2
fi
OUT=${OUT:-$1}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
ARCH=${ARCH:-sm_90}
if [ -d .whl ] && [ -z "${NO_WHEELS:-}" ]; then  # packages the GPU box lacks (pydantic, ...)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 9
  export PYTHONPATH=/tmp/site:$PWD
fi
export PYTHONUNBUFFERED=1 CUDA_DEVICE_ORDER=PCI_BUS_ID

attempt() {
  rc=0
  "$@" || rc=$?
}

commit_sha() {  # DDTREE_GIT_SHA first (as kernels.envinfo): a git-archive copy has no .git
  echo "${DDTREE_GIT_SHA:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}"
}

record() {
  echo "$* bash benchmarks/$(basename "$0")" > "$OUT/command.txt"
  commit_sha > "$OUT/commit.txt"
  nvidia-smi --query-gpu=name,uuid,driver_version,clocks.sm,clocks.mem --format=csv,noheader \
    > "$OUT/gpu.txt" 2>&1 || echo "no nvidia-smi" > "$OUT/gpu.txt"
}

release_source() {
  local src=$1 part
  rm -rf "$src"
  mkdir -p "$src"
  for part in kernels checks engine integration pyproject.toml; do
    if [ -e "$part" ]; then cp -r "$part" "$src"/; fi
  done
  find "$src" -name __pycache__ -prune -exec rm -rf {} +
  rm -rf "$src"/kernels/_build
  git -C "$src" init -q -b main
  git -C "$src" add -A
  git -C "$src" -c user.email=ops@gpu -c user.name=ops commit -q -m "release under test"
}
