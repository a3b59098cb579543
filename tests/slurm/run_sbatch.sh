#!/usr/bin/env bash
# run_sbatch.sh SCRIPT WORKDIR: submits SCRIPT with sbatch --wait from WORKDIR and checks that the job
# succeeded and wrote a verified JSON result.
set -uo pipefail
script=$1
workdir=$2
rm -rf "$workdir" && mkdir -p "$workdir" && cd "$workdir" || exit 1
if ! sbatch --wait --time=5 --export=ALL "$script"; then
  echo "run_sbatch: the job failed" >&2
  cat wb-smoke-*.out >&2 2>/dev/null
  exit 1
fi
cat wb-smoke-*.out
grep -q '"verified": true' wb-smoke-*.json || { echo "run_sbatch: no verified result" >&2; exit 1; }
