#!/usr/bin/env bash
# wb-replay --trace on relay trees (10 ranks, async, 2 versions): the trace file loads and has the
# structure and spans check_trace.py asserts.
#   run_replay_trace.sh WB_REPLAY CHECK_TRACE OUT MPIEXEC NP_FLAG
set -euo pipefail
replay=$1 check=$2 out=$3 mpiexec=$4 np=$5
rm -rf "$out" && mkdir -p "$out"
"$mpiexec" "$np" 10 "$replay" --model qwen3-30b-a3b --scale tiny --trainer tp=2,ep=2 --rollout engines=4,tp=2,ep=2 \
  --gpus-per-node 2 --relay-fan-out 2 --mode async --steps 2 --json "$out/replay.json" --trace "$out/trace.json"
rounds=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["rounds"])' "$out/replay.json")
python3 "$check" "$out/trace.json" 10 2 --rounds "$rounds"
