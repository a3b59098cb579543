#!/usr/bin/env bash
# One link across the trainers and two engine jobs (relay_link_main.cpp): a trainer job, engine job A that
# joins it, engine job B that connects to A and then joins the trainers; A's rank 0 writes 16 MiB to B's
# rank 0 over the link, B checks them bit for bit. With `kill`, A's rank 0 dies after half of them (a relay
# lost mid-update): the trainers and B rebuild their link without A and trainer 0 re-sends the rest; the
# trainer job and B must end 0, A's job by the signal. With `stop`, A's rank 0 SIGSTOPs itself there instead
# (stalled for good): the same, and the script SIGKILLs it once the trainers and B have ended.
# With `fleet`, engine job C (1 rank) opens a port that A and B connect to and joins as well (T+A+B+C); A
# dies after half; the survivors rebuild, trainer 0 re-sends the rest to B and B forwards it to C.
# With `join_after_stop` (`join_after_kill`), A's rank 0 is stopped (killed) once T+A+B formed; C opens its
# port, B's leader connects there and tells trainer 0, A's never does: trainer 0 leaves A out after 3 s,
# trainer 1 knocks C's port, the survivors rebuild T+B and widen it with C, and trainer 0 writes B and C
# 16 MiB each, bit for bit; the trainer job, B and C end 0 (A by the signal, a stopped one killed after).
# Usage: run_relay_link.sh RELAY_LINK_PROGRAM MPIEXEC [kill|stop|fleet|join_after_stop|join_after_kill]
set -euo pipefail
program=$1
mpiexec=${2:-mpirun}
mode=${3:-}
dir=$(mktemp -d)
server=
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  [[ -n $server ]] && { kill "$server" 2>/dev/null; wait "$server" 2>/dev/null; } || true
  rm -rf "$dir"
}
trap cleanup EXIT
. "$(dirname "${BASH_SOURCE[0]}")/name_server.sh"
start_name_server
run() { timeout 90 "$mpiexec" --oversubscribe --ompi-server "file:$dir/uri" --mca pmix_server_max_wait 5 --mca btl_tcp_progress_thread 1 "$@"; }
run -np 2 "$program" trainers "$dir" $mode > "$dir/t.log" 2>&1 &
pids+=($!)
for _ in $(seq 200); do [[ -s $dir/t ]] && break; sleep 0.1; done
run -np 2 "$program" a "$dir" $mode > "$dir/a.log" 2>&1 &
pids+=($!)
for _ in $(seq 200); do [[ -s $dir/a ]] && break; sleep 0.1; done
run -np 1 "$program" b "$dir" $mode > "$dir/b.log" 2>&1 &
pids+=($!)
jobs_=(t a b)
if [[ $mode == fleet || $mode == join_after_* ]]; then
  run -np 1 "$program" c "$dir" $mode > "$dir/c.log" 2>&1 &
  pids+=($!)
  jobs_+=(c)
fi
rcs=()
if [[ $mode == join_after_* ]]; then
  # The trainers, B and C first: they must end while A's rank 0 is still stopped (or gone).
  for p in "${pids[0]}" "${pids[2]}" "${pids[3]}"; do rc=0; wait "$p" || rc=$?; rcs+=("$rc"); done
  [[ -s $dir/a0.pid ]] && kill -KILL "$(cat "$dir/a0.pid")" 2>/dev/null || true
  rc=0; wait "${pids[1]}" || rc=$?
  rcs=("${rcs[0]}" "$rc" "${rcs[1]}" "${rcs[2]}")
elif [[ $mode == stop ]]; then
  # The trainers and B first: they must end while A's rank 0 is still stopped.
  for p in "${pids[0]}" "${pids[2]}"; do rc=0; wait "$p" || rc=$?; rcs+=("$rc"); done
  [[ -s $dir/a0.pid ]] && kill -KILL "$(cat "$dir/a0.pid")" 2>/dev/null || true
  rc=0; wait "${pids[1]}" || rc=$?
  rcs=("${rcs[0]}" "$rc" "${rcs[1]}")
else
  for p in "${pids[@]}"; do rc=0; wait "$p" || rc=$?; rcs+=("$rc"); done
fi
pids=()
for f in "${jobs_[@]}"; do echo "== $f"; cat "$dir/$f.log"; done
if [[ $mode == join_after_* ]]; then
  [[ ${rcs[0]} == 0 && ${rcs[1]} != 0 && ${rcs[2]} == 0 && ${rcs[3]} == 0 ]] ||
    { echo "the jobs ended with ${rcs[*]} (want 0, the signal, 0, 0)"; exit 1; }
  grep -q "did not connect to the joiner's port" "$dir/t.log" || { echo "trainer 0 did not name A as left out"; exit 1; }
  for f in b c; do
    grep -q "16 MiB from T0 over T+B+C.*bit for bit" "$dir/$f.log" || { echo "$f did not get T0's bytes over T+B+C"; exit 1; }
  done
  echo "relay job lost before the next join ($mode): passed"
  exit 0
fi
if [[ $mode == fleet ]]; then
  [[ ${rcs[0]} == 0 && ${rcs[1]} != 0 && ${rcs[2]} == 0 && ${rcs[3]} == 0 ]] ||
    { echo "the jobs ended with ${rcs[*]} (want 0, the signal, 0, 0)"; exit 1; }
  grep -q "re-sent by T0 over the rebuilt link.*bit for bit" "$dir/b.log" || { echo "B did not get the rest from the trainers"; exit 1; }
  grep -q "re-sent by the child before it over the rebuilt link.*bit for bit" "$dir/c.log" || { echo "C did not get the rest from B"; exit 1; }
  echo "relay link of three engine jobs, relay killed: passed"
  exit 0
fi
if [[ -n $mode ]]; then
  [[ ${rcs[0]} == 0 && ${rcs[1]} != 0 && ${rcs[2]} == 0 ]] || { echo "the jobs ended with ${rcs[*]} (want 0, the signal, 0)"; exit 1; }
  grep -q "re-sent by T0 over the rebuilt link.*bit for bit" "$dir/b.log" || { echo "B did not get the rest from the trainers"; exit 1; }
  echo "relay link, relay lost ($mode): passed"
  exit 0
fi
[[ ${rcs[*]} == "0 0 0" ]] || { echo "the jobs ended with ${rcs[*]}"; exit 1; }
grep -q "bit for bit" "$dir/b.log" || { echo "B did not receive A's bytes"; exit 1; }
echo "relay link: passed"
