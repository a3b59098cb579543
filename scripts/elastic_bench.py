#!/usr/bin/env python3
"""Merges what scripts/elastic-bench.sh's jobs wrote (DIR/trainers.json, DIR/{A,B,C}.json, DIR/plan_N.json)
into the benchmark JSON of issue 31's "Measured" paragraph, on stdout. Usage: elastic_bench.py DIR

EWTT of version v: from the first trainer entering send_weights(v) to the last stall end of any worker for v
(the trainers' send_weights spans and every engine job's stall intervals are on one clock: trainer rank 0's).
T_min of one replica: the bound of a joined engine's own link (the trainers to that engine). T_min of a fleet:
wb-plan's bound for the trainers and that many engines as one plan (the fleet link, the default), and beside
it the sum of the per-link bounds, which is what per-job links run (fleet_link 0: one plan per joined engine
job, written one after another). sends_while_joining: the trainers' send_weights before the counted ones, each
with whether a joiner's copy from the replica ran beside it (what a join costs the training)."""
import json
import os
import re
import statistics
import sys

NAMES = ("A", "B", "C")


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def ratio(a, b):
    return a / b if a is not None and b else None


def main(directory):
    trainers = load(os.path.join(directory, "trainers.json"))
    if trainers is None or "join" not in trainers:
        sys.exit("elastic_bench.py: no trainers.json with a join record in " + directory)
    engines = {n: load(os.path.join(directory, n + ".json")) for n in NAMES}
    plans = {n: load(os.path.join(directory, "plan_%d.json" % n)) for n in (1, 2, 3)}
    join = trainers["join"]
    sends = join["sends"]
    last = sends[-1]["version"] if sends else 0
    deadline = join["timeout_s"]

    spans = {}
    for s in sends:
        spans[s["version"]] = [s["begin_s"], s["end_s"]]
    for e in engines.values():
        for version, begin, end in (e or {}).get("stalls", []):
            if version in spans:
                spans[version][0] = min(spans[version][0], begin)
                spans[version][1] = max(spans[version][1], end)
    ewtt = {v: end - begin for v, (begin, end) in spans.items()}

    links = [e["t_min_s"] for e in engines.values() if e and e.get("t_min_s")]
    t_min_one = statistics.median(links) if links else None  # every engine job has the same layout
    one_plan = {n: (p or {}).get("t_min_s") for n, p in plans.items()}

    def fleet(n):
        return {"engines": n, "t_min_one_plan_s": one_plan.get(n),
                "t_min_per_link_sum_s": n * t_min_one if t_min_one else None}

    joins = []
    for name, e in engines.items():
        if not e:
            joins.append({"engine": name, "report": "none (killed before it wrote one)" if name == "A" else "missing"})
            continue
        versions = e["installed"]
        # A first version from the fleet link's replica (before the take), then every one from the take on.
        replica = bool(e.get("first_version_from_replica")) and len(versions) > 1
        taken = versions[1:] if replica else versions
        joins.append({"engine": name, "verified": e["verified"], "installed_first": (versions or [None])[0],
                      "first_version_from_replica": replica,
                      "installed_last": (versions or [None])[-1], "installs": len(versions),
                      "every_version_to_the_last": bool(taken) and taken == list(range(taken[0], last + 1)),
                      "wait_at_port_s": e["taken_after_s"], "probe_s": e["probe_s"],
                      "link_connect_s": e["connect_seconds"], "join_to_install_s": e["join_to_install_s"],
                      "after_probe_s": e["after_probe_s"], "t_min_one_replica_s": e["t_min_s"],
                      "after_probe_over_t_min": ratio(e["after_probe_s"], e["t_min_s"]), "goal": 1.2,
                      # Of it, the wait for the replica to take the joiner (its update in flight, its own
                      # work between polls), and the rest: the link and the copy.
                      "replica_wait_s": e.get("replica_wait_s"),
                      "after_probe_less_wait_over_t_min": ratio(e["after_probe_s"] - (e.get("replica_wait_s") or 0),
                                                                e["t_min_s"]) if e["after_probe_s"] is not None else None,
                      "link_trainer_egress_bytes": e.get("link_trainer_egress_bytes")})
        if e.get("join_placed"):  # --knock-at: the join (its early probe, then the knock) started this far into an update
            joins[-1]["join_placed"] = dict(e["join_placed"])
            # The knock at the replica follows the early probe (that long after the join's start).
            joins[-1]["join_placed"]["knock_into_update_s"] = e["join_placed"]["into_update_s"] + e["probe_s"]

    # Each job's own JSON sees its own hosts only: the fleet spans hosts when an engine job ran on a host the
    # trainers did not (its "machine" starts with its host name).
    trainer_hosts = {h["host"] for h in trainers.get("network", {}).get("hosts", [])}
    engine_hosts = {e["machine"].split(":")[0] for e in engines.values() if e and e.get("machine")}
    between_hosts = bool(trainers.get("between_hosts")) or bool(engine_hosts - trainer_hosts)
    counted = [s for s in sends if s["counted"]]
    serving = [j for j in joins if j["engine"] != "A"]  # they must serve to the end
    killed = next((s for s in counted if s["engines_after"] < s["engines_before"]), None)
    result = {"mode": trainers["mode"], "model": trainers["model"], "trainer": trainers["trainer"],
              "between_hosts": between_hosts, "hosts": sorted(trainer_hosts | engine_hosts), "node_gbps": trainers.get("node_gbps"),
              "detection_deadline_s": deadline, "versions_sent": last,
              "verified": trainers["verified"] and all(j.get("verified") and j["every_version_to_the_last"] for j in serving),
              "engines": join["engines"], "joins": joins,
              # Each joined job has a plan of its own: the trainers' egress per update is the sum over the
              # serving links (the goal is that a join leaves it unchanged).
              "trainer_egress_bytes_per_link": [j.get("link_trainer_egress_bytes") for j in joins if "probe_s" in j]}
    # The training's side of the joins: every send_weights while the engines joined, how long the trainers
    # spent in it, and whether it overlapped a joiner's copy from the replica (taken as the last T_min of
    # that joiner's wait for its first version: the copy runs at the link's rate). A sync update that meets
    # the copy waits for the replica (its parameters are being read), an async one for its install.
    copies = []
    for e in engines.values():
        if e and e.get("first_version_from_replica") and e.get("stalls") and t_min_one:
            end = e["stalls"][0][2]
            copies.append((end - t_min_one, end))
    result["sends_while_joining"] = [
        {"version": s["version"], "engines_before": s["engines_before"], "engines_after": s["engines_after"],
         "send_s": s["end_s"] - s["begin_s"],
         "beside_a_copy": any(s["begin_s"] < end and begin < s["end_s"] for begin, end in copies)}
        for s in sends if not s["counted"]]
    def search_log(name, pattern):  # the first match of pattern in the job's log, None without one
        try:
            with open(os.path.join(directory, name)) as log:
                return re.search(pattern, log.read())
        except OSError:
            return None
    # --kill-at: A's rank 0 was killed this far into the trainers' update, as its line in A.log measured it
    # (else in its before_update_hook, which a staged engine runs after the receive).
    placed = search_log("A.log", r"fault placed: .*: ([0-9.]+) s into the trainers' update (\d+)")
    # With sender staging the trainers answer the loss on the fleet link's thread, behind send_weights (the
    # next call adopts the rebuilt link: that is where the fleet shrinks); trainer 0 says so when it happens.
    behind = search_log("trainers.log", r"rebuilt from the survivors behind send_weights \(in ([0-9.e+-]+) s")
    if killed is None:
        result["kill"] = {"report": "no counted update lost an engine"}
    else:
        # The send_weights that saw the fleet shrink is not always the update A died in: in the staged modes
        # a call returns before its engines install, and the loss is met (or, rebuilt behind the call,
        # adopted) at the next call. The update it died in is the one the trainers name ("version V: ..."),
        # the one after its last install.
        detected, before, after = killed["version"], killed["engines_before"], killed["engines_after"]
        dropped = [e for e in join["engines"] if e.get("state") == "dropped"]
        named = re.match(r"version (\d+):", dropped[0].get("why", "")) if dropped else None
        v = int(named.group(1)) if named else (dropped[0]["installed"] + 1 if dropped else detected)
        old = fleet(before)
        bound = old["t_min_one_plan_s"] + deadline + t_min_one if old["t_min_one_plan_s"] and t_min_one else None
        per_link = old["t_min_per_link_sum_s"] + deadline + t_min_one if t_min_one else None
        result["kill"] = {"version": v, "ewtt_s": ewtt.get(v), "fleet_before": old,
                          "detected_in_version": detected, "detected_in_ewtt_s": ewtt[detected],
                          "rebuilt_behind_send_weights": behind is not None,
                          "rebuild_behind_s": float(behind.group(1)) if behind else None,
                          "placed": "in the trainers' update" if placed else "in A's before_update_hook",
                          "placed_into_update_s": float(placed.group(1)) if placed else None,
                          "placed_in_update": int(placed.group(2)) if placed else None,
                          "bound_s": bound, "bound": "T_min of the fleet as one plan + the deadline + one resend (T_min of one replica)",
                          "ewtt_over_bound": ratio(ewtt.get(v), bound),
                          "bound_per_link_s": per_link, "ewtt_over_bound_per_link": ratio(ewtt.get(v), per_link)}
        # Before: every update wholly before the one A died in; after: every update after the call that
        # met the loss (the first ones wholly on the smaller fleet).
        before_loss = [ewtt[s["version"]] for s in counted if s["version"] < v]
        after_loss = [ewtt[s["version"]] for s in counted if s["version"] > detected]
        smaller = fleet(after)
        median_after = statistics.median(after_loss) if after_loss else None
        result["before_loss"] = {"updates": len(before_loss), "ewtt_s": before_loss,
                                 "ewtt_median_s": statistics.median(before_loss) if before_loss else None,
                                 "fleet": fleet(before)}
        # Of each EWTT: how far apart the trainers entered send_weights (wb-replay ends their training steps
        # together, as a real job's collectives do: this shows it held), and how long the call took.
        later = [s for s in counted if s["version"] > detected]
        result["after_loss"] = {"updates": len(after_loss), "ewtt_s": after_loss, "ewtt_median_s": median_after,
                                "trainer_entry_skew_s": [s.get("last_begin_s", s["begin_s"]) - s["begin_s"] for s in later],
                                "send_weights_s": [s["end_s"] - s["begin_s"] for s in later],
                                "fleet": smaller, "goal": 1.15,
                                "median_over_t_min_one_plan": ratio(median_after, smaller["t_min_one_plan_s"]),
                                "median_over_t_min_per_link_sum": ratio(median_after, smaller["t_min_per_link_sum_s"]),
                                "within_goal_one_plan": sum(1 for x in after_loss if smaller["t_min_one_plan_s"]
                                                            and x <= 1.15 * smaller["t_min_one_plan_s"])}
    if not result["between_hosts"]:
        result["note"] = ("one host: every write is a same-machine copy while T_min assumes links of node_gbps, "
                          "so the ratios to T_min say nothing here; run on the emulated cluster with shaped links")
    json.dump(result, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0 if result["verified"] else 1


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1]))
