#!/usr/bin/env python3
"""Settings and flags that mean what they say (issue 28): each bad value is refused at start, by wb-replay on one
rank, with a message naming the setting or flag and the cause, non-zero and within a bound; an unknown WB_*
variable is warned about, naming the closest setting. Exit status 0 when every case holds."""
import os
import subprocess
import sys
import time

BOUND_S = 30
# (environment, arguments, substrings of the output, whether the run must fail)
CASES = [
    ({}, ["--step-ms", "nan"], ["--step-ms nan is not in [0, 3.6e+06] milliseconds"], True),
    ({}, ["--step-ms", "inf"], ["--step-ms inf is not in [0, 3.6e+06] milliseconds"], True),
    ({}, ["--step-ms", "1e300"], ["--step-ms 1e+300 is not in [0, 3.6e+06] milliseconds"], True),
    ({"WB_TIMEOUT_SECONDS": "3"}, ["--step-ms", "5000"],
     ["--step-ms 5000 is not shorter than timeout_seconds 3: every wait for a peer's step would time out"], True),
    ({"WB_TIMEOUT_SECONDS": "-1"}, [], ["setting timeout_seconds (WB_TIMEOUT_SECONDS", "'-1' is not in [0, inf]"], True),
    ({"WB_TIMEOUT_SECONDS": "1e-320"}, [], ["'1e-320' is not in the range of a double"], True),
    ({"WB_TIMEOUT_SECONDS": "0x10"}, [], ["'0x10' is not a decimal number (hexadecimal is not read)"], True),
    ({"WB_BUFER_MIB": "8", "WB_TIMEOUT_SECOND": "5", "WB_CLUSTER_NAME": "wb28"}, [],
     ["environment variable WB_BUFER_MIB is no WeightBridge setting and is ignored; the closest setting is WB_BUFFER_MIB",
      "environment variable WB_TIMEOUT_SECOND is no WeightBridge setting and is ignored; the closest setting is "
      "WB_TIMEOUT_SECONDS"], True),
]


def main():
    replay = sys.argv[1]
    failures = []
    for environment, arguments, expected, must_fail in CASES:
        env = {k: v for k, v in os.environ.items() if not k.startswith("WB_") or k in ("WB_LOG_LEVEL",)}
        env.update(environment)
        label = f"{environment} {' '.join(arguments)}"
        start = time.monotonic()
        try:
            run = subprocess.run([replay, *arguments], env=env, capture_output=True, text=True, timeout=BOUND_S)
        except subprocess.TimeoutExpired:
            failures.append(f"{label}: still running after {BOUND_S} s")
            continue
        output = run.stdout + run.stderr
        took = time.monotonic() - start
        if must_fail and run.returncode == 0:
            failures.append(f"{label}: exit status 0")
        for text in expected:
            if text not in output:
                failures.append(f"{label}: output lacks {text!r}:\n{output[-2000:]}")
        if "WB_CLUSTER_NAME" in environment and "WB_CLUSTER_NAME is no" in output:
            failures.append(f"{label}: warned about the script variable WB_CLUSTER_NAME")
        print(f"{label}: exit {run.returncode} in {took:.1f} s")
    for failure in failures:
        print("FAIL:", failure)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
