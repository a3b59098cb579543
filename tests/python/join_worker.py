"""A trainer job and engine jobs of their own in Python (issue 31), run by check_join.py:

    join_worker.py trainers ADDRESS MODE    2 trainers, no engine of their own world: they publish ADDRESS
                                            (join_address) and send versions 1.. until an engine job joined,
                                            left and another joined, then 3 more
    join_worker.py engine ADDRESS MODE ROLE an engine of as many workers as its job's ranks (tensor parallel)
                                            that joins by ADDRESS; ROLE leave: leave() after its third
                                            install; serve: until the trainers shut down

Parameters moved by their framework on a joined link (`p.data = p.data.clone()`, as vLLM's
process_weights_after_loading does): trainer rank 0 rebinds every parameter once the first engine job
joined (every later version must be read from the new memory), and the serving engine's worker 0 after its
first install (every later one must land there; the memory it let go of, kept alive, is never written again).

MODE: sync | async (both sides staged). Version v is the example model's initial checkpoint plus v/1000
(examples/python/tiny_model.py): the trainers load it with their load_weights before each send_weights, and
every engine worker compares each version it installs with its own load_weights of it, bit for bit.
"""

import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples", "python"))
from harness import Checks, import_or_skip  # noqa: E402

torch, MPI = import_or_skip()
import weightbridge  # noqa: E402
from tiny_model import RolloutModel, TrainerModel, initial_checkpoint  # noqa: E402

role, address, mode = sys.argv[1:4]
engine_role = sys.argv[4] if len(sys.argv) > 4 else ""
world = MPI.COMM_WORLD
rank = world.Get_rank()
checks = Checks(world, 200)
staged = mode == "async"
BEFORE, AFTER = 3, 3


def checkpoint(version):
    return [(name, tensor + version / 1000) for name, tensor in initial_checkpoint()]


def say(text):
    sys.stdout.write(text + "\n")  # one write: mpirun does not interleave it with another rank's line
    sys.stdout.flush()


def run_trainers():
    model = TrainerModel()
    model.load_weights(checkpoint(0))
    from tiny_model import checkpoint_tensors
    sender = weightbridge.SenderAdapter(world, world, dict(model.named_parameters()), checkpoint_tensors(),
                                        model.load_weights, join_address=address, timeout_seconds=30,
                                        sender_staging=staged, receiver_staging=staged)
    sender.connect()
    checks.check(sender.engines == 0, f"a trainer job with no engine counts {sender.engines} engines")
    events = [1, 0, 1]  # engines after a send_weights: one joined, it left, another joined
    seen, engines, last = 0, 0, 0
    rebound = False
    for version in range(1, 1500):
        model.load_weights(checkpoint(version))  # "training"
        sender.send_weights(version)
        if version == BEFORE and rank == 0:
            say(f"trainers: version {version} sent")
        if sender.engines != engines and rank == 0:
            say(f"trainers: {sender.engines} engines after version {version}")
        engines = sender.engines
        if engines == 1 and not rebound:
            rebound = True
            if rank == 0:
                for p in model.parameters():
                    p.data = p.data.clone()
        if seen < len(events) and engines == events[seen]:
            seen += 1
            last = version + AFTER if seen == len(events) else 0
        if last and version == last:
            break
        if version >= BEFORE:
            time.sleep(0.05)
    checks.check(last != 0, f"{seen} of the {len(events)} events (join, leave, join) by version 1500")
    sender.shutdown()
    states = [(e.state, e.installed) for e in sender.stats().engines]
    checks.check(states == [("left", states[0][1]), ("serving", last)] and states[0][1] > BEFORE,
                 f"the trainers' engines: {sender.stats().engines}")
    if rank == 0:
        for e in sender.stats().engines:
            say(f"trainers: {e.name}: {e.state}, installed {e.installed}")
        say(f"trainers: sent up to {last}")


def run_engine():
    tp = world.Get_size()
    model = RolloutModel(rank, tp)
    model.load_weights(checkpoint(0))
    expected = RolloutModel(rank, tp)
    receiver = weightbridge.ReceiverAdapter(world, world, dict(model.named_parameters()), model.load_weights,
                                            join_address=address, timeout_seconds=30, receiver_staging=staged,
                                            sender_staging=staged)
    events, installed, let_go = [], [], []
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        result = receiver.poll_requests()
        if result.event in (weightbridge.Event.NONE, weightbridge.Event.RECEIVING):
            time.sleep(0.002)
            continue
        events.append(result.event)
        if result.event == weightbridge.Event.INSTALLED:
            expected.load_weights(checkpoint(result.version))
            for (name, got), (_, want) in zip(model.named_parameters(), expected.named_parameters()):
                checks.check(torch.equal(got, want), f"version {result.version}: {name} differs")
            installed.append(result.version)
            if engine_role == "serve" and rank == 0 and not let_go:
                for p in model.parameters():
                    let_go.append((p.data, p.data.clone()))
                    p.data = p.data.clone()
            if engine_role == "leave" and len(installed) == 3:
                receiver.leave()
                final = receiver.poll_requests().event
                checks.check(final == weightbridge.Event.SHUTDOWN, f"after leave() poll_requests said {final}")
                break
        if result.event == weightbridge.Event.SHUTDOWN:
            break
    checks.check(events[:2] == [weightbridge.Event.CONNECTED, weightbridge.Event.INSTALLED],
                 f"the first events were {events[:2]}, not CONNECTED then INSTALLED")
    checks.check(len(installed) >= 3 and installed == list(range(installed[0], installed[0] + len(installed)))
                 and installed[0] > BEFORE, f"installed {installed}")
    checks.check(all(torch.equal(old, kept) for old, kept in let_go),
                 "the memory the engine let go of was written after it rebound its parameters")
    if installed:
        say(f"joined engine worker {rank}: first event after CONNECTED INSTALLED {installed[0]}, then up to "
            f"{installed[-1]}, each bit for bit{'; then it left' if engine_role == 'leave' else ''}")


try:
    run_trainers() if role == "trainers" else run_engine()
except Exception:  # noqa: BLE001 (every rank's failure is reported)
    checks.exception(role)
checks.finish()
