#!/usr/bin/python3
"""wb-plan with FP8 engines: M and the trainers' egress (as planned and as simulated) are the FP8 form's
bytes, exactly, fewer than the checkpoint's; every rollout node receives its M_v, at most the form.

    check_fp8_plan.py WB_PLAN [wb-plan arguments...]

Runs WB_PLAN with the arguments and --json, prints its output, and exits non-zero naming the first figure
that differs."""
import json
import os
import subprocess
import sys
import tempfile


def main():
    wb_plan, args = sys.argv[1], sys.argv[2:]
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "plan.json")
        run = subprocess.run([wb_plan, *args, "--json", path], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True, check=False)
        print(run.stdout, end="")
        if run.returncode != 0:
            sys.exit(f"wb-plan exited {run.returncode}")
        with open(path, encoding="utf-8") as f:
            plan = json.load(f)
    fp8 = plan.get("fp8")
    if fp8 is None:
        sys.exit("the plan has no fp8 entry: not planned for FP8 engines")
    form = fp8["form_bytes"]
    failures = []

    def expect(what, value):
        if value != form:
            failures.append(f"{what} is {value} bytes, not the FP8 form's {form}")

    if not 0 < form < fp8["checkpoint_bytes"]:
        failures.append(f"the FP8 form's {form} bytes are not fewer than the checkpoint's {fp8['checkpoint_bytes']}")
    expect("M", plan["model_bytes"])
    expect("the trainers' planned egress", fp8["trainer_egress_bytes"])
    expect("the trainer nodes' simulated egress", plan["trainer_egress_bytes"])
    for node in plan["rollout_nodes"]:
        # A node receives what its engines' FP8 parameters need, once: all of the form when it holds a whole
        # engine, less when an engine spans nodes.
        if not 0 < node["need_bytes"] <= form:
            failures.append(f"rollout node {node['node']}'s M_v is {node['need_bytes']} bytes, beyond the FP8 form's {form}")
        if node["ingress_bytes"] != node["need_bytes"]:
            failures.append(f"rollout node {node['node']} receives {node['ingress_bytes']} bytes, not its M_v of "
                            f"{node['need_bytes']}")
    if failures:
        sys.exit("\n".join(failures))
    print(f"check_fp8_plan: M and the trainers' egress are the FP8 form's {form} bytes "
          f"({form / fp8['checkpoint_bytes']:.3f} x the checkpoint's); {len(plan['rollout_nodes'])} rollout nodes "
          f"receive their M_v")


if __name__ == "__main__":
    main()
