#!/usr/bin/env python3
"""The demo's table: one row per wb-replay run (JSON files from scripts/demo.sh), what a newcomer reads.

  demo_table.py replay-sync.json replay-sender-staged.json ...
"""
import json
import sys


def transports(network):
    """'cma' or 'libfabric between hosts, cma within': the transports that carried bytes."""
    between = [name for name, b in sorted(network.get("between_machines_bytes_by_transport", {}).items()) if b > 0]
    within = [name for name, b in sorted(network.get("within_machine_bytes_by_transport", {}).items()) if b > 0]
    if between:
        return "+".join(between) + " between hosts" + (", " + "+".join(within) + " within" if within else "")
    return "+".join(within) or "-"


def main(paths):
    rows, single_host, failed = [], None, False
    for path in paths:
        try:
            with open(path) as f:
                run = json.load(f)
        except (OSError, ValueError) as error:
            rows.append([path, "NO RESULT", "", "", "", "", str(error)])
            failed = True
            continue
        done = [s for s in run["steps"] if s.get("completed")]
        mean = lambda key: sum(s[key] for s in done) / max(len(done), 1)  # noqa: E731
        between = run.get("between_hosts", False)
        ratio = "%.2f" % (mean("ewtt_s") / run["t_min_s"]) if between and run["t_min_s"] > 0 else "-"
        rows.append([run["mode"], "yes" if run["verified"] else "NO", "%d/%d" % (len(done), len(run["steps"])),
                     "%.2f" % (1e3 * mean("ewtt_s")), "%.2f" % (1e3 * mean("agst_s")),
                     "%.2f MiB" % (sum(s["bytes_moved"] for s in done) / max(len(done), 1) / 2**20), ratio,
                     transports(run["network"])])
        failed = failed or not run["verified"]
        if not between:
            single_host = run
    header = ["mode", "verified", "versions", "EWTT [ms]", "AGST [ms]", "moved/version", "EWTT/T_min", "transport"]
    widths = [max(len(str(r[i])) for r in rows + [header]) for i in range(len(header))]
    for row in [header] + rows:
        print("  ".join(str(cell).ljust(w) for cell, w in zip(row, widths)).rstrip())
    if single_host is not None:
        print("EWTT/T_min: none on one host. T_min (%.3f ms) is the bound for nodes with %g GB/s links (WB_NODE_GBPS);\n"
              "here every write is a same-machine copy, which no such link limits. scripts/bench-compare.sh\n"
              "measures against T_min on an emulated cluster with shaped links."
              % (1e3 * single_host["t_min_s"], single_host["node_gbps"]))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
