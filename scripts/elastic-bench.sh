#!/usr/bin/env bash
# The figures of issue 31's "Measured" paragraph, as benchmark JSON: engines that are MPI jobs of their own
# (wb-replay --engine-job) join a trainer job (wb-replay --join-address, no engine of its own), one is
# SIGKILLed in the middle of an update, and the training goes on with the others. Every install of every
# engine job is checked bit for bit against the engine's own load_weights of that version.
#
#   1. ompi-server; the trainer job publishes its address and sends versions, one every --step-ms, while
#      engine jobs A, B and C (--engine-tp workers each) join one after another; once all three serve, it
#      sends --steps more ("counted");
#   2. when C has installed 3 versions, A's rank 0 kills itself (SIGKILL) in its before_update_hook of the
#      next update (wb-replay --fault kill,rank=0,when=FILE): the trainers wait WB_TIMEOUT_SECONDS, drop A
#      and go on with B and C (on the fleet link, the default, rebuilt from them, the version re-sent; with
#      WB_BENCH_ARGS="--fleet-link 0" each engine job on a link of its own);
#   3. scripts/elastic_bench.py merges the jobs' JSON into $WB_OUT_DIR/elastic-bench.json: per join the
#      time from the take to the first install with the probe apart, against the T_min of one replica; the
#      EWTT of the update A was killed in, against T_min + the deadline + one resend; the updates after the
#      loss against the T_min of the smaller fleet (wb-plan's bound of that fleet as one plan, and the sum
#      of the per-link bounds that per-job links run).
#
#   scripts/elastic-bench.sh [--mode sync|sender-staged|receiver-staged|async] [--trainer SPEC] [--trainer-ranks N]
#       [--engine-tp N] [--steps K] [--step-ms MS] [--engine-step-ms MS] [--gpus-per-node G] [--fp8 BLOCK]
#       [--knock-at MS] [--kill-at MS]
#   defaults: sync, tp=2 on 2 ranks, engines of tp=2, 12 steps, a training step of 100 ms, an inference step
#   (the engines poll between two; a sync install waits for the next poll) of 2 ms, and nodes of --engine-tp
#   ranks (the trainers' ranks must fill whole nodes: wb-plan's bound takes trainers and engines apart).
#   --knock-at MS: B and C each start their join (early probe, then the knock at the replica) MS ms into the
#   trainers' next update, and --kill-at MS: A's rank 0 is killed MS ms into the trainers' first update after
#   the trigger, wherever A is then (both by the trainers' --update-mark; by default the knock falls where it
#   may, and the kill in A's before_update_hook, which a staged engine runs after its receive).
#   --fp8 128x128: the engine jobs serve block FP8 (quantized by the trainers; the model's shards must be
#   tiled by the blocks, e.g. WB_MODEL_ARGS with --hidden 1024 --head-dim 128), the bounds those of FP8 engines.
# Environment (defaults in brackets):
#   WB_BUILD_DIR [build/], WB_OUT_DIR [$WB_BUILD_DIR/elastic-bench], WB_DEMO_SKIP_BUILD [0: build first]
#   WB_MPIRUN            the launcher of every job, words [mpirun --oversubscribe]; a word %h is replaced by the
#                        job's number (1 trainers, 2-4 engine jobs A-C). On the emulated cluster each job's
#                        mpirun runs on its own host: "bash scripts/cluster.sh exec %h mpirun --oversubscribe
#                        --mca btl tcp,self,vader --mca btl_tcp_if_include SUBNET.0/24 --mca oob_tcp_if_include
#                        SUBNET.0/24" with WB_JOB_HOSTS (Open MPI 4.1's mpirun crashed, SIGSEGV in
#                        orte_rml_base_parse_uris, when the ranks of joined jobs ran under daemons of another
#                        host: "cluster.sh mpirun" starts every mpirun on host 1)
#   WB_JOB_HOSTS         optional: four hosts, one per job (trainers, A, B, C), each passed as --host H:SLOTS
#   WB_SERVER_PREFIX     words before ompi-server [none]; on the emulated cluster "bash scripts/cluster.sh exec 1"
#   WB_MODEL_ARGS        [--model qwen3-30b-a3b --scale tiny]
#   WB_BENCH_ARGS        more options for every wb-replay and wb-plan (settings), e.g. "--node-gbps 0.125"
#   WB_TIMEOUT_SECONDS   the deadline on a silent engine, the detection deadline of the kill [5]
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${WB_BUILD_DIR:-$root/build}
mode=sync trainer=tp=2 trainer_ranks=2 engine_tp=2 steps=12 step_ms=100 engine_step_ms=2 gpus_per_node= fp8= knock_at= kill_at=
while [[ $# -gt 0 ]]; do
  [[ $# -ge 2 ]] || { echo "elastic-bench.sh: $1 needs a value"; exit 2; }
  case $1 in
    --mode) mode=$2 ;;
    --trainer) trainer=$2 ;;
    --trainer-ranks) trainer_ranks=$2 ;;
    --engine-tp) engine_tp=$2 ;;
    --steps) steps=$2 ;;
    --step-ms) step_ms=$2 ;;
    --engine-step-ms) engine_step_ms=$2 ;;
    --gpus-per-node) gpus_per_node=$2 ;;
    --fp8) fp8=,fp8=$2 ;;
    --knock-at) knock_at=$2 ;;
    --kill-at) kill_at=$2 ;;
    *) echo "elastic-bench.sh: unknown option $1"; exit 2 ;;
  esac
  shift 2
