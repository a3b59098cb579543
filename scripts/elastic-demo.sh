#!/usr/bin/env bash
# Rollout engines that come and go (README, "Engines as jobs of their own"): one ompi-server, a trainer job
# of 2 ranks that trains 60 versions, one every 250 ms, and engine jobs of their own (wb-elastic) that join
# it by its address file: engine A (2 workers) and engine B (1 worker) join; A's job is SIGKILLed while the
# training runs; engine C (2 workers) joins after. Prints each engine's installed versions (each checked
# bit for bit against the engine's own load_weights of it), the trainers' warning for the lost engine and
# their list of engines. Exit 0 when the trainers never failed and B and C installed every version from
# their first to the last one sent.
#   scripts/elastic-demo.sh [MODE]   MODE: sync (default), sender-staged, receiver-staged or async
#   WB_BUILD_DIR         the build (default: build/)
#   WB_DEMO_DIR          where the logs go (default: $WB_BUILD_DIR/elastic-demo)
#   WB_DEMO_SKIP_BUILD   1: run the wb-elastic already built in WB_BUILD_DIR, build nothing
#   WB_TIMEOUT_SECONDS   how long the trainers wait for a silent engine before they drop it (default here 5)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${WB_BUILD_DIR:-$root/build}
mode=${1:-sync}
[[ "${WB_DEMO_SKIP_BUILD:-0}" == "1" ]] || bash "$root/scripts/build.sh" --target wb-elastic
program=$build/apps/wb-elastic
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export WB_TIMEOUT_SECONDS=${WB_TIMEOUT_SECONDS:-5}
dir=${WB_DEMO_DIR:-$build/elastic-demo}
mkdir -p "$dir"
rm -f "$dir"/*.log "$dir/uri" "$dir/address"

pids=()
cleanup() {  # whatever is still running when the script ends (an error, Ctrl-C)
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
}
trap cleanup EXIT
ompi-server --no-daemonize --report-uri "$dir/uri" &
pids+=($!)
for _ in $(seq 100); do [[ -s $dir/uri ]] && break; sleep 0.1; done
[[ -s $dir/uri ]] || { echo "ompi-server wrote no URI"; exit 1; }

job() {  # job NAME RANKS ARGS...: an mpirun of wb-elastic in the background, its log $dir/NAME.log
  local name=$1 ranks=$2
  shift 2
  mpirun --ompi-server "file:$dir/uri" --mca pmix_server_max_wait 5 --mca btl_tcp_progress_thread 1 -np "$ranks" "$program" "$@" --address "$dir/address" --mode "$mode" \
    >"$dir/$name.log" 2>&1 &
  pids+=($!)
  eval "pid_$name=$!"
}
wait_for() {  # wait_for LOG PATTERN COUNT: until LOG has COUNT lines matching PATTERN (up to 120 s)
  for _ in $(seq 1200); do
    (($(grep -c -- "$2" "$dir/$1.log" 2>/dev/null || true) >= $3)) && return
    sleep 0.1
  done
  echo "no '$2' in $1.log within 120 s"; cat "$dir/$1.log"; exit 1
}

echo "== trainers: 2 ranks, 60 versions, one every 250 ms ($mode); engines dropped after ${WB_TIMEOUT_SECONDS} s of silence"
job trainers 2 trainers --steps 60 --step-ms 250
for _ in $(seq 600); do [[ -s $dir/address ]] && break; sleep 0.1; done
echo "== engine A (2 workers) and engine B (1 worker) join"
job A 2 engine --name A
wait_for A "installed version" 3
job B 1 engine --name B
wait_for B "installed version" 3
echo "== engine A's job is SIGKILLed"
pkill -KILL -P "$pid_A"  # the ranks of A's mpirun
wait "$pid_A" || true
wait_for trainers "engine(s) after version" 3
echo "== engine C (2 workers) joins"
job C 2 engine --name C

status=0
wait "$pid_trainers" || { echo "the trainer job failed"; status=1; }
for e in B C; do wait "$(eval echo "\$pid_$e")" || { echo "engine $e failed"; status=1; }; done
last=60
echo
echo "== installed versions (each bit for bit)"
for e in A B C; do
  versions=$(sed -n "s/^$e: installed version \([0-9]*\), bit for bit$/\1/p" "$dir/$e.log")
  note=""
  # A first version from the fleet's replica (A), before the trainers took it: every one from the take on.
  replica=$(sed -n "s/^$e: version \([0-9]*\) from the fleet's replica engine.*/\1/p" "$dir/$e.log")
  if [[ -n $replica && $(head -1 <<<"$versions") == "$replica" ]]; then
    versions=$(tail -n +2 <<<"$versions")
    note=" (version $replica before, from the replica A)"
  fi
  first=$(head -1 <<<"$versions")
  end=$(tail -1 <<<"$versions")
  count=$(wc -l <<<"$versions")
  [[ $e == A ]] && note=" (then killed)"
  echo "engine $e: versions $first..$end ($count installs)$note"
  if [[ $e != A ]] && [[ -z $first || $end != "$last" || $count != $((end - first + 1)) ]]; then
    echo "engine $e did not install every version from $first to $last"; status=1
  fi
done
echo
echo "== the trainers"
grep -E "^trainers: |WARN" "$dir/trainers.log" || true
echo "logs: $dir"
exit $status
