"""Misuse that used to wait for ever ends within the timeout, on every rank, with one error naming the cause
(issue 28), under mpirun:

    mpirun -n 4 python3 test_misuse.py

Ranks 0-1: a Megatron trainer (tp=2, ep=2); ranks 2-3: one rollout engine (tp=2, ep=2). Cases, each with
fresh adapters:
  - world rank 3 passes MPI_COMM_SELF as its engine_comm while world rank 2 passes the engine's: both
    groups are named (before, rank 2 waited in MPI_Comm_dup for ever);
  - the trainers pass the world communicator as trainer_comm: the rollout rank it holds is named;
  - the trainers call shutdown() without connect(): the rollouts' poll_requests fails, naming the cause
    (before, they polled NONE for ever); the same when the trainers' adapters are just destroyed.
"""

import gc
import os
import re
import time

from harness import Checks, import_or_skip

torch, MPI = import_or_skip()

import weightbridge as wb  # noqa: E402

import hf_checkpoint  # noqa: E402
from megatron_model import GPTModel  # noqa: E402
from rollout_model import Qwen3MoeForCausalLM  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
TIMEOUT_SECONDS = 5


def main():
    world = MPI.COMM_WORLD
    rank = world.Get_rank()
    checks = Checks(world, watchdog_seconds=int(os.environ.get("WB_TEST_WATCHDOG", 120)))
    if world.Get_size() != 4:
        raise SystemExit("needs 4 ranks")
    trainer = rank < 2
    comm = world.Split(0 if trainer else 1, rank)
    config = hf_checkpoint.load_config(os.path.join(HERE, "qwen3_moe_tiny.json"))
    tensors = [(n, d, s) for n, d, s in hf_checkpoint.tensor_list(config)]
    model = GPTModel(config, comm.Get_rank(), tp=2, dp=1, ep=2) if trainer else Qwen3MoeForCausalLM(config, comm.Get_rank(), 2)
    params = dict(model.named_parameters())

    def construct(group, **extra):
        if trainer:
            return wb.SenderAdapter(world, group, params, tensors, model.load_weights, timeout_seconds=TIMEOUT_SECONDS,
                                    **extra)
        return wb.ReceiverAdapter(world, group, params, model.load_weights, timeout_seconds=TIMEOUT_SECONDS, **extra)

    def attempt(action):
        start = time.monotonic()
        try:
            action()
        except wb.Error as error:
            return error, time.monotonic() - start
        except Exception as error:  # noqa: BLE001 - reported as a failure below
            return error, time.monotonic() - start
        return None, time.monotonic() - start

    def expect_error(case, outcome, pattern, ranks=range(4), same=True):
        error, seconds = outcome
        everyone = world.allgather(error.message if isinstance(error, wb.Error) else repr(error))
        if rank not in ranks:
            return
        if not checks.check(isinstance(error, wb.Error), f"{case}: no weightbridge.Error was raised ({error!r})"):
            return
        checks.check(re.search(pattern, error.message, re.S) is not None,
                     f"{case}: message {error.message!r} does not match {pattern!r}")
        if same:
            checks.check(len({everyone[r] for r in ranks}) == 1, f"{case}: ranks saw different messages: {everyone}")
        checks.check(seconds < 2 * TIMEOUT_SECONDS, f"{case}: took {seconds:.1f} s, beyond twice the timeout")

    try:
        # MPI_COMM_SELF on one worker of the engine.
        group = MPI.COMM_SELF if rank == 3 else comm
        expect_error("MPI_COMM_SELF on one rollout worker", attempt(lambda: construct(group)),
                     r"^constructing the adapters: world ranks 2 and 3 disagree about their engine_comm: world rank 2's "
                     r"holds world ranks \[2, 3\], world rank 3's holds \[3\] \(MPI_COMM_SELF on one of them\?\)")

        # The world passed as the trainers' communicator.
        group = world if trainer else comm
        expect_error("the world as trainer_comm", attempt(lambda: construct(group)),
                     r"^constructing the adapters: world rank 0 \(a SenderAdapter\) passes a trainer_comm that holds "
                     r"world rank 2, which constructs a ReceiverAdapter: the trainer_comm holds the trainers only")

        # shutdown() without connect(), then the adapters destroyed without either.
        for how in ("shutdown", "destroyed"):
            def run():
                adapter = construct(comm)
                if trainer:
                    if how == "shutdown":
                        adapter.shutdown()
                    del adapter
                    gc.collect()
                    return
                deadline = time.monotonic() + 4 * TIMEOUT_SECONDS
                while time.monotonic() < deadline:
                    if adapter.poll_requests().event == wb.Event.SHUTDOWN:
                        raise AssertionError("SHUTDOWN without connect")
                    time.sleep(0.002)
                raise AssertionError(f"still polling after {4 * TIMEOUT_SECONDS} s")
            outcome = attempt(run)
            if trainer:
                checks.check(outcome[0] is None, f"trainers {how} without connect: {outcome[0]!r}")
            expect_error(f"trainers {how} without connect", outcome,
                         r"^engine 0 worker [01] \(world rank [23]\): the trainers shut down before connect", ranks=(2, 3),
                         same=False)
            world.Barrier()
    except Exception:
        checks.exception("misuse")
    checks.finish()


if __name__ == "__main__":
    main()
