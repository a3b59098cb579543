#!/usr/bin/env bash
# Joins by address between job steps that srun --mpi=pmix launched (run inside an allocation: salloc ...
# bash run_srun_join.sh WB_ELASTIC). Open MPI 4.1 under Slurm's PMIx has no accept/connect: the trainer step
# must train on regardless (one warning: no more joins are taken), and the engine step must fail with one
# error that says so and names what works instead (mpirun --ompi-server inside the allocation).
set -euo pipefail
program=$1
dir=$(mktemp -d)
trainers=
cleanup() { [[ -n $trainers ]] && kill "$trainers" 2>/dev/null; rm -rf "$dir"; }
trap cleanup EXIT
export WB_TIMEOUT_SECONDS=10
timeout 120 srun -n 2 --mpi=pmix --overlap "$program" trainers --address "$dir/address" --steps 20 --step-ms 200 \
  >"$dir/trainers.log" 2>&1 &
trainers=$!
for _ in $(seq 300); do [[ -s $dir/address ]] && break; sleep 0.1; done
engine_rc=0
timeout 60 srun -n 1 --mpi=pmix --overlap "$program" engine --address "$dir/address" >"$dir/engine.log" 2>&1 || engine_rc=$?
trainers_rc=0
wait "$trainers" || trainers_rc=$?
trainers=
cat "$dir/trainers.log" "$dir/engine.log"
fail() { echo "$@"; exit 1; }
[[ $trainers_rc == 0 ]] || fail "the trainer step failed ($trainers_rc)"
grep -q "no more joins are taken" "$dir/trainers.log" || fail "the trainers did not say that joins are off"
[[ $engine_rc != 0 ]] || fail "the engine step ended with 0"
grep -q "have no accept/connect in Open MPI 4.1: start each job with mpirun --ompi-server" "$dir/engine.log" ||
  fail "the engine's error does not say why and what works instead"
echo "srun --mpi=pmix: joins refused with one error, the trainers trained on"
