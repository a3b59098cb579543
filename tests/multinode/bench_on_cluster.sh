#!/usr/bin/env bash
# wb-bench across the emulated cluster's first three hosts, checked from its JSON (see CMakeLists.txt).
set -euo pipefail
bench=$1
cluster=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/scripts/cluster.sh
if [[ -z $(bash "$cluster" status) ]]; then
  echo "multinode: skipped: the emulated cluster ${WB_CLUSTER_NAME:-wbc} is not up (not root?)"
  exit 77
fi
json=$(mktemp /tmp/wb-bench.XXXXXX.json)
trap 'rm -f "$json"' EXIT
WB_CLUSTER_SLOTS=2 bash "$cluster" mpirun -np 6 --oversubscribe "$bench" --model qwen3-30b-a3b --scale tiny \
  --trainer tp=1,ep=2,dp=2 --rollout engines=2,tp=2,ep=2 --gpus-per-node 2 --reps 1 --warmup 1 --json "$json"
/usr/bin/env python3 - "$json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
M = r["model_bytes"]
by = {m["method"]: m for m in r["methods"]}
problems = []
if not r["verified"] or r["machines"] != 3: problems.append("verified %s on %s machines" % (r["verified"], r["machines"]))
if by["weightbridge-sync"]["between_machines_bytes"] != 2 * M: problems.append("weightbridge: %d bytes between hosts, 2 M = %d" % (by["weightbridge-sync"]["between_machines_bytes"], 2 * M))
if by["broadcast"]["between_machines_bytes"] != 4 * M: problems.append("broadcast: %d bytes between hosts, 4 M = %d" % (by["broadcast"]["between_machines_bytes"], 4 * M))
# The ring enters each rollout host once: the head to the first host's chain, its last worker to the next host.
if by["ring-broadcast"]["between_machines_bytes"] != 2 * M: problems.append("ring broadcast: %d bytes between hosts, 2 M = %d" % (by["ring-broadcast"]["between_machines_bytes"], 2 * M))
if by["p2p"]["between_machines_bytes"] < 2 * M: problems.append("p2p: %d bytes between hosts, under 2 M" % by["p2p"]["between_machines_bytes"])
for p in problems: print("bench_on_cluster: " + p)
print("bench_on_cluster:", "FAILED" if problems else "OK", {k: v["between_machines_bytes"] for k, v in by.items()}, "M =", M)
sys.exit(1 if problems else 0)
PY
