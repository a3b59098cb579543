"""Ctrl-C and threads against the Python adapters (issue 28), under mpirun:

    mpirun -n 4 python3 test_interrupt.py

Ranks 0-1: a Megatron trainer (tp=2, ep=2); ranks 2-3: one rollout engine (tp=2, ep=2). The engine's
before_update_hook holds an update for HOLD_SECONDS, so the trainers' send_weights waits in the transfer
for that long (the engine grants nothing before its hook returned).
  - SIGINT to trainer rank 0 one second into send_weights(2): KeyboardInterrupt there within
    INTERRUPT_SECONDS of the signal (before, only when the call returned, after the version was sent);
    trainer rank 1's send_weights raises weightbridge.Error naming the interruption; each rollout rank
    gets version 2 as Event.ABORTED, its status naming the interruption, parameters_intact, and its
    parameters still version 1 bit for bit; the next poll_requests raises; every rank ends.
  - send_weights from a second thread while the first runs: RuntimeError naming both calls (so do wait
    and shutdown), nothing queued; the same for poll_requests on a rollout; the first call then completes
    and a later version arrives bit for bit.
"""

import os
import re
import signal
import threading
import time

from harness import Checks, import_or_skip

torch, MPI = import_or_skip()

import weightbridge as wb  # noqa: E402

import hf_checkpoint  # noqa: E402
from megatron_model import GPTModel  # noqa: E402
from rollout_model import Qwen3MoeForCausalLM  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
TIMEOUT_SECONDS = 30
HOLD_SECONDS = 6  # what send_weights would take without the interrupt
SIGNAL_AFTER_SECONDS = 1
INTERRUPT_SECONDS = 2  # goal: within 100 ms of the signal; 2 s leaves room for a loaded machine
INTERRUPTED = r"interrupted by a signal \(KeyboardInterrupt raised by its handler"


