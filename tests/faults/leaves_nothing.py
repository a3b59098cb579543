#!/usr/bin/env python3
"""Runs one fault test's command and checks that its job left nothing behind (issue 28): the command gets a
shared-memory folder of its own (OMPI_MCA_btl_vader_backing_directory, a fresh folder under /dev/shm, where
Open MPI 4.1 puts its segment files; the job's own, so that other jobs on the machine do not count) and a
fresh working folder (where a program writes what it is given by a relative name). Both must be empty when
the command ends; they are removed either way and what was in them is named.

No exception is made for Open MPI's own segment files (vader_segment.*) after a job that failed: Open MPI 4.1's
daemons remove them after a rank that called MPI_Abort, was killed (SIGKILL) or exited without MPI_Finalize,
also under mpirun --enable-recovery (measured, and every fault test passes this check). Only an mpirun killed
with SIGKILL leaves them, which no test here does (the README says how to clear them then).

The command's exit status is passed on (77, ctest's SKIP_RETURN_CODE, too); a command that passed but left
something exits 1.

usage: leaves_nothing.py -- COMMAND [ARGUMENT...]"""
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time


def main():
    if sys.argv[1:2] != ["--"] or len(sys.argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    command = sys.argv[2:]
    shm = tempfile.mkdtemp(prefix="wb-test-shm-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    work = tempfile.mkdtemp(prefix="leaves_nothing-", dir=os.getcwd())
    env = dict(os.environ, OMPI_MCA_btl_vader_backing_directory=shm)
    job = None

    def stop(signum, _frame):
        # SIGTERM or Ctrl-C: pass it on, then clean up below rather than die with the folders left. (ctest's
        # timeout sends SIGKILL, measured with CMake 3.25, which no handler sees: then the folders stay.)
        if job is not None and job.poll() is None:
            job.send_signal(signum)
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        job = subprocess.Popen(command, env=env, cwd=work)
        # How many files the folder held at most while the job ran: evidence that Open MPI used it (a check
        # of a folder nobody wrote to would pass for nothing), printed with the verdict.
        peak = 0
        while job.poll() is None:
            peak = max(peak, len(os.listdir(shm)))
            time.sleep(0.1)
        status = job.returncode
        status = 128 - status if status < 0 else status  # a signal, as a shell reports it
        left_shm, left_work = sorted(os.listdir(shm)), sorted(os.listdir(work))
    finally:
        shutil.rmtree(shm, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)
    failures = [f"left in the job's shared-memory folder {shm}: {left_shm}"] if left_shm else []
    failures += [f"left in the job's working folder {work}: {left_work}"] if left_work else []
    for failure in failures:
        print("leaves_nothing: FAILED: " + failure)
    if not failures:
        print(f"leaves_nothing: nothing left in {shm} (it held up to {peak} files while the job ran) or {work}")
    return 1 if failures and status in (0, 77) else status


if __name__ == "__main__":
    sys.exit(main())
