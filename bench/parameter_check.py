"""What the check of the parameters before every update costs (issue 28): a Python adapter reads each
parameter's storage address, dtype, shape and strides again and compares them with what it registered.
Goal: at most 1 ms per 10,000 parameters.

    /usr/bin/python3 bench/parameter_check.py [--parameters 100000] [--repeats 20] [--json FILE]

(PYTHONPATH=<build>/python). One process, a trainer job with no engine: the adapter is constructed, never
connected, and SenderAdapter._check_parameters runs the check that send_weights runs first. Validates before
timing: nothing reported as moved, then a rebound parameter reported and a resized one refused. Times torch
nn.Parameters (read in place where the build found torch's C++ headers) and numpy arrays (every one read
through a new DLPack export, the road of any other __dlpack__ producer). Prints one JSON object.
"""

import argparse
import json
import statistics
import sys
import time

import numpy
import torch
from mpi4py import MPI

import weightbridge as wb


def adapter_over(params):
    tensors = [(name, t.dtype, tuple(t.shape)) for name, t in params.items()]
    return wb.SenderAdapter(MPI.COMM_WORLD, MPI.COMM_WORLD, params, tensors, lambda weights: None,
                            timeout_seconds=60)


def time_checks(adapter, repeats):
    """Wall and CPU seconds of each check (on a shared machine the CPU time is the fairer figure)."""
    wall, cpu = [], []
    for _ in range(repeats):
        start, start_cpu = time.perf_counter(), time.thread_time()
        moved, _ = adapter._check_parameters()
        wall.append(time.perf_counter() - start)
        cpu.append(time.thread_time() - start_cpu)
        if moved:
            raise SystemExit(f"parameter_check: parameters {moved[:5]} reported as moved while none was")
    return wall, cpu


def validate(adapter, params):
    names = list(params)
    moved, in_place = adapter._check_parameters()
    if moved:
        raise SystemExit(f"parameter_check: {moved[:5]} reported as moved before anything moved")
    first = params[names[0]]
    kept = first.data
    first.data = first.data.clone()  # rebound: reported, not followed (the check only looks)
    moved, _ = adapter._check_parameters()
    if moved != [0]:
        raise SystemExit(f"parameter_check: a rebound {names[0]} gave {moved[:5]}, not [0]")
    first.data = kept
    last = params[names[-1]]
    last.resize_(last.numel() * 4)  # a different shape: refused
    try:
        adapter._check_parameters()
        raise SystemExit(f"parameter_check: {names[-1]} resized, and the check did not refuse it")
    except wb.Error as error:
        if names[-1] not in error.message or "shape changed" not in error.message:
            raise SystemExit(f"parameter_check: the refusal does not name {names[-1]} and its shape: {error.message}")
    return in_place


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parameters", type=int, default=100_000)
    parser.add_argument("--numpy-parameters", type=int, default=10_000, help="the DLPack road (slower: fewer)")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--json", help="also write the result here")
    args = parser.parse_args()
    torch.set_num_threads(1)

    params = {f"layers.{i}.weight": torch.nn.Parameter(torch.zeros(4, 4), requires_grad=False)
              for i in range(args.parameters)}
    adapter = adapter_over(params)
    torch_seconds, torch_cpu = time_checks(adapter, args.repeats)
    in_place = validate(adapter, params)
    del adapter

    arrays = {f"layers.{i}.weight": numpy.zeros((4, 4), numpy.float32) for i in range(args.numpy_parameters)}
    numpy_adapter = adapter_over(arrays)
    _, numpy_cpu = time_checks(numpy_adapter, max(3, args.repeats // 4))
    del numpy_adapter

    per_10k = lambda seconds, n: statistics.median(seconds) * 1e3 * 10_000 / n  # noqa: E731
    result = {
        "benchmark": "parameter_check",
        "parameters": args.parameters,
        "read_in_place": in_place,
        "torch_headers": in_place == args.parameters,
        "repeats": args.repeats,
        "median_ms_per_check": statistics.median(torch_seconds) * 1e3,
        "min_ms_per_check": min(torch_seconds) * 1e3,
        "median_ms_per_10000": per_10k(torch_seconds, args.parameters),
        "median_cpu_ms_per_10000": per_10k(torch_cpu, args.parameters),
        "goal_ms_per_10000": 1.0,
        "dlpack_parameters": args.numpy_parameters,
        "dlpack_median_cpu_ms_per_10000": per_10k(numpy_cpu, args.numpy_parameters),
        "validated": True,
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
