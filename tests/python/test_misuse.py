"""Misuse that used to wait for ever ends within the timeout, on every rank, with one error naming the cause
(issue 28), under mpirun:

    mpirun -n 4 python3 test_misuse.py

Ranks 0-1: a Megatron trainer (tp=2, ep=2); ranks 2-3: one rollout engine (tp=2, ep=2). Cases, each with
fresh adapters:
  - world rank 3 passes MPI_COMM_SELF as its engine_comm while world rank 2 passes the engine's: both
    groups are named (before, rank 2 waited in MPI_Comm_dup for ever);
  - the trainers pass the world communicator as trainer_comm: the rollout rank it holds is named;
  - the trainers call shutdown() without connect(): the rollouts' poll_requests fails, naming the cause
    (before, they polled NONE for ever); the same when the trainers' adapters are just destroyed;
  - a 0-element tensor [4, 0] (strides [1, 1]) in the checkpoint and on both sides: accepted, nothing to send (before: "not
    contiguous (strides [1, 1])"); connect and two versions succeed, every other rollout parameter bit for bit.
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
EMPTY = "empty"  # a name the rollout loader takes as is (params[name])


class EmptyTrainer(GPTModel):
    """Holds a 0-element parameter besides the model's (a bias of size 0, an expert slice of no rows)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.empty = torch.nn.Parameter(torch.empty(4, 0, dtype=torch.bfloat16), requires_grad=False)

    def load_weights(self, weights):
        def others():
            for name, tensor in weights:
                if name == EMPTY:
                    self.empty.data.copy_(tensor)
                else:
                    yield name, tensor
        return super().load_weights(others())


class EmptyRollout(Qwen3MoeForCausalLM):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.register_parameter(EMPTY, torch.nn.Parameter(torch.empty(4, 0, dtype=torch.bfloat16), requires_grad=False))


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

        # A 0-element tensor: accepted, nothing to send.
        with_empty = tensors + [(EMPTY, torch.bfloat16, (4, 0))]
        if trainer:
            empty_model = EmptyTrainer(config, comm.Get_rank(), tp=2, dp=1, ep=2)
        else:
            empty_model = EmptyRollout(config, comm.Get_rank(), 2)
        empty_params = dict(empty_model.named_parameters())
        checks.check(EMPTY in empty_params and empty_params[EMPTY].numel() == 0, f"no 0-element {EMPTY}: {list(empty_params)[:3]}")
        version_2 = hf_checkpoint.make_checkpoint(with_empty, 2)

        def connect_and_send():
            if trainer:
                GPTModel.load_weights(empty_model, (kv for kv in version_2.items() if kv[0] != EMPTY))
                sender = wb.SenderAdapter(world, comm, empty_params, with_empty, empty_model.load_weights,
                                          timeout_seconds=TIMEOUT_SECONDS)
                sender.connect()
                sender.send_weights(1)
                sender.shutdown()
                return
            receiver = wb.ReceiverAdapter(world, comm, empty_params, empty_model.load_weights,
                                          timeout_seconds=TIMEOUT_SECONDS)
            deadline = time.monotonic() + 4 * TIMEOUT_SECONDS
            while (event := receiver.poll_requests().event) != wb.Event.SHUTDOWN and time.monotonic() < deadline:
                time.sleep(0.002)
            if event != wb.Event.SHUTDOWN:
                raise AssertionError("no SHUTDOWN")
        error, seconds = attempt(connect_and_send)
        checks.check(error is None, f"a 0-element tensor: {error!r}")
        if not trainer and error is None:
            expected = Qwen3MoeForCausalLM(config, comm.Get_rank(), 2)
            Qwen3MoeForCausalLM.load_weights(expected, (kv for kv in version_2.items() if kv[0] != EMPTY))
            mine = dict(empty_model.named_parameters())
            for name, want in expected.named_parameters():
                bits = (lambda t: t.view(torch.int16)) if want.dtype == torch.bfloat16 else (lambda t: t)
                checks.check(torch.equal(bits(mine[name]), bits(want)),
                             f"a 0-element tensor: {name} is not version 2")
    except Exception:
        checks.exception("misuse")
    checks.finish()


if __name__ == "__main__":
    main()
