"""The trainer side of the example: every rank is one data-parallel replica that, after each training
step, sends its weights to the rollout engines. Run it together with rollout.py in one MPI job:

    mpirun -n 2 python3 examples/python/trainer.py : -n 2 python3 examples/python/rollout.py

(Open MPI as root also needs --allow-run-as-root; on a 2-core machine --oversubscribe.)
"""

import argparse

import mpi4py

mpi4py.rc.thread_level = "multiple"  # the staged modes run the transfer on a background thread
from mpi4py import MPI  # noqa: E402

import weightbridge  # noqa: E402
from tiny_model import TrainerModel, checkpoint_tensors, initial_checkpoint  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=5)
parser.add_argument("--staging", action="store_true", help="return from send_weights once the weights are staged")
args = parser.parse_args()

world = MPI.COMM_WORLD
trainer_comm = world.Split(0, world.Get_rank())  # rollout.py splits with color 1: every rank calls Split once
leader = trainer_comm.Get_rank() == 0

model = TrainerModel()
model.load_weights(initial_checkpoint())
# Collective over the world: every rollout rank constructs its ReceiverAdapter at the same time.
sender = weightbridge.SenderAdapter(world, trainer_comm, dict(model.named_parameters()), checkpoint_tensors(),
                                    model.load_weights, sender_staging=args.staging)
sender.connect()  # probes both sides' load_weights and plans the transfer, once
if leader:
    summary = sender.summary()
    print(f"trainer: connected in {summary.connect_seconds:.3f} s; {summary.model_bytes} bytes per version "
          f"in {summary.rounds} rounds", flush=True)

for step in range(1, args.steps + 1):
    model.train_step(step)
    sender.send_weights(step)  # weightbridge.Error on failure; the parameters may change right after it returns
    if leader:
        print(f"trainer: sent version {step}, checksum {model.checksum():.6f}", flush=True)
sender.shutdown()  # the engines' poll_requests return Event.SHUTDOWN
