#!/usr/bin/env bash
# One wb-replay across the emulated cluster's hosts, checked from its JSON: verified bit for bit, planned
# nodes are the hosts, and the bytes that crossed between hosts (the transports' own counters) equal the
# plan, all of them over libfabric (none over a same-machine transport).
#   replay_on_cluster.sh SLOTS_PER_HOST RANKS WB_REPLAY ARGS...
set -euo pipefail
slots=$1 ranks=$2 replay=$3
shift 3
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cluster=$here/../../scripts/cluster.sh
if [[ -z $(bash "$cluster" status) ]]; then
  echo "multinode: skipped: the emulated cluster ${WB_CLUSTER_NAME:-wbc} is not up (not root?)"
  exit 77
fi
json=$(mktemp /tmp/wb-multinode.XXXXXX.json)
trap 'rm -f "$json"' EXIT
WB_CLUSTER_SLOTS=$slots bash "$cluster" mpirun -np "$ranks" --oversubscribe "$replay" "$@" --json "$json"
/usr/bin/env python3 - "$json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
net = r["network"]
problems = []
if not r["verified"]: problems.append("not verified: %s" % r["failures"])
if not net["nodes_are_machines"]: problems.append("planned nodes are not the hosts: the traffic check did not apply")
if net["matches_plan"] is not True: problems.append("measured network bytes differ from the plan")
between = net["between_machines_bytes_by_transport"]
if set(between) - {"libfabric"}: problems.append("bytes between hosts over %s" % sorted(set(between) - {"libfabric"}))
if between.get("libfabric", 0) != r["inter_node_bytes_per_update"]:
    problems.append("libfabric carried %s bytes between hosts per update, the plan %s" % (between.get("libfabric", 0), r["inter_node_bytes_per_update"]))
hosts = len(net["hosts"])
for p in problems: print("replay_on_cluster: " + p)
print("replay_on_cluster: %d hosts, %d bytes between hosts per update over libfabric, %s" % (hosts, between.get("libfabric", 0), "OK" if not problems else "FAILED"))
sys.exit(1 if problems else 0)
PY
