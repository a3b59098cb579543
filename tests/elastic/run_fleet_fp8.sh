#!/usr/bin/env bash
# FP8 engines on the fleet link (issue 31 with issue 32's engines): scripts/elastic-bench.sh with --fp8 on
# one machine. Three engine jobs of block-FP8 engines join a trainer job with no engine of its own, all on
# one fleet link; A is SIGKILLed in an update; the trainers rebuild the link from B and C and re-send the
# version (quantized again from their parameters, or from the old link's staging). Passes when both
# survivors verified every version they installed bit for bit against their own load_weights of the FP8
# form, installed every version from their first to the trainers' last, B's and C's first versions came from
# the fleet's replica, the trainers list A dropped and B, C serving at the last version, and a counted update
# lost A (the loss came inside the measured updates), with sender staging answered behind send_weights (the
# fleet link's thread rebuilt it and re-sent the version at once). More ARGS go to elastic-bench.sh: with --kill-at MS
# A is killed that far into an update, wherever it is (the check then wants A's kill measured at least that
# far into one), and with --knock-at MS B and C join at least that far into one.
# Usage: run_fleet_fp8.sh MODE [ARGS...]
set -euo pipefail
mode=${1:-sync}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
export WB_DEMO_SKIP_BUILD=1 WB_OUT_DIR=$dir
export WB_MODEL_ARGS="--model qwen3-30b-a3b --scale tiny --hidden 512 --head-dim 128 --experts 8 --expert-width 256 --layers 2"
export WB_BENCH_ARGS="--fleet-link 1"
status=0
bash "$root/scripts/elastic-bench.sh" --mode "$mode" --steps 6 --fp8 128x128 "${@:2}" >"$dir/bench.log" 2>&1 || status=$?
/usr/bin/python3 - "$dir/elastic-bench.json" "${@:2}" <<'PY' || status=1
import json, sys
j = json.load(open(sys.argv[1]))
args = sys.argv[2:]
last = j["versions_sent"]
states = {e["name"].split(" on ")[0]: (e["state"], e["installed"]) for e in j["engines"]}
assert j["verified"], "a survivor missed a version or installed one that is not its own load_weights of it"
assert states.get("joined engine 0", ("", 0))[0] == "dropped", states
for name in ("joined engine 1", "joined engine 2"):
    assert states.get(name) == ("serving", last), (name, states, last)
for join in j["joins"][1:]:
    assert join["verified"] and join["every_version_to_the_last"] and join["installed_last"] == last, join
    # B's and C's first versions are the replica's copy (A, then B or A), the trainers' egress unchanged: a
    # joiner at the replica's port goes before the trainers' next update (back to back here, FP8 costing).
    assert join["first_version_from_replica"], join
assert "version" in j["kill"], j["kill"]
# With sender staging the loss is answered on the fleet link's thread, behind send_weights: the survivors
# get the version at once, not a training step later.
if j["mode"] in ("sender-staged", "async"):
    assert j["kill"]["rebuilt_behind_send_weights"], j["kill"]
if "--kill-at" in args:
    assert j["kill"]["placed_into_update_s"] >= float(args[args.index("--kill-at") + 1]) / 1e3, j["kill"]
if "--knock-at" in args:
    for join in j["joins"][1:]:
        assert join["join_placed"]["into_update_s"] >= float(args[args.index("--knock-at") + 1]) / 1e3, join
print("fleet FP8 %s: A dropped in version %d, B and C installed every version to %d bit for bit" % (j["mode"], j["kill"]["version"], last))
PY
if [[ $status != 0 ]]; then
  for f in "$dir"/*.log; do echo "== $f"; tail -n 30 "$f"; done
  exit 1
fi
