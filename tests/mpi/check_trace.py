#!/usr/bin/env python3
"""Checks a Chrome trace-event file written by wb-replay / wb-bench --trace.

  check_trace.py TRACE RANKS VERSIONS [--rounds N] [--methods m1,m2,...]

Structure: a JSON object with a traceEvents list; every event has ph, pid and name; complete events (ph X)
have ts >= 0 and dur >= 0 and known categories; one process_name per rank; slices on one thread never
overlap (Perfetto needs them nested). Content: the rollouts (ranks named "engine ...") have stalls for every
version; each rollout assembles the same rounds in every version, and together they assemble every round
(all N with --rounds, else every round any span names); some rank packs. With --methods, each method has
a stall on every rank.
"""
import collections
import json
import sys


def fail(message):
    print("check_trace: " + message)
    sys.exit(1)


def main():
    args = sys.argv[1:]
    path, ranks, versions = args[0], int(args[1]), int(args[2])
    rounds, methods = None, []
    for i, a in enumerate(args):
        if a == "--rounds":
            rounds = int(args[i + 1])
        if a == "--methods":
            methods = args[i + 1].split(",")
    doc = json.load(open(path))
    events = doc.get("traceEvents")
    if not isinstance(events, list) or not events:
        fail("no traceEvents list")
    kinds = {"pack", "credit wait", "write", "forward", "assemble", "stall"}
    names = {}
    slices = collections.defaultdict(list)
    spans = collections.defaultdict(set)  # (pid, kind) -> {(version, round)}
    stall_methods = collections.defaultdict(set)
    for e in events:
        for key in ("ph", "pid", "name"):
            if key not in e:
                fail("event without %s: %r" % (key, e))
        if e["ph"] == "M":
            if e["name"] == "process_name":
                names[e["pid"]] = e["args"]["name"]
            continue
        if e["ph"] != "X":
            fail("unexpected phase %r" % e)
        if e.get("cat") not in kinds:
            fail("unknown category %r" % e)
        if e["ts"] < 0 or e["dur"] < 0:
            fail("negative time %r" % e)
        if not 0 <= e["pid"] < ranks:
            fail("pid out of range %r" % e)
        slices[(e["pid"], e["tid"])].append((e["ts"], e["ts"] + e["dur"]))
        a = e["args"]
        if e["cat"] == "stall":
            spans[(e["pid"], "stall")].add((a["version"], -1))
            if "method" in a:
                stall_methods[e["pid"]].add(a["method"])
        else:
            if a["round"] < 0 or (rounds is not None and a["round"] >= rounds):
                fail("round out of range %r" % e)
            spans[(e["pid"], e["cat"])].add((a["version"], a["round"]))
    if sorted(names) != list(range(ranks)):
        fail("process names for ranks %s, expected 0..%d" % (sorted(names), ranks - 1))
    for track, intervals in slices.items():
        intervals.sort()
        for (b0, e0), (b1, e1) in zip(intervals, intervals[1:]):
            if b1 < e0 - 1e-3:
                fail("overlapping slices on track %s: [%f, %f] and [%f, %f]" % (track, b0, e0, b1, e1))
    rollouts = [r for r in range(ranks) if "engine" in names[r].lower()]
    if not rollouts:
        fail("no rank is named as a rollout engine: %s" % names)
    if rounds is None:
        rounds = 1 + max(g for key, got in spans.items() for _, g in got)
    assembled = set()
    for r in rollouts:
        got = spans[(r, "assemble")]
        per_version = collections.defaultdict(set)
        for v, g in got:
            per_version[v].add(g)
        if len(per_version) < versions:
            fail("rank %d (%s) assembled in versions %s, expected %d" % (r, names[r], sorted(per_version), versions))
        first = next(iter(per_version.values()))
        for v, gs in per_version.items():
            if gs != first:
                fail("rank %d assembles rounds %s in version %d but %s in another" % (r, sorted(gs), v, sorted(first)))
        assembled |= first
    if assembled != set(range(rounds)):
        fail("no rollout assembles rounds %s" % sorted(set(range(rounds)) - assembled))
    for r in range(ranks):
        stalls = {v for v, _ in spans[(r, "stall")]}
        if r in rollouts and len(stalls) < versions:
            fail("rank %d has stalls for versions %s, expected %d" % (r, sorted(stalls), versions))
        if methods and not set(methods) <= stall_methods[r]:
            fail("rank %d has stalls of methods %s, expected %s" % (r, sorted(stall_methods[r]), methods))
    packers = [r for r in range(ranks) if spans[(r, "pack")]]
    if not packers:
        fail("no rank packs")
    counts = collections.Counter(e["cat"] for e in events if e["ph"] == "X")
    print("check_trace: OK, %d ranks, %s" % (ranks, ", ".join("%s %d" % kv for kv in sorted(counts.items()))))


if __name__ == "__main__":
    main()
