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
  - an unknown WB_* variable (WB_BUFER_MIB) set on every rank: world rank 0's first adapter warns once, naming the
    closest setting; the other ranks say nothing (before: only wb-replay and wb-bench warned);
  - a parameter name that is not UTF-8 (a lone surrogate) on world rank 2: every rank's error names the rank and
    the name (before: pybind11's "Unable to cast Python instance" naming nothing);
  - an HDF5 file with a tensor name that is not UTF-8: read_tensor_list raises weightbridge.Error naming the
    file and the name (before: a bare UnicodeDecodeError);
  - tied weights: the embedding under a second name on both sides (one memory, as a state_dict lists tied
    weights): connect and an update succeed, sync and both sides staged, every rollout parameter bit for bit
    (before: "not a pure copy");
    a parameter that is part of another one's memory is refused on every rank naming both.
"""

import gc
import os
import re
import shutil
import tempfile
import time

import sys

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
        # MPI_COMM_SELF on one worker of the engine, with an unknown WB_* variable that the first adapter warns of.
        group = MPI.COMM_SELF if rank == 3 else comm
        os.environ["WB_BUFER_MIB"] = "64"
        with tempfile.TemporaryFile() as captured:
            sys.stderr.flush()
            saved_stderr = os.dup(2)
            os.dup2(captured.fileno(), 2)
            try:
                outcome = attempt(lambda: construct(group))
            finally:
                os.dup2(saved_stderr, 2)
                os.close(saved_stderr)
            captured.seek(0)
            stderr_text = captured.read().decode(errors="replace")
        del os.environ["WB_BUFER_MIB"]
        warning = ("environment variable WB_BUFER_MIB is no WeightBridge setting and is ignored; the closest setting "
                   "is WB_BUFFER_MIB")
        checks.check(stderr_text.count(warning) == (1 if rank == 0 else 0),
                     f"unknown WB_BUFER_MIB: world rank {rank} printed {stderr_text.count(warning)} warnings: {stderr_text!r}")
        expect_error("MPI_COMM_SELF on one rollout worker", outcome,
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

        # A parameter name that is not UTF-8, on one rollout worker.
        bad_name = "model.norm.weight\udcff"
        bad_params = dict(params, **{bad_name: torch.zeros(4, dtype=torch.bfloat16)}) if rank == 2 else params
        expect_error("a name that is not UTF-8",
                     attempt(lambda: wb.ReceiverAdapter(world, comm, bad_params, model.load_weights,
                                                        timeout_seconds=TIMEOUT_SECONDS) if not trainer else construct(comm)),
                     r"^rollout \(world rank 2\): params: the parameter name 'model\.norm\.weight\\udcff' is not valid "
                     r"UTF-8 \(UnicodeEncodeError: .*surrogates not allowed\)")

        for make, what in ((lambda: wb.TensorInfo(bad_name, "bf16", (4,)), "TensorInfo: the name"),
                           (lambda: construct(comm, not_loaded=[bad_name]), "not_loaded: the name")):
            error, _ = attempt(make)
            checks.check(isinstance(error, wb.Error) and f"{what} 'model.norm.weight\\udcff' is not valid UTF-8"
                         in error.message, f"a name that is not UTF-8 in {what}: {error!r}")

        # An HDF5 file with a tensor name that is not UTF-8 (written with h5py where it is installed).
        if rank == 0:
            try:
                import h5py
                import numpy
            except ImportError:
                h5py = None
            if h5py is not None:
                folder = tempfile.mkdtemp(prefix="wb-misuse-")
                path = os.path.join(folder, "not_utf8.h5")
                with h5py.File(path, "w") as f:
                    f.create_dataset(b"w.\xff", data=numpy.zeros(4, dtype="<f4"))
                try:
                    wb.read_tensor_list(path)
                    checks.fail("an HDF5 name that is not UTF-8: read_tensor_list succeeded")
                except wb.Error as error:
                    checks.check(path in error.message and "tensor w.\\xff" in error.message and "not UTF-8" in error.message,
                                 f"an HDF5 name that is not UTF-8: {error.message!r}")
                except Exception as error:  # noqa: BLE001 - the failure this case is about
                    checks.fail(f"an HDF5 name that is not UTF-8: {error!r}")
                shutil.rmtree(folder)
        world.Barrier()

        # Tied weights: the embedding also under a second name, one memory (as a state_dict lists tied weights).
        embedding = "embedding.word_embeddings.weight" if trainer else "model.embed_tokens.weight"
        tied_model = GPTModel(config, comm.Get_rank(), tp=2, dp=1, ep=2) if trainer else Qwen3MoeForCausalLM(config, comm.Get_rank(), 2)
        tied_params = dict(tied_model.named_parameters())
        tied_params["tied.output.weight"] = tied_params[embedding]
        for version, staged in ((3, False), (4, True)):  # sync, then both sides staged
            checkpoint = hf_checkpoint.make_checkpoint(tensors, version)
            mode = dict(sender_staging=staged) if trainer else dict(receiver_staging=staged)

            def tied_update():
                if trainer:
                    GPTModel.load_weights(tied_model, checkpoint.items())
                    sender = wb.SenderAdapter(world, comm, tied_params, tensors, tied_model.load_weights,
                                              timeout_seconds=TIMEOUT_SECONDS, **mode)
                    sender.connect()
                    sender.send_weights(1)
                    sender.shutdown()
                    return
                receiver = wb.ReceiverAdapter(world, comm, tied_params, tied_model.load_weights,
                                              timeout_seconds=TIMEOUT_SECONDS, **mode)
                deadline = time.monotonic() + 4 * TIMEOUT_SECONDS
                while (event := receiver.poll_requests().event) != wb.Event.SHUTDOWN and time.monotonic() < deadline:
                    time.sleep(0.002)
                if event != wb.Event.SHUTDOWN:
                    raise AssertionError("no SHUTDOWN")
            error, seconds = attempt(tied_update)
            checks.check(error is None, f"tied weights, staged={staged}: {error!r}")
            if not trainer and error is None:
                expected = Qwen3MoeForCausalLM(config, comm.Get_rank(), 2)
                Qwen3MoeForCausalLM.load_weights(expected, checkpoint.items())
                want_all = dict(expected.named_parameters())
                want_all["tied.output.weight"] = want_all[embedding]
                for name, want in want_all.items():
                    checks.check(torch.equal(hf_checkpoint.as_bits(tied_params[name]), hf_checkpoint.as_bits(want)),
                                 f"tied weights, staged={staged}: {name} is not version {version}")
            world.Barrier()

        # A parameter that is part of another's memory: refused at connect, naming both.
        part_params = dict(tied_model.named_parameters())
        if trainer:
            part_params["part.of.embedding"] = part_params[embedding][1:]

        def part_connect():
            if trainer:
                wb.SenderAdapter(world, comm, part_params, tensors, tied_model.load_weights,
                                 timeout_seconds=TIMEOUT_SECONDS).connect()
                return
            receiver = wb.ReceiverAdapter(world, comm, part_params, tied_model.load_weights, timeout_seconds=TIMEOUT_SECONDS)
            deadline = time.monotonic() + 4 * TIMEOUT_SECONDS
            while time.monotonic() < deadline:
                receiver.poll_requests()
                time.sleep(0.002)
            raise AssertionError("no error")
        expect_error("a parameter inside another's memory", attempt(part_connect),
                     r"trainer 0 \(world rank 0\): .*parameters embedding\.word_embeddings\.weight \(bf16 \[\d+, \d+\]\) and "
                     r"part\.of\.embedding \(bf16 \[\d+, \d+\]\) overlap in memory without being the same tensor", same=False)

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
