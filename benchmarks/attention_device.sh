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
if [[ $what == v4 ]]; then
  # v4 (wgmma, sm_90a): build, check the wgmma variants launch (else build sm_90a only and use
  # that library), time old default (mma5) vs mma7 / mma8 on the two target sizes, GPU tests.
  t0=$(date +%s)
  python3 -c "
import torch
from kernels.cuda_core import library_path
print('lib', library_path())
from kernels.cuda_attention import tree_verify_attention as f
q = torch.randn(2, 1, 576, device='cuda', dtype=torch.bfloat16)
kv = torch.randn(4, 16, 576, device='cuda', dtype=torch.bfloat16)
t = torch.arange(4, dtype=torch.int32, device='cuda').view(2, 2)
pl = torch.tensor([3, 5], dtype=torch.int32, device='cuda')
tl = torch.ones(2, dtype=torch.int32, device='cuda')
vis = torch.ones(2, 1, 1, dtype=torch.bool, device='cuda')
f(q, kv, t, pl, tl, vis, 0.1, algo='mma7'); torch.cuda.synchronize(); print('mma7 launches')
" > "$OUT/launch.txt" 2>&1
  cat "$OUT/launch.txt" | tail -3
  if ! grep -q "mma7 launches" "$OUT/launch.txt"; then
    echo "wgmma not launchable from the default build: building --arch sm_90a only"
    python3 -m kernels.build --arch sm_90a --out /tmp/lib90a && export DDTREE_KERNELS_LIB=/tmp/lib90a/libddtree_kernels.so
  fi
  echo "build+check $(( $(date +%s) - t0 )) s"
  timeout 90 python3 -c "import json,sys; import kernels.bench_attention as ba
ba.SWEEP = {(64, 4096, 65, 8): [0, 1, 3], (8, 32768, 65, 8): [0, 16]}
json.dump({'suite': 'attn-sweep-v4', 'environment': ba.environment(),
           'lib': __import__('os').environ.get('DDTREE_KERNELS_LIB', 'default build'),
           'rows': ba.sweep(('mma5', 'mma7', 'mma8'))}, open(sys.argv[1], 'w'), indent=1)" \
    "$OUT/h200-attn-v4.json" 2> "$OUT/sweep.log"
  echo "sweep done $(( $(date +%s) - t0 )) s"
  timeout 120 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_attention_cuda.py 2>&1 \
    | tee "$OUT/pytest.log" | tail -8
  echo "tests done $(( $(date +%s) - t0 )) s"
  cat "$OUT/sweep.log"
fi
