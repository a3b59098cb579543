#!/usr/bin/env bash
# Measured EWTT against the lower bound on a shaped network: an emulated cluster (scripts/cluster.sh) whose
# links are shaped so that the network, not this machine's cores, is the bottleneck, and wb-replay over
# libfabric on layouts where T_min is about a second or more. Writes one wb-replay JSON per run and a
# summary JSON (EWTT / T_min per layout and mode) under OUT; prints a table. Needs root (namespaces).
#
#   bash scripts/bench-network.sh [--rate 1gbit] [--mtu 4096] [--steps 5] [--modes "sync"] [--out DIR] [--build DIR]
#
# --mtu: the links' MTU, 4096 by default as in scripts/bench-compare.sh (which says why).
#
# Layouts (qwen3-30b-a3b, the tiny architecture widened to hidden 1024, 32 experts of width 256, 4 layers:
# about 200 MB of bf16):
#   two_rollout_hosts     1 trainer host (EP with DP replicas) -> 2 rollout hosts, one engine each: every
#                         rollout host needs the whole model (receive + external exchange)
#   engine_across_hosts   1 trainer host -> one engine with TP 4 over 2 hosts: each host needs part of it
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
rate=1gbit mtu=4096 steps=5 modes="sync" out="" build=${WB_BUILD_DIR:-$root/build}
while [[ $# -gt 0 ]]; do
  case $1 in
    --rate) rate=$2; shift 2 ;;
    --mtu) mtu=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --modes) modes=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    *) echo "bench-network.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
out=${out:-$build/bench-network}
replay=$build/apps/wb-replay
[[ -x $replay ]] || { echo "bench-network.sh: $replay not built (bash scripts/build.sh)" >&2; exit 2; }
[[ $(id -u) -eq 0 ]] || { echo "bench-network.sh: needs root for the emulated cluster" >&2; exit 2; }

# GB/s per node each way for T_min, from the tc rate.
gbps=$(/usr/bin/env python3 - "$rate" <<'PY'
import re, sys
m = re.fullmatch(r"([0-9.]+)([kmg]?)(bit|bps)", sys.argv[1].lower())
if not m: sys.exit("bench-network.sh: rate %r is not like 1gbit, 500mbit or 100mbps" % sys.argv[1])
value = float(m.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[m.group(2)]
print(value / 8e9 if m.group(3) == "bit" else value / 1e9)
PY
)

export WB_CLUSTER_NAME=wbbench OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
cluster=$root/scripts/cluster.sh
trap 'bash "$cluster" down' EXIT
bash "$cluster" up 3 --rate "$rate" --mtu "$mtu"
mkdir -p "$out"

model=(--model qwen3-30b-a3b --scale tiny --hidden 1024 --experts 32 --expert-width 256 --layers 4)
declare -A layouts=(
  [two_rollout_hosts]="--trainer tp=1,ep=2,dp=2 --rollout engines=2,tp=2,ep=2"
  [engine_across_hosts]="--trainer tp=1,ep=2,dp=2 --rollout engines=1,tp=4,ep=4"
)
declare -A ranks=([two_rollout_hosts]=6 [engine_across_hosts]=6)
results=()
for layout in two_rollout_hosts engine_across_hosts; do
  for mode in $modes; do
    json=$out/$layout.$mode.json
    # shellcheck disable=SC2086
    WB_CLUSTER_SLOTS=2 bash "$cluster" mpirun -np "${ranks[$layout]}" --oversubscribe "$replay" "${model[@]}" \
      ${layouts[$layout]} --gpus-per-node 2 --mode "$mode" --steps "$steps" --step-ms 0 --node-gbps "$gbps" \
      --json "$json" >"$out/$layout.$mode.log" 2>&1 || { echo "bench-network.sh: $layout $mode failed (see $out/$layout.$mode.log)" >&2; exit 1; }
    results+=("$json")
  done
done

/usr/bin/env python3 - "$out/summary.json" "$rate" "$gbps" "${results[@]}" <<'PY'
import json, statistics, sys
summary_path, rate, gbps, paths = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4:]
rows = []
for path in paths:
    r = json.load(open(path))
    # The first version warms up connections and caches; the figures are the rest.
    steps = r["steps"][1:] or r["steps"]
    ewtt = [s["ewtt_s"] for s in steps]
    agst = [s["agst_s"] for s in steps]
    layout = path.rsplit("/", 1)[-1].split(".")[0]
    rows.append({
        "layout": layout, "mode": r["mode"], "verified": r["verified"], "rate": rate, "node_gbps": gbps,
        "model_bytes": r["model_bytes"], "max_node_need_bytes": r["max_node_need_bytes"], "t_min_s": r["t_min_s"],
        "simulated_ewtt_s": r["simulated_ewtt_s"], "rounds": r["rounds"],
        "ewtt_s": ewtt, "ewtt_median_s": statistics.median(ewtt), "agst_median_s": statistics.median(agst),
        "ewtt_over_t_min": statistics.median(ewtt) / r["t_min_s"],
        "network_matches_plan": r["network"]["matches_plan"], "hosts": r["network"]["hosts"],
    })
json.dump({"rate": rate, "node_gbps": gbps, "runs": rows}, open(summary_path, "w"), indent=2)
print("%-22s %-16s %9s %10s %10s %12s %10s %9s" % ("layout", "mode", "M [MB]", "T_min [s]", "EWTT [s]", "EWTT/T_min", "AGST [s]", "verified"))
for row in rows:
    print("%-22s %-16s %9.1f %10.3f %10.3f %12.3f %10.3f %9s" % (row["layout"], row["mode"], row["model_bytes"] / 1e6, row["t_min_s"],
          row["ewtt_median_s"], row["ewtt_over_t_min"], row["agst_median_s"], row["verified"] and row["network_matches_plan"]))
print("summary: " + summary_path)
PY
