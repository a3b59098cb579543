#!/usr/bin/env bash
# Builds the libFuzzer targets of fuzz/ with clang, AddressSanitizer and UndefinedBehaviorSanitizer, and
# runs each for a bounded time on its corpus (fuzz/corpus/<target>/, the seeds the library's own encoders
# write, and what earlier runs of this build found).
#
#   bash scripts/fuzz.sh [SECONDS_PER_TARGET] [TARGET...]     (default 60 s, every target)
#
# Targets: safetensors_header safetensors_index hdf5 source_map round_schedule connect_records.
# BUILD_DIR (default build-fuzz) and JOBS (default 2) are read from the environment. Exits 0 when no
# target found anything; otherwise 1, with each finding's input in $BUILD_DIR/fuzz-findings/<target>/ (a
# target reproduces one with: $BUILD_DIR/fuzz/fuzz_<target> FILE).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
seconds=${1:-60}
shift || true
targets=("$@")
if [[ ${#targets[@]} -eq 0 ]]; then
  targets=(safetensors_header safetensors_index hdf5 source_map round_schedule connect_records)
fi
build=${BUILD_DIR:-$root/build-fuzz}
jobs=${JOBS:-2}

command -v clang++ >/dev/null || { echo "fuzz.sh: clang++ not found (apt-get install clang libclang-rt-14-dev)" >&2; exit 2; }
# Warnings are not errors here: clang warns about things gcc does not, and this build exists to fuzz.
CC=clang CXX=clang++ cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DWB_CUDA=OFF -DWB_FUZZ=ON \
  -DWB_SANITIZE=address,undefined -DWB_BUILD_TESTS=OFF -DWB_BUILD_BENCHMARKS=OFF -DWB_BUILD_APPS=OFF >/dev/null
cmake --build "$build" -j "$jobs" --target wb_fuzz_seeds "${targets[@]/#/fuzz_}"

# Undefined behaviour is a finding, not a note in the log.
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
export ASAN_OPTIONS=detect_leaks=0:allocator_may_return_null=1  # leaks: MPI and libhdf5 keep allocations for the
# process's life; a huge malloc returns NULL, as glibc's does, instead of ending the run
seeds=$build/fuzz-seeds
rm -rf "$seeds"
"$build/fuzz/wb_fuzz_seeds" "$seeds"

status=0
summary=()
for target in "${targets[@]}"; do
  work=$build/fuzz-corpus/$target  # grows from run to run; the fuzzer adds new inputs here only
  findings=$build/fuzz-findings/$target
  mkdir -p "$work" "$findings" "$seeds/$target"
  log=$build/fuzz-$target.log
  echo "fuzz.sh: $target for ${seconds} s (log: $log)"
  options=(-max_total_time="$seconds" -timeout=60 -rss_limit_mb=4096 -max_len=65536 -artifact_prefix="$findings/"
    -print_final_stats=1)
  if [[ $target == hdf5 ]]; then
    # libhdf5 crashes and loops on some corrupt metadata (the reader's checking child catches that):
    # explore with the check off, in fork mode so that the run goes on past them, then replay each such
    # input with the check on, where every one must be an error.
    options+=(-fork=1 -ignore_crashes=1 -ignore_timeouts=1 -ignore_ooms=1 -timeout=10)
  fi
  set +e
  "$build/fuzz/fuzz_$target" "${options[@]}" "$work" "$root/fuzz/corpus/$target" "$seeds/$target" >"$log" 2>&1
  rc=$?
  set -e
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1 || true)
  if [[ $target == hdf5 ]]; then
    runs=$(grep -oE '^#[0-9]+:' "$log" | tail -1 | tr -d '#:' || true)  # fork mode: "#N: cov: ..."
    caught=0
    failed=()
    for input in "$findings"/crash-* "$findings"/timeout-* "$findings"/oom-*; do
      [[ -e $input ]] || continue
      if WB_HDF5_CHECK_IN_CHILD=1 timeout 120 "$build/fuzz/fuzz_hdf5" "$input" >>"$log.replay" 2>&1; then
        caught=$((caught + 1))
        mv "$input" "$findings/caught-by-check-$(basename "$input")"
      else
        failed+=("$input")
      fi
    done
    if [[ ${#failed[@]} -gt 0 || $rc -ne 0 && $rc -ne 1 ]]; then
      status=1
      summary+=("$target: FOUND ${#failed[@]} input(s) that crash or hang even with the checking child: ${failed[*]:-see $log}")
    else
      summary+=("$target: nothing found in ${runs:-?} runs; $caught input(s) crash or hang libhdf5 in-process and are refused by the checking child")
    fi
  elif [[ $rc -ne 0 ]]; then
    status=1
    summary+=("$target: FOUND SOMETHING after ${runs:-?} runs: $(grep -m1 -E 'ERROR|runtime error|deadly signal|Timeout' "$log" || echo "exit $rc"); inputs in $findings")
  else
    summary+=("$target: nothing found in ${runs:-?} runs")
  fi
done
printf 'fuzz.sh: %s\n' "${summary[@]}"
exit $status
