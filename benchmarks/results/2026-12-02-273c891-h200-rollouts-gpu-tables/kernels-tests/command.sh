set -u
python3 -m pip install -q --upgrade --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD DDTREE_GIT_SHA=273c891f3cdc6f5abdfc9cf560dfe5b67bf6c589 ENGINE_GIT_SHA=273c891f3cdc6f5abdfc9cf560dfe5b67bf6c589 PYTHONUNBUFFERED=1 CUDA_DEVICE_ORDER=PCI_BUS_ID
O=$OUT/r; mkdir -p $O; cp call1.sh $O/command.sh
nvidia-smi --query-gpu=name,uuid,driver_version,clocks.sm,clocks.mem --format=csv,noheader > $O/gpu.txt
python3 -m kernels.build --arch sm_90 --out /tmp/k --json > $O/build.json || { tail -c 3000 $O/build.json; exit 1; }
export DDTREE_KERNELS_LIB=/tmp/k/libddtree_kernels.so
timeout 200 python3 -m pytest -m gpu tests/test_row_attention.py tests/test_stage_exposure.py tests/test_engine_gpu.py -q -p no:cacheprovider > $O/pytest-gpu.txt 2>&1; echo pytest rc=$?; tail -5 $O/pytest-gpu.txt
for r in 1 2; do timeout 90 python3 -m kernels.bench --suite attn --quick --prefix-len 1024 --batch 1 --json > $O/bench-attn-1024-$r.json 2> $O/bench-attn-1024-$r.err; echo bench rc=$?; done
timeout 90 python3 benchmarks/stage_exposure.py --reps 15 --sets 4 --json $O/stage-exposure.json > $O/stage-exposure.txt 2>&1; echo stage rc=$?
timeout 120 python3 -m engine.attn_bench --preset small --device cuda --impls torch cuda --batch 1 8 --prompt-len 1024 --steps 16 --max-budget 0 --json $O/engine-attn.json > $O/engine-attn.txt 2>&1; echo engine rc=$?; head -3 $O/engine-attn.txt
python3 - $O <<'PY'
import json, sys, glob
for f in sorted(glob.glob(sys.argv[1] + "/bench-attn-1024-*.json")):
    try: d = json.load(open(f))
    except Exception as e: print(f, e); continue
    for r in d["results"]:
        if "host_us" in r: print(f[-6:], r["kernel"], r["impl"], round(r["median_us"]), round(r["host_us"]), round(r["gpu_us"]), r.get("refcheck"))
PY
cd $OUT && tar czf r.tgz r && rm -rf r
