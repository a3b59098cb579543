#!/usr/bin/env python3
"""A checkpoint that changes under a running job (issue 28): wb-replay on 4 ranks reads a safetensors checkpoint
at every version; the file is truncated to half while the job runs. Checked: the job ends non-zero within a
bound, a rank's error names the file and the change ("the file changed while the job reads it (its size went
from ... to ... bytes)"), no rank ends by a signal (SIGBUS before: the file was mapped), and nothing of the job
is left beside the checkpoint (leaves_nothing.py, in front of this script, checks the job's shared-memory folder).

usage: run_changed_checkpoint.py WB_MKCKPT WB_REPLAY MPIEXEC WORKDIR"""
import os
import shutil
import subprocess
import sys
import time

BOUND_S = 60
RUNNING_S = 4  # the job is past connect and sending versions (each step 20 ms, 1000 of them)


def main():
    mkckpt, replay, mpiexec, work = sys.argv[1:5]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    checkpoint = os.path.join(work, "m.safetensors")
    model = ["--model", "qwen3-30b-a3b", "--scale", "tiny"]
    subprocess.run([mkckpt, *model, "--output", checkpoint], check=True, stdout=subprocess.DEVNULL)
    size = os.path.getsize(checkpoint)
    env = dict(os.environ, WB_TIMEOUT_SECONDS="3")
    command = [mpiexec, "-n", "4", "--oversubscribe", replay, *model, "--checkpoint", checkpoint, "--trainer", "tp=2",
               "--rollout", "engines=1,tp=2", "--steps", "1000", "--step-ms", "20"]
    failures = []
    start = time.monotonic()
    job = subprocess.Popen(command, env=env, cwd=work, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    time.sleep(RUNNING_S)
    if job.poll() is not None:
        failures.append(f"the job ended before the checkpoint was changed (exit {job.returncode})")
    os.truncate(checkpoint, size // 2)
    changed = time.monotonic()
    try:
        output, _ = job.communicate(timeout=BOUND_S)
    except subprocess.TimeoutExpired:
        job.kill()
        output, _ = job.communicate()
        failures.append(f"still running {BOUND_S} s after the checkpoint was truncated")
    took = time.monotonic() - changed
    lines = [line for line in output.splitlines() if not line.startswith("{")]  # the report's JSON aside
    text = "\n".join(lines)
    if job.returncode == 0:
        failures.append("exit status 0")
    # The change is seen either by the check before a read (the size) or by the guard of a read that the
    # truncation overtook (the SIGBUS the mapping raised, caught and named as the file's change).
    named = f"safetensors checkpoint {checkpoint}: tensor "
    changes = (f"the file changed while the job reads it (its size went from {size} to {size // 2} bytes)",
               "the file changed while the job reads it (reading it raised SIGBUS: it was truncated)")
    if not any(named in line and any(change in line for change in changes) for line in lines):
        failures.append(f"no line names the file {named!r} and the change, one of {changes}")
    # A rank ended by a signal: Open MPI's report of it, or the shell's; the library's own message above
    # may name the SIGBUS it caught.
    unnamed = "\n".join(line for line in lines if not any(change in line for change in changes))
    for sign in ("signal", "Bus error", "SIGBUS", "core dumped"):
        if sign in unnamed:
            failures.append(f"the output says {sign!r}")
    left = sorted(set(os.listdir(work)) - {"m.safetensors"})
    if left:
        failures.append(f"left beside the checkpoint: {left}")
    print(f"truncated at {changed - start:.1f} s; the job ended {took:.1f} s later with exit {job.returncode}")
    if failures:
        print(text[-6000:])
        for failure in failures:
            print("FAILED:", failure)
        return 1
    shutil.rmtree(work, ignore_errors=True)
    print("PASSED")
    return 0


if __name__ == "__main__":
    sys.exit(main())
