#!/usr/bin/env bash
# The demo as a newcomer runs it (scripts/demo.sh), on the programs of this build, 2 versions per mode: it
# exits 0, its table shows every mode verified with every version installed over the machine's own
# transport and no ratio to T_min on one host, and each mode's JSON file exists, parses and says verified.
#   run_demo.sh DEMO_SH BUILD_DIR OUT
set -euo pipefail
demo=$1 build=$2 out=$3
steps=2
rm -rf "$out" && mkdir -p "$out"
status=0
WB_BUILD_DIR=$build WB_DEMO_DIR=$out WB_DEMO_SKIP_BUILD=1 WB_DEMO_STEPS=$steps bash "$demo" >"$out/demo.out" 2>&1 || status=$?
cat "$out/demo.out"
if [[ $status -ne 0 ]]; then
  echo "run_demo: scripts/demo.sh exited $status"
  exit 1
fi
/usr/bin/env python3 - "$out" "$steps" <<'PY'
import json, os, re, sys
out, steps = sys.argv[1], int(sys.argv[2])
modes = ["sync", "sender-staged", "receiver-staged", "async"]
lines = open(os.path.join(out, "demo.out")).read().splitlines()
header = next(i for i, line in enumerate(lines) if line.startswith("mode ") and "verified" in line)
columns = re.split(r"\s{2,}", lines[header])
assert columns == ["mode", "verified", "versions", "EWTT [ms]", "AGST [ms]", "moved/version", "EWTT/T_min", "transport"], columns
rows = [dict(zip(columns, re.split(r"\s{2,}", line))) for line in lines[header + 1:header + 1 + len(modes)]]
assert [r["mode"] for r in rows] == modes, rows
for r in rows:
    assert r["verified"] == "yes", r
    assert r["versions"] == "%d/%d" % (steps, steps), r
    assert float(r["EWTT [ms]"]) > 0 and float(r["AGST [ms]"]) >= 0, r
    assert r["moved/version"].endswith(" MiB") and float(r["moved/version"].split()[0]) > 0, r
    assert r["EWTT/T_min"] == "-" and r["transport"] == "cma", r
assert lines[header + 1 + len(modes)].startswith("EWTT/T_min: none on one host."), lines[header + 1 + len(modes)]
assert lines[-1] == "demo: every rollout worker verified every version in all four modes", lines[-1]
json.load(open(os.path.join(out, "mkckpt.json")))
for mode in modes:
    run = json.load(open(os.path.join(out, "replay-%s.json" % mode)))
    assert run["mode"] == mode and run["verified"] is True and run["between_hosts"] is False, (mode, run["verified"])
    assert len(run["steps"]) == steps and all(s["completed"] for s in run["steps"]), (mode, run["steps"])
    assert os.path.getsize(os.path.join(out, "replay-%s.log" % mode)) > 0, mode
print("run_demo: OK, %d modes verified, %d versions each" % (len(modes), steps))
PY
