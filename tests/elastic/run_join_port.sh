#!/usr/bin/env bash
# Jobs of their own meet by address (comm/join.hpp): one ompi-server, a trainer job that publishes its port
# in an address file (mode 0600, with a secret), a joiner job of 2 ranks that is admitted, then a joiner
# whose copy of the file carries another secret, refused on every rank before anything reaches it; the trainer
# job runs without Open MPI's TCP progress thread and warns once, the joiner with it does not. With
# after_dead instead: a joiner whose connect to a port whose job died (its half at the name server) was given
# up on is then admitted: that connect fails at its mpirun's deadline (pmix_server_max_wait 5) and lets the
# TCP transport go; under Open MPI's default it held it for good and the join timed out.
# With ready: a fleet replica's port, where joiners connect while they probe: one admitted that never says
# "ready" is left queued, and the one that says it 1.5 s after its admission is taken, at once.
# Usage: run_join_port.sh JOIN_PORT_PROGRAM MPIEXEC [after_dead|ready]
set -euo pipefail
program=$1
mpiexec=${2:-mpirun}
dir=$(mktemp -d)
server=
trainer=
cleanup() {
  [[ -n $trainer ]] && kill "$trainer" 2>/dev/null || true
  [[ -n $server ]] && { kill "$server" 2>/dev/null; wait "$server" 2>/dev/null; } || true
  rm -rf "$dir"
}
trap cleanup EXIT
. "$(dirname "${BASH_SOURCE[0]}")/name_server.sh"
start_name_server
# btl_tcp_progress_thread as the README asks (1), but the first test's trainer job runs without it (0) and is
# told once (comm/dead_job.hpp).
run() {
  timeout 90 "$mpiexec" --oversubscribe --ompi-server "file:$dir/uri" --mca pmix_server_max_wait 5 \
    --mca btl_tcp_progress_thread "${tcp_progress_thread:-1}" "$@"
}
if [[ ${3:-} == after_dead ]]; then
  run -np 2 "$program" trainer "$dir/address" 1 0 &
  trainer=$!
  run -np 1 "$program" dead_port "$dir/dead" > "$dir/dead.log" 2>&1 && { cat "$dir/dead.log"; echo "the dead port's job ended with 0"; exit 1; }
  grep -q "dead port: published, and gone" "$dir/dead.log" || { cat "$dir/dead.log"; echo "the dead port never published"; exit 1; }
  for _ in $(seq 200); do [[ -s $dir/address ]] && break; sleep 0.1; done
  WB_LOG_LEVEL=info run -np 1 "$program" joiner_after_dead "$dir/dead" "$dir/address" > "$dir/after.log" 2>&1 ||
    { cat "$dir/after.log"; echo "the joiner after a connect to a dead port was not admitted"; exit 1; }
  cat "$dir/after.log"
  grep -q "the MPI_Comm_connect given up on .* ago returned" "$dir/after.log" || { echo "the connect to the dead port never said it returned"; exit 1; }
  wait "$trainer"
  trainer=
  echo "join by address: admitted after a connect to a dead port was given up on"
  exit 0
fi
if [[ ${3:-} == ready ]]; then
  run -np 2 "$program" replica "$dir/address" > "$dir/replica.log" 2>&1 &
  trainer=$!
  for _ in $(seq 200); do [[ -s $dir/address ]] && break; sleep 0.1; done
  [[ -s $dir/address ]] || { cat "$dir/replica.log"; echo "the replica job wrote no address file"; exit 1; }
  run -np 1 "$program" joiner_unready "$dir/address" > "$dir/unready.log" 2>&1 &
  unready=$!
  for _ in $(seq 200); do grep -q admitted "$dir/unready.log" 2>/dev/null && break; sleep 0.1; done
  grep -q admitted "$dir/unready.log" || { cat "$dir/unready.log"; echo "the unready joiner was not admitted"; exit 1; }
  run -np 1 "$program" joiner_ready_later "$dir/address" || { cat "$dir/replica.log"; echo "the ready joiner was not taken"; exit 1; }
  wait "$unready" || { cat "$dir/unready.log"; echo "the unready joiner failed"; exit 1; }
  wait "$trainer" || { cat "$dir/replica.log"; echo "the replica job failed"; exit 1; }
  trainer=
  cat "$dir/replica.log"
  echo "join by address: a replica's port takes the joiner that said ready, not the one admitted first"
  exit 0
fi
tcp_progress_thread=0 run -np 2 "$program" trainer "$dir/address" 1 1 > "$dir/trainer.log" 2>&1 &
trainer=$!
for _ in $(seq 200); do [[ -s $dir/address ]] && break; sleep 0.1; done
[[ -s $dir/address ]] || { cat "$dir/trainer.log"; echo "the trainer job wrote no address file"; exit 1; }
run -np 2 "$program" joiner "$dir/address" ok > "$dir/joiner.log" 2>&1 || { cat "$dir/joiner.log"; echo "the joiner failed"; exit 1; }
cat "$dir/joiner.log"
# The same port, another secret: refused.
sed '3s/.*/0000000000000000000000000000000000000000000000000000000000000000/' "$dir/address" > "$dir/forged"
run -np 2 "$program" joiner "$dir/forged" refused
wait "$trainer" || { cat "$dir/trainer.log"; echo "the trainer job failed"; exit 1; }
trainer=
cat "$dir/trainer.log"
warning="Open MPI's TCP transport runs here without its progress thread"
[[ $(grep -c "$warning" "$dir/trainer.log") == 1 ]] || { echo "not one warning on the trainer job run without the TCP progress thread"; exit 1; }
if grep -q "$warning" "$dir/joiner.log"; then echo "a warning on the joiner job run with the TCP progress thread"; exit 1; fi
echo "join by address: admitted, refused, port closed; told once without the TCP progress thread"
