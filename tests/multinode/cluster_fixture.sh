#!/usr/bin/env bash
# ctest fixture of the multinode tests: brings the emulated cluster up (setup) or down (cleanup).
# Skips (exit 77) where namespaces cannot be made: not root, or no network namespaces in this sandbox.
set -uo pipefail
action=$1
shift
cluster=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/scripts/cluster.sh
if [[ $action == down ]]; then
  bash "$cluster" down
  exit 0
fi
if [[ $(id -u) -ne 0 ]]; then
  echo "multinode: skipped: the emulated cluster needs root (network namespaces)"
  exit 77
fi
if ! out=$(bash "$cluster" up "$@" 2>&1); then
  echo "$out"
  bash "$cluster" down
  if ! ip netns add "${WB_CLUSTER_NAME:-wbc}-probe" 2>/dev/null; then
    echo "multinode: skipped: network namespaces cannot be created here"
    exit 77
  fi
  ip netns del "${WB_CLUSTER_NAME:-wbc}-probe"
  exit 1
fi
echo "$out"