def bits(t):
    return t.view(torch.int16) if t.dtype == torch.bfloat16 else t


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
        return dict(m.named_parameters())

    def same_as(params, want, what):
        wrong = [n for n, p in params.items() if not torch.equal(bits(p), bits(want[n]))]
        return checks.check(not wrong, f"{what}: {len(wrong)} parameters differ, e.g. {wrong[:3]}")

    hold = {}  # version -> seconds the rollouts' hook holds it

    def hook(version):
        time.sleep(hold.get(version, 0))

    def construct(m):
        params = dict(m.named_parameters())
        if trainer:
            return wb.SenderAdapter(world, comm, params, tensors, m.load_weights, timeout_seconds=TIMEOUT_SECONDS)
        return wb.ReceiverAdapter(world, comm, params, m.load_weights, timeout_seconds=TIMEOUT_SECONDS,
                                  before_update_hook=hook)

    def poll_until(receiver, events, what):
        deadline = time.monotonic() + 3 * TIMEOUT_SECONDS
        while time.monotonic() < deadline:
            result = receiver.poll_requests()
            if result.event in events:
                return result
            time.sleep(0.002)
        raise AssertionError(f"{what}: none of {events} within {3 * TIMEOUT_SECONDS} s")

    try:
        # ---- Ctrl-C during send_weights -------------------------------------------------------------
        m = model()
        adapter = construct(m)
        hold[2] = HOLD_SECONDS
        if trainer:
            type(m).load_weights(m, iter(versions[1].items()))
            adapter.connect()
            adapter.send_weights(1)
            type(m).load_weights(m, iter(versions[2].items()))
            fired = []
            if rank == 0:
                # What an interactive interpreter has; a launcher may start its ranks with SIGINT ignored.
                signal.signal(signal.SIGINT, signal.default_int_handler)

                def interrupt():
                    fired.append(time.monotonic())
                    os.kill(os.getpid(), signal.SIGINT)
                threading.Timer(SIGNAL_AFTER_SECONDS, interrupt).start()
            start = time.monotonic()
            outcome = None
            try:
                adapter.send_weights(2)
            except KeyboardInterrupt:
                outcome = "KeyboardInterrupt"
            except wb.Error as error:
                outcome = error
            ended = time.monotonic()
            if rank == 0:
                checks.check(outcome == "KeyboardInterrupt", f"Ctrl-C: send_weights gave {outcome!r}, not KeyboardInterrupt")
                after = ended - fired[0] if fired else float("inf")
                print(f"Ctrl-C: KeyboardInterrupt {after * 1000:.0f} ms after the signal "
                      f"(send_weights held {HOLD_SECONDS} s by the rollouts)", flush=True)
                checks.check(after < INTERRUPT_SECONDS,
                             f"Ctrl-C: KeyboardInterrupt {after:.2f} s after the signal (at most {INTERRUPT_SECONDS} s)")
            else:
                print(f"Ctrl-C: trainer rank 1: {outcome!r}", flush=True)
                checks.check(isinstance(outcome, wb.Error) and re.search(INTERRUPTED, outcome.message),
                             f"Ctrl-C: trainer rank 1's send_weights gave {outcome!r}, not an error naming the interruption")
                checks.check(ended - start < HOLD_SECONDS, f"Ctrl-C: trainer rank 1 returned after {ended - start:.1f} s")
            # The adapter keeps the failure: every later call raises it, shutdown included.
            try:
                adapter.shutdown()
                checks.fail("Ctrl-C: shutdown after the interrupted update raised nothing")
            except wb.Error as error:
                checks.check(re.search(INTERRUPTED, error.message) is not None,
                             f"Ctrl-C: shutdown raised {error.message!r}, not the interruption")
        else:
            poll_until(adapter, (wb.Event.CONNECTED,), "connect")
            result = poll_until(adapter, (wb.Event.INSTALLED,), "version 1")
            version_1 = {n: p.detach().clone() for n, p in m.named_parameters()}
            same_as(version_1, expected(1), "version 1")
            start = time.monotonic()
            result = poll_until(adapter, (wb.Event.ABORTED, wb.Event.INSTALLED), "version 2")
            print(f"Ctrl-C: world rank {rank}: {result!r}", flush=True)
            checks.check(result.event == wb.Event.ABORTED and result.aborted_version == 2,
                         f"Ctrl-C: the rollout got {result.event} (aborted_version {result.aborted_version}), not version 2 ABORTED")
            checks.check(re.search(INTERRUPTED, result.status.message) is not None,
                         f"Ctrl-C: the rollout's status {result.status.message!r} does not name the interruption")
            checks.check(result.parameters_intact, "Ctrl-C: parameters_intact is False")
            checks.check(result.version == 1 and adapter.installed_version == 1,
                         f"Ctrl-C: installed version {adapter.installed_version}, not 1")
            checks.check(time.monotonic() - start < HOLD_SECONDS + TIMEOUT_SECONDS / 2,
                         f"Ctrl-C: ABORTED after {time.monotonic() - start:.1f} s")
            same_as(dict(m.named_parameters()), version_1, "Ctrl-C: after the aborted update, version 1")
            try:
                adapter.poll_requests()
                checks.fail("Ctrl-C: poll_requests after ABORTED raised nothing")
            except wb.Error as error:
                checks.check(re.search(INTERRUPTED, error.message) is not None,
                             f"Ctrl-C: the next poll_requests raised {error.message!r}")
        del adapter
        world.Barrier()

        # ---- two threads in one adapter ---------------------------------------------------------------
        m = model()
        adapter = construct(m)
        hold.clear()
        hold[1] = 3
        refusals = []

        def refused(call, pattern):
            try:
                call()
                refusals.append(f"threads: {pattern} was not refused")
            except RuntimeError as error:
                if re.search(pattern, str(error)) is None:
                    refusals.append(f"threads: {str(error)!r} does not match {pattern!r}")
            except Exception as error:  # noqa: BLE001
                refusals.append(f"threads: {pattern}: {error!r}, not RuntimeError")

        first = {}

        def in_thread(call):
            def body():
                try:
                    first["result"] = call()
                except Exception as error:  # noqa: BLE001
                    first["error"] = error
            thread = threading.Thread(target=body)
            thread.start()
            time.sleep(1)  # the first call is inside, held by the hook for 3 s
            return thread

        busy = r" runs on another thread: an adapter takes one call at a time"
        if trainer:
            type(m).load_weights(m, iter(versions[1].items()))
            adapter.connect()
            thread = in_thread(lambda: adapter.send_weights(1))
            refused(lambda: adapter.send_weights(2), r"^SenderAdapter\.send_weights was called while SenderAdapter\.send_weights" + busy)
            refused(adapter.wait, r"^SenderAdapter\.wait was called while SenderAdapter\.send_weights" + busy)
            refused(adapter.shutdown, r"^SenderAdapter\.shutdown was called while SenderAdapter\.send_weights" + busy)
            thread.join()
            checks.check("error" not in first, f"threads: the first send_weights raised {first.get('error')!r}")
            type(m).load_weights(m, iter(versions[3].items()))
            adapter.send_weights(3)  # the refused version 2 took nothing: 3 follows 1
            adapter.shutdown()
        else:
            poll_until(adapter, (wb.Event.CONNECTED,), "connect")
            # Wait for the update request inside a thread; the hook holds it there.
            thread = in_thread(lambda: poll_until(adapter, (wb.Event.INSTALLED, wb.Event.ABORTED), "version 1"))
            refused(adapter.poll_requests, r"^ReceiverAdapter\.poll_requests was called while ReceiverAdapter\.poll_requests" + busy)
            thread.join()
            checks.check("error" not in first and first.get("result") is not None and
                         first["result"].event == wb.Event.INSTALLED and first["result"].version == 1,
                         f"threads: the first poll_requests gave {first!r}")
            result = poll_until(adapter, (wb.Event.INSTALLED,), "version 3")
            checks.check(result.version == 3, f"threads: installed {result.version}, not 3")
            same_as(dict(m.named_parameters()), expected(3), "threads: version 3")
            poll_until(adapter, (wb.Event.SHUTDOWN,), "shutdown")
        for r in refusals:
            checks.fail(r)
        del adapter
    except Exception:
        checks.exception("interrupt")
    checks.finish()


if __name__ == "__main__":
    main()
