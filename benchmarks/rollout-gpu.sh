#!/usr/bin/env bash
# `ops rollout` on one GPU against the reference engine serving on that GPU (process manager,
# preset small): a validation rollout per change, which deploys the candidate WHATEVER the
# verdict (`when: always`), so the measured gain can be set beside the predicted one.
#   WHICH=tree: tree_build reference -> cuda (playbooks/rollout.yaml's change), prompts 32
#   WHICH=attn: attention torch -> cuda (playbooks/rollout-attention.yaml: s(c) from the
#               engine-shaped row_attention rows), prompts 1024
# With one GPU it holds both the service and the bench, so the bench runs --allow-shared and the
# interference probe's threshold is lifted (this run checks the prediction, not isolation), and
# the bench's times include the service's load. With GPUS=2 (a two-GPU host) the service runs
# on GPU 0 and the bench on GPU 1, guarded and probed as shipped.
# The engine serves with a fixed tree budget (SERVE_ARGS, default `--max-budget 0`): the playbooks'
# bench shapes are trees of 17 rows (the preset's budget 16) at every concurrency, which the
# preset's budget by batch size (32 nodes up to batch 17) would not match.
# The measure after the switch rechecks (RECHECK=1, the default; 0: off): the baseline's release
# switched back in, the load once more (A''), the candidate back: drift beside the gain; with
# CYCLES=N the two releases alternate N times (A A' | after | A'' | after | A'' ...).
# With one GPU the interference probe paces its requests 0.5 s apart (probe_interval), so the
# probe's own load on the shared GPU stays out of the bench's timings.
# Usage on the GPU host, project root:
#   OUT=dir WHICH=tree|attn [ARCH=sm_90] [GPUS=1|2] [RECHECK=0|1] [CYCLES=N]
#   [SERVE_ARGS=...] [ROLLOUT_SETS=...] [ROLLOUT_TIMEOUT=s] bash benchmarks/rollout-gpu.sh
. "$(dirname "$0")/preamble.sh" /tmp/rollout-gpu
WHICH=${WHICH:-tree}
export OPS_RUNS_DIR=$OUT/runs
# what ran, to commit beside the results: this command line with every setting it read
record "WHICH=$WHICH ARCH=$ARCH GPUS=${GPUS:-1} RECHECK=${RECHECK:-1} CYCLES=${CYCLES:-1}" \
  "PRESET=${PRESET:-small} DEVICE=${DEVICE:-cuda:0} SERVE_ARGS=\"${SERVE_ARGS---max-budget 0}\"" \
  "ROLLOUT_TIMEOUT=${ROLLOUT_TIMEOUT:-420} ROLLOUT_SETS=\"${ROLLOUT_SETS:-}\""
LOG=$OUT/log.txt
say() { echo "=== $(date +%T) $*" | tee -a "$LOG"; }
src=/tmp/rollout-src
root=/tmp/rollout-root
rm -rf "$root"
release_source "$src"
inv=$OUT/ops.toml
if [ "$WHICH" = attn ]; then
  comps='tree_build = "cuda", topk = "cuda", accept = "cuda", attention = "torch"'
  base=playbooks/rollout-attention.yaml
else
  comps='tree_build = "reference", topk = "cuda", accept = "cuda", attention = "cuda"'
  base=playbooks/rollout.yaml
fi
GPUS=${GPUS:-1}; BENCH_GPU=$([ "$GPUS" -ge 2 ] && echo 1 || echo 0)
gpu_lines=$(printf 'gpus = %s\ncuda_arch = "%s"\nbench_gpu = %s' "$GPUS" "$ARCH" "$BENCH_GPU")
if [ "${DEVICE:-cuda:0}" = cpu ]; then gpu_lines=""; fi  # a CPU dry run: no GPU there
cat > "$inv" <<TOML
[targets.local]
python = "$(command -v python3)"
remote_root = "$root"
$gpu_lines
[targets.local.service]
url = "http://127.0.0.1:30188"
command = "{python} -m engine --host {host} --port {port} --preset ${PRESET:-small} --mode ddtree --device ${DEVICE:-cuda:0} ${SERVE_ARGS---max-budget 0}"
components = { $comps }
TOML
# the validation playbook: the shipped one, every step after `decide` run whatever the verdict
pb=$OUT/playbook.yaml
python3 - "$base" "$pb" "$src" "$GPUS" "${RECHECK:-1}" "${CYCLES:-1}" <<'PY'
import sys, yaml
raw = yaml.safe_load(open(sys.argv[1]))
raw["name"] = raw["name"] + "-validate"
for st in raw["steps"]:
    if st["step"] == "bench" and int(sys.argv[4]) < 2:  # one GPU: shared with the service
        # the probe's requests paced 0.5 s apart, so its own load stays out of the bench's times
        st.update(allow_shared=True, probe_threshold=100.0, probe_interval=0.5)
    if st.get("when") == "go":
        st["when"] = "always"
    if st["step"] == "deploy":
        st["source"] = sys.argv[3]
    if st["step"] == "measure" and st.get("phase") == "after" and sys.argv[5] == "1":
        st["recheck"] = True  # the drift check: A'' on the baseline, switched back and forth
        st["cycles"] = int(sys.argv[6])  # CYCLES: the releases alternate this many times
yaml.safe_dump(raw, open(sys.argv[2], "w"), sort_keys=False)
PY
O="python3 -m ops"
nvidia-smi --query-gpu=index,name,uuid,driver_version --format=csv >> "$LOG" 2>&1 || true
say "deploy --bootstrap ($comps)"
attempt timeout 300 $O deploy local -i "$inv" --source "$src" --bootstrap --json \
  > "$OUT/deploy.json" 2>> "$LOG"
echo "deploy rc=$rc" | tee -a "$LOG"
say "rollout ($WHICH)"
# ROLLOUT_SETS: extra --set overrides, e.g. "--set load.requests=96 --set baseline.repeats=2"
# shellcheck disable=SC2086
attempt timeout "${ROLLOUT_TIMEOUT:-420}" $O rollout local -i "$inv" --playbook "$pb" --json \
  ${ROLLOUT_SETS:-} > "$OUT/rollout.json" 2>> "$LOG"
echo "rollout rc=$rc" | tee -a "$LOG"
# the last service's own view (stage times, the garbage collector's pauses), before it stops
curl -sf --max-time 10 http://127.0.0.1:30188/get_server_info > "$OUT/server-info.json" || true
$O service stop local -i "$inv" >> "$LOG" 2>&1 || true
tail -n 30 "$root"/logs/*.log >> "$LOG" 2>&1 || true
say "done"
