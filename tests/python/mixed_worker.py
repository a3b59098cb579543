"""The Python half of a job that mixes Python and C++ adapters (mixed_worker.cpp, wb-mixed-worker, is the C++
half: the same model, layouts and values; check_mixed.py runs the two in one mpirun).

    mpirun -n 2 python3 mixed_worker.py --role trainer : -n 2 wb-mixed-worker --role rollout

Trainers are world ranks 0..T-1, the rest rollout engines of --tp ranks. Every element of version v is a
function of (tensor, flat index, v), computed as the C++ half does; a rollout checks every parameter bit for
bit after each install. Prints one "mixed: ..." line; exit 0 only when every version verified (trainers:
every send succeeded and stats().history gives each version's EWTT and AGST). No collective outside the
adapters: the C++ ranks would not take part.
"""

import argparse
import os
import sys
import time

from harness import import_or_skip

torch, MPI = import_or_skip()

import weightbridge as wb  # noqa: E402

TENSORS = [("embed.weight", torch.bfloat16, (48, 32)), ("proj.weight", torch.float32, (40, 24)),
           ("norm.weight", torch.float32, (24,))]



def say(line):
    """One write(2) per line: mpirun forwards each rank's pipe as it reads it, and print() may hand the text and
    its newline over separately, so that another rank's line lands in the middle of this one."""
    sys.stdout.flush()
    os.write(1, (line + "\n").encode())

def full_tensor(index, version):
    """Version `version` of checkpoint tensor `index`, as mixed_worker.cpp's values()."""
    _, dtype, shape = TENSORS[index]
    n = 1
    for d in shape:
        n *= d
    code = torch.arange(n, dtype=torch.int64) * 7919 + index * 104729 + version * 1000003
    if dtype == torch.bfloat16:
        return (code % 0x3F00 + 0x100).to(torch.int16).view(torch.bfloat16).reshape(shape)
    return ((code % 65521).double() / 65521.0 - 0.5).float().reshape(shape)


def layout(trainer, rank, size):
    """name -> (tensor index, slices): mixed_worker.cpp's layout()."""
    if trainer:
        cols, rows = 32 // size, 40 // size
        pieces = {"embed": (0, (slice(None), slice(rank * cols, (rank + 1) * cols))),
                  "proj": (1, (slice(rank * rows, (rank + 1) * rows), slice(None)))}
        if rank == 0:
            pieces["norm"] = (2, (slice(None),))
        return pieces
    rows, cols = 48 // size, 24 // size
    return {"embed": (0, (slice(rank * rows, (rank + 1) * rows), slice(None))),
            "proj": (1, (slice(None), slice(rank * cols, (rank + 1) * cols))),
            "norm": (2, (slice(None),))}


class Worker:
    def __init__(self, trainer, rank, size):
        self.pieces = layout(trainer, rank, size)
        self.params = {name: full_tensor(i, 0)[cut].clone(memory_format=torch.contiguous_format)
                       for name, (i, cut) in self.pieces.items()}
        self.by_tensor = {TENSORS[i][0]: (name, cut) for name, (i, cut) in self.pieces.items()}

    def load_weights(self, weights):
        for tensor_name, tensor in weights:
            if tensor_name in self.by_tensor:
                name, cut = self.by_tensor[tensor_name]
                self.params[name].copy_(tensor[cut])

    def set(self, version):
        for name, (i, cut) in self.pieces.items():
            self.params[name].copy_(full_tensor(i, version)[cut])

    def difference(self, version):
        for name, (i, cut) in self.pieces.items():
            want = full_tensor(i, version)[cut].contiguous()
            have = self.params[name]
            bits = torch.int16 if want.dtype == torch.bfloat16 else torch.int32
            if not torch.equal(have.view(bits), want.view(bits)):
                return name
        return None


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--role", choices=["trainer", "rollout"], required=True)
    parser.add_argument("--staging", action="store_true")
    parser.add_argument("--trainers", type=int, default=2)
    parser.add_argument("--tp", type=int, default=2)
    parser.add_argument("--versions", type=int, default=3)
    parser.add_argument("--bad-input", type=int, default=-1,
                        help="this world rank passes load_weights=None; every rank prints what it was refused with")
    args = parser.parse_args()
    world = MPI.COMM_WORLD
    rank = world.Get_rank()
    trainer = args.role == "trainer"
    if trainer != (rank < args.trainers):
        sys.exit(f"mixed_worker.py: world rank {rank} cannot be a {args.role} with --trainers {args.trainers}")
    side = world.Split(0 if trainer else 1, rank)
    group = side if trainer else side.Split(side.Get_rank() // args.tp, side.Get_rank())
    worker = Worker(trainer, group.Get_rank(), group.Get_size())
    who = f"{args.role} {rank} (Python)"
    if args.bad_input >= 0:
        load = None if rank == args.bad_input else worker.load_weights
        try:
            if trainer:
                wb.SenderAdapter(world, group, worker.params, list(TENSORS), load, timeout_seconds=30)
            else:
                wb.ReceiverAdapter(world, group, worker.params, load, timeout_seconds=30)
            say(f"mixed: {who}: constructed its adapter")
        except wb.Error as error:
            say(f"mixed: {who}: refused: {error}")
        world.Barrier()  # as the C++ half: every line printed before anyone exits
        return 0
    if trainer:
        sender = wb.SenderAdapter(world, group, worker.params, [(n, d, s) for n, d, s in TENSORS], worker.load_weights,
                                  sender_staging=args.staging, timeout_seconds=30)
        sender.connect()
        for version in range(1, args.versions + 1):
            worker.set(version)
            sender.send_weights(version)
            if args.staging:
                worker.set(1000)  # the next step changes the parameters at once
        sender.shutdown()
        figures = [u for u in sender.stats().history
                   if u.completed and u.ewtt_seconds is not None and u.agst_seconds is not None
                   and 0 < u.agst_seconds <= u.ewtt_seconds]
        print(f"mixed: {who}: sent {args.versions} versions, EWTT and AGST for {len(figures)}", flush=True)
        return 0 if len(figures) == args.versions else 1
    receiver = wb.ReceiverAdapter(world, group, worker.params, worker.load_weights, receiver_staging=args.staging,
                                  timeout_seconds=30)
    verified = 0
    deadline = time.monotonic() + 120
    while True:
        result = receiver.poll_requests()
        if result.event == wb.Event.SHUTDOWN:
            break
        if result.event == wb.Event.ABORTED:
            print(f"mixed: {who}: {result.status}", flush=True)
            return 1
        if result.event == wb.Event.INSTALLED:
            differs = worker.difference(result.version)
            if result.version != verified + 1:
                print(f"mixed: {who}: installed version {result.version} after {verified}", flush=True)
            elif differs is None:
                verified += 1
            else:
                print(f"mixed: {who}: version {result.version}: parameter {differs} differs", flush=True)
        if time.monotonic() > deadline:
            print(f"mixed: {who}: no shutdown within 120 s", flush=True)
            return 1
        time.sleep(0.001)
    print(f"mixed: {who}: verified {verified} of {args.versions} versions", flush=True)
    return 0 if verified == args.versions else 1


if __name__ == "__main__":
    try:
        code = main()
    except wb.Error as error:
        print(f"mixed: Python worker: {error}", flush=True)
        code = 1
    if code:
        MPI.COMM_WORLD.Abort(code)
