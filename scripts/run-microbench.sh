#!/usr/bin/env bash
# Runs every Google Benchmark micro-benchmark of the build (planner, probe, source-map decoding, the
# second-difference codec, checkpoint reads, CPU pack/assemble; with CUDA the kernels, which skip without a
# device) and the Python adapters' parameter check (bench/parameter_check.py), and saves each one's JSON.
# Each validates its result before timing.
#
#   bash scripts/run-microbench.sh [--out DIR] [--filter REGEX] [--min-time SECONDS]
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${WB_BUILD_DIR:-$root/build}
out="" filter="" min_time=""
while [[ $# -gt 0 ]]; do
  case $1 in
    --out) out=$2; shift 2 ;;
    --filter) filter=$2; shift 2 ;;
    --min-time) min_time=$2; shift 2 ;;
    *) echo "run-microbench.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
out=${out:-$build/microbench}
mkdir -p "$out"
found=0
for bench in "$build"/bench/bench_*; do
  [[ -x $bench && -f $bench ]] || continue
  name=$(basename "$bench")
  # bench_executor is an MPI program (mpirun -np 4); the others are plain Google Benchmark binaries.
  grep -q "benchmark_out" <("$bench" --help 2>&1 || true) || continue
  found=$((found + 1))
  args=(--benchmark_out="$out/$name.json" --benchmark_out_format=json)
  [[ -n $filter ]] && args+=(--benchmark_filter="$filter")
  [[ -n $min_time ]] && args+=(--benchmark_min_time="$min_time")
  echo "run-microbench.sh: $name"
  "$bench" "${args[@]}"
done
[[ $found -gt 0 ]] || { echo "run-microbench.sh: no benchmarks under $build/bench (built with Google Benchmark?)" >&2; exit 1; }
# The Python adapters' parameter check at 100,000 parameters (needs the package built, torch and mpi4py).
if [[ -d $build/python/weightbridge ]] && /usr/bin/python3 -c "import torch, mpi4py" 2>/dev/null; then
  echo "run-microbench.sh: parameter_check.py"
  PYTHONPATH=$build/python /usr/bin/python3 "$root/bench/parameter_check.py" --json "$out/parameter_check.json" >/dev/null
  found=$((found + 1))
fi
echo "run-microbench.sh: $found benchmark programs, JSON in $out"
