#!/usr/bin/env bash
# WeightBridge against the paper's two baselines (broadcast, P2P) and the broadcast NCCL runs (ring-broadcast), measured on an emulated cluster with
# shaped links (scripts/cluster.sh; needs root): the network, not this machine's cores, is the bottleneck.
# Runs wb-bench on
#   two_rollout_hosts     1 trainer host -> 2 rollout hosts, one engine each (the paper's Figure 11 shape)
#   engine_across_hosts   1 trainer host -> one engine spread over 2 hosts (a host needs part of the model)
#   sweep_N               1 trainer host -> N rollout hosts, one replica each, N = 1..SWEEP (Figure 12)
# and writes every wb-bench JSON, a summary JSON, a table (summary.md) and the plots (scripts/plot_bench.py) under OUT.
#
#   sudo bash scripts/bench-compare.sh [--rate 1gbit] [--mtu 4096] [--reps 3] [--sweep 4] [--modes sync] [--out DIR]
#
# --mtu: the links' MTU (scripts/cluster.sh, "Framing"). 4096 by default, so that a link frames like the
# RDMA fabric of a GPU job (RoCEv2 at its 4096-byte MTU keeps 98.4 % of the rate for payload, as TCP does
# here at 4096; at Ethernet's 1500 TCP keeps 95.7 %, and every host's cores handle 2.7 x the packets, work
# an RDMA NIC does in hardware). --mtu 1500 gives the figures of 2026-12-05 and before.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
rate=1gbit mtu=4096 reps=3 sweep=4 modes=sync out="" build=${WB_BUILD_DIR:-$root/build} only=""
while [[ $# -gt 0 ]]; do
  case $1 in
    --rate) rate=$2; shift 2 ;;
    --mtu) mtu=$2; shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    --sweep) sweep=$2; shift 2 ;;
    --modes) modes=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --only) only=$2; shift 2 ;;  # run one layout: two_rollout_hosts, engine_across_hosts or sweep
    *) echo "bench-compare.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
out=${out:-$build/bench-compare}
bench=$build/apps/wb-bench
[[ -x $bench ]] || { echo "bench-compare.sh: $bench not built (bash scripts/build.sh)" >&2; exit 2; }
[[ $(id -u) -eq 0 ]] || { echo "bench-compare.sh: needs root for the emulated cluster" >&2; exit 2; }
gbps=$(/usr/bin/env python3 -c "
import re, sys
m = re.fullmatch(r'([0-9.]+)([kmg]?)bit', sys.argv[1].lower())
if not m: sys.exit('bench-compare.sh: rate %r is not like 1gbit or 500mbit' % sys.argv[1])
print(float(m.group(1)) * {'': 1, 'k': 1e3, 'm': 1e6, 'g': 1e9}[m.group(2)] / 8e9)" "$rate")

# WB_CLUSTER_NAME / WB_CLUSTER_SUBNET name a cluster of your own beside others' (default wbcmp).
export WB_CLUSTER_NAME=${WB_CLUSTER_NAME:-wbcmp} OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
cluster=$root/scripts/cluster.sh
trap 'bash "$cluster" down' EXIT
hosts=$((sweep + 1))
[[ $hosts -ge 3 ]] || hosts=3
bash "$cluster" up "$hosts" --rate "$rate" --mtu "$mtu"
mkdir -p "$out"

# About 200 MB of bf16: Qwen3-30B-A3B's architecture, widened.
model=(--model qwen3-30b-a3b --scale tiny --hidden 1024 --experts 32 --expert-width 256 --layers 4)
run() {  # NAME RANKS ARGS...
  local name=$1 ranks=$2
  shift 2
  echo "bench-compare.sh: $name ($ranks ranks)"
  WB_CLUSTER_SLOTS=2 bash "$cluster" mpirun -np "$ranks" --oversubscribe "$bench" "${model[@]}" --gpus-per-node 2 \
    --modes "$modes" --reps "$reps" --warmup 1 --node-gbps "$gbps" --json "$out/$name.json" --csv "$out/$name.csv" "$@" \
    >"$out/$name.log" 2>&1 || { echo "bench-compare.sh: $name failed (see $out/$name.log)" >&2; tail -5 "$out/$name.log" >&2; exit 1; }
  grep -v '^{' "$out/$name.log" | tail -n 8
}
if [[ -z $only || $only == two_rollout_hosts ]]; then
  run two_rollout_hosts 6 --trainer tp=1,ep=2,dp=2 --rollout engines=2,tp=2,ep=2
fi
if [[ -z $only || $only == engine_across_hosts ]]; then
  run engine_across_hosts 6 --trainer tp=1,ep=2,dp=2 --rollout engines=1,tp=4,ep=4
fi
if [[ -z $only || $only == sweep ]]; then
  for ((n = 1; n <= sweep; ++n)); do
    run "sweep_$n" $((2 + 2 * n)) --trainer tp=1,ep=2,dp=2 --rollout "engines=$n,tp=2,ep=2"
  done
fi

/usr/bin/env python3 - "$out" "$rate" "$mtu" <<'PY'
import glob, json, os, sys
out, rate, mtu = sys.argv[1], sys.argv[2], int(sys.argv[3])
runs = {os.path.basename(p)[:-5]: json.load(open(p)) for p in sorted(glob.glob(os.path.join(out, "*.json"))) if not p.endswith("summary.json")}
json.dump({"rate": rate, "mtu": mtu, "runs": runs}, open(os.path.join(out, "summary.json"), "w"), indent=2)
# One table: per layout, each method's median EWTT, its ratio to T_min, its spread (max/min over the
# repetitions), and every WeightBridge mode against the stronger of the two broadcasts and P2P.
lines = ["| layout | T_min | method | EWTT median | x T_min | min-max | spread | vs stronger broadcast | vs P2P |", "|---|---|---|---|---|---|---|---|---|"]
for name, r in sorted(runs.items()):
    by = {m["method"]: m for m in r["methods"]}
    best = r.get("strongest_broadcast") or {}
    p2p = by.get("p2p", {}).get("ewtt_median_s")
    for m in r["methods"]:
        e, lo, hi = m["ewtt_median_s"], m["ewtt_min_s"], m["ewtt_max_s"]
        wb = m["method"].startswith("weightbridge")
        vs_b = "%.2f x (%s)" % (e / best["ewtt_median_s"], best["method"]) if wb and best else ""
        vs_p = "%.2f x" % (e / p2p) if wb and p2p else ""
        lines.append("| %s | %.3f s | %s | %.3f s | %.2f | %.2f-%.2f | %.2f | %s | %s |" % (
            name, r["t_min_s"], m["method"], e, e / r["t_min_s"], lo, hi, hi / lo if lo > 0 else 0, vs_b, vs_p))
open(os.path.join(out, "summary.md"), "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
print("bench-compare.sh: summary in", os.path.join(out, "summary.json"), "and summary.md")
PY
if /usr/bin/python3 -c "import matplotlib" 2>/dev/null; then
  /usr/bin/python3 "$root/scripts/plot_bench.py" --summary "$out/summary.json" --out "$out"
else
  echo "bench-compare.sh: matplotlib missing (apt-get install python3-matplotlib): no plots"
fi
