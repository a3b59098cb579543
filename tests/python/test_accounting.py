"""Every rollout element is accounted for at connect, under mpirun: a rollout parameter that load_weights never
writes fails connect on every rank, naming the rank, the parameters and the likely cause, unless declared in
not_loaded; what only part of a parameter misses is kept (and logged).

    mpirun -n 4 python3 test_accounting.py

Ranks 0-1: a Megatron trainer (tp=2, ep=2); ranks 2-3: one rollout engine (tp=2, ep=2). Cases, each with
fresh adapters, each ending within the timeout on every rank:
  - world rank 3's load_weights returns at once: "load_weights wrote nothing on this rank";
  - world rank 2's loader skips a tensor it does not know (model.norm.weight): that parameter is named;
  - the rollouts' loader is a generator function (a stray yield): "load_weights is a generator function";
  - the trainers' tensor list omits model.norm.weight, which the rollouts' loader would read;
  - the same skipping loader with model.norm.weight declared in not_loaded: connects, and an update leaves
    that parameter as it was while every other parameter is the rollout's own load_weights of the version;
  - a loader that leaves part of qkv_proj unwritten (a k_proj it skips): kept, connect succeeds.
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
TIMEOUT_SECONDS = 10
SKIPPED = "model.norm.weight"
PARTLY = "model.layers.0.self_attn.k_proj.weight"


class LazyRollout(Qwen3MoeForCausalLM):
    """Returns before loading anything (a guard that is always true, an early return)."""

    def load_weights(self, weights):
        return set()


class SkippingRollout(Qwen3MoeForCausalLM):
    """Skips names it does not know: here one it should know (a name missing from its mappings)."""

    skipped = SKIPPED

    def load_weights(self, weights):
        return super().load_weights((n, t) for n, t in weights if n != self.skipped)


class PartlySkippingRollout(SkippingRollout):
    skipped = PARTLY


class GeneratorRollout(Qwen3MoeForCausalLM):
    def load_weights(self, weights):
        for name, tensor in weights:  # a stray yield makes this a generator function: nothing of it runs
            yield super().load_weights([(name, tensor)])


def run_case(world, comm, trainer, model, tensors, versions=0, **options):
    """Constructs the adapters, connects, sends `versions` versions (the trainers' parameters hold version 1).
    Returns (the weightbridge.Error raised or None, seconds taken)."""
    params = dict(model.named_parameters())
    start = time.monotonic()
    try:
        if trainer:
            sender = wb.SenderAdapter(world, comm, params, tensors, model.load_weights, timeout_seconds=TIMEOUT_SECONDS,
                                      **options)
            sender.connect()
            for version in range(1, versions + 1):
                sender.send_weights(version)
            sender.shutdown()
        else:
            receiver = wb.ReceiverAdapter(world, comm, params, model.load_weights, timeout_seconds=TIMEOUT_SECONDS,
                                          **options)
            deadline = time.monotonic() + 3 * TIMEOUT_SECONDS
            while receiver.poll_requests().event != wb.Event.SHUTDOWN and time.monotonic() < deadline:
                time.sleep(0.002)
    except wb.Error as error:
        return error, time.monotonic() - start
    return None, time.monotonic() - start


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

    def models(rollout_class=Qwen3MoeForCausalLM):
        if trainer:
            model = GPTModel(config, comm.Get_rank(), tp=2, dp=1, ep=2)
            GPTModel.load_weights(model, checkpoint)  # version 1 through the sound loader
        else:
            model = rollout_class(config, comm.Get_rank(), 2)
            Qwen3MoeForCausalLM.load_weights(model, checkpoint)
        return model

    def expect_error(case, outcome, pattern):
        """Every rank raised weightbridge.Error with the same message, matching `pattern`, within the timeout."""
        error, seconds = outcome
        everyone = world.allgather(error.message if isinstance(error, wb.Error) else repr(error))
        if not checks.check(isinstance(error, wb.Error), f"{case}: no weightbridge.Error was raised ({error!r})"):
            return
        checks.check(error.code == wb.ErrorCode.INVALID_ARGUMENT, f"{case}: code {error.code}")
        checks.check(re.search(pattern, error.message, re.S) is not None,
                     f"{case}: message {error.message!r} does not match {pattern!r}")
        checks.check(len(set(everyone)) == 1, f"{case}: ranks saw different messages: {sorted(set(everyone))}")
        checks.check(seconds < TIMEOUT_SECONDS, f"{case}: took {seconds:.1f} s, beyond the {TIMEOUT_SECONDS} s timeout")

    def expect_success(case, outcome):
        error, seconds = outcome
        checks.check(error is None, f"{case}: {error!r}")
        checks.check(seconds < 3 * TIMEOUT_SECONDS, f"{case}: took {seconds:.1f} s")

    try:
        expect_error("a rank that writes nothing",
                     run_case(world, comm, trainer, models(LazyRollout if rank == 3 else Qwen3MoeForCausalLM), tensors),
                     r"^engine 0 worker 1 \(world rank 3\): no update would reach (\d+) parameters of \1 on this rank: "
                     r"model\.embed_tokens\.weight, .*Cause: load_weights wrote nothing on this rank.*not_loaded")

        expect_error("a rank whose loader skips a tensor",
                     run_case(world, comm, trainer, models(SkippingRollout if rank == 2 else Qwen3MoeForCausalLM), tensors),
                     r"^engine 0 worker 0 \(world rank 2\): no update would reach 1 parameter of \d+ on this rank: "
                     rf"{re.escape(SKIPPED)}\. Cause: load_weights never writes them: a checkpoint name its mappings "
                     r"miss \(a stacked_params_mapping entry, say\)")

        expect_error("a generator loader",
                     run_case(world, comm, trainer, models(GeneratorRollout), tensors),
                     r"^engine 0 worker 0 \(world rank 2\): probing load_weights failed: load_weights is a generator "
                     r"function: .*wrote nothing on this rank: no update would reach its \d+ parameters "
                     r"\(model\.embed_tokens\.weight, ")

        expect_error("the trainers' list omits a tensor",
                     run_case(world, comm, trainer, models(), [t for t in tensors if t[0] != SKIPPED]),
                     r"^engine 0 worker 0 \(world rank 2\): no update would reach 1 parameter of \d+ on this rank: "
                     rf"{re.escape(SKIPPED)}\. Cause: .*a tensor the trainers' tensor list \(checkpoint_tensors\) lacks")

        # Declared: the skipped parameter keeps its contents through an update; the others are version 2's.
        model = models(SkippingRollout)
        if not trainer:
            with torch.no_grad():
                model.model.norm.weight.fill_(0.5)
            before = model.model.norm.weight.detach().clone()
        else:
            GPTModel.load_weights(model, hf_checkpoint.make_checkpoint(tensors, 2).items())
        outcome = run_case(world, comm, trainer, model, tensors, versions=2, not_loaded=[SKIPPED] if not trainer else [])
        expect_success("a declared parameter", outcome)
        if not trainer and outcome[0] is None:
            checks.check(torch.equal(model.model.norm.weight.view(torch.int16), before.view(torch.int16)),
                         "a declared parameter: an update wrote into it")
            expected = Qwen3MoeForCausalLM(config, comm.Get_rank(), 2)
            Qwen3MoeForCausalLM.load_weights(expected, hf_checkpoint.make_checkpoint(tensors, 2).items())
            mine = dict(model.named_parameters())
            for name, want in expected.named_parameters():
                if name != SKIPPED:
                    checks.check(torch.equal(mine[name].view(torch.int16) if want.dtype == torch.bfloat16 else mine[name],
                                             want.view(torch.int16) if want.dtype == torch.bfloat16 else want),
                                 f"a declared parameter: {name} is not version 2")

        # Part of a parameter missed (qkv_proj without k_proj of layer 0): kept, connect succeeds.
        expect_success("a partly reached parameter",
                       run_case(world, comm, trainer, models(PartlySkippingRollout if rank == 3 else Qwen3MoeForCausalLM),
                                tensors))
    except Exception:
        checks.exception("accounting")
    checks.finish()


if __name__ == "__main__":
    main()
