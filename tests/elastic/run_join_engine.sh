#!/usr/bin/env bash
# Engine jobs of their own join, leave and die beside a running trainer job (join_engine_main.cpp says what
# each side checks; this script checks what needs both logs). Usage:
#   run_join_engine.sh JOIN_ENGINE_PROGRAM MPIEXEC MODE SCENARIO
# SCENARIO join: one engine job joins after version 3; its first install is the trainers' latest version
#   when they took it, written by the built-in engine, and it installs every later one up to the trainers' last.
# leave: an engine job joins, installs three versions and leaves; then another joins in its place.
# kill: three engine jobs join (2, 2 and 1 workers); the first is SIGKILLed during an update; the trainers
#   warn once, naming it, and the other two install that version and every later one.
# stop: as kill, but the first is SIGSTOPped during an update; once the trainers dropped it, this script
#   resumes it (SIGCONT); it reports kFailed naming why, joins again and installs every later version.
# vanish: a joiner is admitted at the port and dies before the trainers take it; the trainers warn, and the
#   next joiner joins and installs every later version.
# ghost: as vanish, but the joiner dies right after it answered the trainers' take.
# joined_replica: a trainer job with no engine of its own; the first engine job to join (2 workers) is
#   appointed the replica (its port beside the trainers' address); the second connects there first and
#   gets its first version (the trainers' latest) from it.
# kill_relay: as joined_replica, but the second joiner SIGKILLs the first (the replica) in the hook of the
#   version the replica writes it: its first version is then the trainers' next, the replica is dropped.
# lose_joiner: a joiner dies while the built-in engine writes it its first version; the built-in engine warns
#   once and serves on, the trainers drop the joiner (one warning) and never fail; the next joiner gets its
#   first version from the built-in engine and serves to the trainers' last.
# at_once: three engine jobs (2, 2 and 1 workers) started at the same moment all join, each installs every
#   version from its first to the trainers' last.
# fleet: fleet_link set on every job (and fleet_replica, unless the test sets it 0); a trainer job with no engine
#   of its own; two engine jobs join one after the other onto one link and one plan (the second's leader met the
#   first at its port); the first, of two workers, is the fleet's replica and writes the second its first version
#   before the trainers take it (with fleet_replica 0: none); each installs from
#   the version that took it on, and the trainers' egress per update stays one model copy.
# fleet_long_step: as fleet, each joiner's timeout 3 s, and the trainers' step before each take held until the
#   joiner has waited at their port for 7 s: both are taken all the same, B's first version A's copy.
# fleet_bad_list: as fleet, with the tensor list beside A's replica address damaged before B comes: B refuses
#   the copy (one line naming the file) and tells A, which lets it go, and its first version is the take's.
# fleet_slow_probe: as fleet, A's timeout 3 s, and B's probe before the copy 4 s longer: A links B as it is
#   admitted, lets it go once B has not asked for the copy within A's timeout (one warning), B says so once,
#   and its first version is the take's.
# fleet_join_after_stop, fleet_join_after_kill: as fleet; then A is SIGSTOPped (SIGKILLed) between updates and C
#   (one worker) joins: the trainers leave A out (the link rebuilt from B), then widen it with C, in one
#   send_weights; C installs from that version on, B every version; stopped, A is resumed, reports kFailed and
#   joins again. fleet_join_after_stop_alone: as fleet_join_after_stop without B: no engine is left on the
#   link once A is left out, and C starts a fleet link of its own.
# ghost_connector: a joiner connects and presents nothing (the trainers' accept thread waits for its secret);
#   meanwhile another starts to connect and dies: the trainers' next accept pairs with the dead job and fails
#   after 5 s (pmix_server_max_wait 5), with one warning, and the port takes the next joiner, which serves.
# fleet_ghost: A joins the fleet link; then a joiner of one worker dies once it answered the trainers' fleet
#   offer, before A's leader met its port: that joiner is given up on with one warning, and A serves on to
#   the trainers' last version (never dropped).
# fleet_ghost_next: as fleet_ghost, then B (one worker) joins 6 s after the trainers gave up on the dead joiner:
#   A's leader meets B's port (A's runtime gave up on the dead job by then; its connect to the dead port stays
#   inside MPI to the end), and B installs from the version that took it.
# fleet_refused: A joins the fleet link; B is served by A (the replica), and its admission at the trainers'
#   port after the copy presents another secret (B replaced the address file in the copy's hook, as a trainer
#   job restarted meanwhile would): every worker of B reports kFailed naming the refused secret after the
#   replica's version, the trainers warn once and never take it, and A serves on to their last version.
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
  # A job's workers still stopped (a test that failed before resuming them) end with it: theirs by the pid
  # they wrote, only where that process is still this test's.
  for f in "$dir"/address.stopped.*; do
    [[ -s $f ]] && grep -qs "$dir" "/proc/$(cat "$f")/cmdline" && kill -KILL "$(cat "$f")" 2>/dev/null
  done
  [[ -n $trainers ]] && kill "$trainers" 2>/dev/null || true
  for e in "${engines[@]}"; do kill "$e" 2>/dev/null || true; done
  [[ -n $server ]] && { kill "$server" 2>/dev/null; wait "$server" 2>/dev/null; } || true
  rm -rf "$dir"
}
trap cleanup EXIT
. "$(dirname "${BASH_SOURCE[0]}")/name_server.sh"
# Polls of the logs fork nothing (nap, log_has, log_count): four of these tests run at once.
. "$(dirname "${BASH_SOURCE[0]}")/../../scripts/log-poll.sh"
start_name_server
# pmix_server_max_wait 5: a job that died while pairing with another is given up on after 5 s; btl_tcp_progress_thread
# 1: a failed write to a killed job's process cannot leave a survivor spinning in its next MPI call (README).
run() { timeout 200 "$mpiexec" --oversubscribe --ompi-server "file:$dir/uri" --mca pmix_server_max_wait 5 --mca btl_tcp_progress_thread 1 "$@"; }
# fleet_kill_arriving: every round in flight at once (no grant needed from the frozen engine), so that the
# trainers' writes into it complete and the loss is met only through the forwards it never makes.
[[ $scenario == fleet_kill_arriving ]] && export WB_BUFFER_MIB=256 WB_PIPELINE_DEPTH=8
# join: the built-in engine says (info) which version it wrote to the joiner; leave: the trainers say who left.
[[ $scenario == join || $scenario == lose_joiner || $scenario == joined_replica || $scenario == leave ]] &&
  export WB_LOG_LEVEL=${WB_LOG_LEVEL:-info}
