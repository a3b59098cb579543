#!/usr/bin/env bash
# One engine at the start, a second engine job joins by address after version 3 (join_engine_main.cpp says
# what each side checks). Usage: run_join_engine.sh JOIN_ENGINE_PROGRAM MPIEXEC MODE
set -euo pipefail
program=$1
mpiexec=${2:-mpirun}
mode=${3:-sync}
dir=$(mktemp -d)
server=
trainers=
cleanup() {
  [[ -n $trainers ]] && kill "$trainers" 2>/dev/null || true
  [[ -n $server ]] && { kill "$server" 2>/dev/null; wait "$server" 2>/dev/null; } || true
  rm -rf "$dir"
}
trap cleanup EXIT
ompi-server --no-daemonize --report-uri "$dir/uri" &
server=$!
for _ in $(seq 100); do [[ -s $dir/uri ]] && break; sleep 0.1; done
[[ -s $dir/uri ]] || { echo "ompi-server wrote no URI"; exit 1; }
run() { timeout 200 "$mpiexec" --oversubscribe --ompi-server "file:$dir/uri" "$@"; }
run -np 3 "$program" trainers "$dir/address" "$mode" > "$dir/trainers.log" 2>&1 &
trainers=$!
for _ in $(seq 600); do
  grep -q "version 3 sent" "$dir/trainers.log" 2>/dev/null && break
  kill -0 "$trainers" 2>/dev/null || break
  sleep 0.1
done
grep -q "version 3 sent" "$dir/trainers.log" || { cat "$dir/trainers.log"; echo "the trainers never sent version 3"; exit 1; }
run -np 2 "$program" engine "$dir/address" "$mode" > "$dir/engine.log" 2>&1 &
engine=$!
trainers_rc=0
wait "$trainers" || trainers_rc=$?
trainers=
engine_rc=0
wait "$engine" || engine_rc=$?
cat "$dir/engine.log"
cat "$dir/trainers.log"
[[ $engine_rc == 0 && $trainers_rc == 0 ]] || { echo "engine job: $engine_rc, trainer job: $trainers_rc"; exit 1; }
echo "elastic join ($mode): passed"
