"""What the MPI test scripts here share: a skip without torch or mpi4py, a watchdog, and failures gathered
from every rank so that a failure on any rank fails the test with its message."""

import faulthandler
import os
import sys
import traceback

SKIP = 77  # ctest's SKIP_RETURN_CODE


def import_or_skip():
    """(torch, MPI) with MPI at MPI_THREAD_MULTIPLE (the staged modes' background threads), or exit 77."""
    try:
        import torch
        import mpi4py

        mpi4py.rc.thread_level = "multiple"
        from mpi4py import MPI
    except ImportError as error:
        print(f"skipped: {sys.executable} cannot import {error.name}", flush=True)
        sys.exit(SKIP)
    # Several ranks share few cores: one compute thread each, as launchers set OMP_NUM_THREADS.
    torch.set_num_threads(1)
    return torch, MPI


class Checks:
    """Collects this rank's failures; finish() reports every rank's and exits non-zero on all if any."""

    def __init__(self, world, watchdog_seconds):
        self.world = world
        self.rank = world.Get_rank()
        self.failures = []
        # A rank stuck in a collective is killed with its traceback rather than hanging the test.
        faulthandler.dump_traceback_later(watchdog_seconds, exit=True)

    def check(self, condition, message):
        if not condition:
            self.failures.append(message)
        return condition

    def fail(self, message):
        self.failures.append(message)

    def exception(self, what):
        self.failures.append(f"{what}: {traceback.format_exc()}")

    def finish(self):
        everyone = self.world.allgather(self.failures)
        faulthandler.cancel_dump_traceback_later()
        count = sum(len(f) for f in everyone)
        if self.rank == 0:
            for rank, failures in enumerate(everyone):
                for failure in failures:
                    print(f"FAILED [rank {rank}] {failure}", flush=True)
            print(f"{os.path.basename(sys.argv[0])}: {'PASSED' if count == 0 else f'{count} FAILURES'}", flush=True)
        sys.stdout.flush()
        sys.exit(1 if count else 0)
