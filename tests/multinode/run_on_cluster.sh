#!/usr/bin/env bash
# mpirun ARGS... across the emulated cluster; skips (77) when the cluster is not up.
set -euo pipefail
cluster=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/scripts/cluster.sh
if [[ -z $(bash "$cluster" status) ]]; then
  echo "multinode: skipped: the emulated cluster ${WB_CLUSTER_NAME:-wbc} is not up (not root?)"
  exit 77
fi
exec bash "$cluster" mpirun "$@"
