"""Loaders and hooks that go wrong, under mpirun: one clear weightbridge.Error on every rank, never a hang.

    mpirun -n 4 python3 test_bad_loaders.py

Ranks 0-1: a Megatron trainer (tp=2, ep=2); ranks 2-3: one rollout engine (tp=2, ep=2). Cases, each with
fresh adapters:
  - a rollout loader that computes (scales one norm) on one rank: connect fails on every rank with the same
    error, naming that rank and the parameter;
  - a rollout loader that raises, and a trainer loader that raises: every rank gets weightbridge.Error with
    the exception's type and text; on the raising rank its __cause__ is the exception itself;
  - a before_update_hook that raises at version 1 (receiver-staged): the rollouts' poll_requests and the
    trainers' shutdown (which collects version 1) raise weightbridge.Error naming the hook, the version
    and the exception (each rank also names its own step: the rank that raised, the others that it gave up).
    Before that, each rollout's poll_requests returns the update once as Event.ABORTED (the hook ran for it)
    with aborted_version 1, version 0, parameters_intact and a status carrying the same error, and its
    parameters still hold version 0 bit for bit.
Every message is also checked against the C++ convention: str(error) == "[rank r] <code words>: <message>".
"""

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
TIMEOUT_SECONDS = 20
SCALED = "model.layers.1.post_attention_layernorm.weight"
RAISED_ON = "model.layers.2.mlp.experts.5.up_proj.weight"


class ScalingRollout(Qwen3MoeForCausalLM):
    """A loader that computes: one tensor is scaled on its way in (a real bug: a forgotten conversion)."""

    def load_weights(self, weights):
        return super().load_weights((name, tensor * 2 if name == SCALED else tensor) for name, tensor in weights)


class RaisingRollout(Qwen3MoeForCausalLM):
    def load_weights(self, weights):
        def checked():
            for name, tensor in weights:
                if name == RAISED_ON:
                    raise ValueError(f"{name}: unexpected checkpoint tensor")
                yield name, tensor
        return super().load_weights(checked())


class RaisingTrainer(GPTModel):
    def load_weights(self, weights):
        raise KeyError("decoder.layers.0.self_attention.linear_qkv.weight")


def run_case(world, comm, trainer, model, tensors, hook=None, versions=0, receiver_staging=False, results=None):
    """Constructs the adapters, connects, sends `versions` versions. Returns the weightbridge.Error raised;
    a rollout's poll results other than NONE are appended to `results` when given."""
    params = dict(model.named_parameters())
    try:
        if trainer:
            sender = wb.SenderAdapter(world, comm, params, tensors, model.load_weights, timeout_seconds=TIMEOUT_SECONDS)
            sender.connect()
            for version in range(1, versions + 1):
                sender.send_weights(version)
            sender.shutdown()
        else:
            receiver = wb.ReceiverAdapter(world, comm, params, model.load_weights, timeout_seconds=TIMEOUT_SECONDS,
                                          before_update_hook=hook, receiver_staging=receiver_staging)
            deadline = time.monotonic() + 3 * TIMEOUT_SECONDS
            while time.monotonic() < deadline:
                result = receiver.poll_requests()
                if results is not None and result.event != wb.Event.NONE:
                    results.append(result)
                if result.event == wb.Event.SHUTDOWN:
                    break
                time.sleep(0.002)
    except wb.Error as error:
        return error
    return None


def expect_error(checks, case, error, pattern, everyone, same=True):
    """`error` is a weightbridge.Error whose message matches `pattern`, with the same message on every rank.
    With same=False (a failure during an update), each rank names its own step and the rank that gave up:
    every rank's message contains the cause."""
    if not checks.check(isinstance(error, wb.Error), f"{case}: no weightbridge.Error was raised"):
        return
    if same:
        checks.check(error.code == wb.ErrorCode.INVALID_ARGUMENT, f"{case}: code {error.code}")
        checks.check(re.fullmatch(pattern, error.message, re.S) is not None,
                     f"{case}: message {error.message!r} does not match {pattern!r}")
        rank = checks.rank
        checks.check(str(error) == f"[rank {rank}] invalid argument: {error.message}",
                     f"{case}: str(error) is {str(error)!r}")
        messages = set(everyone)
        checks.check(len(messages) == 1, f"{case}: ranks saw different messages: {sorted(messages)}")
    else:
        for message in everyone:
            checks.check(re.search(pattern, message, re.S) is not None,
                         f"{case}: a rank's message {message!r} does not name the cause {pattern!r}")


