#!/usr/bin/env bash
# One device call for Kernels II: environment, build, GPU tests, the `attn` benchmark suite.
# Usage (on the GPU host, repo root): OUT=/some/dir [SWEEP=1] bash benchmarks/attention_device.sh
# Steps run in separate processes so that one failing step cannot take the others' results.
set -o pipefail
export PYTHONUNBUFFERED=1 CUDA_DEVICE_ORDER=PCI_BUS_ID
what=${1:-all}
nvidia-smi --query-gpu=name,uuid,driver_version,clocks.sm,clocks.mem,temperature.gpu,utilization.gpu \
  --format=csv > "$OUT/env.txt" 2>&1
nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv >> "$OUT/env.txt" 2>&1
python3 -c "from kernels.cuda_core import library as l; print(l())" 2>&1 | tail -3
if [[ $what == tests || $what == all ]]; then
  timeout 300 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_attention_cuda.py 2>&1 \
    | tee "$OUT/pytest.log" | tail -25
fi
if [[ $what == bench || $what == all ]]; then
  if [[ -n $SWEEP ]]; then
    timeout 200 python3 -c "import json,sys; from kernels.bench_attention import sweep, environment; \
json.dump({'suite': 'attn-sweep', 'environment': environment(), 'rows': sweep()}, \
open(sys.argv[1], 'w'))" "$OUT/h200-attn-sweep.json" 2>&1 | tail -40
  fi
  timeout 300 python3 -m kernels.bench_attention --json "$OUT/h200-attn.json" 2>&1 | tee "$OUT/bench.log"
  timeout 120 python3 -m kernels.bench --suite attn --quick --reps 20 --json > "$OUT/bench-registry.json" \
    2> "$OUT/bench-registry.err" || tail -5 "$OUT/bench-registry.err"
fi
