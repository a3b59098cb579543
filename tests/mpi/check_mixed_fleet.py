"""Runs wb-replay on a mixed fleet (BF16 and FP8 engines of one trainer job, one plan) and checks, from its
JSON, what the run verified and what its transports counted:

    python3 check_mixed_fleet.py [--relays] [--plan WB_PLAN] MPIEXEC NPFLAG RANKS WB_REPLAY ARGS...

- wb-replay verified every version on every rollout worker bit for bit against its own load_weights of the
  reference checkpoint of its form (the BF16 file, or the FP8 file of that version), and the fleet mixes both;
- each rollout node (whole engines: --gpus-per-node a multiple of tp) receives its own form once: the bytes
  the transports carried into it from other nodes equal the plan's M_v for it and that form's whole bytes
  (the FP8 form's weights and scales, or the checkpoint's; a node of both forms: their union), per update;
- the trainers send one copy of each form present: their egress equals M, the union of the two forms (the
  tensors both hold, such as norms and the embedding, counted once);
- no node passes to a node of the other form more than the bytes both forms hold alike (a relay forwards
  only what its own form holds); with --relays, some rollout node relays to another of its own form;
- with --plan: wb-plan, describing the same deployment without running it, plans what connect planned (M,
  each rollout node's M_v, ingress and egress, the trainers' egress, the simulated EWTT where connect has one).
"""
import json
import os
import subprocess
import sys
import tempfile

args = sys.argv[1:]
relays = args[0] == "--relays"
if relays:
    args = args[1:]
plan_program = None
if args[0] == "--plan":
    plan_program, args = args[1], args[2:]
mpiexec, npflag, ranks, replay, *rest = args
with tempfile.TemporaryDirectory() as tmp:
    out = os.path.join(tmp, "replay.json")
    command = [mpiexec, npflag, ranks, replay, *rest, "--json", out]
    print(" ".join(command), flush=True)
    run = subprocess.run(command, timeout=240)
    if run.returncode != 0:
        sys.exit(f"check_mixed_fleet: wb-replay exited with {run.returncode}")
    with open(out) as f:
        result = json.load(f)

problems = []


def check(ok, what):
    if not ok:
        problems.append(what)


check(result["verified"], "wb-replay did not verify every version")
fp8 = result["fp8"]
engines = fp8["engines"]
forms = {e["fp8"] for e in engines}
check(forms == {True, False}, f"not a mixed fleet: engines {engines}")
checkpoint_bytes, form_bytes, copied_bytes = result["checkpoint_bytes"], fp8["form_bytes"], fp8["copied_bytes"]
check(0 < copied_bytes < form_bytes < checkpoint_bytes, f"form sizes: checkpoint {checkpoint_bytes}, FP8 form {form_bytes}, "
      f"held alike {copied_bytes}")
node_of = result["node_of_worker"]
nodes = {n["node"]: n for n in result["network"]["planned_nodes"]}
union = checkpoint_bytes + form_bytes - copied_bytes
forms_of_node = {}  # rollout node -> the forms of its engines (True: FP8)
for e in engines:
    ranks_of = range(e["first_world_rank"], e["first_world_rank"] + e["workers"])
    engine_nodes = {node_of[r] for r in ranks_of}
    check(len(engine_nodes) == 1, f"engine {e['engine']} spans nodes {engine_nodes}: give --gpus-per-node a multiple of its tp")
    forms_of_node.setdefault(engine_nodes.pop(), set()).add(e["fp8"])
for node, node_forms in sorted(forms_of_node.items()):
    # A node of both forms needs the union: what both hold alike once, then forwarded inside the node.
    own = union if len(node_forms) == 2 else form_bytes if True in node_forms else checkpoint_bytes
    n = nodes[node]
    name = f"node {node} ({' and '.join('FP8' if f else 'BF16' for f in sorted(node_forms))})"
    check(n["need_bytes"] == own, f"{name}: M_v {n['need_bytes']}, its forms {own}")
    check(n["planned_in_bytes"] == own, f"{name}: planned ingress {n['planned_in_bytes']}, its forms {own}")
    check(n["measured_in_bytes"] == own, f"{name}: measured ingress {n['measured_in_bytes']} per update, its forms {own}")
    print(f"check_mixed_fleet: {name}: received {n['measured_in_bytes']} bytes per update; its forms {own}")
form_of_node = {node: f.pop() for node, f in forms_of_node.items() if len(f) == 1}
trainer_nodes = [v for k, v in nodes.items() if k not in forms_of_node]
egress = sum(n["measured_out_bytes"] for n in trainer_nodes)
check(result["model_bytes"] == union, f"M {result['model_bytes']}, the union of both forms {union}")
check(egress == union, f"the trainers' measured egress {egress} per update, the union of both forms {union}")
print(f"check_mixed_fleet: trainers sent {egress} bytes per update; the union: checkpoint {checkpoint_bytes} + FP8 form "
      f"{form_bytes} - held alike {copied_bytes} = {union}")
same_form_relays = 0
for source, target, moved in result["network"]["node_to_node_bytes"]:
    if source not in form_of_node or target not in form_of_node:
        continue
    if form_of_node[source] != form_of_node[target]:
        check(moved <= copied_bytes, f"node {source} passed {moved} bytes per update to node {target} of the other form, "
              f"more than the {copied_bytes} both forms hold alike")
    elif moved > 0:
        same_form_relays += 1
    print(f"check_mixed_fleet: node {source} -> node {target}: {moved} bytes per update")
if relays:
    check(same_form_relays > 0, "no rollout node relayed to another of its form")
if plan_program:
    # The deployment's flags only: wb-plan reads no checkpoint and runs no mode.
    deployment, skip = [], False
    for a in rest:
        if skip:
            skip = False
        elif a in ("--checkpoint", "--engine-checkpoint", "--mode", "--steps"):
            skip = True
        else:
            deployment.append(a)
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "plan.json")
        subprocess.run([plan_program, *deployment, "--json", out], check=True, timeout=120, stdout=subprocess.DEVNULL)
        with open(out) as f:
            plan = json.load(f)
    check(plan["model_bytes"] == result["model_bytes"], f"wb-plan's M {plan['model_bytes']}, connect's {result['model_bytes']}")
    check(plan["trainer_egress_bytes"] == union, f"wb-plan's trainers send {plan['trainer_egress_bytes']}, the union {union}")
    for p in plan["rollout_nodes"]:
        n = nodes[p["node"]]
        got = (p["need_bytes"], p["ingress_bytes"], p["egress_bytes"])
        want = (n["need_bytes"], n["planned_in_bytes"], n["planned_out_bytes"])
        check(got == want, f"node {p['node']}: wb-plan's M_v, ingress, egress {got}, connect's {want}")
    # (connect simulates only the plans it chooses among: none when a relay fan-out is given)
    if result["simulated_ewtt_s"] > 0:
        check(plan["sim_ewtt_s"] == result["simulated_ewtt_s"],
              f"wb-plan simulates {plan['sim_ewtt_s']} s, connect's plan {result['simulated_ewtt_s']} s")
    print(f"check_mixed_fleet: wb-plan's plan of the mixed fleet is connect's (M {plan['model_bytes']}, "
          f"{len(plan['rollout_nodes'])} rollout nodes, simulated EWTT {plan['sim_ewtt_s']} s)")
print("\n".join(problems) or "check_mixed_fleet: PASSED")
sys.exit(1 if problems else 0)