def main():
    world = MPI.COMM_WORLD
    rank = world.Get_rank()
    checks = Checks(world, watchdog_seconds=int(os.environ.get("WB_TEST_WATCHDOG", 240)))
    if world.Get_size() != 4:
        raise SystemExit("needs 4 ranks")
    trainer = rank < 2
    comm = world.Split(0 if trainer else 1, rank)
    config = hf_checkpoint.load_config(os.path.join(HERE, "qwen3_moe_tiny.json"))
    tensors = [(n, d, s) for n, d, s in hf_checkpoint.tensor_list(config)]
    checkpoint = hf_checkpoint.make_checkpoint(tensors, 1).items()

    def models(rollout_class=Qwen3MoeForCausalLM, trainer_class=GPTModel):
        if trainer:
            model = trainer_class(config, comm.Get_rank(), tp=2, dp=1, ep=2)
            GPTModel.load_weights(model, checkpoint)  # version 1 through the sound loader
        else:
            model = rollout_class(config, comm.Get_rank(), 2)
            Qwen3MoeForCausalLM.load_weights(model, checkpoint)
        return model

    def gathered(error):
        return world.allgather(error.message if isinstance(error, wb.Error) else repr(error))

    try:
        # 1. World rank 3's loader scales one tensor.
        error = run_case(world, comm, trainer, models(ScalingRollout if rank == 3 else Qwen3MoeForCausalLM), tensors)
        expect_error(checks, "scaling loader", error,
                     r"engine 0 worker 1 \(world rank 3\): probing load_weights failed: .*load_weights is not a pure "
                     rf"copy: parameter {re.escape(SCALED)}, element \[\d+\]: .+", gathered(error))

        # 2. World rank 2's loader raises ValueError.
        error = run_case(world, comm, trainer, models(RaisingRollout if rank == 2 else Qwen3MoeForCausalLM), tensors)
        expect_error(checks, "raising rollout loader", error,
                     r"engine 0 worker 0 \(world rank 2\): load_weights threw while probed: load_weights raised "
                     rf"ValueError: {re.escape(RAISED_ON)}: unexpected checkpoint tensor", gathered(error))
        if rank == 2 and isinstance(error, wb.Error):
            checks.check(isinstance(error.__cause__, ValueError), f"raising rollout loader: cause {error.__cause__!r}")

        # 3. Trainer rank 1's loader raises KeyError.
        error = run_case(world, comm, trainer, models(trainer_class=RaisingTrainer if rank == 1 else GPTModel), tensors)
        expect_error(checks, "raising trainer loader", error,
                     r"trainer 1 \(world rank 1\): load_weights threw while probed: load_weights raised KeyError: "
                     r"'decoder\.layers\.0\.self_attention\.linear_qkv\.weight'", gathered(error))
        if rank == 1 and isinstance(error, wb.Error):
            checks.check(isinstance(error.__cause__, KeyError), f"raising trainer loader: cause {error.__cause__!r}")

        # 4. World rank 3's before_update_hook raises at version 1. Receiver-staged: the version has arrived
        # when the hook runs, so the engine settles on the hook's error at once. (Without staging, the C++
        # adapter runs the hook before the transfer, and the engine's other ranks and the trainers then
        # wait for the raising rank's part until the timeout, which is what they report.)
        def hook(version):
            if rank == 3:
                raise RuntimeError(f"cannot pause the scheduler for version {version}")

        model = models()
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        results = []
        error = run_case(world, comm, trainer, model, tensors, hook=hook, versions=1, receiver_staging=True,
                         results=results)
        cause = (r"engine 0 worker 1 \(world rank 3\): before_update_hook\(1\) threw: RuntimeError: cannot pause "
                 r"the scheduler for version 1")
        expect_error(checks, "raising hook", error, cause, gathered(error), same=False)
        if not trainer:
            aborted = [r for r in results if r.event == wb.Event.ABORTED]
            events = [r.event.name for r in results]
            if checks.check(len(aborted) == 1 and results[-1] is aborted[0],
                            f"raising hook: poll results {events}, not one ABORTED last"):
                a = aborted[0]
                checks.check(a.aborted_version == 1 and a.version == 0 and a.parameters_intact,
                             f"raising hook: {a!r}")
                checks.check(not a.status and not a.status.ok and a.status.code != wb.ErrorCode.OK
                             and re.search(cause, a.status.message, re.S) is not None,
                             f"raising hook: status {a.status!r} does not name the cause")
                checks.check(isinstance(error, wb.Error) and error.message == a.status.message
                             and error.code == a.status.code,
                             f"raising hook: the error raised next ({error!r}) is not the ABORTED status ({a.status!r})")
                checks.check(str(a.status) == f"[rank {rank}] {wb.error_code_name(a.status.code)}: {a.status.message}",
                             f"raising hook: str(status) is {str(a.status)!r}")
            difference = hf_checkpoint.first_difference(dict(model.named_parameters()), before)
            checks.check(difference is None, f"raising hook: the parameters reported intact changed: {difference}")
        if rank == 3 and isinstance(error, wb.Error):
            checks.check(isinstance(error.__cause__, RuntimeError), f"raising hook: cause {error.__cause__!r}")
    except Exception:
        checks.exception("bad loaders")
    checks.finish()


if __name__ == "__main__":
    main()
