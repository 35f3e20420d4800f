set -u
python3 -m pip install -q --upgrade --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD DDTREE_GIT_SHA=327f9d128304cb456b7e24cfa62d0a7a1db5bf55 ENGINE_GIT_SHA=327f9d128304cb456b7e24cfa62d0a7a1db5bf55 PYTHONUNBUFFERED=1 CUDA_DEVICE_ORDER=PCI_BUS_ID
O=$OUT/r2; mkdir -p $O; cp call5.sh $O/command.sh
nvidia-smi --query-gpu=name,uuid,driver_version,clocks.sm,clocks.mem --format=csv,noheader > $O/gpu.txt
python3 -m kernels.build --arch sm_90 --out /tmp/k --json > $O/build.json || { tail -c 3000 $O/build.json; exit 1; }
export DDTREE_KERNELS_LIB=/tmp/k/libddtree_kernels.so
for r in 1; do
  timeout 90 python3 -m kernels.bench --suite attn --quick --prefix-len 1024 --batch 1,8,32 --json > $O/bench-attn-1024-$r.json 2> $O/bench-attn-1024-$r.err; echo bench rc=$?
  timeout 120 python3 -m engine.attn_bench --preset small --device cuda --impls torch cuda --batch 1 8 32 --prompt-len 1024 --steps 16 --max-budget 0 --json $O/engine-attn-$r.json > $O/engine-attn-$r.txt 2>&1; echo engine rc=$?; head -4 $O/engine-attn-$r.txt
done
python3 - $O <<'PY'
import json, sys, glob
for f in sorted(glob.glob(sys.argv[1] + "/bench-attn-1024-*.json")):
    d = json.load(open(f))
    for r in d["results"]:
        if "host_us" in r and r.get("shape", {}).get("L") == 1024: print(f[-6:], r["kernel"], r["impl"], r["shape"].get("B"), round(r["median_us"]), round(r["host_us"]), round(r["gpu_us"]))
for f in sorted(glob.glob(sys.argv[1] + "/engine-attn-*.json")):
    d = json.load(open(f))
    for r in d["results"]: print(f[-6:], r["kernel"], r["impl"], r["shape"].get("B"), round(r["median_us"]))
PY
cd $OUT && tar czf r2.tgz r2 && rm -rf r2