done
gpus_per_node=${gpus_per_node:-$engine_tp}
((trainer_ranks % gpus_per_node == 0)) || { echo "--trainer-ranks $trainer_ranks does not fill nodes of $gpus_per_node ranks"; exit 2; }
[[ "${WB_DEMO_SKIP_BUILD:-0}" == "1" ]] || bash "$root/scripts/build.sh" --target wb-replay wb-plan
replay=$build/apps/wb-replay
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export WB_TIMEOUT_SECONDS=${WB_TIMEOUT_SECONDS:-5}
dir=${WB_OUT_DIR:-$build/elastic-bench}
read -r -a launcher <<<"${WB_MPIRUN:-mpirun --oversubscribe}"
read -r -a hosts <<<"${WB_JOB_HOSTS:-}"
read -r -a server_prefix <<<"${WB_SERVER_PREFIX:-}"
read -r -a model <<<"${WB_MODEL_ARGS:---model qwen3-30b-a3b --scale tiny}"
read -r -a extra <<<"${WB_BENCH_ARGS:-}"
mkdir -p "$dir"
rm -f "$dir"/*.log "$dir"/*.json "$dir/uri" "$dir/address" "$dir/kill" "$dir/server.pid" "$dir/update-mark"

pids=()
cleanup() {  # whatever still runs when the script ends (an error, Ctrl-C), and the server
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  [[ -s $dir/server.pid ]] && kill "$(<"$dir/server.pid")" 2>/dev/null
  return 0
}
trap cleanup EXIT
# The waits fork nothing (nap, log_count): a grep and a sleep every 0.1 s took CPU from the jobs measured.
. "$root/scripts/log-poll.sh"
# Under a prefix (cluster.sh exec) the kill of $! reaches the prefix, not the server, which outlived the
# runs: so the server writes its pid (the emulated hosts share this machine's process ids), and is bounded
# in time too. (setsid around the jobs, to kill what a prefix starts, made the joins' TCP connects fail
# here: 2 runs of 2.)
# shellcheck disable=SC2016  # $$ is the inner shell's
"${server_prefix[@]}" timeout 1800 sh -c 'echo $$ >"$1"; exec ompi-server --no-daemonize --report-uri "$2"' sh \
  "$dir/server.pid" "$dir/uri" &
pids+=($!)
for _ in $(seq 100); do [[ -s $dir/uri ]] && break; nap; done
[[ -s $dir/uri ]] || { echo "ompi-server wrote no URI"; exit 1; }

job() {  # job INDEX NAME RANKS ARGS...: one wb-replay job in the background, its log $dir/NAME.log
  local index=$1 name=$2 ranks=$3 place=()
  shift 3
  [[ ${#hosts[@]} -gt $index ]] && place=(--host "${hosts[$index]}:$ranks")
  "${launcher[@]//%h/$((index + 1))}" "${place[@]}" --ompi-server "file:$dir/uri" --mca pmix_server_max_wait 5 --mca btl_tcp_progress_thread 1 -np "$ranks" "$replay" "${model[@]}" "${extra[@]}" \
    --mode "$mode" --gpus-per-node "$gpus_per_node" --join-address "$dir/address" --update-mark "$dir/update-mark" \
    --json "$dir/$name.json" "$@" >"$dir/$name.log" 2>&1 &
  pids+=($!)
  eval "pid_$name=$!"
}
wait_for() {  # wait_for NAME ERE COUNT: until NAME.log has COUNT lines matching ERE (up to 120 s)
  for _ in $(seq 1200); do
    log_count "$dir/$1.log" "$2"
    ((counted >= $3)) && return
    nap
  done
  echo "no '$2' in $1.log within 120 s"; cat "$dir/$1.log"; exit 1
}

echo "== trainer job ($trainer_ranks ranks, $trainer, no engine of its own, $mode): 3 engine jobs join, then $steps versions"
job 0 trainers "$trainer_ranks" --trainer "$trainer" --rollout "engines=0,tp=$engine_tp" --joiners 3 --steps "$steps" \
  --step-ms "$step_ms"
for _ in $(seq 600); do [[ -s $dir/address ]] && break; nap; done
engine() {  # engine INDEX NAME ARGS...
  job "$1" "$2" "$engine_tp" --engine-job --rollout "engines=1,tp=$engine_tp$fp8" --engine-name "$2" --step-ms "$engine_step_ms" "${@:3}"
}
engine 1 A --fault "kill,rank=0,when=$dir/kill${kill_at:+,at=$kill_at}"
wait_for A "installed version" 1
knock=()
[[ -n $knock_at ]] && knock=(--knock-at-ms "$knock_at")
engine 2 B "${knock[@]}"
wait_for B "installed version" 1
engine 3 C "${knock[@]}"
wait_for C "installed version" 3
echo "== engine A's rank 0 kills itself in its next update${kill_at:+, $kill_at ms into it}"
touch "$dir/kill"

status=0
wait "$pid_trainers" || { echo "the trainer job failed"; status=1; }
wait "$pid_A" && { echo "engine A was not killed"; status=1; }
for e in B C; do wait "$(eval echo "\$pid_$e")" || { echo "engine job $e failed"; status=1; }; done
grep -E "^wb-replay engine job|^wb-replay: joined" "$dir"/*.log | sed "s|$dir/||" || true

# wb-plan's T_min of the fleets as one plan: the trainers and 1, 2 or 3 engines of the engine jobs' layout.
for n in 1 2 3; do
  "$build/apps/wb-plan" "${model[@]}" "${extra[@]}" --gpus-per-node "$gpus_per_node" --trainer "$trainer" --rollout "engines=$n,tp=$engine_tp$fp8" \
    --json "$dir/plan_$n.json" >"$dir/plan_$n.log" 2>&1 || { echo "wb-plan (engines=$n) failed"; cat "$dir/plan_$n.log"; status=1; }
done
/usr/bin/env python3 "$root/scripts/elastic_bench.py" "$dir" >"$dir/elastic-bench.json" || status=1
cat "$dir/elastic-bench.json"
echo "logs and JSON: $dir"
exit $status
