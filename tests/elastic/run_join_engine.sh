#!/usr/bin/env bash
# Engine jobs of their own join, leave and die beside a running trainer job (join_engine_main.cpp says what
# each side checks; this script checks what needs both logs). Usage:
#   run_join_engine.sh JOIN_ENGINE_PROGRAM MPIEXEC MODE SCENARIO
# SCENARIO join: one engine job joins after version 3; its first install is the trainers' version when
#   they took it, and it installs every later one up to the trainers' last.
# leave: an engine job joins, installs three versions and leaves; then another joins in its place.
# kill: two engine jobs join; one is SIGKILLed during an update; the trainers warn once, naming it, and
#   the other installs that version and every later one.
set -euo pipefail
program=$1
mpiexec=${2:-mpirun}
mode=${3:-sync}
scenario=${4:-join}
dir=$(mktemp -d)
server=
trainers=
engines=()
cleanup() {
  [[ -n $trainers ]] && kill "$trainers" 2>/dev/null || true
  for e in "${engines[@]}"; do kill "$e" 2>/dev/null || true; done
  [[ -n $server ]] && { kill "$server" 2>/dev/null; wait "$server" 2>/dev/null; } || true
  rm -rf "$dir"
}
trap cleanup EXIT
ompi-server --no-daemonize --report-uri "$dir/uri" &
server=$!
for _ in $(seq 100); do [[ -s $dir/uri ]] && break; sleep 0.1; done
[[ -s $dir/uri ]] || { echo "ompi-server wrote no URI"; exit 1; }
run() { timeout 200 "$mpiexec" --oversubscribe --ompi-server "file:$dir/uri" "$@"; }
run -np 3 "$program" trainers "$dir/address" "$mode" "$scenario" > "$dir/trainers.log" 2>&1 &
trainers=$!
for _ in $(seq 600); do
  grep -q "version 3 sent" "$dir/trainers.log" 2>/dev/null && break
  kill -0 "$trainers" 2>/dev/null || break
  sleep 0.1
done
grep -q "version 3 sent" "$dir/trainers.log" || { cat "$dir/trainers.log"; echo "the trainers never sent version 3"; exit 1; }
engine() {  # engine NAME ROLE: starts an engine job in the background, its log $dir/NAME.log
  run -np 2 "$program" engine "$dir/address" "$mode" "$2" > "$dir/$1.log" 2>&1 &
  engines+=($!)
}
fail() { for f in "$dir"/*.log; do echo "== $f"; cat "$f"; done; echo "$@"; exit 1; }
case $scenario in
  join) engine first serve ;;
  leave)
    engine first leave
    wait "${engines[0]}" || fail "the engine job that leaves failed"
    engine second serve ;;
  kill) engine first killed; engine second serve ;;
esac
trainers_rc=0
wait "$trainers" || trainers_rc=$?
trainers=
rcs=()
for e in "${engines[@]}"; do rc=0; wait "$e" || rc=$?; rcs+=("$rc"); done
engines=()
[[ $trainers_rc == 0 ]] || fail "the trainer job failed ($trainers_rc)"
last=$(sed -n 's/^trainers: sent up to \([0-9]*\)$/\1/p' "$dir/trainers.log")
serving=$dir/first.log
case $scenario in
  join)
    # The joiner's first install is the version the trainers sent when they took it (their latest), on
    # every worker: none older, none later.
    joined_at=$(sed -n 's/^trainers: an engine joined at version \([0-9]*\);.*/\1/p' "$dir/trainers.log")
    firsts=$(sed -n 's/^joined engine worker [0-9]*: first event after kConnected kInstalled \([0-9]*\),.*/\1/p' "$dir/first.log" | sort -u)
    [[ -n $joined_at && $firsts == "$joined_at" ]] || fail "the trainers took the joiner at version '$joined_at'; its workers installed first '$firsts'" ;;
  leave)
    [[ $(grep -c "then it left" "$dir/first.log") == 2 ]] || fail "the first engine's workers did not both leave"
    serving=$dir/second.log ;;
  kill)
    [[ ${rcs[0]} != 0 ]] || fail "the killed engine job ended with 0"
    [[ $(grep -c "was dropped after version" "$dir/trainers.log") == 1 ]] || fail "not one warning naming the lost engine"
    serving=$dir/second.log ;;
esac
[[ ${rcs[-1]} == 0 ]] || fail "the serving engine job failed (${rcs[-1]})"
lasts=$(sed -n 's/^joined engine worker [0-9]*: .*then up to \([0-9]*\),.*/\1/p' "$serving" | sort -u)
[[ -n $last && $lasts == "$last" ]] || fail "the trainers sent up to '$last'; the serving joiner's workers installed up to '$lasts'"
for f in "$dir"/*.log; do echo "== $(basename "$f")"; cat "$f"; done
echo "elastic $scenario ($mode): passed"
