#!/usr/bin/python3
"""Figures from WeightBridge's measurements (matplotlib; run with the interpreter that has it, /usr/bin/python3
on Debian).

  plot_bench.py --summary OUT/summary.json --out DIR     wb-bench runs of scripts/bench-compare.sh:
      bench_<layout>.png   AGST and EWTT per method, each labelled with its ratio to WeightBridge
      bench_sweep.png      EWTT and AGST against rollout replicas (1 trainer host, n rollout hosts), with T_min
  plot_bench.py --bench FILE.json [...] --out DIR         the same from wb-bench JSON files given one by one
  plot_bench.py --plan FILE.json [...] --out DIR          wb-plan --json of several deployments:
      plan_presets.png     simulated EWTT over T_min per deployment and strategy
"""
import argparse
import json
import os
import re
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

# One colour per method, the same in every figure: each WeightBridge mode its own shade of blue, the
# baselines their own; a method not named here gets the next colour of the palette, never a shared one.
COLORS = {
    "weightbridge-sync": "#1f77b4",
    "weightbridge-sender-staged": "#17becf",
    "weightbridge-receiver-staged": "#9467bd",
    "weightbridge-async": "#08306b",
    "weightbridge": "#1f77b4",
    "broadcast": "#ff7f0e",
    "ring-broadcast": "#d62728",
    "p2p": "#2ca02c",
}
_PALETTE = ["#8c564b", "#e377c2", "#bcbd22", "#7f7f7f", "#aec7e8", "#ffbb78", "#98df8a"]
_assigned = {}


def color_of(method):
    if method in COLORS:
        return COLORS[method]
    if method not in _assigned:
        _assigned[method] = _PALETTE[len(_assigned) % len(_PALETTE)]
    return _assigned[method]


def bench_bars(name, run, out):
    methods = run["methods"]
    labels = [m["method"] for m in methods]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, key, title, ratio in ((axes[0], "agst_median_s", "AGST", "agst_over_weightbridge"),
                                  (axes[1], "ewtt_median_s", "EWTT", "ewtt_over_weightbridge")):
        values = [m[key] for m in methods]
        bars = ax.bar(labels, values, color=[color_of(l) for l in labels])
        for bar, m in zip(bars, methods):
            ax.annotate("%.2fx" % m[ratio], (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                        ha="center", va="bottom", fontsize=9)
        if key == "ewtt_median_s" and run.get("t_min_s"):
            ax.axhline(run["t_min_s"], color="black", linestyle="--", linewidth=1, label="T_min")
            ax.legend()
        ax.set_title("%s (median of %d)" % (title, run.get("reps", 0)))
        ax.set_ylabel("seconds")
        ax.tick_params(axis="x", rotation=20)
    fig.suptitle("%s: %s -> %s, %d machines, %.3g GB/s per node" %
                 (name, run["trainer"], run["rollout"], run["machines"], run["node_gbps"]))
    fig.tight_layout()
    path = os.path.join(out, "bench_%s.png" % name)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def bench_sweep(runs, out):
    points = sorted((int(re.search(r"(\d+)$", name).group(1)), run) for name, run in runs.items())
    if not points:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    methods = [m["method"] for m in points[0][1]["methods"]]
    for ax, key, title in ((axes[0], "ewtt_median_s", "EWTT"), (axes[1], "agst_median_s", "AGST")):
        for method in methods:
            xs, ys = [], []
            for n, run in points:
                for m in run["methods"]:
                    if m["method"] == method:
                        xs.append(n)
                        ys.append(m[key])
            ax.plot(xs, ys, marker="o", label=method, color=color_of(method))
        if key == "ewtt_median_s":
            ax.plot([n for n, _ in points], [run["t_min_s"] for _, run in points], "k--", label="T_min")
        ax.set_xlabel("rollout replicas (one host each)")
        ax.set_ylabel("seconds")
        ax.set_title(title)
        ax.set_xticks([n for n, _ in points])
        ax.legend()
    fig.suptitle("replica sweep: one trainer host, %.3g GB/s per node" % points[0][1]["node_gbps"])
    fig.tight_layout()
    path = os.path.join(out, "bench_sweep.png")
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plan_presets(plans, out):
    fig, ax = plt.subplots(figsize=(10, 4))
    names = []
    strategies = ["weightbridge", "broadcast", "p2p"]
    width = 0.25
    for i, (name, plan) in enumerate(plans):
        names.append(name)
        for j, strategy in enumerate(strategies):
            entry = plan.get("strategies", {}).get(strategy)
            if entry is None:
                continue
            value = entry["sim_ewtt_over_t_min"]
            bar = ax.bar(i + (j - 1) * width, value, width, color=color_of(strategy), label=strategy if i == 0 else None)
            ax.annotate("%.2f" % value, (bar[0].get_x() + width / 2, value), ha="center", va="bottom", fontsize=8)
    ax.axhline(1.0, color="black", linestyle="--", linewidth=1)
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels(names, rotation=15)
    ax.set_ylabel("simulated EWTT / T_min")
    ax.set_title("the plans on the network model (wb-plan)")
    ax.legend()
    fig.tight_layout()
    path = os.path.join(out, "plan_presets.png")
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--summary", help="summary.json of scripts/bench-compare.sh")
    parser.add_argument("--bench", nargs="*", default=[], help="wb-bench --json files")
    parser.add_argument("--plan", nargs="*", default=[], help="wb-plan --json files")
    parser.add_argument("--out", required=True, help="directory for the PNG files")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    runs = {}
    if args.summary:
        runs.update(json.load(open(args.summary))["runs"])
    for path in args.bench:
        runs[os.path.splitext(os.path.basename(path))[0]] = json.load(open(path))
    written = []
    sweep = {name: run for name, run in runs.items() if re.match(r"sweep_\d+$", name)}
    for name, run in sorted(runs.items()):
        if name not in sweep:
            written.append(bench_bars(name, run, args.out))
    if sweep:
        written.append(bench_sweep(sweep, args.out))
    if args.plan:
        plans = [(os.path.splitext(os.path.basename(p))[0], json.load(open(p))) for p in args.plan]
        written.append(plan_presets(plans, args.out))
    if not written:
        sys.exit("plot_bench.py: nothing to plot (give --summary, --bench or --plan)")
    for path in written:
        if path:
            print("plot_bench.py: wrote", path)


if __name__ == "__main__":
    main()