ranks=3  # 2 trainers and a built-in engine; joined_replica: the trainers alone
[[ $scenario == joined_replica || $scenario == kill_relay || $scenario == fleet* ]] && ranks=2
# fleet*: the fleet's replica on (WB_FLEET_REPLICA, the default) unless the test turns it off.
[[ $scenario == fleet* ]] && export WB_FLEET_LINK=1 WB_LOG_LEVEL=${WB_LOG_LEVEL:-info} WB_FLEET_REPLICA=${WB_FLEET_REPLICA:-1}
# kill and stop run on either link (the fleet link, fleet_link's default, unless WB_FLEET_LINK=0): the loss is
# said in the link's words.
[[ ${WB_FLEET_LINK:-1} == 0 ]] && fleet_link=false || fleet_link=true
$fleet_link && lost_words="was lost in version" || lost_words="was dropped after version"
# Every job alike: it also bounds a joiner's catch-up, which must end well within the trainers' 5 s deadline
# of the victim scenarios.
export WB_JOIN_ANSWER_SECONDS=${WB_JOIN_ANSWER_SECONDS:-3}
# fleet_bad_list and fleet_slow_probe are fleet to the trainers: only what is between the engine jobs differs.
trainers_scenario=$scenario
[[ $scenario == fleet_bad_list || $scenario == fleet_slow_probe ]] && trainers_scenario=fleet
run -np $ranks "$program" trainers "$dir/address" "$mode" "$trainers_scenario" > "$dir/trainers.log" 2>&1 &
trainers=$!
for _ in $(seq 600); do
  log_has "$dir/trainers.log" "version 3 sent" && break
  kill -0 "$trainers" 2>/dev/null || break
  nap
