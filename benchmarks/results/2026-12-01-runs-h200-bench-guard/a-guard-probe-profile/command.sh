#!/usr/bin/env bash
# ops bench / ops profile on a real H200 with the reference engine serving on the same GPU.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 9
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 OPS_RUNS_DIR=/tmp/runs CUDA_DEVICE_ORDER=PCI_BUS_ID
LOG=$OUT/log.txt
say() { echo "=== $*" | tee -a $LOG; }
say "nvidia-smi before"; nvidia-smi --query-gpu=index,name,uuid,memory.used,memory.total --format=csv >> $LOG 2>&1
python3 -m kernels.build --arch sm_90 --out /tmp/ddtree-k --json > /tmp/build.json 2>&1 || { tail -c 3000 /tmp/build.json; exit 1; }
export DDTREE_KERNELS_LIB=/tmp/ddtree-k/libddtree_kernels.so
cat > /tmp/ops.toml <<EOF
[targets.local]
remote_root = '/tmp/opsroot'
gpus = 1
bench_gpu = 0
[targets.local.service]
url = 'http://127.0.0.1:30123'
command = "{python} -m engine --host {host} --port {port} --preset small --mode ddtree --device cuda"
EOF
O="python3 -m ops"; I="-i /tmp/ops.toml"
say "service start"; timeout 240 $O service start local $I --wait 200 >> $LOG 2>&1; echo "rc=$?" >> $LOG
say "nvidia-smi with the engine"; nvidia-smi >> $LOG 2>&1
nvidia-smi --query-compute-apps=pid,gpu_uuid,used_memory,process_name --format=csv >> $LOG 2>&1
say "bench --gpu 9"; timeout 60 $O bench local $I --gpu 9 >> $LOG 2>&1; echo "rc=$?" >> $LOG
say "bench (gpu 0, shared)"; timeout 60 $O bench local $I --json > $OUT/refused.json 2>> $LOG; echo "rc=$?" >> $LOG
say "bench heavy --allow-shared"; timeout 280 $O bench local $I --allow-shared --suite accept,topk --batch 64 --timeout 240 --json > $OUT/heavy.json 2>> $LOG; echo "rc=$?" >> $LOG
say "bench light --allow-shared"; timeout 200 $O bench local $I --allow-shared --suite tree --batch 1,8 --timeout 150 > $OUT/light.txt 2>&1; echo "rc=$?" | tee -a $LOG
say "profile"; timeout 120 $O profile local $I -c 1,8 --requests 16 --output-len 32 --json > $OUT/profile.json 2>> $LOG; echo "rc=$?" >> $LOG
$O service stop local $I >> $LOG 2>&1
cp /tmp/runs/*light*/record.json $OUT/light-record.json 2>/dev/null || cp "$(ls -d /tmp/runs/*bench* | tail -1)/record.json" $OUT/light-record.json
cat $LOG
