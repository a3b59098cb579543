#!/usr/bin/env bash
# wb-bench on one machine (6 ranks): every method verified, the JSON complete, and plotted.
#   run_wb_bench.sh WB_BENCH PLOT_SCRIPT OUT MPIEXEC NP_FLAG RANKS CHECK_TRACE
set -euo pipefail
bench=$1 plot=$2 out=$3 mpiexec=$4 np=$5 ranks=$6 check_trace=$7
rm -rf "$out" && mkdir -p "$out"
"$mpiexec" "$np" "$ranks" "$bench" --model qwen3-30b-a3b --scale tiny --trainer tp=1,ep=2,dp=2 \
  --rollout engines=2,tp=2,ep=2 --gpus-per-node 2 --modes sync,async --reps 2 --warmup 1 --ring-segment-kib 333 \
  --json "$out/bench.json" --csv "$out/bench.csv" --trace "$out/trace.json"
/usr/bin/env python3 - "$out/bench.json" "$out/bench.csv" <<'PY'
import csv, json, sys
r = json.load(open(sys.argv[1]))
names = [m["method"] for m in r["methods"]]
assert r["verified"], "not verified"
assert names == ["weightbridge-sync", "weightbridge-async", "broadcast", "ring-broadcast", "p2p"], names
for m in r["methods"]:
    assert m["verified"], m["method"]
    assert len(m["ewtt_s"]) == 2 and all(e > 0 for e in m["ewtt_s"]), m
    assert m["within_machine_bytes"] > 0 and m["between_machines_bytes"] == 0, m
# Every rollout worker receives the whole model from the broadcast: 4 workers x M at least.
bc = next(m for m in r["methods"] if m["method"] == "broadcast")
assert bc["within_machine_bytes"] >= 4 * r["model_bytes"], (bc["within_machine_bytes"], r["model_bytes"])
# The ring passes the whole model down a chain of the head and the 4 workers: 4 hops, each the whole model
# once, as many bytes as the plain broadcast hands its 4 receivers (the gather to the head alike).
ring = next(m for m in r["methods"] if m["method"] == "ring-broadcast")
assert ring["within_machine_bytes"] == bc["within_machine_bytes"], (ring, bc)
assert r["strongest_broadcast"]["method"] in ("broadcast", "ring-broadcast"), r["strongest_broadcast"]
rows = list(csv.DictReader(open(sys.argv[2])))
assert [row["method"] for row in rows] == names, rows
print("run_wb_bench: OK,", ", ".join("%s %.3f s" % (m["method"], m["ewtt_median_s"]) for m in r["methods"]))
PY
# 3 updates per method (warm-up included), each method's interval on every rank.
python3 "$check_trace" "$out/trace.json" "$ranks" 3 --methods weightbridge-sync,weightbridge-async,broadcast,ring-broadcast,p2p
if /usr/bin/python3 -c "import matplotlib" 2>/dev/null; then
  /usr/bin/python3 "$plot" --bench "$out/bench.json" --out "$out"
  head -c 8 "$out/bench_bench.png" | od -An -c | grep -q "P   N   G" || { echo "run_wb_bench: $out/bench_bench.png is not a PNG"; exit 1; }
else
  echo "run_wb_bench: python3-matplotlib missing: plot not checked"
fi