done
grep -q "version 3 sent" "$dir/trainers.log" || { cat "$dir/trainers.log"; echo "the trainers never sent version 3"; exit 1; }
engine() {  # engine NAME ROLE [WORKERS]: starts an engine job in the background, its log $dir/NAME.log
  run -np "${3:-2}" "$program" engine "$dir/address" "$mode" "$2" > "$dir/$1.log" 2>&1 &
  engines+=($!)
}
fail() { for f in "$dir"/*.log; do echo "== $f"; cat "$f"; done; echo "$@"; exit 1; }
engines_at() {  # engines_at N: waits until the trainers count N engines (one job joins at a time)
  for _ in $(seq 1200); do
    log_has "$dir/trainers.log" "^trainers: $1 engines after version" && return
    kill -0 "$trainers" 2>/dev/null || break
    nap
  done
  fail "the trainers never counted $1 engines"
}
await_trainers() {  # await_trainers ERE: until the trainers' log has it (or they ended), at most 2 minutes
  for _ in $(seq 1200); do
    log_has "$dir/trainers.log" "$1" && return
    kill -0 "$trainers" 2>/dev/null || return 0
    nap
  done
}
await_line() {  # await_line LOG ERE PID WHY: until LOG has ERE (or PID ended), at most 2 minutes; else fails WHY
  for _ in $(seq 1200); do
    log_has "$1" "$2" && return
    kill -0 "$3" 2>/dev/null || break
    nap
  done
  log_has "$1" "$2" || fail "$4"
}
resume_stopped() {  # resume_stopped ERE: once the trainers' log says it (the stopped job was dropped),
  # every worker of it is resumed, by the pid it wrote.
  await_trainers "$1"
  log_has "$dir/trainers.log" "$1" || fail "the trainers never dropped the stopped engine (\"$1\")"
  for rank in 0 1; do
    [[ -s $dir/address.stopped.$rank ]] || fail "engine worker $rank of the stopped job wrote no pid"
    kill -CONT "$(cat "$dir/address.stopped.$rank")"
  done
}
case $scenario in
  join) engine first serve ;;
  at_once) engine first serve; engine second serve; engine third serve 1 ;;
  fleet) engine first serve; engines_at 1; engine second serve ;;
  fleet_kill) engine first killed; engines_at 1; engine second serve ;;
  fleet_long_step)
    # A training step longer than the joiners' timeout (3 s, role patient): the trainers hold their next
    # send_weights (ADDRESS.hold) until the joiner has waited at their port over twice that (ADDRESS.go).
    held=0
    for name in first second; do
      touch "$dir/address.hold"
      held=$((held + 1))
      for _ in $(seq 1200); do
        log_count "$dir/trainers.log" "^trainers: holding after version"
        ((counted >= held)) && break
        kill -0 "$trainers" 2>/dev/null || break
        nap
      done
      [[ $(grep -c "^trainers: holding after version" "$dir/trainers.log") -ge $held ]] || fail "the trainers never held their step"
      engine $name patient
      await_line "$dir/$name.log" "admitted at .*waiting to be taken" "${engines[-1]}" "the $name joiner was never admitted at the trainers' port"
      sleep 7
      touch "$dir/address.go"
      engines_at $held
    done ;;
  fleet_bad_list)
    # The tensor list beside the replica's address is not one (damaged, or an older job's): B refuses the
    # copy before it connects there and is taken as a joiner with no replica.
    engine first serve; engines_at 1
    for _ in $(seq 600); do [[ -s $dir/address.replica.tensors ]] && break; nap; done
    [[ -s $dir/address.replica.tensors ]] || fail "the replica left no tensor list beside its address"
    (umask 077 && printf 'not a tensor list' > "$dir/list" && mv "$dir/list" "$dir/address.replica.tensors")
    engine second serve ;;
  fleet_slow_probe)
    engine first patient; engines_at 1
    for _ in $(seq 600); do [[ -s $dir/address.replica.tensors ]] && break; nap; done
    engine second slow_probe ;;
  fleet_kill_arriving)
    engine first frozen_arriving; engines_at 1; engine second serve
    await_trainers "was lost in version"
    for rank in 0 1; do
      [[ -s $dir/address.stopped.$rank ]] || fail "engine worker $rank of the frozen job wrote no pid"
      kill -KILL "$(cat "$dir/address.stopped.$rank")"
    done ;;
  fleet_leave) engine first leave_at_trigger; engines_at 1; engine second serve ;;
  fleet_join_after_*)
    role=stopped_between
    [[ $scenario == fleet_join_after_kill ]] && role=killed_between
    engine first $role
    [[ $scenario == *_alone ]] || { engines_at 1; engine second serve; }
    # A stopped (killed) once it installed the version the trainers named; the trainers send nothing more
    # until C waits at their port (its leader says so), so that A is silent at C's port, not in an update.
    for _ in $(seq 1200); do
      [[ -s $dir/address.stopped.0 && -s $dir/address.stopped.1 ]] && break
      kill -0 "$trainers" 2>/dev/null || break
      nap
    done
    [[ -s $dir/address.stopped.0 && -s $dir/address.stopped.1 ]] || fail "the first engine job was never hit between updates"
    engine third serve 1
    await_line "$dir/third.log" "admitted at .*waiting to be taken" "$trainers" "the joiner was never admitted at the trainers' port"
    touch "$dir/address.go"
    # Resumed once the trainers took C (A was left out before): its stale meeting finds no port.
    if [[ $scenario == *_alone ]]; then resume_stopped "1 engines \(dropped serving\)"
    elif [[ $scenario == fleet_join_after_stop ]]; then resume_stopped "2 engines \(dropped serving serving\)"; fi ;;
  fleet_stop)
    engine first stopped; engines_at 1; engine second serve
    resume_stopped "was lost in version" ;;
  leave)
    engine first leave
    wait "${engines[0]}" || fail "the engine job that leaves failed"
    engine second serve ;;
  vanish)
    engine first vanish 1
    wait "${engines[0]}" && fail "the vanishing joiner ended with 0" || true
    await_trainers "did not answer when taken"
    grep -q "did not answer when taken" "$dir/trainers.log" || fail "the trainers did not warn about the joiner that vanished"
    engine second serve ;;
  ghost)
    engine first ghost 1
    wait "${engines[0]}" && fail "the ghost joiner ended with 0" || true
    engine second serve ;;
  fleet_ghost|fleet_ghost_next)
    engine first serve; engines_at 1
    engine ghost ghost_fleet 1
    wait "${engines[1]}" && fail "the ghost joiner ended with 0" || true
    engines=("${engines[0]}")  # the ghost's end is checked here, not with the serving jobs'
    # Once the trainers gave up on the joiner (or, before the fix, left A out for it), they may end.
    await_trainers "could not meet the joiner's port|left out of the fleet link"
    # fleet_ghost_next: B comes once A's mpirun gave up on the dead job (5 s after A's connect met its half;
    # before that, A's runtime can pair with nobody). Nothing of A says when: its connect never returns (A
    # names it, still inside MPI, at MPI_Finalize; measured), so a fixed margin it is.
    if [[ $scenario == fleet_ghost_next ]]; then sleep 6; engine second serve 1; else touch "$dir/address.go"; fi ;;
  fleet_refused)
    engine first serve; engines_at 1
    engine second forged_address
    wait "${engines[1]}" || fail "the refused joiner's workers did not all report its refused admission after the replica's version"
    engines=("${engines[0]}")  # its end is checked here
    touch "$dir/address.go" ;;
  ghost_connector)
    engine silent silent_joiner 1
    await_line "$dir/silent.log" "silent joiner: connected" "${engines[0]}" "the silent joiner never connected"
    engine ghost ghost_connector 1
    wait "${engines[1]}" && fail "the ghost connector ended with 0" || true
    await_trainers "MPI_Comm_accept failed"
    touch "$dir/address.go"
    wait "${engines[0]}" || true
    engines=("${engines[0]}")  # neither is a serving job (the first's end is not checked, the second's was)
    engine second serve ;;
  joined_replica)
    engine first serve
    for _ in $(seq 1200); do [[ -e $dir/address.replica ]] && break; kill -0 "$trainers" 2>/dev/null || break; nap; done
    [[ -e $dir/address.replica ]] || fail "the first engine job never opened the replica's port"
    engine second serve ;;
  kill_relay)
    engine first relay
    for _ in $(seq 1200); do [[ -e $dir/address.replica ]] && break; kill -0 "$trainers" 2>/dev/null || break; nap; done
    [[ -e $dir/address.replica ]] || fail "the first engine job never opened the replica's port"
    engine second kill_relay ;;
  lose_joiner)
    engine first killed_first
    await_trainers "was dropped after version"
    grep -q "was dropped after version" "$dir/trainers.log" || fail "the trainers never dropped the joiner that died in its catch-up"
    engine second serve ;;
  kill) engine first killed; engines_at 2; engine second serve; engines_at 3; engine third serve 1 ;;
  stop)
    engine first stopped; engines_at 2; engine second serve; engines_at 3; engine third serve 1
    resume_stopped "$lost_words" ;;
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
# The version at which the trainers took a joiner, and the first versions a joined job's workers installed
# after kConnected (each distinct one once) in its LOG.
version_taken() { sed -n 's/^trainers: an engine joined at version \([0-9]*\);.*/\1/p' "$dir/trainers.log"; }
first_installs() { sed -n 's/^joined engine worker [0-9]*: first event after kConnected kInstalled \([0-9]*\),.*/\1/p' "$1" | sort -u; }
# expect_first_install LOG OFFSET: every worker of LOG's job installed first the version the trainers took
# it at plus OFFSET (-1: the latest before it, from a replica; 0: the trainers' own); sets $firsts.
expect_first_install() {
  local joined_at
  joined_at=$(version_taken)
  firsts=$(first_installs "$1")
  [[ -n $joined_at && $firsts == "$((joined_at + $2))" ]] ||
    fail "the trainers took the joiner of $(basename "$1") at version '$joined_at'; its workers installed first '$firsts', expected $((joined_at + $2))"
}
# expect_first_from_replica LOG REPLICA_LOG: on the fleet link, every worker of LOG's job installed first the
# version the replica (REPLICA_LOG's job) wrote it before the trainers took it, older than the one they took
# it at; sets $firsts.
expect_first_from_replica() {
  local joined_at
  joined_at=$(version_taken)
  firsts=$(first_installs "$1")
  [[ -n $joined_at && -n $firsts && $firsts != *$'\n'* && $firsts -lt $joined_at ]] ||
    fail "the trainers took the joiner of $(basename "$1") at version '$joined_at'; its workers installed first '$firsts', expected one version older, from the replica"
  grep -q "wrote version $firsts to a joining engine" "$2" || fail "$(basename "$2")'s job did not write version $firsts to the joiner of $(basename "$1")"
  grep -q "installed version $firsts from the trainers' replica engine before joining" "$1" ||
    fail "the joiner of $(basename "$1") did not say it installed version $firsts from the replica before joining"
  # It probed against the tensor list beside the replica's address before it connected there: the
  # replica, and the trainers' update it holds back, wait for no probe.
  grep -q "probed its load_weights against the replica's tensor list before connecting" "$1" ||
    fail "the joiner of $(basename "$1") did not probe before it connected to the replica"
}
# The fleet link's loss: trainer 0 did not wait for the note of the engine the failed update found lost
# (A: silent at a deadline, dead, or left), only for B's, so its wait ended on B's answer, not at its bound.
expect_notes_on_every_answer() {
  grep -Eq "notes after a loss: 1 engine\(s\) answered, 1 found lost by the failed update \(not waited for\), 0 silent past .*\(ended on every answer\)" \
    "$dir/trainers.log" || fail "trainer 0 waited for a lost engine's note after the loss (or not for B's)"
}
case $scenario in
  joined_replica)
    expect_first_install "$dir/second.log" -1
    grep -q "wrote version $firsts to a joining engine" "$dir/first.log" || fail "the first engine job did not write version $firsts to the second"
    serving="$dir/first.log $dir/second.log" ;;
  kill_relay)
    # The relay died while it wrote the joiner its first version: the joiner's first install is the version
    # the trainers sent when they took it, from them; the relay is dropped, named once.
    [[ ${rcs[0]} != 0 ]] || fail "the killed relay's job ended with 0"
    [[ $(grep -c "was dropped after version" "$dir/trainers.log") == 1 ]] || fail "not one warning naming the lost relay"
    [[ $(grep -c "no first version from the trainers' replica engine" "$dir/second.log") == 1 ]] || fail "the joiner did not warn once that its replica was lost"
    expect_first_install "$dir/second.log" 0
    serving=$dir/second.log ;;
  lose_joiner)
    [[ ${rcs[0]} != 0 ]] || fail "the joiner killed in its catch-up ended with 0"
    [[ $(grep -c "was dropped after version" "$dir/trainers.log") == 1 ]] || fail "not one warning naming the lost joiner"
    [[ $(grep -c "serving a joining engine its first version failed" "$dir/trainers.log") == 1 ]] || fail "the built-in engine did not warn once about the joiner it lost"
    expect_first_install "$dir/second.log" -1
    grep -q "wrote version $firsts to a joining engine" "$dir/trainers.log" || fail "the built-in engine did not write version $firsts to the second joiner"
    serving=$dir/second.log ;;
  join)
    # The joiner's first install is the trainers' latest version when they took it (the one before the
    # send_weights that took it), written by the built-in engine, on every worker: none older, none later.
    expect_first_install "$dir/first.log" -1
    grep -q "wrote version $firsts to a joining engine" "$dir/trainers.log" || fail "the built-in engine did not say it wrote version $firsts to the joiner"
    [[ ${rcs[0]} == 0 ]] || fail "the engine job failed (${rcs[0]})" ;;
  leave)
    [[ $(grep -c "then it left" "$dir/first.log") == 2 ]] || fail "the first engine's workers did not both leave"
    # The trainers' word on the leave names the engine as their stats().engines do.
    name=$(sed -n 's/^trainers: \(joined engine .*\): left, .*/\1/p' "$dir/trainers.log")
    [[ -n $name ]] && grep -qF "] $name left " "$dir/trainers.log" || fail "the trainers did not say '$name' left"
    serving=$dir/second.log ;;
  at_once) serving="$dir/first.log $dir/second.log $dir/third.log" ;;
  fleet)
    # A, of two workers, is the fleet link's replica: B's first install is the version A held when B came,
    # before the trainers took it; then the versions from the one that took it, from the one plan. With
    # fleet_replica 0 (the trainers' setting) A opens no port, and B's first install is the version that took it.
    if [[ ${WB_FLEET_REPLICA:-1} == 0 ]]; then
      grep -q "take joining engines at .*\.replica" "$dir/first.log" && fail "A opened a replica's port with fleet_replica 0"
      expect_first_install "$dir/second.log" 0
    else
      expect_first_from_replica "$dir/second.log" "$dir/first.log"
    fi
    [[ $(grep -c "joined the fleet link after version" "$dir/trainers.log") == 2 ]] || fail "not two joins onto the fleet link"
    grep -q "2 engines on one plan" "$dir/trainers.log" || fail "the second join did not put both engines on one plan"
    # Every job ended: the replica's address and tensor list went with its port.
    [[ ! -e $dir/address.replica && ! -e $dir/address.replica.tensors ]] || fail "the replica's files outlived its job"
    serving="$dir/first.log $dir/second.log" ;;
  fleet_long_step)
    # Both were taken after waiting at the port past their timeout, B's first version A's copy, as in fleet.
    expect_first_from_replica "$dir/second.log" "$dir/first.log"
    [[ $(grep -c "joined the fleet link after version" "$dir/trainers.log") == 2 ]] || fail "not two joins onto the fleet link"
    serving="$dir/first.log $dir/second.log" ;;
  fleet_bad_list)
    grep -q "no copy from the replica (the trainers' connect probes again and says why): .*the tensor list in .*address.replica.tensors" \
      "$dir/second.log" || fail "B did not refuse the damaged tensor list beside the replica's address"
    grep -q "wrote version .* to a joining engine" "$dir/first.log" && fail "A wrote B a copy, though B refused its list"
    # B had made its link with A beside its probe; it said "no copy", and A let it go at once.
    grep -q "let a joining engine go without its first version (it gets the trainers' next one): its probe failed" "$dir/first.log" ||
      fail "A did not let B go on its word"
    expect_first_install "$dir/second.log" 0
    serving="$dir/first.log $dir/second.log" ;;
  fleet_slow_probe)
    [[ $(grep -c "let a joining engine go without its first version (it gets the trainers' next one): it did not finish its probe within 3 s" \
      "$dir/first.log") == 1 ]] || fail "A did not warn once that it let B go, B's probe past A's timeout"
    [[ $(grep -c "no first version from the trainers' replica engine .*the replica engine let this engine go before the copy" \
      "$dir/second.log") == 1 ]] || fail "B did not say once that the replica let it go"
    grep -q "wrote version .* to a joining engine" "$dir/first.log" && fail "A wrote B a copy after it let it go"
    expect_first_install "$dir/second.log" 0
    serving="$dir/first.log $dir/second.log" ;;
  fleet_leave)
    # A left on the fleet link: said once, not as a loss; B rejoined the link rebuilt without it and serves on.
    [[ ${rcs[0]} == 0 ]] || fail "the engine job that left failed (${rcs[0]})"
    [[ $(grep -c "left the fleet link after version" "$dir/trainers.log") == 1 ]] || fail "the trainers did not say once that A left"
    grep -q "was lost in version" "$dir/trainers.log" && fail "a leave was reported as a loss"
    grep -q "rebuilt from the survivors" "$dir/second.log" || fail "B did not rejoin the rebuilt link"
    expect_first_from_replica "$dir/second.log" "$dir/first.log"
    expect_notes_on_every_answer
    serving=$dir/second.log ;;
  fleet_join_after_stop_alone)
    # A, alone on the link and silent at C's port, was dropped (no engine left to rebuild from), named once;
    # C then started a fleet link of its own, in that send_weights; resumed, A reports kFailed and joins again.
    [[ ${rcs[0]} == 0 ]] || fail "the stopped engine job failed (${rcs[0]})"
    [[ $(grep -c "resumed: failed: .*left this engine job out of the fleet link" "$dir/first.log") == 2 ]] ||
      fail "the resumed engine's workers did not both report kFailed naming why"
    [[ $(grep -c "was dropped after version .*did not meet a joining engine's port" "$dir/trainers.log") == 1 ]] ||
      fail "not one warning naming the engine left out"
    left=$(grep -n "was dropped after version" "$dir/trainers.log" | head -1 | cut -d: -f1)
    widened=$(grep -n "joined the fleet link after version" "$dir/trainers.log" | sed -n 2p | cut -d: -f1)
    [[ -n $left && -n $widened && $left -lt $widened ]] || fail "A was not left out before C was taken"
    grep -q "replica engine at .* did not touch its address" "$dir/third.log" || fail "C did not see that the stopped replica's address went untouched"
    expect_first_install "$dir/third.log" 0
    serving="$dir/first.log $dir/third.log" ;;
  fleet_join_after_stop|fleet_join_after_kill)
    # A was silent at C's port: left out first (named once, not as a loss in an update), B rejoined the
    # rebuilt link, and only then was it widened with C, whose first install is the version that took it.
    if [[ $scenario == fleet_join_after_kill ]]; then
      [[ ${rcs[0]} != 0 ]] || fail "the killed engine job ended with 0"
      serving="$dir/second.log $dir/third.log"
    else
      [[ ${rcs[0]} == 0 ]] || fail "the stopped engine job failed (${rcs[0]})"
      [[ $(grep -c "resumed: failed: .*left this engine job out of the fleet link" "$dir/first.log") == 2 ]] ||
        fail "the resumed engine's workers did not both report kFailed naming why"
      serving="$dir/first.log $dir/second.log $dir/third.log"
    fi
    [[ $(grep -c "was left out of the fleet link" "$dir/trainers.log") == 1 ]] || fail "not one warning naming the engine left out"
    grep -q "was lost in version" "$dir/trainers.log" && fail "the engine silent between updates was reported lost in an update"
    grep -Eq "notes after a loss: 1 engine\(s\) answered, 1 silent at a joiner's port \(not waited for\), 0 silent past .*\(ended on every answer\)" \
      "$dir/trainers.log" || fail "trainer 0 waited for the silent engine's note (or not for B's)"
    left=$(grep -n "was left out of the fleet link" "$dir/trainers.log" | head -1 | cut -d: -f1)
    widened=$(grep -n "joined the fleet link after version" "$dir/trainers.log" | sed -n 3p | cut -d: -f1)
    [[ -n $left && -n $widened && $left -lt $widened ]] || fail "A was not left out before the fleet link was widened with C"
    grep -q "rebuilt from the survivors" "$dir/second.log" || fail "B did not rejoin the rebuilt link"
    # A was the fleet link's replica: C saw its address file untouched (A stopped or dead) and did not connect
    # there (a connect to a stopped job's port holds the joiner's next connect); its first version is the
    # trainers' next.
    grep -q "replica engine at .* did not touch its address" "$dir/third.log" || fail "C did not see that the stopped replica's address went untouched"
    expect_first_install "$dir/third.log" 0 ;;
  fleet_kill|fleet_kill_arriving|fleet_stop)
    # A lost mid-update on the fleet link: named once; B installed the version A was hit in (and every
    # later one, checked below), from the rebuilt link; stopped, A reports kFailed once resumed and joins again.
    if [[ $scenario == fleet_kill* ]]; then
      [[ ${rcs[0]} != 0 ]] || fail "the killed engine job ended with 0"
    else
      [[ ${rcs[0]} == 0 ]] || fail "the stopped engine job failed (${rcs[0]})"
      [[ $(grep -c "resumed: failed: " "$dir/first.log") == 2 ]] || fail "the resumed engine's workers did not both report kFailed"
    fi
    [[ $(grep -c "was lost in version" "$dir/trainers.log") == 1 ]] || fail "not one warning naming the lost engine"
    expect_notes_on_every_answer
    hit=$(sed -n 's/^trainers: the victim is hit in version \([0-9]*\)$/\1/p' "$dir/trainers.log")
    lost=$(sed -n 's/.* was lost in version \([0-9]*\);.*/\1/p' "$dir/trainers.log")
    [[ -n $hit && $lost == "$hit" ]] || fail "the victim was hit in version '$hit' but lost in version '$lost'"
    # B holds the version before (A died before its forwards) or that one (receiver staging: A dies in its
    # hook, which runs once the version arrived and was forwarded).
    held="$((hit - 1))|$hit"
    # fleet_kill_arriving: A froze before its forwards, so B mostly misses the version (4 of 5 runs here; A's
    # transfer thread may forward B's part before its main thread stops); that B then installs it, not the
    # next one, is checked on B's side (every version, in order).
    grep -Eq "rebuilt from the survivors \(holding version ($held)\)" "$dir/second.log" || fail "B did not rejoin the rebuilt link holding version $held"
    expect_first_from_replica "$dir/second.log" "$dir/first.log"
    serving=$dir/second.log
    [[ $scenario == fleet_stop ]] && serving="$dir/first.log $dir/second.log"
    ;;
  ghost)
    [[ $(grep -c "merging the leaders' link did not complete" "$dir/trainers.log") == 1 ]] || fail "no warning about the joiner that died after its answer"
    grep -q "MPI_Finalize with 1 thread(s) of WeightBridge still inside MPI, given up on: trainer 0: taking a joining engine" \
      "$dir/trainers.log" || fail "MPI_Finalize did not name trainer 0's merging thread left inside MPI"
    serving=$dir/second.log ;;
  ghost_connector)
    # The accept that paired with the dead connector failed at its mpirun's deadline, once, and the port took
    # the next join.
    [[ $(grep -c "MPI_Comm_accept failed after .*the port takes the next join" "$dir/trainers.log") == 1 ]] ||
      fail "not one warning that the accept paired with the dead connector failed"
    grep -q "no more joins are taken" "$dir/trainers.log" && fail "the trainers' port stopped taking joins"
    serving=$dir/second.log ;;
  fleet_refused)
    [[ ${rcs[0]} == 0 ]] || fail "A failed (${rcs[0]})"
    [[ $(grep -c "served version .* by the replica (1 install(s)), then failed: .*the trainers refused the secret" "$dir/second.log") == 2 ]] ||
      fail "B's workers did not both report kFailed naming the refused secret after the replica's version"
    grep -q "wrote version .* to a joining engine" "$dir/first.log" || fail "A did not write B its first version"
    [[ $(grep -c "join port: a peer was refused before any plan or weight reached it" "$dir/trainers.log") == 1 ]] ||
      fail "not one warning on the trainers naming the refused joiner"
    [[ $(grep -c "joined the fleet link after version" "$dir/trainers.log") == 1 ]] || fail "the trainers took more than A"
    grep -q "was lost in version\|was dropped after version\|left out of the fleet link" "$dir/trainers.log" && fail "A was dropped for the refused joiner"
    serving=$dir/first.log ;;
  vanish)
    [[ $(grep -c "did not answer when taken" "$dir/trainers.log") == 1 ]] || fail "no warning about the joiner that vanished"
    serving=$dir/second.log ;;
  fleet_ghost|fleet_ghost_next)
    # The joiner that died after the offer cost A nothing: A's leader said it could not meet the joiner's
    # port within the trainers' wait (one warning), so the joiner, not A, was given up on.
    grep -q "ghost joiner: answered the fleet offer (1 job(s) to meet)" "$dir/ghost.log" || fail "the ghost joiner did not answer the fleet offer"
    [[ $(grep -c "could not meet the joiner's port; the joiner is not taken" "$dir/trainers.log") == 1 ]] ||
      fail "not one warning that A could not meet the dead joiner's port"
    grep -q "left out of the fleet link\|was lost in version\|was dropped after version" "$dir/trainers.log" && fail "A was dropped for a joiner that died"
    serving=$dir/first.log
    if [[ $scenario == fleet_ghost_next ]]; then
      # The next joiner after the dead one: A's leader met its port (its connect to the dead one given up on
      # and left in MPI), and it joined onto the one plan; its first version came from A, the replica.
      expect_first_from_replica "$dir/second.log" "$dir/first.log"
      serving="$dir/first.log $dir/second.log"
    fi ;;
  kill|stop)
    [[ $(grep -c "$lost_words" "$dir/trainers.log") == 1 ]] || fail "not one warning naming the lost engine ('$lost_words')"
    hit=$(sed -n 's/^trainers: the victim is hit in version \([0-9]*\)$/\1/p' "$dir/trainers.log")
    # A per-job link names the last version the lost engine acknowledged, the fleet link the one it was lost in.
    if $fleet_link; then
      lost=$(sed -n 's/.* was lost in version \([0-9]*\);.*/\1/p' "$dir/trainers.log")
      [[ -n $hit && $lost == "$hit" ]] || fail "the victim was hit in version '$hit' but lost in version '$lost'"
    else
      dropped=$(sed -n 's/.* was dropped after version \([0-9]*\) .*/\1/p' "$dir/trainers.log")
      [[ -n $hit && $dropped == $((hit - 1)) ]] || fail "the victim was hit in version '$hit' but dropped after version '$dropped'"
    fi
    if [[ $scenario == kill ]]; then
      [[ ${rcs[0]} != 0 ]] || fail "the killed engine job ended with 0"
      serving="$dir/second.log $dir/third.log"
    else
      [[ ${rcs[0]} == 0 ]] || fail "the stopped engine job failed (${rcs[0]})"
      [[ $(grep -c "resumed: failed: " "$dir/first.log") == 2 ]] || fail "the resumed engine's workers did not both report kFailed"
      serving="$dir/first.log $dir/second.log $dir/third.log"
    fi
    # The others installed the version the victim was hit in, bit for bit (J.. in order, J before it).
    for f in $dir/second.log $dir/third.log; do
      firsts=$(first_installs "$f")
      [[ -n $firsts && $firsts -le $hit ]] || fail "$(basename "$f"): first install '$firsts', after the version the victim was hit in ($hit)"
    done ;;
esac
for rc in "${rcs[@]:1}"; do [[ $rc == 0 ]] || fail "a serving engine job failed ($rc)"; done
for f in $serving; do
  lasts=$(sed -n 's/^joined engine worker [0-9]*: .*then up to \([0-9]*\),.*/\1/p' "$f" | sort -u)
  [[ -n $last && $lasts == "$last" ]] || fail "the trainers sent up to '$last'; $(basename "$f")'s workers installed up to '$lasts'"
done
for f in "$dir"/*.log; do echo "== $(basename "$f")"; cat "$f"; done
echo "elastic $scenario ($mode): passed"
