#!/usr/bin/env bash
# One device call for Kernels II: environment, build, GPU tests, the `attn` benchmark suite.
# Usage (on the GPU host, repo root): OUT=/some/dir bash benchmarks/attention_device.sh [tests|bench|all]
set -o pipefail
export PYTHONUNBUFFERED=1 CUDA_DEVICE_ORDER=PCI_BUS_ID
what=${1:-all}
nvidia-smi --query-gpu=name,uuid,driver_version,clocks.sm,clocks.mem,temperature.gpu,utilization.gpu \
  --format=csv > "$OUT/env.txt" 2>&1
nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv >> "$OUT/env.txt" 2>&1
git rev-parse HEAD >> "$OUT/env.txt" 2>/dev/null; git status --short kernels tests >> "$OUT/env.txt"
python3 -c "from kernels.cuda_core import library as l; print(l())" 2>&1 | tail -3
if [[ $what == tests || $what == all ]]; then
  timeout 300 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_attention_cuda.py 2>&1 \
    | tee "$OUT/pytest.log" | tail -25
fi
if [[ $what == bench || $what == all ]]; then
  timeout 420 python3 -m kernels.bench_attention --json "$OUT/h200-attn.json" ${SWEEP:+--sweep "$OUT/h200-attn-sweep.json"} 2>&1 | tee "$OUT/bench.log"
fi
