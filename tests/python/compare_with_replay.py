"""Times the same transfer driven from Python (test_frameworks.py) and from C++ (wb-replay), back to back.

    PYTHONPATH=build/python python3 tests/python/compare_with_replay.py --replay build/apps/wb-replay \
        --config tests/python/qwen3_moe_small.json --repeats 3

Both use the model of --config (wb-replay with --scale full reads the same config.json), trainers tp=2,
dp=2, ep=2 and two rollout engines tp=2, ep=2 on 8 ranks, the four modes, three versions, a 2 ms step
between polls (wb-replay --step-ms 2). Prints, per mode, the median over runs and versions of connect time, EWTT and AGST (EWTT:
first worker stops computing -> last resumes, from the adapters' stall intervals on the common clock;
AGST: all stalls / workers), and how long Python's send_weights call takes beyond its C++ stall.
Not a test: timings on a shared machine are noisy, so it reports and checks nothing.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
MODES = ["sync", "sender-staged", "receiver-staged", "async"]


def run(command):
    result = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=900)
    if result.returncode != 0:
        sys.exit(f"failed ({result.returncode}): {' '.join(command)}\n{result.stdout[-3000:]}")
    return result.stdout


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--replay", required=True)
    parser.add_argument("--config", default=os.path.join(HERE, "qwen3_moe_small.json"))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--mpiexec", default="mpirun")
    parser.add_argument("--hook-check", choices=["full", "none"], default="none",
                        help="full: the Python rollouts compare every parameter inside the hook, as wb-replay's do "
                             "(in C++); none: no Python work inside a stall")
    args = parser.parse_args()
    samples = {(side, mode): {"connect": [], "ewtt": [], "agst": [], "overhead": []}
               for side in ("python", "c++") for mode in MODES}
    plans = {}
    for _ in range(args.repeats):
        output = run([args.mpiexec, "-n", "8", sys.executable, os.path.join(HERE, "test_frameworks.py"),
                      "--config", args.config, "--versions", "3", "--hook-check", args.hook_check])
        for line in output.splitlines():
            if line.startswith("python-frameworks "):
                r = json.loads(line.split(" ", 1)[1])
                s = samples[("python", r["mode"])]
                s["connect"].append(r["connect_s"])
                s["ewtt"] += r["ewtt_s"]
                s["agst"] += r["agst_s"]
                s["overhead"] += [c - t for c, t in zip(r["send_call_s"], r["trainer0_stall_s"])]
                plans[("python", r["mode"])] = (r["model_bytes"], r["bytes_per_update"], r["rounds"])
        for mode in MODES:
            with tempfile.NamedTemporaryFile(suffix=".json") as out:
                run([args.mpiexec, "-n", "8", args.replay, "--model", args.config, "--scale", "full",
                     "--trainer", "tp=2,ep=2,dp=2", "--rollout", "engines=2,tp=2,ep=2", "--gpus-per-node", "4",
                     "--mode", mode, "--steps", "3", "--json", out.name])
                r = json.load(open(out.name))
            s = samples[("c++", mode)]
            s["connect"].append(r["connect_seconds"])
            s["ewtt"] += [step["ewtt_s"] for step in r["steps"]]
            s["agst"] += [step["agst_s"] for step in r["steps"]]
            plans[("c++", mode)] = (r["model_bytes"], r["planned_bytes_per_update"], r["rounds"])
    print(f"{'mode':16} {'side':6} {'connect ms':>11} {'EWTT ms':>9} {'AGST ms':>9} {'send_weights - stall us':>24}"
          f"  plan (M, bytes/update, rounds)")
    for mode in MODES:
        for side in ("python", "c++"):
            s = samples[(side, mode)]
            overhead = f"{statistics.median(s['overhead']) * 1e6:.1f}" if s["overhead"] else "-"
            print(f"{mode:16} {side:6} {statistics.median(s['connect']) * 1e3:11.1f} "
                  f"{statistics.median(s['ewtt']) * 1e3:9.2f} {statistics.median(s['agst']) * 1e3:9.2f} "
                  f"{overhead:>24}  {plans[(side, mode)]}")
    print(json.dumps({f"{side}/{mode}": v for (side, mode), v in samples.items()}))


if __name__ == "__main__":
    main()
