#!/usr/bin/env bash
# run_sbatch.sh SCRIPT WORKDIR [PREFIX]: submits SCRIPT with sbatch --wait from WORKDIR and checks that the
# job succeeded and wrote a verified JSON result (PREFIX-*.json beside its PREFIX-*.out log; default wb-smoke).
set -uo pipefail
script=$1
workdir=$2
prefix=${3:-wb-smoke}
rm -rf "$workdir" && mkdir -p "$workdir" && cd "$workdir" || exit 1
if ! sbatch --wait --time=5 --export=ALL "$script"; then
  echo "run_sbatch: the job failed" >&2
  cat "$prefix"-*.out >&2 2>/dev/null
  exit 1
fi
cat "$prefix"-*.out
grep -q '"verified": true' "$prefix"-*.json || { echo "run_sbatch: no verified result" >&2; exit 1; }
