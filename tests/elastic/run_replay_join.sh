#!/usr/bin/env bash
# wb-replay's separate-job mode: a trainer job (2 trainers and one engine of its own world) publishes its
# address and waits for one engine job, which joins it (wb-replay --engine-job, one worker). Passes when both
# jobs exit 0 and their JSON says: the engine job verified every version it installed bit for bit against its
# own load_weights, its first install is the trainers' latest version when they took it (written by their own
# engine, the replica, which the trainers sent nothing more for: their bytes for that version are those of
# the version before, with one engine), and it installed every later one to the trainers' last; the
# trainers' own engine verified all of them; the trainers list the joined engine as serving with that last
# version. With `fp8` both engines serve block FP8 (fp8=128x128 on a model whose shards the blocks tile):
# the replica's codes and scales are copied as they are, and the joined link's trainers quantize and
# exchange amaxes on it, beside the world's. With `mixed` the trainers' own engine is BF16 and the joiner
# FP8 (a mixed fleet across jobs): the replica and the joiner load different forms, so the catch-up is
# refused (a warning on both sides) and the joiner's first version is the trainers' next, which they write
# whole to it: that version's bytes are the BF16 engine's plus the FP8 form's (M of the joiner's link).
# All of that on per-job links (WB_FLEET_LINK=0). On the fleet link (fleet_link's default) the joined engine is
# no catch-up's: its first version is the trainers' next, written whole to it beside their own engine's (that
# version's bytes: the world's plus the joiner's M), in every form.
# Usage: run_replay_join.sh WB_REPLAY MPIEXEC [bf16|fp8|mixed] [MODE]
set -euo pipefail
replay=$1
mpiexec=${2:-mpirun}
form=${3:-bf16}
mode=${4:-sync}
model=(--model qwen3-30b-a3b --scale tiny --layers 2)
fp8=
own_fp8=
if [[ $form == fp8 || $form == mixed ]]; then
  model+=(--hidden 576 --experts 8 --expert-width 128 --head-dim 64)
  fp8=,fp8=128x128
  [[ $form == fp8 ]] && own_fp8=$fp8
fi
dir=$(mktemp -d)
server=
trainers=
cleanup() {
  [[ -n $trainers ]] && kill "$trainers" 2>/dev/null || true
  [[ -n $server ]] && { kill "$server" 2>/dev/null; wait "$server" 2>/dev/null; } || true
  rm -rf "$dir"
}
trap cleanup EXIT
fail() { for f in "$dir"/*.log; do echo "== $f"; cat "$f"; done; echo "$@"; exit 1; }
ompi-server --no-daemonize --report-uri "$dir/uri" &
server=$!
for _ in $(seq 100); do [[ -s $dir/uri ]] && break; sleep 0.1; done
[[ -s $dir/uri ]] || { echo "ompi-server wrote no URI"; exit 1; }
run() {  # NAME RANKS ARGS...
  local name=$1 ranks=$2
  shift 2
  timeout 100 "$mpiexec" --oversubscribe --ompi-server "file:$dir/uri" --mca pmix_server_max_wait 5 --mca btl_tcp_progress_thread 1 -np "$ranks" "$replay" "${model[@]}" --mode "$mode" \
    --join-address "$dir/address" --json "$dir/$name.json" "$@" >"$dir/$name.log" 2>&1
}
run trainers 3 --trainer tp=2 --rollout "engines=1,tp=1$own_fp8" --joiners 1 --steps 3 --step-ms 20 &
trainers=$!
for _ in $(seq 600); do [[ -s $dir/address ]] && break; kill -0 "$trainers" 2>/dev/null || break; sleep 0.1; done
[[ -s $dir/address ]] || fail "the trainers published no address"
engine_rc=0
run engine 1 --engine-job --rollout "tp=1$fp8" --engine-name joiner --step-ms 2 || engine_rc=$?
trainers_rc=0
wait "$trainers" || trainers_rc=$?
trainers=
[[ $trainers_rc == 0 && $engine_rc == 0 ]] || fail "the trainer job ended with $trainers_rc, the engine job with $engine_rc"
[[ ${WB_FLEET_LINK:-1} == 0 ]] && fleet_link=0 || fleet_link=1
/usr/bin/python3 - "$dir" "$form" "$fleet_link" <<'PY' || fail "the JSON does not say so"
import json, re, sys
d = sys.argv[1]
fleet_link = sys.argv[3] == "1"
t, e = json.load(open(d + "/trainers.json")), json.load(open(d + "/engine.json"))
last = t["join"]["sends"][-1]["version"]
joined = [x for x in t["join"]["engines"] if x["name"].startswith("joined engine")]
assert t["verified"] and len(joined) == 1 and joined[0]["state"] == "serving" and joined[0]["installed"] == last, (t["verified"], joined, last)
taken = int(re.search(r"after version (\d+)", joined[0]["name"]).group(1))
v = e["installed"]
assert e["verified"] and e["failures"] == [] and e["verified_versions"] == len(v), e
moved = {s["version"]: s["bytes_moved"] for s in t["steps"]}
assert ("on the fleet link" in joined[0]["name"]) == fleet_link, joined
if fleet_link:
    # The trainers' next version its first, written whole to it (its own form's bytes) beside their engine's.
    assert v == list(range(taken + 1, last + 1)), (v, taken, last)
    assert moved[taken + 1] == moved[taken] + e["model_bytes"], (taken, moved, e)
    if taken > 1:
        assert moved[taken] == moved[taken - 1], (taken, moved)
elif sys.argv[2] == "mixed":
    # No catch-up between forms: the trainers' next version is its first, written whole by the trainers in
    # its own form (the FP8 form's bytes, e["fp8"]) beside their own BF16 engine's.
    assert v == list(range(taken + 1, last + 1)), (v, taken, last)
    assert e["model_bytes"] == e["fp8_form_bytes"] < t["checkpoint_bytes"], e
    assert moved[taken] == t["checkpoint_bytes"] and moved[taken + 1] == moved[taken] + e["model_bytes"], (taken, moved, e)
else:
    # Its first version is the trainers' latest when they took it, written by their own engine (the replica),
    # in either form: the trainers wrote it once, to their own engine (as the version before), and the next
    # one to both engines.
    assert v == list(range(taken, last + 1)), (v, taken, last)
    if taken > 1:
        assert moved[taken] == moved[taken - 1] and moved[taken + 1] == 2 * moved[taken], (taken, moved)
assert t["join"]["join_versions"] + 3 == last, t["join"]
print("engine job: versions %d..%d, every one bit for bit; the trainers' engine: %d versions" % (v[0], v[-1], last))
PY
if [[ $form == mixed && $fleet_link == 0 ]]; then
  grep -q "load different forms" "$dir/trainers.log" || fail "the trainer job's replica did not say the forms differ"
  grep -q "load different forms" "$dir/engine.log" || fail "the engine job did not say the forms differ"
fi
grep -h "verified bit for bit\|wb-replay summary" "$dir"/*.log
echo "replay join ($form, $mode): passed"
