"""Parameters that their framework moves after the adapter took them (issue 28), under mpirun:

    mpirun -n 4 python3 test_moved_parameters.py

Ranks 0-1: a Megatron trainer (tp=2, ep=2); ranks 2-3: one rollout engine (tp=2, ep=2). Each case has fresh
adapters, sends version 1, lets ranks move parameters, then sends more versions:
  - followed: rollout rank 2 rebinds every parameter (`p.data = p.data.clone()`, what vLLM's
    process_weights_after_loading does) and trainer rank 0 grows one parameter's storage
    (`p.data.resize_()`, which frees the old block; tensors filled with a pattern are allocated into it):
    versions 2 and 3 arrive bit for bit on every rollout rank (on rank 3, which moved nothing, any byte
    the trainers read from their freed blocks would show), and the storage rank 2 let go of (kept
    alive by the test) still holds version 1: the adapter never wrote it again;
  - refused, rollout: rollout rank 3 calls `resize_()` on a parameter (a new shape; the old block freed,
    tensors filled with a pattern allocated into it): version 2 fails on every rank with an error naming
    world rank 3, the parameter and its shapes; the pattern is intact, and rollout rank 2, which changed
    nothing, still holds version 1 bit for bit (nothing of version 2 was written anywhere);
  - refused, trainer: trainer rank 1 rebinds a bf16 parameter to float32: version 2 fails on every rank,
    naming world rank 1, the parameter and both dtypes; both rollout ranks still hold version 1.
Every case runs twice: neither side staged, and both staged. Then, unstaged:
  - followed at connect: trainer rank 1 and rollout rank 2 rebind every parameter between the adapter's
    construction and connect: connect probes the new memory, and version 2 arrives bit for bit;
  - refused, storage freed: rollout rank 2 frees a parameter's storage (`storage().resize_(0)`, as FSDP
    does): named with the bytes left; rollout rank 3 still holds version 1;
  - refused, tied: rollout rank 3 rebinds a parameter onto another's memory (`p.data = q.data`): both named;
    rollout rank 2 still holds version 1.
Every failure reaches every rank within twice the timeout.
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
TIMEOUT_SECONDS = 5
PATTERN = 0x5A5A  # what the tensors allocated into a freed block hold


def fill_freed_block(nbytes):
    """Tensors of `nbytes` (the size of a block just freed) holding PATTERN: some land in the freed block."""
    return [torch.full((max(1, nbytes // 2),), PATTERN, dtype=torch.int16) for _ in range(8)]


def main():
    world = MPI.COMM_WORLD
    rank = world.Get_rank()
    checks = Checks(world, watchdog_seconds=int(os.environ.get("WB_TEST_WATCHDOG", 150)))
    if world.Get_size() != 4:
        raise SystemExit("needs 4 ranks")
    trainer = rank < 2
    comm = world.Split(0 if trainer else 1, rank)
    config = hf_checkpoint.load_config(os.path.join(HERE, "qwen3_moe_tiny.json"))
    tensors = list(hf_checkpoint.tensor_list(config))
    versions = {v: hf_checkpoint.make_checkpoint(tensors, v) for v in (1, 2, 3)}

    def model():
        if trainer:
            return GPTModel(config, comm.Get_rank(), tp=2, dp=1, ep=2)
        return Qwen3MoeForCausalLM(config, comm.Get_rank(), 2)

    def expected(v):
        m = model()
        type(m).load_weights(m, iter(versions[v].items()))
        return {n: p.detach() for n, p in m.named_parameters()}

    def same_as(params, v, what):
        wrong = hf_checkpoint.first_difference(params, expected(v))
        checks.check(wrong is None, f"{what}: world rank {rank} does not hold version {v}: {wrong}")

    def poll_until(receiver, events, what):
        deadline = time.monotonic() + 3 * TIMEOUT_SECONDS
        while time.monotonic() < deadline:
            result = receiver.poll_requests()
            if result.event in events:
                return result
            time.sleep(0.002)
        raise AssertionError(f"{what}: none of {events} within {3 * TIMEOUT_SECONDS} s")

    def run_case(name, move, last_version, staged, before_connect=None):
        """Connects fresh adapters (both sides staged or neither), sends version 1, calls move(model) on every
        rank once version 1 is in, then sends versions 2..last_version. before_connect(model), when given, runs
        between the adapter's construction and connect. Returns (model, error message or None, seconds the
        failure took)."""
        m = model()
        params = dict(m.named_parameters())
        modes = {"sender_staging": staged, "receiver_staging": staged, "timeout_seconds": TIMEOUT_SECONDS}
        if trainer:
            adapter = wb.SenderAdapter(world, comm, params, tensors, m.load_weights, **modes)
            if before_connect:
                before_connect(m)
            type(m).load_weights(m, iter(versions[1].items()))
            adapter.connect()
            adapter.send_weights(1)
            adapter.wait()  # every rollout installed it
            move(m)
            try:
                for v in range(2, last_version + 1):
                    type(m).load_weights(m, iter(versions[v].items()))
                    start = time.monotonic()
                    adapter.send_weights(v)
                adapter.shutdown()
            except wb.Error as error:
                return m, error.message, time.monotonic() - start
            return m, None, 0.0
        adapter = wb.ReceiverAdapter(world, comm, params, m.load_weights, **modes)
        if before_connect:
            before_connect(m)
        poll_until(adapter, (wb.Event.CONNECTED,), f"{name}: connect")
        poll_until(adapter, (wb.Event.INSTALLED,), f"{name}: version 1")
        same_as(dict(m.named_parameters()), 1, f"{name}: version 1")
        move(m)  # before the next poll_requests, which takes version 2
        start = time.monotonic()
        try:
            result = poll_until(adapter, (wb.Event.SHUTDOWN, wb.Event.ABORTED), name)
        except wb.Error as error:
            return m, error.message, time.monotonic() - start
        if result.event == wb.Event.ABORTED:
            checks.check(result.version == 1 and result.parameters_intact,
                         f"{name}: ABORTED with version {result.version}, parameters_intact {result.parameters_intact}")
            return m, result.status.message, time.monotonic() - start
        return m, None, 0.0

    def expect_refusal(name, outcome, pattern):
        _, message, seconds = outcome
        if not checks.check(message is not None, f"{name}: no error on world rank {rank}"):
            return
        checks.check(re.search(pattern, message, re.S) is not None,
                     f"{name}: world rank {rank}'s error {message!r} does not match {pattern!r}")
        checks.check(seconds < 2 * TIMEOUT_SECONDS, f"{name}: the error took {seconds:.1f} s on world rank {rank}")

    try:
        for staged in (False, True):
            mode = " (both sides staged)" if staged else ""
            # ---- followed ------------------------------------------------------------------------------------
            let_go = {}  # rollout rank 2: the storage each parameter had before it was rebound
            fillers = []

            def rebind(m):
                if rank == 2:
                    for n, p in m.named_parameters():
                        let_go[n] = p.data
                        p.data = p.data.clone()
                elif trainer:
                    p = next(p for _, p in m.named_parameters() if p.numel() > 1)
                    nbytes = p.numel() * p.element_size()
                    p.data.resize_(4 * p.numel())  # the storage grows (its old block freed); p keeps its shape
                    fillers.extend(fill_freed_block(nbytes))

            m, message, _ = run_case(f"followed{mode}", rebind, 3, staged)
            checks.check(message is None, f"followed{mode}: world rank {rank}: {message}")
            if not trainer and message is None:
                same_as(dict(m.named_parameters()), 3, f"followed{mode}: versions 2 and 3 after the rebinding")
            if rank == 2:
                same_as(let_go, 1, f"followed{mode}: the storage let go of (never written after the rebinding)")
            world.Barrier()

            # ---- refused: a rollout parameter resized --------------------------------------------------------
            moved = {}

            def resize(m):
                if rank == 3:
                    name, p = next((n, p) for n, p in m.named_parameters() if p.dim() == 1 and p.numel() > 1)
                    moved["name"], moved["shape"] = name, list(p.shape)
                    nbytes = p.numel() * p.element_size()
                    p.resize_(4 * p.numel())  # a new shape, and its old block freed
                    fillers.extend(fill_freed_block(nbytes))

            outcome = run_case(f"rollout resize_{mode}", resize, 2, staged)
            name = world.bcast(moved.get("name"), root=3)
            shape = world.bcast(moved.get("shape"), root=3)
            expect_refusal(f"rollout resize_{mode}", outcome,
                           rf"engine 0 worker 1 \(world rank 3\): version 2: parameter {re.escape(name)}: "
                           rf"its shape changed from \[{shape[0]}\] to \[{4 * shape[0]}\].*"
                           r"nothing of this version was written")
            if rank == 2:
                same_as(dict(outcome[0].named_parameters()), 1, f"rollout resize_{mode}: the other rollout rank")
            if rank == 3:
                spoiled = sum(1 for t in fillers if not bool((t == PATTERN).all()))
                checks.check(not spoiled, f"rollout resize_{mode}: {spoiled} tensors allocated into the freed "
                                          "block were written")
            world.Barrier()

            # ---- refused: a trainer parameter's dtype changed ------------------------------------------------
            def retype(m):
                if rank == 1:
                    name, p = next((n, p) for n, p in m.named_parameters() if p.dtype == torch.bfloat16)
                    moved["trainer"] = name
                    p.data = p.data.float()

            outcome = run_case(f"trainer dtype{mode}", retype, 2, staged)
            name = world.bcast(moved.get("trainer"), root=1)
            expect_refusal(f"trainer dtype{mode}", outcome,
                           rf"trainer 1 \(world rank 1\): version 2: parameter {re.escape(name)}: "
                           r"its dtype changed from bf16 to f32")
            if not trainer:
                same_as(dict(outcome[0].named_parameters()), 1, f"trainer dtype{mode}: the rollouts")

        # ---- followed at connect: parameters rebound between construction and connect -----------------------
        def rebind_all(m):
            if rank in (1, 2):
                for _, p in m.named_parameters():
                    p.data = p.data.clone()

        m, message, _ = run_case("rebound before connect", lambda m: None, 2, False, before_connect=rebind_all)
        checks.check(message is None, f"rebound before connect: world rank {rank}: {message}")
        if not trainer and message is None:
            same_as(dict(m.named_parameters()), 2, "rebound before connect: version 2")
        world.Barrier()

        # ---- refused: a rollout storage freed; two rollout parameters tied into one place ----------------
        def free_storage(m):
            if rank == 2:
                name, p = next((n, p) for n, p in m.named_parameters() if p.numel() > 1)
                moved["freed"], moved["bytes"] = name, p.numel() * p.element_size()
                p.data.storage().resize_(0)  # what FSDP does to a parameter it does not hold

        outcome = run_case("storage freed", free_storage, 2, False)
        name, nbytes = world.bcast((moved.get("freed"), moved.get("bytes")), root=2)
        expect_refusal("storage freed", outcome,
                       rf"engine 0 worker 0 \(world rank 2\): version 2: parameter {re.escape(name)}: "
                       rf"its storage was freed or shrunk \(0 bytes left of its {nbytes}\)")
        if rank == 3:
            same_as(dict(outcome[0].named_parameters()), 1, "storage freed: the other rollout rank")
        world.Barrier()

        def tie(m):
            if rank == 3:
                params = list(m.named_parameters())
                (a, p), (b, q) = next(((x, y) for i, x in enumerate(params) for y in params[i + 1:]
                                       if x[1].shape == y[1].shape and x[1].dtype == y[1].dtype))
                moved["tied"] = (a, b)
                p.data = q.data  # followable on its own, but two parameters in one place get each other's bytes

        outcome = run_case("tied", tie, 2, False)
        a, b = world.bcast(moved.get("tied"), root=3)
        expect_refusal("tied", outcome,
                       rf"engine 0 worker 1 \(world rank 3\): version 2: parameter {re.escape(a)} was rebound to "
                       rf"memory that parameter {re.escape(b)} holds too")
        if rank == 2:
            same_as(dict(outcome[0].named_parameters()), 1, "tied: the other rollout rank")
    except Exception:
        checks.exception("moved parameters")
    checks.finish()


if __name__ == "__main__":
    main()
