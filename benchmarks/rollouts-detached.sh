#!/usr/bin/env bash
# The two validation rollouts (benchmarks/rollout-gpu.sh: attention, then the tree build, or
# as ORDER says) in their own process session, so they outlive one device command (a lent
# machine runs a command for at most 10 minutes and ends what it leaves running, but for a new
# session):
# a measure with more cycles than one command's 10 minutes hold.
#   start:   bash benchmarks/rollouts-detached.sh start     (returns at once)
#   wait:    bash benchmarks/rollouts-detached.sh wait SECONDS
#            (prints the rollouts' step lines as they come; exit 0 once both are done, 3 while
#            they still run at the end of SECONDS)
#   collect: OUT=dir bash benchmarks/rollouts-detached.sh collect  (a tarball of the results)
# Settings (start): CYCLES (attention, default 6); the tree's cycles are read when it starts,
# from $DIR/tree-cycles if that file is there (so a later command can shorten it to fit the
# time left), else TREE_CYCLES, else CYCLES (CYCLES=0 TREE_CYCLES=3: the tree alone). ORDER: the
# order of the two (default "attn tree"; "tree attn" runs the tree first). ROLLOUT_SETS and
# SERVE_ARGS as rollout-gpu.sh. DIR: /tmp/rollouts.
set -u
DIR=${DIR:-/tmp/rollouts}
case "${1:-}" in
  start)
    rm -rf "$DIR"; mkdir -p "$DIR"
    export DIR CYCLES=${CYCLES:-6} ORDER=${ORDER:-attn tree}
    setsid nohup bash "$0" run > "$DIR/driver.log" 2>&1 < /dev/null &
    echo "started: $DIR/driver.log" ;;
  run)
    for which in ${ORDER:-attn tree}; do
      case "$which" in attn|tree) ;; *) echo "=== ORDER: unknown rollout $which"; continue ;; esac
      cycles=$CYCLES
      [ "$which" = tree ] && cycles=${TREE_CYCLES:-$cycles}
      [ "$which" = tree ] && [ -f "$DIR/tree-cycles" ] && cycles=$(cat "$DIR/tree-cycles")
      [ "$cycles" -gt 0 ] || { echo "=== $(date +%T) $which skipped (cycles 0)"; continue; }
      echo "=== $(date +%T) $which, $cycles cycles"
      echo "$DIR/rollout-$which/log.txt" >> "$DIR/logs"  # wait reads the logs in this order
      OUT=$DIR/rollout-$which WHICH=$which NO_WHEELS=1 CYCLES=$cycles \
        ROLLOUT_TIMEOUT=${ROLLOUT_TIMEOUT:-1500} bash benchmarks/rollout-gpu.sh
      echo "=== $(date +%T) $which ended"
    done
    touch "$DIR/done" ;;
  wait)
    end=$((SECONDS + ${2:-500})); seen=0
    logs() { [ -f "$DIR/logs" ] && xargs cat < "$DIR/logs" 2> /dev/null; }
    while :; do
      n=$(logs | grep -cE '^\[[0-9]+/[0-9]+\]|^===|recheck|run [0-9]+/')
      if [ "$n" -gt "$seen" ]; then
        logs | grep -E '^\[[0-9]+/[0-9]+\]|^===|recheck|run [0-9]+/' \
          | tail -n +$((seen + 1)) | sed 's/^ *//' | cut -c1-160
        seen=$n
      fi
      [ -f "$DIR/done" ] && { cat "$DIR/driver.log" | grep '^===' ; exit 0; }
      [ $SECONDS -ge $end ] && exit 3
      sleep 5
    done ;;
  collect)
    mkdir -p "$OUT"; tar -czf "$OUT/rollouts.tgz" -C "$DIR" . && ls -la "$OUT" ;;
  *) echo "usage: $0 start|wait SECONDS|collect" >&2; exit 2 ;;
esac
